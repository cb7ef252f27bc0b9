"""``stampd verify COMMIT|TAG --signers FILE`` and ``stampd verify --range A..B --signers FILE``:
a commit's or tag's **own** signature checked at the time its stamp proves, not at the date its
signer wrote (docs/signatures.md).

For each object: its signature (`client.verify.signers`); the earliest stamp that proves it
existed (`client.verify.covering`: a branch or tag stamp of it or of a descendant, verified
with the server's key; or a digest receipt of the object kept as a note in
``refs/notes/stampd-receipts``; with ``--fetch-proof``, what the server has: its log's entry
for the commit, the receipts of the object's digest); the **bounds** that stamp gives, strongest
first -- the time a quorum of witnesses had cosigned its log checkpoint (``--policy``: vouched
for by the witnesses, independently of the server's key), else the stamp's own time (vouched
for by the server's key, and its log when its proof checks) -- and the signer's key valid at the
strongest bound it is valid at (`Bound`). A key valid at none of them is refused, naming its end
and the stamp's time.

Exit status: 0 every object valid; 1 one invalid (a signature that does not verify, a key not
valid at the time its stamp proves, a log proof that fails; with ``--range`` also an unsigned
commit); 2 malformed (a single unsigned object, an unusable argument); 3 an object no stamp
covers (and, with ``--range``, none invalid).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from client.fetch import FetchError, http_request
from client.verify.covering import (
    StampKeys,
    VerifiedStamp,
    earliest_stamps,
    find_git_stamps,
    verify_stamps,
)
from client.verify.errors import (
    CannotCheck,
    Invalid,
    Malformed,
    NotStamped,
    VerifyError,
)
from client.verify.gitread import (
    notes,
    object_format,
    read_objects,
    rev_parse,
    run_git,
)
from client.verify.gitstamp import resolve_git_object
from client.verify.receipt import receipt_text, verify_receipt
from client.verify.signers import (
    Identified,
    Outcome,
    Signed,
    Signers,
    identify_openpgp,
    identify_ssh,
    iso,
    load_signers,
    signed_object,
    ssh_check_many,
)
from client.verify.tlog import (
    NOTES_REF,
    Held,
    ProofUnavailable,
    check_proof,
    fetch_proof,
    held_git,
    pinned_log_keys,
    quorum_missing,
    read_log_key,
    read_policy,
    report_line,
    store_proof_note,
    witnessed_line,
)
from formats.gitobjects import SHA256, git_object_id
from formats.note import NoteError
from formats.receipts import END_SIG
from formats.tlog.entry import GIT_KINDS, Entry
from formats.tlog.errors import TlogError
from formats.tlog.policy import Policy, PolicyError
from formats.tlog.proof import TlogProof

RECEIPTS_REF = "refs/notes/stampd-receipts"
SSH_END = "-----END SSH SIGNATURE-----"
MAX_RECEIPTS = 256 * 1024


@dataclass(frozen=True)
class Bound:
    """An upper bound on when an object existed, and who vouches for it."""

    time: int
    by: str  # in words
    label: str  # for a range's line: "witnessed", "stamp and log", "stamp", "log", "receipt"


@dataclass(frozen=True)
class Evidence:
    """What proves when an object existed at the latest: the stamp and its bounds."""

    what: str
    bounds: tuple[Bound, ...]  # strongest first
    lines: tuple[str, ...] = ()  # report lines: log:, witnessed:
    notes: tuple[str, ...] = ()  # why a stronger bound is not at hand

    @property
    def earliest(self) -> int:
        return min(b.time for b in self.bounds)


@dataclass
class Verdict:
    oid: str
    status: str  # "valid", "invalid", "not stamped", "not signed"
    signed: Signed | None = None
    who: Identified | None = None
    evidence: Evidence | None = None
    bound: Bound | None = None
    reason: str | None = None
    said: str | None = None


# --------------------------------------------------------------------------- the log


@dataclass
class LogContext:
    """What a stamp's log proof is checked with: the log keys (``--log-key``, ``--policy``'s
    logs, else those pinned) and ``--policy``'s witnesses."""

    keys: list[str]
    key_origin: str
    policy: Policy | None
    policy_file: Path | None
    stored: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, args: argparse.Namespace, repo: Path) -> LogContext:
        policy_file: Path | None = getattr(args, "policy", None)
        policy = None if policy_file is None else read_policy(policy_file)
        if policy is not None:
            keys = [v.key.encode() for v, _ in policy.logs]
            if not keys:
                raise Malformed(f"the policy {policy_file} names no log")
            return cls(keys, f"policy {policy_file}", policy, policy_file)
        given: str | None = getattr(args, "log_key", None)
        if given is not None:
            vkey, origin = read_log_key(given)
            return cls([vkey], origin, None, None)
        return cls(pinned_log_keys(repo, None), "pinned log key", None, None)

    def bounds(self, proof: bytes | None, held: Held, source: str, base: Bound
               ) -> tuple[tuple[Bound, ...], tuple[str, ...], tuple[str, ...]]:
        """(bounds, report lines, notes) of a stamp whose own bound is ``base``, given its
        log proof (None: none at hand). A proof that fails is `Invalid`; cosignatures that do
        not verify or fall short of the quorum leave the weaker bound, said in a note."""
        if proof is None:
            return (base,), (), ("no log proof of the stamp: its time rests on the server's "
                                 "key alone (stampd verify --fetch-proof fetches the proof)",)
        if not self.keys:
            return (base,), (), ("the stamp's log proof is not checked: no log key (give "
                                 "--log-key VKEY_OR_FILE or --policy FILE)",)
        proven = check_proof(proof, held, self.keys, source=source)
        logged = replace(base, by=f"{base.by}, and its log (index {proven.leaf_index})",
                         label="stamp and log")
        lines = [f"log:           {report_line(proven, self.key_origin)}; proof {source}"]
        if self.policy is None:
            return (logged,), tuple(lines), ("no --policy: the witnesses' cosignatures, which "
                                             "bound the time independently of the server's "
                                             "key, are not checked",)
        try:
            w = self.policy.check(TlogProof.parse(proof).checkpoint)
        except (PolicyError, TlogError, NoteError) as e:
            return (logged,), tuple(lines), (f"the witnesses' cosignatures do not verify "
                                             f"({e}): the weaker bound, the stamp's time, is "
                                             "used",)
        if not w.quorum_holds or w.quorum_time is None:
            return (logged,), tuple(lines), (f"witnesses: {quorum_missing(w, self.policy)}: "
                                             "the weaker bound, the stamp's time, is used",)
        lines.append(f"witnessed:     {witnessed_line(w, self.policy)}")
        names = ", ".join(sorted(w.cosigned))
        witnessed = Bound(w.quorum_time, f"the witnesses {names} (a quorum of {self.policy_file}"
                          "), independently of the server's key", "witnessed")
        return (witnessed, logged), tuple(lines), ()


