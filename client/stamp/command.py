"""``stampd stamp``: files (`client.stamp.manifest`) or a git stamp (`client.stamp.gitstamp`),
its report printed."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from client.stamp.errors import UsageError
from client.stamp.gitstamp import report, stamp
from client.stamp.manifest import report_written, stamp_files
from client.stamp.proofs import MAX_QUORUM_WAIT, ProofOutcome, obtain_proof
from client.verify.errors import Malformed
from client.verify.tlog import (
    DEFAULT_WAIT,
    MAX_WAIT,
    held_git,
    held_manifest,
    read_policy,
)


def cmd_stamp(args: argparse.Namespace) -> int:
    """``stampd stamp (--tag NAME | --branch NAME) [COMMIT]`` or ``stampd stamp FILE|DIR...
    [-o FILE] [--algorithm sha256|sha512]``, with ``[--server URL] [--format openpgp|ssh]
    [--key FILE|SHA256:...] [--repo DIR]``: 0 when stored; otherwise raise a `StampFailed`
    (exit status 1, 2 or 3)."""
    positional: list[str] = list(getattr(args, "paths", None) or [])
    wait = _wait(args)
    if getattr(args, "object", None) is not None:
        return _stamp_object(args, positional)
    if args.tag is None and args.branch is None:
        if not positional:
            raise UsageError("give FILE|DIR... to stamp files, or --tag NAME / --branch NAME "
                             "for a git stamp")
        res = stamp_files([Path(p) for p in positional], server=args.server,
                          output=getattr(args, "output", None),
                          algorithm=getattr(args, "algorithm", None) or "sha256",
                          fmt=args.format, key=args.key, repo=args.repo)
        for item in res.skipped:
            print(f"stampd stamp: skipped {item.path}: {item.why}", file=sys.stderr)
        h = res.header
        outcome = obtain_proof(
            args.repo, res.url, held_manifest(h.serial, h.time, h.key, res.answer, res.signer),
            wait, in_repository=res.in_repository, serial=h.serial, file=res.path,
            **_quorum(args))
        print("\n".join(report_written(res)))
        if res.skipped:
            print(f"skipped:       {len(res.skipped)} (not regular files; named on stderr)")
        _report_proof(outcome)
        return 0
    if getattr(args, "output", None) is not None or getattr(args, "algorithm", None):
        raise UsageError("-o and --algorithm are for stamping files, not git stamps")
    if len(positional) > 1:
        raise UsageError("a git stamp is of one COMMIT")
    res_git = stamp(args.repo, server=args.server, tag=args.tag, branch=args.branch,
                    commit=positional[0] if positional else "HEAD", fmt=args.format,
                    key=args.key)
    outcome = obtain_proof(
        args.repo, res_git.server,
        held_git(res_git.kind, res_git.oid, res_git.commit, res_git.time, [res_git.signer]),
        wait, in_repository=True, object_id=res_git.oid, **_quorum(args))
    print("\n".join(report(res_git)))
    _report_proof(outcome)
    return 0


def _stamp_object(args: argparse.Namespace, positional: list[str]) -> int:
    """``stampd stamp --object REV``: a receipt of the object's bytes, kept as its note."""
    from client.stamp.objectstamp import report_object, stamp_object

    if positional or getattr(args, "output", None) is not None or \
            getattr(args, "algorithm", None) or args.format == "ssh":
        raise UsageError("--object REV takes no FILE, -o, --algorithm or --format ssh")
    res = stamp_object(args.repo, args.object, server=args.server,
                       key=Path(args.key) if args.key else None)
    print("\n".join(report_object(res)))
    return 0


def _wait(args: argparse.Namespace) -> int:
    wait = getattr(args, "proof_wait", DEFAULT_WAIT)
    wait = DEFAULT_WAIT if wait is None else int(wait)
    if not 0 <= wait <= MAX_WAIT:
        raise UsageError(f"--proof-wait must be 0 to {MAX_WAIT} seconds, not {wait}")
    return wait


def _quorum(args: argparse.Namespace) -> dict[str, Any]:
    """``quorum_wait`` and ``policy`` of ``--quorum-wait`` and ``--policy``."""
    wait = int(getattr(args, "quorum_wait", 0) or 0)
    if not 0 <= wait <= MAX_QUORUM_WAIT:
        raise UsageError(f"--quorum-wait must be 0 to {MAX_QUORUM_WAIT} seconds, not {wait}")
    given: Path | None = getattr(args, "policy", None)
    try:
        policy = None if given is None else read_policy(given)
    except Malformed as e:
        raise UsageError(e.message) from None
    return {"quorum_wait": wait, "policy": policy}


def _report_proof(outcome: ProofOutcome) -> None:
    if outcome.line is not None:
        print(outcome.line)
    if outcome.witnessed is not None:
        print(outcome.witnessed)
    if outcome.note is not None:
        print(f"stampd stamp: {outcome.note}", file=sys.stderr)
