"""Proofs that a stamp is in the server's transparency log (docs/transparency.md): fetched,
stored, loaded, and checked offline against the stamp the user holds and a pinned log key.

A proof is a ``c2sp.org/tlog-proof@v1`` text (`formats.tlog.proof`) whose ``extra`` line holds
the log entry (`formats.tlog.entry.Entry`). `check_proof` accepts it only when

1. the entry in it parses and is the stamp held (kind, serial where the stamp has one, time,
   key, and digest, commit and object id, or the signed manifest's hash): the extra data is not
   authenticated by the proof, so a proof of another stamp is refused here;
2. its checkpoint's origin is the name of a trusted log key;
3. that key signed the checkpoint;
4. the inclusion proof leads from the entry's leaf hash at its index to the checkpoint's root.

Each refusal is an `Invalid` naming the check (``entry``, ``origin``, ``signature``,
``inclusion``) and, for an entry, the field. The log key is a signed-note verifier key
(``<origin>+<key id>+<base64>``), pinned like the server's key: ``stampd stamp`` fetches
``GET /tlog/vkey`` and pins it in git config as ``timestamper.<server>.tlogkey`` (the hook as
``stampd.tlogkey``).

Where proofs are kept: ``<receipt or manifest>.tlog-proof`` beside the file, and for git stamps
a note on the stamp object under ``refs/notes/stampd-tlog``.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import tempfile
import time
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path

from client.fetch import FetchError, http_request
from client.verify.errors import CannotCheck, Invalid, Malformed
from client.verify.trust import pin_name
from formats.note import Ed25519Verifier, NoteError, open_note, parse_note
from formats.tlog.checkpoint import Checkpoint
from formats.tlog.entry import Entry
from formats.tlog.errors import TlogError
from formats.tlog.merkle import leaf_hash, verify_inclusion
from formats.tlog.policy import Policy, PolicyError, Witnessed
from formats.tlog.proof import ProvenEntry, TlogProof, verify_proof

PROOF_SUFFIX = ".tlog-proof"
NOTES_REF = "refs/notes/stampd-tlog"
MAX_PROOF = 64 * 1024
MAX_VKEY = 1024
MAX_POLICY = 64 * 1024
MAX_WAIT = 60  # seconds: the most the server waits for a proof
DEFAULT_WAIT = 5  # seconds `stampd stamp` waits for its stamp's proof
HTTP_SLACK = 10.0  # seconds a request may take beyond the wait asked for


class ProofUnavailable(CannotCheck):
    """The server has no proof to give: no log (``pending`` False, ``no_log`` True), the stamp
    not covered by a checkpoint yet (``pending`` True), or unknown to it."""

    def __init__(self, message: str, *, pending: bool = False, no_log: bool = False) -> None:
        super().__init__(message)
        self.pending = pending
        self.no_log = no_log


@dataclass(frozen=True)
class Held:
    """What the user holds of a stamp, as its log entry must say it: each field that is not
    None must be the entry's; ``keys`` the fingerprints the entry's key may be (a signing
    subkey's or its primary's)."""

    what: str  # for messages: "receipt", "manifest", "tag stamp"...
    kind: str
    time: int
    keys: frozenset[str]
    serial: int | None = None
    commit: str | None = None
    object_id: str | None = None
    algorithm: str | None = None
    digest: str | None = None
    signed: str | None = None


def held_receipt(serial: int, time: int, key: str, algorithm: str, digest: str,
                 primary: str | None = None) -> Held:
    return Held("receipt", "digest", time, frozenset(k for k in (key, primary) if k),
                serial=serial, algorithm=algorithm, digest=digest)


def held_manifest(serial: int, time: int, key: str, answer: bytes,
                  primary: str | None = None) -> Held:
    """A manifest as answered: the entry names SHA-256 of its exact bytes."""
    return Held("manifest", "manifest", time, frozenset(k for k in (key, primary) if k),
                serial=serial, signed=hashlib.sha256(answer).hexdigest())


def held_git(kind: str, object_id: str, commit: str, time: int, keys: Sequence[str]) -> Held:
    """A tag stamp (``kind`` "tag") or a branch stamp ("branch" or "commit")."""
    kind = "tag" if kind == "tag" else "branch"
    return Held(f"{kind} stamp", kind, time, frozenset(keys), commit=commit,
                object_id=object_id)


# --- the log key ---------------------------------------------------------------------------------

def parse_vkey(text: str, origin: str) -> Ed25519Verifier:
    """The Ed25519 log key of a vkey line; `Malformed` naming ``origin`` otherwise."""
    try:
        return Ed25519Verifier.from_vkey(text.strip())
    except (NoteError, ValueError) as e:
        raise Malformed(f"the log key {origin} is not an Ed25519 verifier key: {e}") from None


def read_log_key(value: str) -> tuple[str, str]:
    """(vkey, where it came from) of ``--log-key``: a vkey itself, or a file holding one."""
    if "+" in value and not Path(value).exists():
        parse_vkey(value, "given")
        return value.strip(), "given with --log-key"
    try:
        text = Path(value).read_text(encoding="utf-8", errors="replace")[:MAX_VKEY]
    except OSError as e:
        raise Malformed(f"--log-key {value}: neither a verifier key nor a readable file "
                        f"({e.strerror})") from None
    line = next((x.strip() for x in text.splitlines() if x.strip()), "")
    parse_vkey(line, f"in {value}")
    return line, f"log key file {value}"


def _base(server: str) -> str:
    parts = urllib.parse.urlsplit(server)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise Malformed(f"server URL must be http:// or https://, not {server[:100]!r}")
    return server.rstrip("/")


def _get_tlog_file(server: str, path: str, limit: int, missing: str, timeout: float
                   ) -> tuple[str, bytes]:
    """(URL, body) of ``GET <server><path>``; `ProofUnavailable` with ``no_log`` for a 404
    (``<server> <missing>``), `CannotCheck` for any other failure."""
    url = _base(server) + path
    try:
        return url, http_request(url, timeout=timeout, limit=limit)
    except FetchError as e:
        if e.status == 404:
            raise ProofUnavailable(f"{server} {missing} (GET {path}: 404)",
                                   no_log=True) from None
        what = f"answered HTTP {e.status}" if e.status is not None else f"failed: {e.reason}"
        raise CannotCheck(f"GET {url} {what}") from None


def fetch_vkey(server: str, timeout: float = HTTP_SLACK) -> str:
    """The server's log key (``GET /tlog/vkey``); `ProofUnavailable` with ``no_log`` for a 404
    (a server without a transparency log), `CannotCheck` for any other failure."""
    url, body = _get_tlog_file(server, "/tlog/vkey", MAX_VKEY, "keeps no transparency log",
                               timeout)
    text = body.decode("ascii", "replace").strip()
    if len(body) > MAX_VKEY or "\n" in text:
        raise CannotCheck(f"{url} did not answer with one verifier key line")
    parse_vkey(text, f"of {url}")
    return text


def pin_variable(server: str) -> str:
    """The git config variable ``stampd stamp`` pins ``server``'s log key as, beside the
    server key's ``timestamper.<server>.keyid``."""
    return f"timestamper.{pin_name(server)}.tlogkey"