# --------------------------------------------------------------------------- evidence


def _stamp_evidence(v: VerifiedStamp, target: str, proof: bytes | None, source: str,
                    log: LogContext) -> Evidence:
    s = v.stamp
    of = "of this commit" if s.stamped == target else f"of its descendant {s.stamped[:12]}"
    base = Bound(s.time, f"the server key {v.signature.primary} ({v.key_origin})", "stamp")
    held = held_git(s.kind, s.oid, s.stamped, s.time,
                    [v.signature.primary, v.signature.fingerprint])
    bounds, lines, notes_ = log.bounds(proof, held, source, base)
    return Evidence(f"{s.describe()} {of}, signed {iso(s.time)}", bounds, lines, notes_)


def _split_receipts(text: str) -> list[str]:
    """The receipts of a note or a server's answer: each ends with its signature's END line."""
    out, current = [], []
    for line in text.splitlines(keepends=True):
        current.append(line)
        if line.rstrip("\n") in (END_SIG, SSH_END):
            out.append("".join(current).lstrip("\n"))  # (git notes append: a blank line)
            current = []
    return out


def _receipt_evidence(texts: Sequence[str], digest: str, args: argparse.Namespace,
                      repo: Path, where: str) -> tuple[Evidence | None, list[str]]:
    """The earliest receipt of ``digest`` among ``texts`` that verifies, and why the others
    do not."""
    best: Evidence | None = None
    refused = []
    for text in texts:
        try:
            res = verify_receipt(receipt_text(text.encode("ascii", "replace")),
                                 key_file=getattr(args, "key", None), digest=digest, repo=repo)
        except VerifyError as e:
            refused.append(f"a receipt {where}: {e}")
            continue
        if res.fetched:
            print(f"note: the server key was {res.key_origin} (trusting that server); use "
                  "--key KEYFILE to check against a key you hold", file=sys.stderr)
        st = res.statement
        bound = Bound(st.time, f"the server key {res.signature.primary} ({res.key_origin})",
                      "receipt")
        ev = Evidence(f"receipt of the object's sha256 {digest[:12]}..., serial {st.serial} of "
                      f"{st.server}, {where}, signed {iso(st.time)}", (bound,), (),
                      ("a receipt's log proof is not checked here: its time rests on the "
                       "server's key",))
        if best is None or ev.earliest < best.earliest:
            best = ev
    return best, refused


