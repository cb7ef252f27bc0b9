"""``stampd verify``: check a digest receipt, or a git tag/commit stamp, with the real gpg and git.

A receipt (see `workers.formats.receipts`) is valid when its statement parses, exactly one OpenPGP
signature verifies over exactly that statement, the signing key is the one the statement names
in ``key:`` (and, with ``--key``, a key of that file), the signature was made in the second the
statement gives as ``time:``, and -- with ``--file`` or ``--digest`` -- the digest matches.

Without ``--key`` the server's key is fetched from the ``server:`` URL of the receipt (this trusts
that server's answer; say ``--key`` for an offline check against a key you hold).

A git target (a tag or commit in ``--repo``) is checked with ``git verify-tag --raw`` or
``git verify-commit --raw`` against the ``--key`` file only, and the tagger/committer time must be
the signature's creation time.

Exit status: 0 valid, 1 invalid (or could not be checked), 2 malformed.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from client.errors import CommandError
from client.fetch import FetchError, http_request
from workers.formats.cleartext import canonical_text
from workers.formats.receipts import (
    ALGORITHMS,
    SSH_BEGIN,
    MalformedReceipt,
    Statement,
    parse_statement,
    split_receipt,
)
from workers.formats.sshsig import KEY_TYPES as SSH_KEY_TYPES
from workers.formats.sshsig import SshPublicKey
from workers.keys.gnupg import GnupgHome, GpgError, GpgStatus, Key, TempGnupgHome, ValidSig
from workers.keys.keyset import RECEIPT_NAMESPACE

MAX_RECEIPT = 64 * 1024
MAX_KEY = 256 * 1024
FETCH_TIMEOUT = 10.0
SIG_BINARY = "00"
SIG_TEXT = "01"
KEYRING_PREFIX = "stampd-v"


class VerifyError(CommandError):
    """A target did not verify: ``stampd verify: <kind>: <message>``, exit status 1 (2 for
    `Malformed`)."""

    exit_code = 1
    kind = "invalid"


class Invalid(VerifyError):
    """Well-formed, but not valid: bad signature, wrong key, wrong time, digest mismatch."""


class CannotCheck(VerifyError):
    """The check could not be made (key not obtainable, gpg missing): not shown valid."""

    kind = "cannot check"


class Malformed(VerifyError):
    """Not a receipt or stamp of a known format, or an unusable argument."""

    exit_code = 2
    kind = "malformed"


# --------------------------------------------------------------------------- gpg


@contextlib.contextmanager
def gpg_checks() -> Iterator[None]:
    """Inside: gpg that cannot be run at all means the check cannot be made."""
    try:
        yield
    except GpgError as e:
        raise CannotCheck(e.message) from None


def import_keys(home: GnupgHome, armored: bytes) -> list[Key]:
    """Import public keys; return what the keyring holds afterwards."""
    home.import_keys(armored)
    return home.list_keys()


def only_signature(status: GpgStatus, ok: bool) -> ValidSig:
    """The one valid signature; raise `Invalid` for none, a bad one, or several."""
    if status.newsig > 1 or len(status.valid) > 1:
        raise Invalid("more than one signature (only one is allowed)")
    if not ok or len(status.valid) != 1 or status.errors:
        reason = ", ".join(sorted(set(status.errors))) or "no valid signature"
        if "NO_PUBKEY" in status.errors or "ERRSIG" in status.errors:
            reason += " (signed by a key that is not the expected one?)"
        raise Invalid(f"signature does not verify: {reason}")
    return status.valid[0]


# --------------------------------------------------------------------------- server key


def public_key_url(server: str) -> str:
    """``server`` with the query ``request=get-public-key-v1`` (http and https only)."""
    parts = urllib.parse.urlsplit(server)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise Malformed(f"server URL must be http:// or https://, not {server[:100]!r}")
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path or "/",
                                    "request=get-public-key-v1", ""))


def fetch_public_key(server: str, timeout: float = FETCH_TIMEOUT) -> bytes:
    """The armored public key a Zeitgitter server answers to ``get-public-key-v1``."""
    url = public_key_url(server)
    try:
        body = http_request(url, timeout=timeout, limit=MAX_KEY)
    except FetchError as e:
        if e.status is not None:
            raise CannotCheck(f"{url} answered HTTP {e.status}") from None
        raise CannotCheck(f"could not fetch the server key from {url}: {e.reason}") from None
    if len(body) > MAX_KEY or b"-----BEGIN PGP PUBLIC KEY BLOCK-----" not in body:
        raise CannotCheck(f"{url} did not answer with an armored public key")
    return body


def load_keyring(home: GnupgHome, key_file: Path | None, server: str | None) -> str:
    """Import the ``--key`` file (or the key fetched from ``server``); return where it came
    from. Raise unless the keyring then holds at least one key."""
    if key_file is not None:
        try:
            data = key_file.read_bytes()[:MAX_KEY + 1]
        except OSError as e:
            raise Malformed(f"cannot read key file {key_file}: {e.strerror}") from None
        origin = f"key file {key_file}"
        if not import_keys(home, data):
            raise Malformed(f"{key_file} holds no OpenPGP public key")
        return origin
    assert server is not None
    origin = f"fetched from {public_key_url(server)}"
    if not import_keys(home, fetch_public_key(server)):
        raise CannotCheck(f"the key {origin} could not be imported")
    return origin


# --------------------------------------------------------------------------- receipts


@dataclass(frozen=True)
class ReceiptResult:
    statement: Statement
    signature: ValidSig
    key_origin: str
    checked: str | None  # what the digest was compared with, if anything


def read_receipt(target: str) -> str:
    """The receipt text from a file (``-``: standard input); printable ASCII only."""
    try:
        if target == "-":
            data = sys.stdin.buffer.read(MAX_RECEIPT + 1)
        else:
            with open(target, "rb") as f:
                data = f.read(MAX_RECEIPT + 1)
    except OSError as e:
        raise Malformed(f"cannot read {target}: {e.strerror}") from None
    if len(data) > MAX_RECEIPT:
        raise Malformed(f"larger than {MAX_RECEIPT} bytes: not a receipt")
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        raise Malformed("not ASCII text: not a receipt") from None
    if any(not (" " <= c <= "~") and c not in "\r\n" for c in text):
        raise Malformed("control characters in the receipt")
    return text


def parse_receipt(text: str) -> tuple[Statement, str, str]:
    """(statement, its text, armored signature); `Malformed` if it is not a receipt."""
    try:
        statement_text, signature = split_receipt(text)
        return parse_statement(statement_text), statement_text, signature
    except MalformedReceipt as e:
        raise Malformed(str(e)) from None


def normalise_digest(digest: str) -> str:
    value = digest.strip().lower()
    if len(value) not in ALGORITHMS.values() or not re.fullmatch(r"[0-9a-f]+", value):
        raise Malformed("--digest must be 64 (sha256) or 128 (sha512) hex digits")
    return value


def file_digest(path: Path, algorithm: str) -> str:
    try:
        with open(path, "rb") as f:
            return hashlib.file_digest(f, algorithm).hexdigest()
    except OSError as e:
        raise Malformed(f"cannot read {path}: {e.strerror}") from None


def ssh_keys_from(data: str) -> list[SshPublicKey]:
    """SSH public keys in a ``.pub`` file or an allowed-signers file (options and
    principals before the key type are skipped)."""
    keys = []
    for line in data.splitlines():
        words = line.split()
        for i, word in enumerate(words):
            if word in SSH_KEY_TYPES and i + 1 < len(words):
                with contextlib.suppress(ValueError):
                    keys.append(SshPublicKey.from_line(f"{word} {words[i + 1]}"))
                break
    return keys


def fetch_allowed_signers(server: str, timeout: float = FETCH_TIMEOUT) -> str:
    parts = urllib.parse.urlsplit(server)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise Malformed(f"server URL must be http:// or https://, not {server[:100]!r}")
    url = server.rstrip("/") + "/v1/keys/allowed_signers"
    try:
        return http_request(url, timeout=timeout, limit=MAX_KEY).decode("ascii", "replace")
    except FetchError as e:
        raise CannotCheck(f"could not fetch the server's SSH keys from {url}: {e}") from None


def verify_ssh_receipt(statement: Statement, statement_text: str, signature: str,
                       key_file: Path | None) -> ReceiptResult:
    """An SSH-signed receipt: ``ssh-keygen -Y verify -n stampd`` with the key that has the
    stated fingerprint. (An SSH signature carries no time: the statement's time is the
    stamp, as with a git object's tagger time.)"""
    if key_file is not None:
        try:
            data, origin = key_file.read_text(errors="replace"), f"key file {key_file}"
        except OSError as e:
            raise Malformed(f"cannot read key file {key_file}: {e.strerror}") from None
    else:
        data = fetch_allowed_signers(statement.server)
        origin = f"fetched from {statement.server.rstrip('/')}/v1/keys/allowed_signers"
    key = next((k for k in ssh_keys_from(data) if k.fingerprint == statement.key), None)
    if key is None:
        raise Invalid(f"the receipt names key {statement.key}, which is not in the {origin}")
    with tempfile.TemporaryDirectory(prefix="stampd-v") as tmp:
        signers, sig = Path(tmp) / "allowed_signers", Path(tmp) / "receipt.sig"
        signers.write_text(f'receipt@stampd namespaces="{RECEIPT_NAMESPACE}" '
                           f"{key.to_line(comment=False)}\n")
        sig.write_text(signature)
        try:
            r = subprocess.run(["ssh-keygen", "-Y", "verify", "-n", RECEIPT_NAMESPACE, "-f",
                                str(signers), "-I", "receipt@stampd", "-s", str(sig)],
                               input=statement_text.encode(), capture_output=True, timeout=60,
                               check=False)
        except FileNotFoundError:
            raise CannotCheck("ssh-keygen is not installed (OpenSSH 8.2 or later)") from None
    if r.returncode != 0:
        raise Invalid(f"the SSH signature does not verify: {r.stderr.decode()[-200:].strip()}")
    sig_info = ValidSig(fingerprint=key.fingerprint, created=statement.time, sig_class="ssh",
                        primary=key.fingerprint)
    return ReceiptResult(statement=statement, signature=sig_info, key_origin=origin,
                         checked=None)


def verify_receipt(text: str, *, key_file: Path | None = None, file: Path | None = None,
                   digest: str | None = None) -> ReceiptResult:
    """Check a receipt completely; raise a `VerifyError` unless it is valid."""
    statement, statement_text, signature = parse_receipt(text)
    expected = normalise_digest(digest) if digest is not None else None
    if signature.startswith(SSH_BEGIN):
        res = verify_ssh_receipt(statement, statement_text, signature, key_file)
        return ReceiptResult(statement, res.signature, res.key_origin,
                             _check_digest(statement, file, expected))
    with gpg_checks(), TempGnupgHome(KEYRING_PREFIX) as home:
        origin = load_keyring(home, key_file, statement.server)
        pinned = {fpr for key in home.list_keys() for fpr in key.fingerprints}
        # Verify the detached signature over exactly the statement we parsed (in the canonical
        # form a cleartext signature covers), so what was checked is what is reported.
        ok, status = home.verify_detached(canonical_text(statement_text), signature)
    sig = only_signature(status, ok)
    if sig.fingerprint != statement.key:
        raise Invalid(f"signed by {sig.fingerprint}, but the receipt names key {statement.key}")
    if sig.primary not in pinned:
        raise Invalid(f"signed by {sig.primary}, which is not in the {origin}")
    if sig.sig_class != SIG_TEXT:
        raise Invalid(f"signature class {sig.sig_class} is not a text signature (01)")
    if sig.created != statement.time:
        raise Invalid(f"signature made at {sig.created}, but the receipt says {statement.time}")
    return ReceiptResult(statement=statement, signature=sig, key_origin=origin,
                         checked=_check_digest(statement, file, expected))


def _check_digest(statement: Statement, file: Path | None, expected: str | None) -> str | None:
    """What the receipt's digest was compared with (None: nothing); Invalid on a mismatch."""
    checked = None
    if file is not None:
        actual = file_digest(file, statement.algorithm)
        if actual != statement.digest:
            raise Invalid(f"{statement.algorithm} of {file} is {actual}, not the receipt's "
                          f"{statement.digest}")
        checked = f"file {file}"
    elif expected is not None:
        if expected != statement.digest:
            raise Invalid(f"the receipt is for {statement.digest}, not {expected}")
        checked = "the given digest"
    return checked


# --------------------------------------------------------------------------- git stamps


@dataclass(frozen=True)
class GitResult:
    kind: str  # "tag" or "commit"
    oid: str
    name: str  # tag name, or the target as given
    stamped: str  # the commit the stamp is about
    signer: str
    time: int
    signature: ValidSig
    key_origin: str


def _git(repo: Path, *args: str, env: dict[str, str] | None = None
         ) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                              timeout=60, env=env, check=False)
    except FileNotFoundError:
        raise CannotCheck("git is not installed") from None