def _config(repo: Path, *args: str) -> list[str]:
    try:
        r = subprocess.run(["git", "-C", str(repo), "config", *args], capture_output=True,
                           text=True, timeout=60, check=False)
    except FileNotFoundError:
        return []
    return r.stdout.splitlines() if r.returncode == 0 else []


def pinned_log_keys(repo: Path, server: str | None) -> list[str]:
    """The log keys pinned in ``repo``'s git config (any scope) for ``server``: its
    ``timestamper.<server>.tlogkey``, and ``stampd.tlogkey`` when the hook's ``stampd.server``
    is ``server``. For ``server`` None (a git stamp names no server): every pinned log key."""
    if server is None:
        lines = _config(repo, "--get-regexp", r"^(timestamper\..*|stampd)\.tlogkey$")
        return [line.split(" ", 1)[1] for line in lines if " " in line]
    keys = _config(repo, "--get", pin_variable(server))
    hook_server = _config(repo, "--get", "stampd.server")
    if hook_server and hook_server[0].rstrip("/") == server.rstrip("/"):
        keys += _config(repo, "--get", "stampd.tlogkey")
    return keys


# --- fetching, storing, loading ------------------------------------------------------------------

def proof_url(server: str, *, serial: int | None = None, object_id: str | None = None,
              wait: int = 0) -> str:
    base = _base(server)
    url = f"{base}/v1/proofs/{serial}" if object_id is None else \
        f"{base}/v1/proofs/git/{object_id}"
    return url + (f"?wait={min(wait, MAX_WAIT)}" if wait > 0 else "")


def fetch_proof(server: str, *, serial: int | None = None, object_id: str | None = None,
                wait: int = 0) -> bytes:
    """The proof of a stamp (by ``serial``, or a git stamp by ``object_id``), the server
    waiting up to ``wait`` s for it; `ProofUnavailable` (``pending``: not covered yet) or
    `CannotCheck`."""
    wait = max(0, min(wait, MAX_WAIT))
    url = proof_url(server, serial=serial, object_id=object_id, wait=wait)
    try:
        body = http_request(url, timeout=wait + HTTP_SLACK, limit=MAX_PROOF)
    except FetchError as e:
        if e.status == 404 and e.retry_after is not None:
            raise ProofUnavailable(f"the stamp is not in a checkpoint of the log yet (GET {url}"
                                   ": 404, retry later)", pending=True) from None
        if e.status == 404:
            raise ProofUnavailable(f"no proof of this stamp at {url} (HTTP 404: no log, or "
                                   "the stamp is unknown to it)") from None
        what = f"answered HTTP {e.status}" if e.status is not None else f"failed: {e.reason}"
        raise CannotCheck(f"GET {url} {what}") from None
    if len(body) > MAX_PROOF:
        raise CannotCheck(f"{url} answered more than {MAX_PROOF} bytes")
    return body