def object_digest(kind: str, body: bytes) -> str:
    """The SHA-256 a receipt stamps of a git object: of ``<type> <size>\\0<body>``, which is
    its id in a SHA-256 repository."""
    return git_object_id(kind, body, SHA256)


def _server(repo: Path) -> str | None:
    for name in ("stampd.server", "timestamp.server"):
        value = run_git(repo, "config", "--get", name, check=False).decode().strip()
        if value:
            return value.split(",")[0].strip()
    return None


def _server_receipts(server: str, digest: str) -> list[str]:
    url = f"{server.rstrip('/')}/v1/stamps/sha256/{digest}"
    try:
        body = http_request(url, timeout=10.0, limit=MAX_RECEIPTS)
    except FetchError as e:
        if e.status == 404:
            return []
        raise CannotCheck(f"GET {url}: {e}") from None
    return _split_receipts(body.decode("ascii", "replace"))


def _server_log_evidence(server: str, commit: str, log: LogContext) -> Evidence | None:
    """The server's log entry for a stamp of ``commit`` (``GET /v1/proofs/git/<commit>``),
    checked with the log key: the log's word, without the stamp object."""
    try:
        proof = fetch_proof(server, object_id=commit)
    except ProofUnavailable:
        return None
    try:
        extra = TlogProof.parse(proof).extra
        entry = Entry.parse(extra) if extra is not None else None
    except TlogError:
        entry = None
    if entry is None or entry.kind not in GIT_KINDS or entry.commit != commit:
        raise Invalid(f"the server's log proof for {commit} is not of a stamp of it")
    if not log.keys:
        raise CannotCheck("cannot check the server's log proof: no log key (give --log-key "
                          "VKEY_OR_FILE or --policy FILE)")
    held = Held(f"{entry.kind} stamp", entry.kind, entry.time, frozenset([entry.key]),
                commit=commit, object_id=entry.object_id)
    base = Bound(entry.time, f"the server's log (its entry for a {entry.kind} stamp by key "
                 f"{entry.key})", "log")
    bounds, lines, notes_ = log.bounds(proof, held, f"fetched from {server}", base)
    bounds = tuple(b if b.label == "witnessed" else replace(b, label="log") for b in bounds)
    return Evidence(f"the log of {server}: a {entry.kind} stamp of this commit, "
                    f"{iso(entry.time)} (the stamp object is not in this repository)",
                    bounds, lines, notes_)


# --------------------------------------------------------------------------- the command


def _refuse_options(args: argparse.Namespace) -> None:
    given = [name for name, attr in (("--file", "file"), ("--digest", "digest"),
                                     ("--dir", "dir"), ("--chain", "chain"), ("--log", "log"),
                                     ("--proof", "proof"), ("--state", "state"))
             if getattr(args, attr, None) is not None]
    if getattr(args, "upgrade_proof", False):
        given.append("--upgrade-proof")
    if given:
        raise Malformed(f"{', '.join(given)}: not with --signers (the stamps' proofs are their "
                        "notes; --fetch-proof fetches the missing ones)")