def resolve_git_object(repo: Path, target: str) -> tuple[str, str]:
    """(object id, type) of a tag or commit named ``target`` in ``repo``."""
    if target.startswith("-"):
        raise Malformed(f"{target!r} is not a receipt file, tag or commit")
    r = _git(repo, "rev-parse", "--verify", "--quiet", f"{target}^{{object}}")
    oid = r.stdout.strip()
    if r.returncode != 0 or not oid:
        raise Malformed(f"{target!r} is neither a receipt file nor a tag or commit in {repo}")
    kind = _git(repo, "cat-file", "-t", oid).stdout.strip()
    if kind not in ("tag", "commit"):
        raise Malformed(f"{target!r} is a {kind or 'unknown object'}, not a tag or commit")
    return oid, kind


def _headers(body: str) -> list[str]:
    return body.split("\n\n", 1)[0].split("\n")


def _identity(line: str) -> tuple[str, int]:
    m = re.fullmatch(r"\S+ (.*) (\d{1,12}) [+-]\d{4}", line)
    if not m:
        raise Malformed(f"bad identity line {line[:100]!r}")
    return m.group(1), int(m.group(2))


def describe_git_object(kind: str, body: str) -> tuple[str, str, int]:
    """(stamped commit, signer, time) of a tag or commit object; `Malformed` if unsigned."""
    headers = _headers(body)
    if kind == "tag":
        signatures = body.count("\n-----BEGIN PGP SIGNATURE-----\n")
        if "\n-----BEGIN SSH SIGNATURE-----\n" in body and not signatures:
            raise Malformed("an SSH-signed tag: only OpenPGP stamps can be checked")
        if not signatures:
            raise Malformed("the tag carries no OpenPGP signature: not a stamp")
        if signatures > 1:
            raise Invalid("more than one signature (only one is allowed)")
        stamped = next((h[7:] for h in headers if h.startswith("object ")), "")
        ident = next((h for h in headers if h.startswith("tagger ")), None)
    else:
        sig_headers = [h for h in headers if h.startswith(("gpgsig ", "gpgsig-sha256 "))]
        if not sig_headers:
            raise Malformed("the commit carries no signature: not a stamp")
        if len(sig_headers) > 1:
            raise Invalid("more than one signature (only one is allowed)")
        if "-----BEGIN SSH SIGNATURE-----" in sig_headers[0]:
            raise Malformed("an SSH-signed commit: only OpenPGP stamps can be checked")
        parents = [h[7:] for h in headers if h.startswith("parent ")]
        stamped = parents[-1] if parents else ""
        ident = next((h for h in headers if h.startswith("committer ")), None)
    if ident is None:
        raise Malformed(f"the {kind} has no {'tagger' if kind == 'tag' else 'committer'} line")
    signer, t = _identity(ident)
    return stamped, signer, t


