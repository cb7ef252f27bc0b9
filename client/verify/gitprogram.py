"""git's ``gpg.ssh.program`` and ``gpg.program``, wrapped: plain ``git verify-commit``,
``git verify-tag`` and ``git log --show-signature`` check a signature at the time its stamp
proves, where there is one, instead of the date its signer wrote.

git runs ``gpg.ssh.program -Y verify -n git -f ALLOWED_SIGNERS -I PRINCIPAL -s SIGFILE
-Overify-time=<committer date>`` with the signed payload (the commit without its signature
header, the tag without its signature) on standard input, after ``-Y find-principals -f FILE
-s SIGFILE -Overify-time=...``; and ``gpg.program --keyid-format=long --status-fd=1 --verify
SIGFILE -`` likewise. It also runs both to sign (``-Y sign``, ``-bsau``), which goes to the real
program untouched.

The wrapper puts the signed object back together (a commit: the signature as the header
git writes, ``gpgsig`` or ``gpgsig-sha256``, at the end of its headers; a tag: the signature
after the payload), hashes it, and, when that object is in the repository, finds its earliest
stamp with the keys pinned there, as ``stampd verify --signers`` does
(`client.verify.signed`). Then:

- **SSH**: ``-Overify-time`` becomes the stamp's time, and ssh-keygen decides with the
  allowed-signers file git gave; ``-Y find-principals`` is answered from that file without a
  time (the time is checked by ``-Y verify``), so that a key whose ``valid-before`` lies between
  the stamp and a later committer date is still found.
- **OpenPGP**: gpg runs with ``--faked-system-time <stamp time>!``: a key that expired after
  the stamp is valid then. A revocation is applied by gpg whatever its time, so a key revoked
  after the stamp stays refused here (``stampd verify --signers`` accepts it when the
  revocation is soft).

Without a stamp (or when the object cannot be put back together, or the stamp not checked)
the real program runs as git called it -- at the signer's date, as without the wrapper -- and
one line on standard error says so. The wrapper is never weaker than git alone: a stamp only
moves the time to check at to one the server vouches for.

``stampd hook install --git-verify`` writes the wrappers as small sh scripts under
``<git common dir>/stampd/`` and points ``gpg.ssh.program`` and ``gpg.program`` at them.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from client.verify.errors import VerifyError
from client.verify.gitread import object_format, rev_parse, run_git
from client.verify.signed import LogContext, evidence_for
from formats.allowed_signers import parse_allowed_signers, ssh_time
from formats.gitobjects import OBJECT_FORMATS, embed_commit_signature, git_object_id
from formats.sshsig import SshSigError, SshSignature


def _say(line: str) -> None:
    print(f"stampd: {line}", file=sys.stderr, flush=True)


def _option(args: Sequence[str], flag: str) -> str | None:
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            return args[i + 1]
    return None


def rebuilt_object(repo: Path, payload: bytes, signature: bytes) -> tuple[str, str] | None:
    """(object id, type) of the signed object git verifies, put back together from its payload
    and signature; None when no such object is in ``repo``."""
    fmt = object_format(repo)
    text = signature.decode("ascii", "replace")
    if not text.endswith("\n"):
        text += "\n"
    if payload.startswith(b"tree "):
        kind = "commit"
        try:
            body = embed_commit_signature(payload, text, OBJECT_FORMATS[fmt][1])
        except ValueError:
            return None
    elif payload.startswith(b"object "):
        kind, body = "tag", payload + text.encode("ascii", "replace")
    else:
        return None
    oid = git_object_id(kind, body, fmt)
    found = run_git(repo, "cat-file", "-t", oid, check=False).decode().strip()
    return (oid, kind) if found == kind else None


def stamp_time(repo: Path, oid: str, kind: str) -> tuple[int, str] | None:
    """(time, what proves it) of the earliest stamp of the object, checked with the keys
    pinned in ``repo``; None when there is none."""
    args = argparse.Namespace(key=None, policy=None, log_key=None, fetch_proof=False)
    exclude = rev_parse(repo, f"{oid}^@") if kind == "commit" else []
    objects = {oid: (kind, run_git(repo, "cat-file", kind, oid))}
    found, _, _, _ = evidence_for(args, repo, object_format(repo), objects, [oid], exclude,
                            LogContext.of(args, repo))
    ev = found.get(oid)
    return None if ev is None else (ev.earliest, ev.what)


def _with_stamp(args: list[str], payload: bytes, sigfile: str | None
                ) -> tuple[str, str, int, str] | None:
    """(object id, type, stamp time, what) of the object being verified, or None."""
    if sigfile is None:
        return None
    repo = Path(".")
    try:
        signature = Path(sigfile).read_bytes()
        rebuilt = rebuilt_object(repo, payload, signature)
        if rebuilt is None:
            _say("the signed object is not in this repository as git writes it: checked at "
                 "the date its signer wrote")
            return None
        found = stamp_time(repo, *rebuilt)
    except (VerifyError, OSError) as e:
        _say(f"no stamp checked ({e}): checked at the date its signer wrote")
        return None
    if found is None:
        _say(f"{rebuilt[1]} {rebuilt[0][:12]} has no stamp: checked at the date its signer "
             "wrote")
        return None
    return (*rebuilt, *found)


def _run(program: str, args: list[str], payload: bytes | None) -> int:
    r = subprocess.run([program, *args], input=payload, capture_output=True, check=False)
    sys.stdout.buffer.write(r.stdout)
    sys.stdout.buffer.flush()
    sys.stderr.buffer.write(r.stderr)
    sys.stderr.buffer.flush()
    return r.returncode


def _find_principals(args: list[str]) -> int:
    """``-Y find-principals``: the principals of the allowed-signers lines holding the
    signature's key, whatever their times; ssh-keygen's own answer when the file has lines
    this reader passes over."""
    signers, sigfile = _option(args, "-f"), _option(args, "-s")
    if signers is None or sigfile is None:
        os.execvp("ssh-keygen", ["ssh-keygen", *args])
    try:
        key = SshSignature.from_armored(Path(sigfile).read_text(encoding="ascii")).public_key
        lines, unread = parse_allowed_signers(Path(signers).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, SshSigError):
        os.execvp("ssh-keygen", ["ssh-keygen", *args])
    found = [",".join(s.principals) for s in lines if s.key.blob == key.blob
             and s.allows_namespace("git")]
    if not found:
        if unread:
            os.execvp("ssh-keygen", ["ssh-keygen", *args])
        print("No principal matched.", file=sys.stderr)
        return 1
    print("\n".join(dict.fromkeys(found)))
    return 0


def ssh_program(args: list[str]) -> int:
    """As git's ``gpg.ssh.program``: see the module docstring."""
    if args[:2] == ["-Y", "find-principals"]:
        return _find_principals(args)
    if args[:2] != ["-Y", "verify"]:
        os.execvp("ssh-keygen", ["ssh-keygen", *args])
    payload = sys.stdin.buffer.read()
    found = _with_stamp(args, payload, _option(args, "-s"))
    if found is not None:
        _, _, t, what = found
        given = next((a for a in args if a.startswith("-Overify-time=")), None)
        args = [a for a in args if not a.startswith("-Overify-time=")]
        args.append(f"-Overify-time={ssh_time(t)}")
        signer_date = given.split("=", 1)[1] if given else "none"
        _say(f"checked at {ssh_time(t)}, the time its stamp proves ({what}), not at the date "
             f"its signer wrote ({signer_date})")
    return _run("ssh-keygen", args, payload)


def gpg_program(args: list[str]) -> int:
    """As git's ``gpg.program``: see the module docstring."""
    if "--verify" not in args:
        os.execvp("gpg", ["gpg", *args])
    i = args.index("--verify")
    sigfile = args[i + 1] if i + 1 < len(args) else None
    payload = sys.stdin.buffer.read()
    found = _with_stamp(args, payload, sigfile)
    if found is not None:
        _, _, t, what = found
        args = [f"--faked-system-time={t}!", *args]
        _say(f"checked at {ssh_time(t)}, the time its stamp proves ({what}), not now")
    return _run("gpg", args, payload)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in ("ssh", "openpgp"):
        print("usage: python -m client.verify.gitprogram ssh|openpgp ARGS... (as git's "
              "gpg.ssh.program or gpg.program)", file=sys.stderr)
        return 2
    return ssh_program(argv[1:]) if argv[0] == "ssh" else gpg_program(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