def _targets(args: argparse.Namespace, repo: Path) -> tuple[list[str], list[str], str]:
    """(objects to check, the exclusions of the history walk, what was asked, in words)."""
    spec: str | None = getattr(args, "range", None)
    if spec is not None:
        if args.target is not None:
            raise Malformed("give a target or --range A..B, not both")
        if spec.startswith("-"):
            raise Malformed(f"--range {spec!r} is not a range of commits")
        revs = rev_parse(repo, spec)
        listed = run_git(repo, "rev-list", spec, "--").decode("ascii").split()
        return listed, [r[1:] for r in revs if r.startswith("^")], f"range {spec}"
    if args.target is None:
        raise Malformed("give a commit or tag, or --range A..B")
    oid, kind = resolve_git_object(repo, args.target)
    exclude = run_git(repo, "rev-parse", f"{oid}^@").decode().split() if kind == "commit" \
        else []
    return [oid], exclude, f"{kind} {args.target}"


def evidence_for(args: argparse.Namespace, repo: Path, fmt: str,
              objects: dict[str, tuple[str, bytes]], targets: list[str], exclude: list[str],
              log: LogContext
              ) -> tuple[dict[str, Evidence], dict[str, str], list[str], dict[str, str]]:
    """({object: its evidence}, {object: why it has none it could use}, notes for stderr,
    {object: why its stamp's log proof fails}: invalid)."""
    keys = StampKeys(repo, getattr(args, "key", None))
    commits = [t for t in targets if objects.get(t, ("", b""))[0] == "commit"]
    found: dict[str, Evidence] = {}
    why: dict[str, str] = {}
    said: list[str] = []
    broken: dict[str, str] = {}
    if commits:
        stamps = find_git_stamps(repo, fmt, keys.uids())
        earliest, failed, passed_over = earliest_stamps(
            repo, commits, exclude, stamps, lambda batch: verify_stamps(keys, batch))
        if failed:
            reasons = sorted(set(failed.values()))
            said.append(f"{len(failed)} stamp(s) passed over, not verified: "
                        f"{reasons[0]}" + (f" (and {len(reasons) - 1} other reason(s))"
                                           if len(reasons) > 1 else ""))
        chosen = {v.stamp.oid: v for v in earliest.values() if v is not None}
        proof_notes = notes(repo, NOTES_REF) if chosen else {}
        blobs = read_objects(repo, [proof_notes[o] for o in chosen if o in proof_notes])
        server = _server(repo)
        covers: dict[str, list[str]] = {}
        for t, v in earliest.items():
            if v is not None:
                covers.setdefault(v.stamp.oid, []).append(t)
        for oid, v in chosen.items():
            blob = proof_notes.get(oid)
            proof = blobs[blob][1] if blob in blobs else None
            source = f"note {oid[:12]} ({NOTES_REF})"
            if proof is None and getattr(args, "fetch_proof", False) and server is not None:
                try:
                    proof = fetch_proof(server, object_id=oid)
                    store_proof_note(repo, oid, proof)
                    source = f"fetched from {server}, stored as {source}"
                except CannotCheck as e:  # (ProofUnavailable too)
                    said.append(f"no log proof of {oid[:12]} fetched: {e.message}")
                    proof = None
            for t in covers.get(oid, []):
                try:
                    found[t] = _stamp_evidence(v, t, proof, source, log)
                except (Invalid, Malformed) as e:  # (a proof that fails: this commit's)
                    broken[t] = f"its stamp {v.stamp.oid[:12]}: {e}"
        for t in passed_over:
            why[t] = ("the stamps of it or of its descendants do not verify: "
                      f"{sorted(set(failed.values()))[0]}")
    receipt_notes = notes(repo, RECEIPTS_REF)
    noted = {t: receipt_notes[t] for t in targets if t in receipt_notes}
    note_blobs = read_objects(repo, noted.values()) if noted else {}
    server = _server(repo)
    for t in targets:
        kind, body = objects.get(t, ("", b""))
        texts = []
        if t in noted and noted[t] in note_blobs:
            texts = _split_receipts(note_blobs[noted[t]][1].decode("ascii", "replace"))
        digest = object_digest(kind, body) if kind else ""
        ev, refused = _receipt_evidence(texts, digest, args, repo, f"note ({RECEIPTS_REF})")
        said += refused
        if ev is None and t not in found and getattr(args, "fetch_proof", False) \
                and server is not None:
            if kind == "tag":
                ev, refused = _receipt_evidence(_server_receipts(server, digest), digest, args,
                                                repo, f"from {server}")
                said += refused
            elif kind == "commit":
                try:
                    ev = _server_log_evidence(server, t, log)
                except (Invalid, Malformed) as e:
                    broken[t] = f"the server's log proof: {e}"
                except CannotCheck as e:
                    why[t] = f"the server's log could not be asked: {e.message}"
        if ev is not None and (t not in found or ev.earliest < found[t].earliest):
            found[t] = ev
    return found, why, said, broken