def verify_git(repo: Path, target: str, key_file: Path) -> GitResult:
    """Check a tag or commit stamp with git against the key file only."""
    oid, kind = resolve_git_object(repo, target)
    body = _git(repo, "cat-file", kind, oid).stdout
    stamped, signer, t = describe_git_object(kind, body)
    with gpg_checks(), TempGnupgHome(KEYRING_PREFIX) as home:
        origin = load_keyring(home, key_file, None)
        pinned = {fpr for key in home.list_keys() for fpr in key.fingerprints}
        env = {**os.environ, "GNUPGHOME": str(home.path)}
        r = _git(repo, "-c", "gpg.format=openpgp", "-c", "gpg.program=gpg",
                 "-c", "gpg.minTrustLevel=undefined",
                 "verify-tag" if kind == "tag" else "verify-commit", "--raw", oid, env=env)
    sig = only_signature(GpgStatus.parse(r.stderr), r.returncode == 0)
    if sig.primary not in pinned:
        raise Invalid(f"signed by {sig.primary}, which is not in the {origin}")
    if sig.sig_class != SIG_BINARY:
        raise Invalid(f"signature class {sig.sig_class} is not a binary signature (00)")
    if sig.created != t:
        raise Invalid(f"signature made at {sig.created}, but the {kind} says {t}")
    name = target
    if kind == "tag":
        name = next((h[4:] for h in _headers(body) if h.startswith("tag ")), target)
    return GitResult(kind=kind, oid=oid, name=name, stamped=stamped, signer=signer, time=t,
                     signature=sig, key_origin=origin)


# --------------------------------------------------------------------------- command


def iso(t: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


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


def cmd_verify(args: argparse.Namespace) -> int:
    """``stampd verify TARGET [--file F | --digest HEX] [--key KEYFILE] [--repo DIR]``: 0 when
    valid; otherwise raise a `VerifyError` (exit status 1 or 2)."""
    if _is_receipt_target(args.target):
        res = verify_receipt(read_receipt(args.target), key_file=args.key, file=args.file,
                             digest=args.digest)
        if args.key is None:
            print(f"note: the server key was {res.key_origin} (trusting that server); "
                  "use --key KEYFILE to check against a key you hold", file=sys.stderr)
        lines = report_receipt(res)
    else:
        if _looks_like_a_file(args.target):
            raise Malformed(f"no such file: {args.target}")
        if args.file is not None or args.digest is not None:
            raise Malformed("--file and --digest apply to receipts, not to git stamps")
        if args.key is None:
            raise Malformed("a git tag or commit stamp needs --key KEYFILE (the server's "
                            "public key)")
        lines = report_git(verify_git(args.repo, args.target, args.key))
    print("\n".join(lines))
    return 0