def proof_path(target: Path) -> Path:
    """Where a receipt's or manifest's proof lies: beside it, ``<name>.tlog-proof``."""
    return target.with_name(target.name + PROOF_SUFFIX)


def write_publishable(path: Path, data: bytes) -> None:
    """Write ``path`` whole or not at all, with the mode of a new file (0666 less the umask:
    0644 as a rule): what stampd stamp and verify write is published beside the files (a
    manifest, a proof with its receipt or manifest), not kept private."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent or Path("."))
    try:
        umask = os.umask(0o022)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def load_proof_file(path: Path) -> bytes:
    try:
        data = path.read_bytes()[:MAX_PROOF + 1]
    except OSError as e:
        raise Malformed(f"cannot read the log proof {path}: {e.strerror}") from None
    if len(data) > MAX_PROOF:
        raise Malformed(f"the log proof {path} is larger than {MAX_PROOF} bytes")
    return data


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    try:
        return subprocess.run(["git", "-C", str(repo), *args], capture_output=True,
                              timeout=60, check=False)
    except FileNotFoundError:
        raise CannotCheck("git is not installed") from None


def store_proof_note(repo: Path, object_id: str, proof: bytes) -> None:
    """Keep a git stamp's proof as a note on the stamp object (``refs/notes/stampd-tlog``),
    replacing an older one."""
    with tempfile.TemporaryDirectory(prefix="stampd-tlog") as tmp:
        file = Path(tmp) / "proof"
        file.write_bytes(proof)
        r = _git(repo, "notes", f"--ref={NOTES_REF}", "add", "-f", "-F", str(file), object_id)
    if r.returncode != 0:
        detail = r.stderr.decode("utf-8", "replace").strip().splitlines()
        raise CannotCheck(f"git notes add: {detail[-1] if detail else r.returncode}")


def load_proof_note(repo: Path, object_id: str) -> bytes | None:
    """A git stamp's proof from its note, or None when it has none."""
    r = _git(repo, "notes", f"--ref={NOTES_REF}", "show", object_id)
    if r.returncode != 0:
        return None
    return r.stdout[:MAX_PROOF + 1]


# --- checking ------------------------------------------------------------------------------------

def _entry_mismatch(entry: Entry, held: Held) -> str | None:
    """The first field in which the entry is not the stamp held, as a reason; None if none."""
    if entry.kind != held.kind:
        return f"kind is {entry.kind}, not {held.kind}"
    if held.serial is not None and entry.serial != held.serial:
        return f"serial is {entry.serial}, not {held.serial}"
    if entry.time != held.time:
        return f"time is {entry.time}, not {held.time}"
    if entry.key not in held.keys:
        return f"key is {entry.key}, not {' or '.join(sorted(held.keys))}"
    for f in fields(Held):
        if f.name in ("what", "kind", "time", "keys", "serial"):
            continue
        want = getattr(held, f.name)
        if want is not None and getattr(entry, f.name) != want:
            name = f.name.replace("_id", "") if f.name != "signed" else "signed sha256"
            return f"{name} is {getattr(entry, f.name) or 'absent'}, not {want}"
    return None