def _choose(signed: Signed, who: Identified, ev: Evidence) -> Verdict:
    """The strongest bound the signer's key is valid at, or the refusal naming both times."""
    for bound in ev.bounds:
        if who.valid_at(bound.time) is None:
            return Verdict(signed.oid, "valid", signed, who, ev, bound)
    t = ev.earliest
    refusal = who.valid_at(t) or "not valid then"
    date = "committer" if signed.kind == "commit" else "tagger"
    return Verdict(signed.oid, "invalid", signed, who, ev, reason=(
        f"{signed.name()}: signed by {who.signer} ({who.key}), whose key was not valid at "
        f"{iso(t)}, the earliest time its stamp proves ({ev.what}): {refusal}; "
        f"git verify-{signed.kind} checks it at the {date} date, {iso(signed.date)}, which its "
        "signer wrote"))


def check_objects(args: argparse.Namespace, repo: Path, targets: list[str], exclude: list[str],
                  signers: Signers) -> tuple[list[Verdict], list[str]]:
    """The verdict of every target, and notes for standard error."""
    fmt = object_format(repo)
    objects = read_objects(repo, targets)
    log = LogContext.of(args, repo)
    verdicts: dict[str, Verdict] = {}
    signed: dict[str, Signed] = {}
    for t in targets:
        kind, body = objects.get(t, ("missing", b""))
        obj = signed_object(t, kind, body, fmt)
        if isinstance(obj, str):
            verdicts[t] = Verdict(t, "not signed" if obj == "not signed" else "invalid",
                                  reason=f"{kind} {t}: {obj}")
        else:
            signed[t] = obj
    evidence, why, said, broken = evidence_for(args, repo, fmt, objects, list(signed), exclude,
                                               log)
    pgp = [s for s in signed.values() if s.fmt == "openpgp"]
    identities: dict[str, Identified | str] = dict(zip(
        [s.oid for s in pgp], identify_openpgp(pgp, signers), strict=True))
    for s in signed.values():
        if s.fmt == "ssh":
            identities[s.oid] = identify_ssh(s, signers)
    ssh_jobs: list[tuple[Signed, Identified, int]] = []
    for t, s in signed.items():
        who = identities[t]
        if isinstance(who, str):
            verdicts[t] = Verdict(t, "invalid", s, reason=f"{s.name()}: {who}")
            continue
        ev = evidence.get(t)
        if t in broken:
            verdicts[t] = Verdict(t, "invalid", s, who, reason=f"{s.name()}: {broken[t]}")
            continue
        if ev is None:
            verdicts[t] = Verdict(t, "not stamped", s, who, reason=(
                f"{s.name()} is signed by {who.signer} ({who.key}), but no stamp proves when: "
                + (why.get(t) or "none of it or of a descendant in the repository "
                   "(timestamp branches, tags, notes)")
                + ("" if getattr(args, "fetch_proof", False) else
                   "; --fetch-proof asks the server")))
            continue
        verdict = _choose(s, who, ev)
        verdicts[t] = verdict
        if verdict.status == "valid" and s.fmt == "ssh":
            assert verdict.bound is not None
            ssh_jobs.append((s, who, verdict.bound.time))
    outcomes: list[Outcome] = ssh_check_many(ssh_jobs, signers) if ssh_jobs else []
    for (s, _, _), outcome in zip(ssh_jobs, outcomes, strict=True):
        v = verdicts[s.oid]
        v.said = outcome.said
        if not outcome.ok:
            v.status, v.reason = "invalid", f"{s.name()}: {outcome.reason}"
    return [verdicts[t] for t in targets], said


