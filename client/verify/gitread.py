"""Reading a repository for ``stampd verify --signers``: many objects through one ``git cat-file
--batch``, refs, config, revision lists and notes, each one git process however many objects
it concerns (a range of 1,000 commits must not cost 1,000 processes)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterable, Iterator
from pathlib import Path

from client.verify.errors import CannotCheck, Malformed
from formats.gitobjects import OBJECT_FORMATS, SHA1

GIT_TIMEOUT = 300.0


def run_git(repo: Path, *args: str, input: bytes | None = None, check: bool = True
            ) -> bytes:
    """Standard output of ``git -C repo ARGS``; `Malformed` naming git's last line when it
    fails (``check``), else b"" for a failure."""
    try:
        r = subprocess.run(["git", "-C", str(repo), *args], input=input, capture_output=True,
                           timeout=GIT_TIMEOUT, check=False)
    except FileNotFoundError:
        raise CannotCheck("git is not installed") from None
    if r.returncode != 0:
        if not check:
            return b""
        detail = r.stderr.decode("utf-8", "replace").strip().splitlines()
        raise Malformed(f"git {' '.join(args[:2])} in {repo}: "
                        f"{detail[-1] if detail else r.returncode}")
    return r.stdout


def object_format(repo: Path) -> str:
    """``sha1`` or ``sha256``: the repository's object format (git before 2.25: sha1)."""
    found = run_git(repo, "rev-parse", "--show-object-format", check=False).decode().strip()
    return found if found in OBJECT_FORMATS else SHA1


def config(repo: Path, name: str) -> str | None:
    value = run_git(repo, "config", "--get", name, check=False).decode("utf-8", "replace")
    return value.strip() or None


def read_objects(repo: Path, oids: Iterable[str]) -> dict[str, tuple[str, bytes]]:
    """{object id: (type, body)} of ``oids`` through one ``git cat-file --batch``; an object
    that does not exist is left out."""
    wanted = list(dict.fromkeys(oids))
    if not wanted:
        return {}
    out = run_git(repo, "cat-file", "--batch", input="".join(f"{o}\n" for o in wanted).encode())
    found: dict[str, tuple[str, bytes]] = {}
    pos = 0
    for oid in wanted:
        end = out.index(b"\n", pos)
        header = out[pos:end].decode("ascii", "replace").split()
        pos = end + 1
        if len(header) != 3 or header[1] == "missing":
            continue
        size = int(header[2])
        found[oid] = (header[1], out[pos:pos + size])
        pos += size + 1
    return found


def rev_parse(repo: Path, *names: str) -> list[str]:
    """``git rev-parse NAMES``: the object ids, ``^<id>`` for an exclusion."""
    return run_git(repo, "rev-parse", *names).decode("ascii").split()


def refs(repo: Path, *patterns: str) -> list[tuple[str, str, str]]:
    """(ref name, object id, object type) of every ref under ``patterns``."""
    out = run_git(repo, "for-each-ref", "--format=%(refname) %(objectname) %(objecttype)",
                  *patterns)
    rows = []
    for line in out.decode("utf-8", "replace").splitlines():
        parts = line.split(" ")
        if len(parts) == 3:
            rows.append((parts[0], parts[1], parts[2]))
    return rows


def first_parent_chain(repo: Path, ref: str) -> Iterator[list[str]]:
    """``[commit, parent...]`` along the first parents of ``ref``, newest first, read as git
    prints them: the caller stops when it has seen enough (the rest is not read)."""
    try:
        proc = subprocess.Popen(["git", "-C", str(repo), "rev-list", "--first-parent",
                                 "--parents", ref, "--"], stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL)
    except FileNotFoundError:
        raise CannotCheck("git is not installed") from None
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            yield line.decode("ascii", "replace").split()
    finally:
        proc.kill()
        proc.stdout.close()
        proc.wait()


def parents_graph(repo: Path, heads: Iterable[str], exclude: Iterable[str]
                  ) -> list[tuple[str, list[str]]]:
    """(commit, parents) of the commits reachable from ``heads`` and not from ``exclude``,
    children before their parents (``git rev-list --topo-order --parents``)."""
    revs = [*dict.fromkeys(heads), *(f"^{e.lstrip('^')}" for e in dict.fromkeys(exclude))]
    if not any(not r.startswith("^") for r in revs):
        return []
    out = run_git(repo, "rev-list", "--topo-order", "--parents", "--stdin",
                  input="".join(f"{r}\n" for r in revs).encode())
    graph = []
    for line in out.decode("ascii").splitlines():
        ids = line.split()
        graph.append((ids[0], ids[1:]))
    return graph


def notes(repo: Path, ref: str) -> dict[str, str]:
    """{annotated object id: note blob id} of the notes under ``ref`` (none: {})."""
    out = run_git(repo, "notes", f"--ref={ref}", "list", check=False)
    found = {}
    for line in out.decode("ascii", "replace").splitlines():
        parts = line.split()
        if len(parts) == 2:
            found[parts[1]] = parts[0]
    return found
