"""`python -m bench.verify_range`: how long `stampd verify --range A..B --signers FILE` takes for
1,000 stamped commits (issue 42: at most 10 s on this machine).

Set-up (not timed): one ``stampd serve`` (the fixed test key, ``--workers 1``, an SSH key
beside it, the transparency log on); a repository of ``--commits`` commits, each signed with
an SSH key (``ssh-keygen -Y sign -n git``, as git signs with ``gpg.format=ssh``) and each
stamped as the post-commit hook stamps it: a ``stamp-branch-v1`` of the commit on the
timestamp branch (a merge chain), its log proof (``GET /v1/proofs/git/<stamp>``) kept as a
note in ``refs/notes/stampd-tlog``, the server's key and log key pinned as ``stampd hook install``
pins them. The objects are written with one ``git hash-object --stdin-paths``, the notes with
one ``git fast-import``; ``git fsck`` checks the result.

Timed: ``stampd verify --range <root>..main --signers allowed_signers`` (every commit but the
unsigned root), as a command line in a process of its own, ``--runs`` times; it must exit 0
with every commit ``ok``. Reported: the wall time of each run (median and worst), its CPU
(user + system, the command and its children: ssh-keygen, gpg, git), and the load average
beside it, since the 2-core machine is shared. ``--stamp-format ssh`` makes SSH-signed stamps
(each checked by an ssh-keygen run of its own) instead of OpenPGP ones.

Exit status 1 if a run failed or the median exceeded ``--limit`` (10 s), 2 if it could not run.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

from bench.procs import BIN, progress
from formats.gitobjects import embed_commit_signature, git_object_id
from tests.helpers import TEST_FPR, TEST_PUBLIC_KEY, seed_data_dir, start_server

NAME = "Alice Signer"
EMAIL = "alice@example.org"
BRANCH = "bench-timestamps"


def git(repo: Path, *args: str, input: bytes | None = None) -> bytes:
    r = subprocess.run(["git", *args], cwd=repo, input=input, capture_output=True,
                       timeout=600, check=False)
    if r.returncode != 0:
        raise RuntimeError(f"git {' '.join(args[:2])}: {r.stderr.decode().strip()}")
    return r.stdout


def post(url: str, form: dict[str, str]) -> bytes:
    req = urllib.request.Request(url, data=urllib.parse.urlencode(form).encode())
    with urllib.request.urlopen(req, timeout=60) as r:
        return bytes(r.read())


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=120) as r:
        return bytes(r.read())


def build(repo: Path, key: Path, server: str, n: int, stamp_format: str, ssh_fpr: str | None
          ) -> None:
    """A repository of ``n`` SSH-signed commits, each with its branch stamp and proof note."""
    git(repo.parent, "init", "-q", "-b", "main", str(repo))
    (repo / "f").write_text("root\n")
    git(repo, "add", "f")
    git(repo, "-c", f"user.name={NAME}", "-c", f"user.email={EMAIL}", "commit", "-q", "-m",
        "root (unsigned)")
    parent = git(repo, "rev-parse", "HEAD").decode().strip()
    objects = Path(tempfile.mkdtemp(prefix="objs", dir=repo.parent))
    files: list[Path] = []
    stamps: list[str] = []
    old: str | None = None
    t0 = int(time.time()) - 2 * n
    paths = [_write(objects / f"b{i}", b"%d\n" % i) for i in range(n)]
    blobs = git(repo, "hash-object", "-w", "--stdin-paths",
                input="".join(f"{path}\n" for path in paths).encode())
    trees = git(repo, "mktree", "--batch", input="".join(
        f"100644 blob {b}\tf\n\n" for b in blobs.decode().split()).encode()).decode().split()
    for i in range(n):
        who = f"{NAME} <{EMAIL}> {t0 + 2 * i} +0000"
        payload = (f"tree {trees[i]}\nparent {parent}\nauthor {who}\ncommitter {who}\n\n"
                   f"commit {i}\n").encode()
        (objects / "payload").write_bytes(payload)
        subprocess.run(["ssh-keygen", "-q", "-Y", "sign", "-n", "git", "-f", str(key),
                        str(objects / "payload")], check=True, timeout=60,
                       capture_output=True)
        sig = (objects / "payload.sig").read_text()
        (objects / "payload.sig").unlink()
        body = embed_commit_signature(payload, sig)
        commit = git_object_id("commit", body)
        files.append(_write(objects / f"c{i}", body))
        form = {"request": "stamp-branch-v1", "commit": commit, "tree": trees[i]}
        if old is not None:
            form["parent"] = old
        if stamp_format == "ssh" and ssh_fpr is not None:
            form.update({"format": "ssh", "key": ssh_fpr})
        answer = post(server, form)
        old = git_object_id("commit", answer)
        stamps.append(old)
        files.append(_write(objects / f"s{i}", answer))
        parent = commit
        if (i + 1) % 100 == 0:
            progress(f"{i + 1} commits signed and stamped")
    written = git(repo, "hash-object", "-t", "commit", "-w", "--stdin-paths",
                  input="".join(f"{f}\n" for f in files).encode()).decode().split()
    assert written[-1] == stamps[-1], "the stamps' ids are git's"
    git(repo, "update-ref", "refs/heads/main", parent)
    git(repo, "update-ref", f"refs/heads/{BRANCH}", stamps[-1])
    progress("fetching the stamps' proofs")
    script = ["commit refs/notes/stampd-tlog",
              f"committer {NAME} <{EMAIL}> {int(time.time())} +0000", "data 0"]
    for s in stamps:
        proof = get(f"{server}v1/proofs/git/{s}?wait=30")
        script += [f"N inline {s}", f"data {len(proof)}", proof.decode()]
    git(repo, "fast-import", "--quiet", input=("\n".join(script) + "\n").encode())
    git(repo, "fsck", "--no-dangling")


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def pin(repo: Path, server: str) -> None:
    """The pins `stampd hook install` makes: the server key and its log key."""
    stampd = repo / ".git" / "stampd"
    stampd.mkdir(exist_ok=True)
    shutil.copy(TEST_PUBLIC_KEY, stampd / "server-key.asc")
    for name, value in (("server", server.rstrip("/")), ("branch", BRANCH),
                        ("fingerprint", TEST_FPR),
                        ("tlogkey", get(f"{server}tlog/vkey").decode().strip())):
        git(repo, "config", f"stampd.{name}", value)
    signers = get(f"{server}v1/keys/allowed_signers").decode()
    (stampd / "allowed_signers").write_text(signers.splitlines()[0] + "\n")
    git(repo, "config", "stampd.key", _ssh_fpr(server))


def timed(argv: list[str], cwd: Path) -> tuple[float, float, int, str]:
    """(wall seconds, CPU seconds of it and its children, exit status, its last line)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    r = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=900, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    lines = (r.stdout + r.stderr).strip().splitlines()
    return wall, cpu, r.returncode, lines[-1] if lines else ""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--commits", type=int, default=1000)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--limit", type=float, default=10.0, help="seconds the median may take")
    p.add_argument("--stamp-format", choices=("openpgp", "ssh"), default="openpgp")
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    a = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bvr", dir="/tmp"))
    server = None
    try:
        server = start_server(seed_data_dir(work / "data"), workers=1, extra_env={
            "STAMPD_TLOG": "on", "STAMPD_EXTRA_KEYS": "ssh:ed25519"})
        server.wait_ready(workers=2)
        url = server.url
        key = work / "alice"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "", "-f",
                        str(key)], check=True, timeout=60)
        ssh_fpr = None
        if a.stamp_format == "ssh":
            ssh_fpr = _ssh_fpr(url)
        repo = work / "repo"
        progress(f"making {a.commits} signed, stamped commits ({a.stamp_format} stamps)")
        build(repo, key, url, a.commits, a.stamp_format, ssh_fpr)
        pin(repo, url)
        pub = (key.with_suffix(".pub")).read_text().split()
        (work / "allowed_signers").write_text(f'{EMAIL} namespaces="git" {pub[0]} {pub[1]}\n')
    except Exception as e:  # (the set-up: exit 2)
        print(f"could not set up: {e}", file=sys.stderr)
        if server is not None:
            print(server.log()[-3000:], file=sys.stderr)
            server.stop()
        return 2
    server.stop()  # (verify is offline: the keys are pinned, the proofs are notes)
    root = git(repo, "rev-list", "--max-parents=0", "main").decode().strip()
    argv = [str(BIN / "stampd"), "verify", "--range", f"{root}..main", "--signers",
            str(work / "allowed_signers")]
    progress(f"timing: {' '.join(argv[1:])} (in {repo})")
    walls, cpus, failed = [], [], []
    for i in range(a.runs):
        load = os.getloadavg()[0]
        wall, cpu, code, last = timed(argv, repo)
        print(f"run {i + 1}: {wall:.2f} s wall, {cpu:.2f} s CPU, exit {code}, load {load:.1f}: "
              f"{last}", flush=True)
        walls.append(wall)
        cpus.append(cpu)
        if code != 0 or f"{a.commits} valid" not in last:
            failed.append(f"run {i + 1} exited {code}: {last}")
    median = statistics.median(walls)
    print(f"{a.commits} commits, {a.stamp_format} stamps: median {median:.2f} s wall "
          f"(worst {max(walls):.2f} s), median {statistics.median(cpus):.2f} s CPU, on "
          f"{os.cpu_count()} cores; limit {a.limit:.0f} s")
    if not a.keep and not failed:
        shutil.rmtree(work, ignore_errors=True)
    else:
        print(f"kept: {work}", file=sys.stderr)
    for f in failed:
        print(f"FAIL: {f}")
    return 1 if failed or median > a.limit else 0


def _ssh_fpr(url: str) -> str:
    signers = get(f"{url}v1/keys/allowed_signers").decode().split()
    from formats.sshsig import SshPublicKey

    for i, w in enumerate(signers):
        if w.startswith("ssh-") and i + 1 < len(signers):
            return SshPublicKey.from_line(f"{w} {signers[i + 1]}").fingerprint
    raise RuntimeError("the server has no SSH key")


if __name__ == "__main__":
    sys.exit(main())