def report_one(v: Verdict) -> Iterator[str]:
    assert v.signed is not None and v.who is not None and v.evidence is not None
    assert v.bound is not None
    s, who, ev, bound = v.signed, v.who, v.evidence, v.bound
    yield f"valid signature: {s.name()}"
    yield f"signed by:     {who.signer} ({who.key}; {who.source}: {who.window})"
    yield f"time:          signed no later than {iso(bound.time)} ({bound.time})"
    yield f"vouched for by: {bound.by}"
    yield f"stamp:         {ev.what}"
    yield from ev.lines
    if bound is not ev.bounds[0]:
        strong = ev.bounds[0]
        yield (f"bound:         the stronger bound ({strong.label}, {iso(strong.time)}) is "
               "after the key's end: the weaker one is used")
    for note in ev.notes:
        yield f"note:          {note}"
    who_date = "committer" if s.kind == "commit" else "tagger"
    yield f"{who_date + ':':15}{iso(s.date)} ({s.ident}; the signer's own word, not relied on)"
    if v.said:
        yield f"ssh-keygen:    {v.said}"


def report_range(verdicts: Sequence[Verdict]) -> Iterator[str]:
    for v in verdicts:
        short = v.oid[:12]
        if v.status == "valid":
            assert v.who is not None and v.bound is not None
            yield (f"ok           {short}  {v.who.signer}  signed no later than "
                   f"{iso(v.bound.time)} ({v.bound.label})")
        else:
            yield f"{v.status.upper():12} {short}  {v.reason}"


def cmd_verify_signed(args: argparse.Namespace) -> int:
    """``stampd verify (COMMIT|TAG | --range A..B) --signers FILE``: 0 when every signature
    verifies at the time its stamp proves; else raise (1 invalid, 2 malformed, 3 not
    stamped)."""
    _refuse_options(args)
    repo: Path = args.repo
    signers = load_signers(args.signers)
    targets, exclude, asked = _targets(args, repo)
    verdicts, said = check_objects(args, repo, targets, exclude, signers)
    for line in said:
        print(f"note: {line}", file=sys.stderr)
    if getattr(args, "range", None) is None:
        v = verdicts[0]
        if v.status == "valid":
            print("\n".join(report_one(v)))
            return 0
        reason = v.reason or v.status
        if v.status == "not signed":
            raise Malformed(f"{reason}: nothing to check with --signers")
        if v.status == "not stamped":
            raise NotStamped(reason)
        raise Invalid(reason)
    print("\n".join(report_range(verdicts)))
    counts = {status: sum(v.status == status for v in verdicts)
              for status in ("valid", "invalid", "not signed", "not stamped")}
    summary = (f"{len(verdicts)} commit(s) of {asked}: {counts['valid']} valid, "
               f"{counts['invalid']} invalid, {counts['not signed']} not signed, "
               f"{counts['not stamped']} not stamped")
    print(f"checked:     {summary}")
    if counts["invalid"] or counts["not signed"]:
        first = next(v for v in verdicts if v.status in ("invalid", "not signed"))
        raise Invalid(f"{summary}; the first: {first.reason}")
    if counts["not stamped"]:
        first = next(v for v in verdicts if v.status == "not stamped")
        raise NotStamped(f"{summary}; the first: {first.reason}")
    return 0