def check_proof(proof: bytes, held: Held, log_keys: Sequence[str], *, source: str
                ) -> ProvenEntry:
    """(index, tree size) when ``proof`` shows that the stamp ``held`` is in the log of one of
    ``log_keys`` (vkeys); `Invalid` naming the failed check otherwise (see the module
    docstring). ``source`` names the proof in messages."""

    def refuse(check: str, detail: str) -> Invalid:
        return Invalid(f"log proof {source}: {check}: {detail}")

    try:
        parsed = TlogProof.parse(proof)
    except TlogError as e:
        raise Malformed(f"log proof {source}: not a c2sp.org/tlog-proof@v1: {e}") from None
    if parsed.extra is None:
        raise refuse("entry", "the proof carries no log entry (no extra line)")
    try:
        entry = Entry.parse(parsed.extra)
    except TlogError as e:
        raise refuse("entry", f"not a stampd log entry: {e}") from None
    mismatch = _entry_mismatch(entry, held)
    if mismatch is not None:
        raise refuse("entry", f"a proof of another stamp: its entry's {mismatch} (the "
                     f"{held.what}'s)")
    keys = {}
    for vkey in log_keys:
        known = parse_vkey(vkey, "pinned")
        keys[known.name] = known
    try:
        text = parse_note(parsed.checkpoint).text
        checkpoint = Checkpoint.parse(text)
    except (NoteError, TlogError) as e:
        raise refuse("checkpoint", str(e)) from None
    verifier = keys.get(checkpoint.origin)
    if verifier is None:
        raise refuse("origin", f"the checkpoint is of {checkpoint.origin!r}, not of the log "
                     f"key's {' or '.join(repr(k) for k in sorted(keys))}")
    try:
        opened = open_note(parsed.checkpoint, [verifier])
    except NoteError as e:
        raise refuse("signature", f"the checkpoint is not signed by the log key "
                     f"{verifier.name}+{verifier.key_id:08x} ({e})") from None
    if not any((s.name, s.key_id) == (verifier.name, verifier.key_id) for s in opened.verified):
        raise refuse("signature", "the checkpoint is not signed by the log key")
    try:
        verify_inclusion(leaf_hash(parsed.extra), parsed.index, checkpoint.size, parsed.hashes,
                         checkpoint.root)
    except TlogError as e:
        raise refuse("inclusion", f"the entry is not at index {parsed.index} of the "
                     f"checkpoint's tree of size {checkpoint.size} ({e})") from None
    try:  # the same checks, as formats.tlog.proof makes them: the final word
        return verify_proof(proof, parsed.extra, origin=verifier.name, log_keys=[verifier])
    except (TlogError, NoteError) as e:
        raise refuse("proof", str(e)) from None


def report_line(proven: ProvenEntry, origin: str) -> str:
    return (f"in the log at index {proven.leaf_index}, checkpoint of size {proven.tree_size} "
            f"({origin})")


# --- witnesses -----------------------------------------------------------------------------------

def parse_policy(data: bytes, source: str) -> Policy:
    """The c2sp tlog-policy of ``data``; `Malformed` naming ``source`` otherwise."""
    if len(data) > MAX_POLICY:
        raise Malformed(f"the policy {source} is larger than {MAX_POLICY} bytes")
    try:
        return Policy.parse(data)
    except PolicyError as e:
        raise Malformed(f"the policy {source}: {e}") from None


def read_policy(path: Path) -> Policy:
    try:
        data = path.read_bytes()[:MAX_POLICY + 1]
    except OSError as e:
        raise Malformed(f"cannot read the policy {path}: {e.strerror}") from None
    return parse_policy(data, str(path))


def fetch_policy(server: str, timeout: float = HTTP_SLACK) -> Policy:
    """The server's published policy (``GET /tlog/policy``); `ProofUnavailable` with
    ``no_log`` for a 404, `CannotCheck` for any other failure."""
    url, body = _get_tlog_file(server, "/tlog/policy", MAX_POLICY, "publishes no policy",
                               timeout)
    return parse_policy(body, f"of {url}")


def witnessed_by(proof: bytes, policy: Policy, *, source: str) -> Witnessed:
    """The witnesses of ``policy`` that cosigned the proof's checkpoint, and its quorum;
    `Invalid` when a cosignature of a known witness does not verify or the log is not the
    policy's (check the proof itself with `check_proof` first)."""
    try:
        return policy.check(TlogProof.parse(proof).checkpoint)
    except (PolicyError, TlogError, NoteError) as e:
        raise Invalid(f"log proof {source}: witnesses: {e}") from None


def witnessed_line(w: Witnessed, policy: Policy) -> str:
    """``2 of 3 witnesses (quorum: 2 of witnesses (a, b, c)), by 2026-...Z``: who cosigned
    and the earliest time by which the quorum had seen the checkpoint."""
    text = (f"{len(w.cosigned)} of {len(policy.witnesses)} witnesses "
            f"(quorum: {policy.describe()})")
    if w.quorum_time is not None:
        text += f", by {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(w.quorum_time))}"
    return text


def quorum_missing(w: Witnessed, policy: Policy) -> str:
    names = ", ".join(sorted(w.cosigned)) or "no witness"
    return f"cosigned by {names}; the policy needs {policy.describe()}"


def cosignature_count(proof: bytes, policy: Policy | None) -> int:
    """How many witnesses cosigned the proof's checkpoint: of ``policy`` (verified), else the
    signature lines beyond the first (the log's; not verified)."""
    try:
        checkpoint = TlogProof.parse(proof).checkpoint
        if policy is not None:
            return len(policy.check(checkpoint).cosigned)
        return len(parse_note(checkpoint).signatures) - 1
    except (PolicyError, TlogError, NoteError):
        return -1
