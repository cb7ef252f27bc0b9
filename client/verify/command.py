"""``stampd verify``: check a digest receipt, a signed manifest, an RFC 3161 time-stamp token, or
a git tag/commit stamp, and print what was checked.

The target tells which: a manifest, a token (DER) or a receipt when it is a file (``-``:
standard input), else a tag or commit in ``--repo``. Each kind is checked by its module
(`client.verify.receipt`, `.manifest`, `.token`, `.gitstamp`); this one prints the reports,
and refuses options that do not apply to the target.

Exit status: 0 valid, 1 invalid (or could not be checked, or unsupported), 2 malformed, 3 a
valid token whose imprint is not in the ``--log`` (yet).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from client.verify.consistency import (
    Forked,
    check_consistency,
    seen_checkpoints,
    server_checkpoint,
)
from client.verify.errors import (
    CannotCheck,
    Invalid,
    Malformed,
    NotLogged,
    Unsupported,
    Usage,
)
from client.verify.gitstamp import GitResult, verify_git
from client.verify.inputs import iso, read_target
from client.verify.manifest import MAX_MANIFEST, ManifestResult, is_manifest, verify_manifest
from client.verify.receipt import ReceiptResult, receipt_text, server_error, verify_receipt
from client.verify.tlog import (
    DEFAULT_WAIT,
    PROOF_SUFFIX,
    Held,
    ProofUnavailable,
    check_proof,
    cosignature_count,
    fetch_proof,
    fetch_vkey,
    held_git,
    held_manifest,
    held_receipt,
    load_proof_file,
    load_proof_note,
    parse_vkey,
    pinned_log_keys,
    proof_path,
    quorum_missing,
    read_log_key,
    read_policy,
    report_line,
    store_proof_note,
    witnessed_by,
    witnessed_line,
    write_publishable,
)
from client.verify.token import (
    MAX_TOKEN,
    LogResult,
    TokenResult,
    find_in_log,
    is_token,
    name_text,
    verify_token,
)
from formats.note import NoteError, parse_note
from formats.tlog.checkpoint import Checkpoint
from formats.tlog.errors import TlogError
from formats.tlog.policy import Policy
from formats.tlog.proof import PROOF_HEADER, ProvenEntry, TlogProof


@dataclass(frozen=True)
class LogCheck:
    """Where a stamp's log proof is and comes from: ``file`` beside a receipt or manifest (None
    for standard input), or the git ``object_id``'s note in ``repo``; ``server`` to fetch it
    and the log key from (None: not known)."""

    held: Held
    server: str | None
    file: Path | None = None
    repo: Path | None = None
    object_id: str | None = None
    serial: int | None = None


def _log_keys(args: argparse.Namespace, check: LogCheck, repo: Path) -> tuple[list[str], str]:
    """(the log keys to check with, where they came from); `CannotCheck` if there are none."""
    given: str | None = getattr(args, "log_key", None)
    if given is not None:
        vkey, origin = read_log_key(given)
        return [vkey], origin
    pinned = pinned_log_keys(repo, check.server)
    if pinned:
        return pinned, "pinned log key"
    if check.server is None:
        raise CannotCheck("cannot check the log proof: no log key (give --log-key "
                          "VKEY_OR_FILE: the server's GET /tlog/vkey)")
    try:
        vkey = fetch_vkey(check.server)
    except CannotCheck as e:
        raise CannotCheck(f"cannot check the log proof: no log key pinned and {e.message}; "
                          "give --log-key VKEY_OR_FILE") from None
    print(f"note: the log key was fetched from {check.server.rstrip('/')}/tlog/vkey (trusting "
          "that server); use --log-key VKEY_OR_FILE to check against a key you hold",
          file=sys.stderr)
    return [vkey], "log key fetched from the server"


def _load_or_fetch(args: argparse.Namespace, check: LogCheck
                   ) -> tuple[bytes, str, bool] | None:
    """(proof, where it is, whether it was fetched now) or None when there is none."""
    given: Path | None = getattr(args, "proof", None)
    if given is not None:
        return load_proof_file(given), str(given), False
    if check.file is not None and proof_path(check.file).is_file():
        path = proof_path(check.file)
        return load_proof_file(path), str(path), False
    if check.object_id is not None and check.repo is not None:
        note = load_proof_note(check.repo, check.object_id)
        if note is not None:
            return note, f"note {check.object_id[:12]} (refs/notes/stampd-tlog)", False
    if not getattr(args, "fetch_proof", False):
        return None
    if check.server is None:
        raise Usage("--fetch-proof: no server to fetch it from (a git stamp: set git config "
                    "stampd.server or timestamp.server)")
    if check.file is None and check.object_id is None:
        raise Usage("--fetch-proof stores the proof beside the receipt: give a file, not -")
    try:
        proof = fetch_proof(check.server, serial=check.serial, object_id=check.object_id,
                            wait=DEFAULT_WAIT)
    except ProofUnavailable as e:
        raise CannotCheck(f"no log proof fetched: {e.message}") from None
    where = str(proof_path(check.file)) if check.file is not None else \
        f"note {(check.object_id or '')[:12]} (refs/notes/stampd-tlog)"
    return proof, where, True


def check_log(args: argparse.Namespace, check: LogCheck, repo: Path) -> list[str]:
    """The report line of the stamp's log proof (none: no proof and no --fetch-proof). Raise
    `Invalid` for a proof that fails, `CannotCheck` when there is no log key."""
    found = _load_or_fetch(args, check)
    if found is None:
        return []
    proof, where, fetched = found
    policy_file: Path | None = getattr(args, "policy", None)
    policy = None if policy_file is None else read_policy(policy_file)
    if policy is not None:  # its logs are the keys to trust
        keys, key_origin = [v.key.encode() for v, _ in policy.logs], f"policy {policy_file}"
        if not keys:
            raise Malformed(f"the policy {policy_file} names no log")
    else:
        keys, key_origin = _log_keys(args, check, repo)
    proven = check_proof(proof, check.held, keys, source=where)
    upgraded = None
    if getattr(args, "upgrade_proof", False) and not fetched:
        upgraded = _upgrade(check, proof, keys, policy)
        if upgraded is not None:
            (proof, proven), fetched = upgraded, True
    witnessed: list[str] = []
    if policy is not None:
        w = witnessed_by(proof, policy, source=where)
        if not w.quorum_holds:
            raise Invalid(f"log proof {where}: witnesses: {quorum_missing(w, policy)}")
        witnessed = [f"witnessed:     {witnessed_line(w, policy)}"]
    consistent = _check_consistency(args, check, proof, keys)
    if consistent:
        witnessed.append(f"consistent:    with {consistent} other checkpoint(s) of the log "
                         "(kept by stampd audit, or the server's)")
    stored = ""
    if fetched:
        if check.file is not None:
            try:
                write_publishable(proof_path(check.file), proof)
            except OSError as e:
                raise CannotCheck(f"cannot store the log proof {where}: {e.strerror}") from None
        elif check.repo is not None and check.object_id is not None:
            store_proof_note(check.repo, check.object_id, proof)
        stored = f"; {'upgraded' if upgraded is not None else 'fetched'}, stored as {where}"
    else:
        stored = f"; proof {where}"
        if getattr(args, "upgrade_proof", False):
            stored += " (kept: the server's proof carries no more cosignatures)"
    return [f"log:           {report_line(proven, key_origin)}{stored}", *witnessed]


def _check_consistency(args: argparse.Namespace, check: LogCheck, proof: bytes,
                       keys: list[str]) -> int:
    """Compare the proof's checkpoint with those earlier audits kept and, with --fetch-proof
    or --upgrade-proof, the server's tree: how many it was compared with; a fork is `Forked`
    (invalid), both signed checkpoints on stderr."""
    try:
        origin = Checkpoint.parse(parse_note(TlogProof.parse(proof).checkpoint).text).origin
    except (NoteError, TlogError):
        return 0
    vkey = next((k for k in keys if k.split("+", 1)[0] == origin), None)
    if vkey is None:
        return 0
    verifier = parse_vkey(vkey, "log")
    others = seen_checkpoints(origin, verifier, getattr(args, "state", None))
    current = None
    if (getattr(args, "fetch_proof", False) or getattr(args, "upgrade_proof", False)) and \
            check.server is not None:
        current = server_checkpoint(check.server, verifier)
    try:
        return check_consistency(proof, verifier, others, current)
    except Forked as e:
        print(e.evidence, file=sys.stderr)
        raise


def _upgrade(check: LogCheck, proof: bytes, keys: list[str], policy: Policy | None
             ) -> tuple[bytes, ProvenEntry] | None:
    """``--upgrade-proof``: the server's proof of the stamp now and what it proves, when it is
    valid and carries more cosignatures than ``proof`` (of the policy's witnesses, else any);
    None to keep ``proof``."""
    if check.server is None:
        raise Usage("--upgrade-proof: no server to fetch the proof from (a git stamp: set git "
                    "config stampd.server or timestamp.server)")
    try:
        new = fetch_proof(check.server, serial=check.serial, object_id=check.object_id)
    except ProofUnavailable as e:
        raise CannotCheck(f"--upgrade-proof: {e.message}") from None
    proven = check_proof(new, check.held, keys, source=f"fetched from {check.server}")
    if cosignature_count(new, policy) > cosignature_count(proof, policy):
        return new, proven
    return None


def report_manifest(res: ManifestResult) -> Iterator[str]:
    h = res.manifest.header
    yield f"valid manifest: {h.lines} {h.algorithm} line(s)"
    if res.matched:
        yield f"matches:        {res.matched}"
    yield f"time:           {iso(h.time)} ({h.time})"
    yield f"key:            {res.signer} ({res.key_origin})"
    yield f"server:         {h.server} (serial {h.serial})"
    if res.files is not None:
        f = res.files
        bad = len(f.changed) + len(f.missing)
        yield (f"files:          {f.checked} checked in {f.directory}: "
               + (f"{bad} do NOT match ({len(f.changed)} changed, {len(f.missing)} missing)"
                  if bad else "all match")
               + (f"; {len(f.unchecked)} line(s) not checked" if f.unchecked else ""))
        for name in f.changed:
            yield f"CHANGED:        {name}"
        for name in f.missing:
            yield f"MISSING:        {name}"
        for name in f.unchecked:
            yield f"NOT CHECKED:    {name} (no name, or outside --dir)"


def verify_manifest_command(args: argparse.Namespace, data: bytes) -> int:
    """The manifest branch of `cmd_verify`: print the report; raise for files that do not
    match (`Invalid`) or could not be checked (`Unsupported`)."""
    res = verify_manifest(data, key_file=args.key, directory=getattr(args, "dir", None),
                          file=args.file, digest=args.digest, repo=args.repo)
    if res.fetched:
        print(f"note: the server key was {res.key_origin} (trusting that server); "
              "use --key KEYFILE to check against a key you hold", file=sys.stderr)
    h = res.manifest.header
    held = held_manifest(h.serial, h.time, h.key, data, res.signer)
    target = None if args.target == "-" else Path(args.target)
    logged = check_log(args, LogCheck(held, h.server, file=target, serial=h.serial), args.repo)
    print("\n".join([*report_manifest(res), *logged]))
    f = res.files
    if f is not None and (f.changed or f.missing):
        names = [*f.changed, *f.missing]
        raise Invalid(f"{len(names)} of {f.checked} files do not match the manifest: "
                      + ", ".join(names[:5]) + (", ..." if len(names) > 5 else ""))
    if f is not None and f.unchecked:
        raise Unsupported(f"{len(f.unchecked)} line(s) name no file inside {f.directory}: "
                          "not checked")
    return 0


def _is_receipt_target(target: str) -> bool:
    return target == "-" or Path(target).is_file()


def _looks_like_a_file(target: str) -> bool:
    """A target that can only be meant as a file (a path or a receipt's name), never a git
    tag or commit name."""
    return "/" in target or target.endswith((".asc", ".receipt", ".txt"))


def report_receipt(res: ReceiptResult) -> Iterator[str]:
    st = res.statement
    yield f"valid receipt: {st.algorithm} {st.digest}"
    if res.checked:
        yield f"matches:       {res.checked}"
    yield f"time:          {iso(st.time)} ({st.time})"
    yield f"key:           {res.signature.fingerprint} ({res.key_origin})"
    yield f"server:        {st.server} (serial {st.serial})"


def report_git(res: GitResult) -> Iterator[str]:
    what = f"tag {res.name}" if res.kind == "tag" else f"commit {res.oid}"
    yield f"valid {res.kind} stamp: {what}"
    yield f"stamps commit: {res.stamped}"
    yield f"time:          {iso(res.time)} ({res.time})"
    yield f"key:           {res.signature.primary} ({res.key_origin})"
    yield f"signer:        {res.signer}"


def _gen_time(moment: datetime) -> str:
    fraction = f".{moment.microsecond:06d}".rstrip("0") if moment.microsecond else ""
    return f"{moment:%Y-%m-%dT%H:%M:%S}{fraction}Z ({int(moment.timestamp())})"


def report_token(res: TokenResult, chain_file: Path | None, logged: LogResult | None
                 ) -> Iterator[str]:
    f = res.fields
    anchored = res.anchor is not None and res.anchor.anchor is not None
    where = " (a TimeStampResp)" if res.container == "TimeStampResp" else " (a bare token)"
    yield f"{'valid token:' if anchored else 'token:':15}{res.imprint}{where}"
    yield f"matches:       {res.checked or 'nothing (give --data FILE or --digest HEX)'}"
    accuracy = f", accuracy {f.accuracy_seconds} s" if f.accuracy_seconds else ""
    yield f"time:          {_gen_time(f.gen_time)}{accuracy}"
    yield f"serial:        {f.serial}"
    yield f"policy:        {f.policy}"
    if f.nonce is not None:
        yield f"nonce:         {f.nonce:#x}"
    yield f"tsa:           {name_text(f.tsa_name) if f.tsa_name else res.signer}" + (
        "" if f.tsa_name else " (the signer; the token names no TSA)")
    yield (f"signature:     {res.signature_algorithm}, certificate sha256 {res.signer_sha256} "
           f"(from {res.certificate_origin})")
    if res.anchor is None:
        yield ("certificate:   NOT ANCHORED: checked against the token's own certificate only "
               "(no --chain)")
    elif res.anchor.path == (res.anchor.anchor,):
        yield f"certificate:   in --chain {chain_file}"
    else:
        yield (f"certificate:   {' <- '.join(res.anchor.path)}; {res.anchor.anchor} is in "
               f"--chain {chain_file}")
    if logged is not None:
        number = f"log commit {logged.number}, " if logged.number is not None else ""
        delta = logged.time - int(f.gen_time.timestamp())
        after = (f"{delta} s after genTime" if delta >= 0 else
                 f"{-delta} s BEFORE genTime: an earlier stamp of the same digest")
        yield f"log commit:    {logged.commit} ({number}{iso(logged.time)}, {after})"
        yield (f"log:           {logged.target}, signed by {logged.fingerprint} (checked as "
               "`stampd audit` does)")
        if logged.stamp is None:
            yield "peer stamp:    none yet"
        else:
            s = logged.stamp
            yield (f"peer stamp:    {s.peer} at {iso(s.time)} ({s.time - logged.time} s after "
                   f"the log commit), commit {s.commit}")


def verify_token_command(args: argparse.Namespace, data: bytes) -> int:
    """The token branch of `cmd_verify`: print the report, then raise what remains unproven
    (no --chain: `CannotCheck`; not in the --log yet: `NotLogged`)."""
    chain_file: Path | None = getattr(args, "chain", None)
    log_target: str | None = getattr(args, "log", None)
    if args.key is not None:
        raise Malformed("--key is for receipts and git stamps; give a token's TSA certificate "
                        "chain with --chain FILE")
    log_only = [o for o, v in (("--proof", getattr(args, "proof", None)),
                               ("--log-key", getattr(args, "log_key", None)),
                               ("--policy", getattr(args, "policy", None)),
                               ("--upgrade-proof", getattr(args, "upgrade_proof", None) or None),
                               ("--state", getattr(args, "state", None)),
                               ("--fetch-proof", getattr(args, "fetch_proof", None) or None))
                if v is not None]
    if log_only:
        raise Malformed(f"{', '.join(log_only)}: log proofs of RFC 3161 tokens are not checked "
                        "yet (receipts, manifests and git stamps only)")
    res = verify_token(data, chain_file=chain_file, file=args.file, digest=args.digest)
    logged: LogResult | None = None
    pending: NotLogged | None = None
    if log_target is not None:
        try:
            logged = find_in_log(str(log_target), res.fields.hash_algorithm,
                                 res.fields.digest.hex())
        except NotLogged as e:
            pending = e
    print("\n".join(report_token(res, chain_file, logged)))
    if logged is not None and logged.problems:
        print(f"note: `stampd audit {logged.target}` finds {logged.problems} problem(s) "
              "elsewhere in the log", file=sys.stderr)
    if res.anchor is None:
        raise CannotCheck(f"the token verifies with its own certificate ({res.signer}), which "
                          "is anchored nowhere: give the TSA's chain with --chain tsa.pem "
                          "(GET /tsa.pem) to check who issued it")
    if pending is not None:
        raise pending
    return 0


def _a_proof(target: str) -> str:
    """What to say of a target that is a transparency-log proof (``X.tlog-proof``)."""
    if target == "-":
        target = "standard input"
    stamp = target.removesuffix(PROOF_SUFFIX) if target.endswith(PROOF_SUFFIX) else None
    where = (f"stampd verify {stamp} finds it beside it" if stamp else
             "stampd verify RECEIPT finds RECEIPT.tlog-proof beside it")
    return (f"{target} is the transparency-log proof of a stamp, not a stamp: verify the "
            f"receipt or manifest it belongs to ({where}; or give it with --proof FILE)")


def git_server(repo: Path) -> str | None:
    """The server a repository's git stamps come from: the hook's ``stampd.server``, else
    ``timestamp.server`` (its first)."""
    for name in ("stampd.server", "timestamp.server"):
        try:
            r = subprocess.run(["git", "-C", str(repo), "config", "--get", name],
                               capture_output=True, text=True, timeout=60, check=False)
        except FileNotFoundError:
            return None
        if r.returncode == 0 and r.stdout.strip():
            return r.stdout.strip().split(",")[0].strip()
    return None


def cmd_verify(args: argparse.Namespace) -> int:
    """``stampd verify TARGET [--file F | --digest HEX] [--key KEYFILE] [--repo DIR]
    [--chain PEM] [--log LOG] [--dir DIR]``: 0 when valid; otherwise raise a `VerifyError`
    (exit status 1, 2, or 3 for a valid token not yet in the log). With ``--signers``: a commit's
    or tag's own signature at the time its stamp proves (`client.verify.signed`)."""
    if getattr(args, "signers", None):
        from client.verify.signed import cmd_verify_signed

        return cmd_verify_signed(args)
    if getattr(args, "range", None) is not None:
        raise Malformed("--range goes with --signers FILE (the commits' own signatures)")
    if args.target is None:
        raise Malformed("give a receipt, manifest, token, or a git tag or commit to verify")
    token_only = [o for o, v in (("--chain", getattr(args, "chain", None)),
                                 ("--log", getattr(args, "log", None))) if v is not None]
    verb = "applies" if len(token_only) == 1 else "apply"
    directory: Path | None = getattr(args, "dir", None)
    if _is_receipt_target(args.target):
        data = read_target(args.target, MAX_TOKEN)
        if is_manifest(data):
            if token_only:
                raise Malformed(f"{' and '.join(token_only)} {verb} to RFC 3161 tokens, not "
                                "to manifests")
            if len(data) > MAX_TOKEN:
                data += read_target(args.target, MAX_MANIFEST)[len(data):] \
                    if args.target != "-" else sys.stdin.buffer.read(MAX_MANIFEST)
            return verify_manifest_command(args, data)
        if directory is not None:
            raise Malformed("--dir applies to manifests (SHA256SUMS.asc), not to receipts, "
                            "tokens or git stamps")
        if is_token(data, args.target):
            return verify_token_command(args, data)
        if token_only:
            raise Malformed(f"{' and '.join(token_only)} {verb} to RFC 3161 tokens, not "
                            "to receipts")
        if data.startswith(PROOF_HEADER.encode() + b"\n"):
            raise Malformed(_a_proof(args.target))
        said = server_error(data)
        if said is not None:
            raise Malformed(f"{args.target} holds {said} (saved by curl without --fail?)")
        res = verify_receipt(receipt_text(data), key_file=args.key, file=args.file,
                             digest=args.digest, repo=args.repo)
        if res.fetched:
            print(f"note: the server key was {res.key_origin} (trusting that server); "
                  "use --key KEYFILE to check against a key you hold", file=sys.stderr)
        st = res.statement
        held = held_receipt(st.serial, st.time, st.key, st.algorithm, st.digest,
                            res.signature.primary)
        target = None if args.target == "-" else Path(args.target)
        logged = check_log(args, LogCheck(held, st.server, file=target, serial=st.serial),
                           args.repo)
        lines = [*report_receipt(res), *logged]
    else:
        if _looks_like_a_file(args.target):
            raise Malformed(f"no such file: {args.target}")
        if directory is not None:
            raise Malformed("--dir applies to manifests (SHA256SUMS.asc), not to git stamps")
        if args.file is not None or args.digest is not None:
            raise Malformed("--file and --digest apply to receipts, not to git stamps")
        if token_only:
            raise Malformed(f"{' and '.join(token_only)} {verb} to RFC 3161 tokens, not "
                            "to git stamps")
        git_res = verify_git(args.repo, args.target, args.key)
        held = held_git(git_res.kind, git_res.oid, git_res.stamped, git_res.time,
                        [git_res.signature.primary, git_res.signature.fingerprint])
        logged = check_log(args, LogCheck(held, git_server(args.repo), repo=args.repo,
                                          object_id=git_res.oid), args.repo)
        lines = [*report_git(git_res), *logged]
    print("\n".join(lines))
    return 0
