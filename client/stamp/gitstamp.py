"""``stampd stamp --tag NAME [COMMIT]`` and ``stampd stamp --branch NAME [COMMIT]``: obtain a git
stamp from any stampd (or Zeitgitter) server, check it as ``git timestamp`` does, and store it.

The requests are Zeitgitter's ``stamp-tag-v1`` and ``stamp-branch-v1`` (docs/protocol.md), with
stampd's ``format=ssh`` and ``key=SHA256:...`` for SSH-signed stamps, and with 64-digit ids in a
SHA-256 repository (``git rev-parse --show-object-format``). The answer is refused, and nothing is
stored, unless: HTTP 200 without redirect; at most 8000 bytes of printable ASCII and LF; it
starts with exactly the lines asked for (``object/type/tag`` or ``tree/parent``) and the server
key's user id as tagger/author/committer; every time is 10 digits in zone ``+0000`` within 30 s
of this computer's clock; exactly one signature, armored without headers, where git reads it
(``gpgsig-sha256`` in a SHA-256 repository); and it verifies over the object without it, with
the trusted key: OpenPGP (binary signature 0x00, made within 30 s of now, by the pinned key or a
key of ``--key FILE``) or SSH (``ssh-keygen -Y verify -n git`` against the trusted key's
allowed-signers line). Only then is it stored with git plumbing: ``git mktag`` +
``git update-ref refs/tags/NAME NEW ""`` (the tag must not exist) or ``git hash-object -t commit
-w`` + ``git update-ref refs/heads/NAME NEW OLD``. A branch stamp's parents are the branch's
previous head and the stamped commit: the branch is a merge chain, as ``git timestamp`` builds it.

The answer's checks are in `client.stamp.answers`, the trusted keys in `client.stamp.trust`.
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from client.stamp.answers import check_branch_answer, check_tag_answer
from client.stamp.errors import StampFailed, UsageError
from client.stamp.git import git, resolve
from client.stamp.remote import post, server_url
from client.stamp.trust import (
    openpgp_trust,
    pin_keys,
    ssh_trust,
    verify_openpgp,
    verify_ssh,
)
from formats.gitobjects import OBJECT_FORMATS, SHA1

_NAME = re.compile(r"[_a-zA-Z][-._a-zA-Z0-9]{0,99}")


@dataclass(frozen=True)
class Stored:
    kind: str  # "tag" or "branch"
    ref: str
    oid: str
    old: str | None  # the branch's previous head
    commit: str
    time: int
    signer: str  # fingerprint of the key that signed
    origin: str  # where the trusted key came from
    server: str


def stamp(repo: Path, *, server: str | None, tag: str | None, branch: str | None,
          commit: str = "HEAD", fmt: str | None = None, key: str | None = None,
          clock: Callable[[], float] = time.time) -> Stored:
    """Obtain, check and store one tag or branch stamp; raise a `StampFailed`."""
    if (tag is None) == (branch is None):
        raise UsageError("give exactly one of --tag NAME and --branch NAME")
    name = tag if tag is not None else branch
    assert name is not None
    if fmt is None:
        fmt = "ssh" if key is not None and key.startswith("SHA256:") else "openpgp"
    if fmt not in ("openpgp", "ssh"):
        raise UsageError(f"--format must be openpgp or ssh, not {fmt!r}")
    if fmt == "openpgp" and key is not None and key.startswith("SHA256:"):
        raise UsageError("an SSH key fingerprint (--key SHA256:...) goes with --format ssh")
    git(repo, "rev-parse", "--git-dir", failure=UsageError)
    ref = f"refs/tags/{name}" if tag is not None else f"refs/heads/{name}"
    if not _NAME.fullmatch(name) or ".." in name \
            or subprocess.run(["git", "check-ref-format", ref], capture_output=True,
                              check=False).returncode != 0:
        raise UsageError(f"{name!r} is not a valid {'tag' if tag else 'branch'} name for a "
                         "stamp ([_a-zA-Z][-._a-zA-Z0-9]{0,99}, no '..')")
    try:
        object_format = git(repo, "rev-parse", "--show-object-format")
    except StampFailed:
        object_format = SHA1  # git before 2.25 knows only SHA-1
    if object_format not in OBJECT_FORMATS:
        raise UsageError(f"repositories with {object_format} object ids cannot be stamped")
    header = OBJECT_FORMATS[object_format][1]
    target = resolve(repo, commit, "commit")
    tree = resolve(repo, commit, "tree")
    if target is None or tree is None:
        raise UsageError(f"{commit!r} is not a commit in {repo}")
    url = server_url(repo, server)

    form = {"request": "stamp-tag-v1" if tag else "stamp-branch-v1", "commit": target}
    old = None
    if tag is not None:
        form["tagname"] = tag
        if resolve(repo, ref, "object") is not None:
            raise UsageError(f"tag {tag} exists already")
    else:
        form["tree"] = tree
        old = resolve(repo, ref, "commit")
        if old is not None:
            if old == target:
                raise UsageError(f"{commit} is the head of {name}: a branch cannot stamp itself")
            if target in git(repo, "rev-parse", f"{old}^@").split():
                raise UsageError(f"{target} is stamped on {name} already")
            form["parent"] = old

    # The OpenPGP key gives the user id of the stamps (SSH keys have none), and signs them
    # unless they are SSH-signed.
    pgp = openpgp_trust(repo, url, Path(key) if fmt == "openpgp" and key else None)
    ssh = ssh_trust(repo, url, key) if fmt == "ssh" else None
    if ssh is not None:
        form["format"] = "ssh"
        form["key"] = ssh.key.fingerprint

    answer = post(url, form)
    now = int(clock())
    if tag is not None:
        checked = check_tag_answer(answer, commit=target, tagname=tag, uid=pgp.uid, fmt=fmt,
                                   now=now)
    else:
        checked = check_branch_answer(answer, tree=tree, commit=target, parent=old,
                                      uid=pgp.uid, fmt=fmt, header=header, now=now)
    if ssh is not None:
        signer, origin = verify_ssh(checked, ssh), ssh.origin
    else:
        signer = verify_openpgp(checked, pgp, "tag" if tag is not None else "commit")
        origin = pgp.origin

    if tag is not None:
        oid = git(repo, "mktag", input=answer)
        git(repo, "update-ref", "-m", f"stampd: timestamp of {target}", ref, oid, "")
    else:
        oid = git(repo, "hash-object", "-t", "commit", "-w", "--stdin", input=answer)
        try:
            git(repo, "update-ref", "-m", f"stampd: timestamp of {target}", ref, oid, old or "")
        except StampFailed as e:
            raise StampFailed(f"{name} moved meanwhile; nothing stored ({e.message})") from None
    # Trust on first use: the keys are pinned (and kept) once a stamp they signed is stored.
    pin_keys(repo, pgp, ssh)
    return Stored(kind="tag" if tag else "branch", ref=ref, oid=oid, old=old, commit=target,
                  time=checked.time, signer=signer, origin=origin, server=url)


def report(res: Stored) -> list[str]:
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(res.time))
    lines = [f"{res.kind} stamp:     {res.ref} = {res.oid}",
             f"stamps commit: {res.commit}"]
    if res.old:
        lines.append(f"chained on:    {res.old}")
    lines += [f"time:          {when} ({res.time})",
              f"key:           {res.signer} ({res.origin})",
              f"server:        {res.server}"]
    return lines

