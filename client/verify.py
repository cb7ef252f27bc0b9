"""``stampd verify``: check a digest receipt, or a git tag/commit stamp, with the real gpg and git.

A receipt (see `formats.receipts`) is valid when its statement parses, exactly one OpenPGP
signature verifies over exactly that statement, the signing key is the one the statement names
in ``key:`` (and, with ``--key``, a key of that file), the signature was made in the second the
statement gives as ``time:``, and -- with ``--file`` or ``--digest`` -- the digest matches.

Without ``--key`` the server's key is fetched from the ``server:`` URL of the receipt (this trusts
that server's answer; say ``--key`` for an offline check against a key you hold).

A git target (a tag or commit in ``--repo``) is checked with ``git verify-tag --raw`` or
``git verify-commit --raw`` against the ``--key`` file only. OpenPGP: the tagger/committer time
must be the signature's creation time. SSH (``-----BEGIN SSH SIGNATURE-----``): ``--key`` is a
``.pub`` or allowed-signers file, git checks with ``gpg.format=ssh`` and an allowed-signers file
of only those keys (namespace ``git``); the signature, which carries no time, covers the
tagger/committer time. A stamp signed in any other way (X.509, an OpenPGP message) is
"unsupported".

An RFC 3161 time-stamp response (``.tsr``) or bare token (a DER file: the first byte tells it
from a receipt's text) is checked offline with ``cryptography``: one SignerInfo whose signature
over the signed attributes verifies with the signer certificate (from the token, or from
``--chain`` when the request had no ``certReq``), contentType id-ct-TSTInfo, messageDigest the
hash of the TSTInfo, signingCertificateV2 naming that certificate, the certificate's critical
timeStamping EKU and validity at ``genTime``, the ``tsa`` name (if any) its subject, and -- with
``--data``/``--file`` or ``--digest`` -- the imprint. With ``--chain`` the certificate must chain
(each link's signature checked) to a certificate of that file, all of which are trusted, as
``openssl ts -verify -CAfile`` has it; without it the token is "cannot check". With ``--log`` (a
log clone or its URL, audited as ``stampd audit`` does) the first main commit whose
``digests.log`` holds the imprint is named, with its earliest peer stamp.

Exit status: 0 valid, 1 invalid (or could not be checked, or unsupported), 2 malformed, 3 a
valid token whose imprint is not in the ``--log`` (yet).
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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pygit2
from asn1crypto import algos, cms, core, x509
from asn1crypto import parser as asn1_parser
from asn1crypto import pem as asn1_pem

from client.audit import (
    MAIN_CHECK,
    URL,
    AuditError,
    PeerStamp,
    TargetError,
    audit,
    local_copy,
    open_repository,
)
from client.checksums import Progress, parse_line
from client.checksums import file_digest as checksum_file_digest
from client.errors import CommandError
from client.fetch import FetchError, http_request
from client.gpg import GpgError, GpgHome, Key, SignatureStatus, TempGpgHome, ValidSig
from formats.cleartext import BEGIN_SIGNED, canonical_text
from formats.manifests import ALGORITHMS as MANIFEST_ALGORITHMS
from formats.manifests import Header, MalformedManifest, check_lines, parse_header
from formats.receipts import (
    ALGORITHMS,
    BEGIN_SIG,
    END_SIG,
    SSH_BEGIN,
    SSH_END,
    MalformedReceipt,
    Statement,
    parse_statement,
    split_receipt,
)
from formats.sshsig import KEY_TYPES as SSH_KEY_TYPES
from formats.sshsig import SshPublicKey
from formats.tsp import (
    HASH_ALGORITHMS,
    TimeStampResp,
    TokenFields,
    TspError,
    load_certificate,
    parse_token,
)

if TYPE_CHECKING:  # imported where used: cryptography is needed for RFC 3161 tokens only
    from cryptography.hazmat.primitives import hashes

MAX_RECEIPT = 64 * 1024
MAX_KEY = 256 * 1024
FETCH_TIMEOUT = 10.0
SIG_BINARY = "00"
SIG_TEXT = "01"
KEYRING_PREFIX = "stampd-v"
# The SSH signature namespace of digest receipts and manifests (git objects: "git"); the
# workers sign in it (workers.keys.keyset.RECEIPT_NAMESPACE).
RECEIPT_NAMESPACE = "stampd"


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


class Unsupported(CannotCheck):
    """Well-formed, but signed in a way stampd verify cannot check (an X.509 signature, an
    OpenPGP message): not shown valid, exit status 1."""

    kind = "unsupported"


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


def import_keys(home: GpgHome, armored: bytes) -> list[Key]:
    """Import public keys; return what the keyring holds afterwards."""
    home.import_keys(armored)
    return home.list_keys()


def only_signature(status: SignatureStatus, ok: bool) -> ValidSig:
    """The one valid signature; raise `Invalid` for none, a bad one, or several."""
    if status.newsig > 1 or len(status.valid_sigs) > 1:
        raise Invalid("more than one signature (only one is allowed)")
    if not ok or len(status.valid_sigs) != 1 or status.errors:
        reason = ", ".join(sorted(set(status.errors))) or "no valid signature"
        if "NO_PUBKEY" in status.errors or "ERRSIG" in status.errors:
            reason += " (signed by a key that is not the expected one?)"
        raise Invalid(f"signature does not verify: {reason}")
    return status.valid_sigs[0]


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


def read_key_file(path: Path) -> bytes:
    """A ``--key`` file's bytes (at most `MAX_KEY` + 1 of them); `Malformed` if unreadable."""
    try:
        return path.read_bytes()[:MAX_KEY + 1]
    except OSError as e:
        raise Malformed(f"cannot read key file {path}: {e.strerror}") from None


def load_keyring(home: GpgHome, key_file: Path | None, server: str | None) -> str:
    """Import the ``--key`` file (or the key fetched from ``server``); return where it came
    from. Raise unless the keyring then holds at least one key."""
    if key_file is not None:
        data = read_key_file(key_file)
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
    return receipt_text(read_target(target, MAX_RECEIPT))


def receipt_text(data: bytes) -> str:
    """``data`` as a receipt's text: at most `MAX_RECEIPT` bytes of printable ASCII."""
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
    with gpg_checks(), TempGpgHome(KEYRING_PREFIX) as home:
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


# The lines that start a signature block git knows (gpg-interface.c), and the formats
# `stampd verify` checks.
SIGNATURE_STARTS = {
    "-----BEGIN PGP SIGNATURE-----": "openpgp",
    "-----BEGIN PGP MESSAGE-----": None,
    "-----BEGIN SIGNED MESSAGE-----": None,  # X.509 (gpgsm)
    "-----BEGIN SSH SIGNATURE-----": "ssh",
}


def _signature_format(first_line: str, kind: str) -> str:
    """"openpgp" or "ssh" for a signature block starting with ``first_line``; `Unsupported`
    for any other."""
    fmt = SIGNATURE_STARTS.get(first_line)
    if fmt is None:
        what = first_line.strip("-").removeprefix("BEGIN ").lower() or "an unknown signature"
        raise Unsupported(f"the {kind} is signed in a format stampd verify cannot check "
                          f"({what}); only OpenPGP and SSH stamps can be checked")
    return fmt


@dataclass(frozen=True)
class GitObject:
    stamped: str  # the commit the stamp is about
    signer: str
    time: int
    signature: str  # "openpgp" or "ssh"


def describe_git_object(kind: str, body: str) -> GitObject:
    """What a tag or commit stamp says; `Malformed` if unsigned, `Unsupported` if signed in
    a format other than OpenPGP or SSH."""
    headers = _headers(body)
    if kind == "tag":
        starts = [line for line in body.split("\n") if line in SIGNATURE_STARTS
                  or re.fullmatch(r"-----BEGIN [A-Z0-9 ]*SIGNATURE-----", line)]
        if not starts:
            raise Malformed("the tag carries no signature: not a stamp")
        if len(starts) > 1:
            raise Invalid("more than one signature (only one is allowed)")
        fmt = _signature_format(starts[0], kind)
        stamped = next((h[7:] for h in headers if h.startswith("object ")), "")
        ident = next((h for h in headers if h.startswith("tagger ")), None)
    else:
        sig_headers = [h for h in headers if h.startswith(("gpgsig ", "gpgsig-sha256 "))]
        if not sig_headers:
            raise Malformed("the commit carries no signature: not a stamp")
        if len(sig_headers) > 1:
            raise Invalid("more than one signature (only one is allowed)")
        fmt = _signature_format(sig_headers[0].split(" ", 1)[1], kind)
        parents = [h[7:] for h in headers if h.startswith("parent ")]
        stamped = parents[-1] if parents else ""
        ident = next((h for h in headers if h.startswith("committer ")), None)
    if ident is None:
        raise Malformed(f"the {kind} has no {'tagger' if kind == 'tag' else 'committer'} line")
    signer, t = _identity(ident)
    return GitObject(stamped=stamped, signer=signer, time=t, signature=fmt)


_GOOD_SSH = re.compile(r'Good "git" signature for \S+ with \S+ key (SHA256:[A-Za-z0-9+/=]+)')


def verify_git_ssh(repo: Path, oid: str, kind: str, obj: GitObject, key_file: Path
                   ) -> tuple[ValidSig, str]:
    """An SSH-signed tag or commit: ``git verify-tag|verify-commit`` with ``gpg.format=ssh``
    and an allowed-signers file holding only the SSH keys of ``key_file`` (namespace git).
    An SSH signature carries no time: the tagger/committer time, which it covers, is the
    stamp's."""
    try:
        text = key_file.read_text(encoding="ascii", errors="replace")[:MAX_KEY + 1]
    except OSError as e:
        raise Malformed(f"cannot read key file {key_file}: {e.strerror}") from None
    keys = ssh_keys_from(text)
    if not keys:
        raise Malformed(f"the {kind} is SSH-signed, and {key_file} holds no SSH public key "
                        "(give the server's allowed-signers line, GET /v1/keys/allowed_signers, "
                        "or its .pub)")
    with tempfile.TemporaryDirectory(prefix=KEYRING_PREFIX) as tmp:
        signers = Path(tmp) / "allowed_signers"
        signers.write_text("".join(f'stamp-{i}@stampd namespaces="git" '
                                   f"{k.to_line(comment=False)}\n"
                                   for i, k in enumerate(keys)), encoding="ascii")
        r = _git(repo, "-c", "gpg.format=ssh", "-c", f"gpg.ssh.allowedSignersFile={signers}",
                 "verify-tag" if kind == "tag" else "verify-commit", "--raw", oid)
    output = r.stdout + r.stderr
    if "ssh-keygen" in output and "No such file" in output:
        raise CannotCheck("ssh-keygen is not installed (OpenSSH 8.2 or later)")
    good = _GOOD_SSH.findall(output)
    if r.returncode != 0 or len(good) != 1:
        detail = output.strip().splitlines()
        raise Invalid("the SSH signature does not verify with a key of "
                      f"{key_file}: {detail[-1][:200] if detail else r.returncode}")
    fingerprint = good[0]
    if fingerprint not in {k.fingerprint for k in keys}:
        raise Invalid(f"signed by {fingerprint}, which is not in the key file {key_file}")
    sig = ValidSig(fingerprint=fingerprint, created=obj.time, sig_class="ssh",
                   primary=fingerprint)
    return sig, f"key file {key_file}"


def verify_git(repo: Path, target: str, key_file: Path) -> GitResult:
    """Check a tag or commit stamp with git against the key file only."""
    oid, kind = resolve_git_object(repo, target)
    body = _git(repo, "cat-file", kind, oid).stdout
    obj = describe_git_object(kind, body)
    if obj.signature == "ssh":
        sig, origin = verify_git_ssh(repo, oid, kind, obj, key_file)
    else:
        sig, origin = verify_git_openpgp(repo, oid, kind, obj, key_file)
    name = target
    if kind == "tag":
        name = next((h[4:] for h in _headers(body) if h.startswith("tag ")), target)
    return GitResult(kind=kind, oid=oid, name=name, stamped=obj.stamped, signer=obj.signer,
                     time=obj.time, signature=sig, key_origin=origin)


def verify_git_openpgp(repo: Path, oid: str, kind: str, obj: GitObject, key_file: Path
                       ) -> tuple[ValidSig, str]:
    """An OpenPGP-signed tag or commit: ``git verify-tag|verify-commit --raw`` in a keyring
    holding only ``key_file``; a binary signature made in the tagger/committer second."""
    with gpg_checks(), TempGpgHome(KEYRING_PREFIX) as home:
        origin = load_keyring(home, key_file, None)
        pinned = {fpr for key in home.list_keys() for fpr in key.fingerprints}
        env = {**os.environ, "GNUPGHOME": str(home.path)}
        r = _git(repo, "-c", "gpg.format=openpgp", "-c", "gpg.program=gpg",
                 "-c", "gpg.minTrustLevel=undefined",
                 "verify-tag" if kind == "tag" else "verify-commit", "--raw", oid, env=env)
    sig = only_signature(SignatureStatus.parse(r.stderr), r.returncode == 0)
    if sig.primary not in pinned:
        raise Invalid(f"signed by {sig.primary}, which is not in the {origin}")
    if sig.sig_class != SIG_BINARY:
        raise Invalid(f"signature class {sig.sig_class} is not a binary signature (00)")
    if sig.created != obj.time:
        raise Invalid(f"signature made at {sig.created}, but the {kind} says {obj.time}")
    return sig, origin


# --------------------------------------------------------------------------- RFC 3161 tokens


class NotLogged(VerifyError):
    """The token is valid, but its imprint is in no commit of the ``--log`` (yet): exit 3.

    Not a failure of the token: a log commit publishes what was stamped during its period, so
    a token younger than the log's last commit is expected to be missing; ask again later."""

    exit_code = 3
    kind = "not in the log"


MAX_TOKEN = 1024 * 1024
MAX_CHAIN = 1024 * 1024
MAX_PATH = 8  # certificates from the TSA's up to an anchor
TOKEN_SUFFIXES = (".tsr", ".tst", ".token", ".der", ".p7s")
DER_SEQUENCE = 0x30
_OID_TAG = 0x06
# PKIStatus values with a token (RFC 3161 §2.4.2): granted, grantedWithMods.
_GRANTED = ("granted", "granted_with_mods")


@dataclass(frozen=True)
class Anchor:
    """How the signer certificate was tied to ``--chain``: the certificates from the signer's
    up (each one's signature checked with the next one's key), and the one found in
    ``--chain`` (None: not anchored)."""

    path: tuple[str, ...]  # subjects, the signer's first
    anchor: str | None


@dataclass(frozen=True)
class TokenResult:
    container: str  # "TimeStampResp" or "token"
    fields: TokenFields
    signature_algorithm: str
    signer: str  # subject of the signer certificate
    signer_sha256: str
    certificate_origin: str  # "the token" or "--chain FILE"
    anchor: Anchor | None  # None: no --chain given
    checked: str | None  # what the imprint was compared with, if anything

    @property
    def imprint(self) -> str:
        return f"{self.fields.hash_algorithm} {self.fields.digest.hex()}"


@dataclass(frozen=True)
class LogResult:
    target: str
    commit: str
    number: int | None
    time: int
    fingerprint: str | None  # the server key that signed the log
    stamp: PeerStamp | None  # the earliest peer stamp covering the commit
    problems: int  # audit failures elsewhere in the log (not about this commit or before it)


def is_token(data: bytes, target: str) -> bool:
    """Whether the bytes read from ``target`` are meant as an RFC 3161 response or token (DER
    starts with a SEQUENCE; receipts are ASCII text) rather than a receipt."""
    return (data[:1] == bytes([DER_SEQUENCE])
            or target.lower().endswith(TOKEN_SUFFIXES))


def read_target(target: str, limit: int) -> bytes:
    """At most ``limit`` + 1 bytes of a file (``-``: standard input)."""
    try:
        if target == "-":
            return sys.stdin.buffer.read(limit + 1)
        with open(target, "rb") as f:
            return f.read(limit + 1)
    except OSError as e:
        raise Malformed(f"cannot read {target}: {e.strerror}") from None


def unwrap_token(data: bytes) -> tuple[bytes, str]:
    """(the token, a ``ContentInfo``; "TimeStampResp" or "token"): a ``TimeStampResp`` (what
    ``curl`` saves from a TSA) is told from a bare token by its first element, a
    ``PKIStatusInfo`` SEQUENCE rather than the ContentInfo's OID."""
    if len(data) > MAX_TOKEN:
        raise Malformed(f"larger than {MAX_TOKEN} bytes: not a time-stamp response or token")
    try:
        _, _, _, _, contents, trailer = asn1_parser.parse(data, strict=True)
    except ValueError:
        raise Malformed("not DER: not a time-stamp response (.tsr) or token") from None
    if data[:1] != bytes([DER_SEQUENCE]) or trailer:
        raise Malformed("not a DER SEQUENCE: not a time-stamp response (.tsr) or token")
    if contents[:1] == bytes([_OID_TAG]):
        return data, "token"
    if contents[:1] != bytes([DER_SEQUENCE]):
        raise Malformed("neither a TimeStampResp nor a token (ContentInfo)")
    try:
        response = TimeStampResp.load(data, strict=True)
        status = response["status"]
        state = status["status"].native
        texts = status["status_string"].native or []
        failures = sorted(status["fail_info"].native or ())
        token = response["time_stamp_token"]
        der = None if isinstance(token, core.Void) else bytes(token.dump())
    except ValueError as e:
        raise Malformed(f"not a TimeStampResp: {e}") from None
    if state not in _GRANTED:
        why = "; ".join(texts) or "no reason given"
        fail = f" (failInfo {', '.join(failures)})" if failures else ""
        raise Malformed(f"the TSA refused the request: status {state}{fail}: {why[:200]}; "
                        "the response holds no token")
    if der is None:
        raise Malformed(f"the response has status {state} but holds no token")
    return der, "TimeStampResp"


def _hash_name(algorithm: algos.DigestAlgorithm) -> str:
    name = str(algorithm["algorithm"].native)
    if name not in HASH_ALGORITHMS and name != "sha224":
        raise Invalid(f"unsupported digest algorithm {name}")
    return name


def _crypto_hash(name: str) -> hashes.HashAlgorithm:
    from cryptography.hazmat.primitives import hashes

    known: dict[str, hashes.HashAlgorithm] = {
        "sha1": hashes.SHA1(), "sha224": hashes.SHA224(), "sha256": hashes.SHA256(),
        "sha384": hashes.SHA384(), "sha512": hashes.SHA512()}
    if name not in known:
        raise Invalid(f"unsupported hash algorithm {name}")
    return known[name]


def _require_cryptography() -> None:
    try:
        import cryptography.x509  # noqa: F401
    except ImportError:
        raise CannotCheck("checking RFC 3161 tokens needs the Python package 'cryptography' "
                          "(pip install 'cryptography>=42')") from None


def verify_signature(cert_der: bytes, signature: bytes, data: bytes,
                     algorithm: algos.SignedDigestAlgorithm, digest_name: str) -> None:
    """Check ``signature`` over ``data`` with the key of ``cert_der``; `Invalid` otherwise."""
    from cryptography import x509 as cx509
    from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
    from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, padding, rsa

    key = cx509.load_der_x509_certificate(cert_der).public_key()
    kind = algorithm.signature_algo
    try:
        hash_name = algorithm.hash_algo
    except ValueError:  # rsassa_pkcs1v15, ecdsa... without a hash in the name
        hash_name = digest_name
    try:
        if kind == "ecdsa" and isinstance(key, ec.EllipticCurvePublicKey):
            key.verify(signature, data, ec.ECDSA(_crypto_hash(hash_name)))
        elif kind == "rsassa_pkcs1v15" and isinstance(key, rsa.RSAPublicKey):
            key.verify(signature, data, padding.PKCS1v15(), _crypto_hash(hash_name))
        elif kind == "rsassa_pss" and isinstance(key, rsa.RSAPublicKey):
            params = algorithm["parameters"]
            mgf_hash = params["mask_gen_algorithm"]["parameters"]["algorithm"].native
            key.verify(signature, data,
                       padding.PSS(padding.MGF1(_crypto_hash(mgf_hash)),
                                   int(params["salt_length"].native)),
                       _crypto_hash(params["hash_algorithm"]["algorithm"].native))
        elif ((kind == "ed25519" and isinstance(key, ed25519.Ed25519PublicKey))
              or (kind == "ed448" and isinstance(key, ed448.Ed448PublicKey))):
            key.verify(signature, data)
        else:
            raise Invalid(f"signature algorithm {algorithm['algorithm'].native} does not fit "
                          f"the certificate's {type(key).__name__.removesuffix('PublicKey')} "
                          "key, or is not supported")
    except InvalidSignature:
        raise Invalid("the signature over the signed attributes does not verify with the "
                      "signer certificate's key") from None
    except (UnsupportedAlgorithm, ValueError, KeyError, TypeError) as e:
        raise Invalid(f"the signature cannot be checked: {e}") from None


_NAME_KEYS = {"common_name": "CN", "organization_name": "O", "organizational_unit_name": "OU",
              "country_name": "C", "state_or_province_name": "ST", "locality_name": "L"}


def name_text(name: x509.Name) -> str:
    """A distinguished name as ``CN=..., O=...``: the most specific part first, as RFC 4514
    writes it."""
    parts = []
    for rdn in reversed(list(name.chosen)):
        parts.append("+".join(f"{_NAME_KEYS.get(atv['type'].native, atv['type'].dotted)}="
                              f"{atv['value'].native}" for atv in rdn))
    return ", ".join(parts)


def _load_certificate(der: bytes, origin: str) -> x509.Certificate:
    try:
        return load_certificate(der)
    except TspError as e:
        raise Malformed(f"a certificate in {origin} cannot be read: {e}") from None


def read_chain(path: Path) -> list[bytes]:
    """The DER certificates of a PEM file (any number of CERTIFICATE blocks) or of one DER
    certificate."""
    try:
        data = path.read_bytes()[:MAX_CHAIN + 1]
    except OSError as e:
        raise Malformed(f"cannot read {path}: {e.strerror}") from None
    if len(data) > MAX_CHAIN:
        raise Malformed(f"{path} is larger than {MAX_CHAIN} bytes: not a certificate chain")
    ders: list[bytes] = []
    if asn1_pem.detect(data):
        try:
            ders = [der for label, _, der in asn1_pem.unarmor(data, multiple=True)
                    if label == "CERTIFICATE"]
        except ValueError as e:
            raise Malformed(f"{path}: bad PEM: {e}") from None
    elif data[:1] == bytes([DER_SEQUENCE]):
        ders = [data]
    if not ders:
        raise Malformed(f"{path} holds no certificate (PEM or DER)")
    for der in ders:
        _load_certificate(der, str(path))
    return ders


def _extension(cert: x509.Certificate, name: str) -> x509.Extension | None:
    return next((e for e in cert["tbs_certificate"]["extensions"] or ()
                 if e["extn_id"].native == name), None)


def check_tsa_certificate(cert: x509.Certificate, gen_time: datetime) -> None:
    """RFC 3161 §2.3: extendedKeyUsage id-kp-timeStamping alone, critical; a keyUsage (if
    any) that allows signatures; valid at the token's time."""
    eku = _extension(cert, "extended_key_usage")
    if eku is None:
        raise Invalid("the signer certificate has no extendedKeyUsage: not a TSA certificate "
                      "(RFC 3161 §2.3 asks for id-kp-timeStamping, critical)")
    if eku["extn_value"].native != ["time_stamping"]:
        raise Invalid(f"the signer certificate's extendedKeyUsage is "
                      f"{', '.join(eku['extn_value'].native)}, not id-kp-timeStamping alone")
    if not eku["critical"].native:
        raise Invalid("the signer certificate's extendedKeyUsage timeStamping is not critical "
                      "(RFC 3161 §2.3)")
    usage = cert.key_usage_value
    if usage is not None and not {"digital_signature", "non_repudiation"} & usage.native:
        raise Invalid("the signer certificate's keyUsage allows no signatures")
    _valid_at(cert, gen_time, "the signer certificate")


def _valid_at(cert: x509.Certificate, moment: datetime, what: str) -> None:
    validity = cert["tbs_certificate"]["validity"]
    not_before, not_after = validity["not_before"].native, validity["not_after"].native
    if not not_before <= moment <= not_after:
        raise Invalid(f"{what} ({name_text(cert.subject)}) is valid from "
                      f"{not_before:%Y-%m-%dT%H:%M:%SZ} to {not_after:%Y-%m-%dT%H:%M:%SZ}, "
                      f"not at the token's time {moment:%Y-%m-%dT%H:%M:%SZ}")


def _is_ca(cert: x509.Certificate) -> bool:
    usage = cert.key_usage_value
    return bool(cert.ca) and (usage is None or "key_cert_sign" in usage.native)


def anchor_certificate(signer: bytes, chain: Sequence[bytes], pool: Sequence[bytes],
                       gen_time: datetime) -> Anchor:
    """Tie ``signer`` to a certificate of ``chain`` (the trusted ``--chain``: like
    ``openssl -CAfile``, every certificate in it is trusted): walk up from the signer
    through issuers found in ``chain`` or ``pool`` (the token's certificates), checking each
    certificate's signature with its issuer's key, the issuer's basicConstraints cA (and
    keyCertSign) and its validity at the token's time. Anchored when a certificate of the
    path is in ``chain``. `Invalid` when a link does not verify."""
    from cryptography import x509 as cx509
    from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm

    trusted = set(chain)
    candidates = list(dict.fromkeys([*chain, *pool]))
    path: list[str] = []
    anchor: str | None = None
    current = signer
    seen: set[bytes] = set()
    while len(path) < MAX_PATH and current not in seen:
        seen.add(current)
        cert = _load_certificate(current, "the chain")
        path.append(name_text(cert.subject))
        if current in trusted and anchor is None:
            anchor = name_text(cert.subject)
        if cert.self_issued:
            issuer_der = current
        else:
            issuers = [d for d in candidates if d != current
                       and _load_certificate(d, "the chain").subject == cert.issuer]
            if not issuers:
                break
            issuer_der = issuers[0]
        issuer = _load_certificate(issuer_der, "the chain")
        try:
            cx509.load_der_x509_certificate(current).verify_directly_issued_by(
                cx509.load_der_x509_certificate(issuer_der))
        except (InvalidSignature, ValueError, TypeError, UnsupportedAlgorithm) as e:
            if issuer_der == current:
                if anchor is not None:
                    break  # a trusted certificate need not verify itself (openssl neither)
                raise Invalid(f"the self-signed certificate {name_text(cert.subject)} "
                              f"does not verify: {e or 'bad signature'}") from None
            raise Invalid(f"the certificate {name_text(cert.subject)} does not verify with "
                          f"the key of its issuer {name_text(issuer.subject)}: "
                          f"{e or 'bad signature'}") from None
        if issuer_der == current:
            break
        if not _is_ca(issuer):
            raise Invalid(f"{name_text(issuer.subject)} issued "
                          f"{name_text(cert.subject)}, but is not a CA certificate")
        _valid_at(issuer, gen_time, "the issuer certificate")
        current = issuer_der
    return Anchor(tuple(path), anchor)


def _attribute(attributes: cms.CMSAttributes, name: str) -> list[Any]:
    """The values of the signed attribute ``name``; `Invalid` if it occurs more than once."""
    found = [a for a in attributes if a["type"].native == name]
    if len(found) > 1:
        raise Invalid(f"the signed attribute {name} occurs {len(found)} times")
    return list(found[0]["values"]) if found else []


def _find_signer(sid: cms.SignerIdentifier, candidates: Sequence[bytes]) -> bytes | None:
    for der in candidates:
        cert = _load_certificate(der, "the token")
        if sid.name == "issuer_and_serial_number":
            if (cert.issuer == sid.chosen["issuer"]
                    and cert.serial_number == sid.chosen["serial_number"].native):
                return der
        elif cert.key_identifier == sid.chosen.native:
            return der
    return None


def _check_signing_certificate(attributes: cms.CMSAttributes, signer_der: bytes,
                               signer: x509.Certificate) -> None:
    """signingCertificateV2 (RFC 5816; or the older signingCertificate, SHA-1) names exactly
    the signer certificate: its first ESSCertID's hash and, if given, issuer and serial."""
    v2 = _attribute(attributes, "signing_certificate_v2")
    v1 = _attribute(attributes, "signing_certificate")
    if not v2 and not v1:
        raise Invalid("the token has no signingCertificateV2 (or signingCertificate) "
                      "attribute (RFC 3161 §2.4.1, RFC 5816)")
    ids = (v2 or v1)[0]["certs"]
    if not len(ids):
        raise Invalid("the signingCertificate attribute names no certificate")
    first = ids[0]
    hash_name = first["hash_algorithm"]["algorithm"].native if v2 else "sha1"
    if hash_name not in hashlib.algorithms_available:
        raise Invalid(f"unsupported ESSCertIDv2 hash {hash_name}")
    if first["cert_hash"].native != hashlib.new(hash_name, signer_der).digest():
        raise Invalid(f"the {hash_name} in signingCertificate{'V2' if v2 else ''} is not the "
                      "signer certificate's: the token names another certificate")
    serial = first["issuer_serial"]
    if serial.native is not None:
        names = [n.chosen for n in serial["issuer"] if n.name == "directory_name"]
        if (serial["serial_number"].native != signer.serial_number
                or (names and names[0] != signer.issuer)):
            raise Invalid("the issuerSerial in signingCertificate is not the signer "
                          "certificate's")


def _check_imprint(fields: TokenFields, file: Path | None, digest: str | None) -> str | None:
    """What the imprint was compared with (None: nothing); `Invalid` on a mismatch."""
    algorithm, imprint = fields.hash_algorithm, fields.digest.hex()
    if file is not None:
        actual = file_digest(file, algorithm)
        if actual != imprint:
            raise Invalid(f"{algorithm} of {file} is {actual}, not the token's imprint {imprint}")
        return f"file {file}"
    if digest is not None:
        value = digest.strip().lower()
        if not re.fullmatch(r"[0-9a-f]+", value):
            raise Malformed("--digest must be hex digits")
        if len(value) != len(imprint):
            raise Invalid(f"the token's imprint is {algorithm} ({len(imprint)} hex digits); "
                          f"the digest given has {len(value)}")
        if value != imprint:
            raise Invalid(f"the token is for {algorithm} {imprint}, not {value}")
        return "the given digest"
    return None


def verify_token(data: bytes, *, chain_file: Path | None = None, file: Path | None = None,
                 digest: str | None = None) -> TokenResult:
    """Check an RFC 3161 response or token offline; raise a `VerifyError` unless it is valid.
    A result whose ``anchor`` is None (no ``--chain``) or has no anchor is valid in itself,
    but not tied to a TSA the caller trusts."""
    token_der, container = unwrap_token(data)
    try:
        parsed = parse_token(token_der)
    except TspError as e:
        raise Malformed(str(e)) from None
    _require_cryptography()
    chain = read_chain(chain_file) if chain_file is not None else []
    try:
        signed = cms.ContentInfo.load(token_der)["content"]
        infos = list(signed["signer_infos"])
    except ValueError as e:
        raise Malformed(f"not a time-stamp token: {e}") from None
    if len(infos) != 1:
        raise Invalid(f"the token has {len(infos)} signatures; RFC 3161 allows only the TSA's")
    info = infos[0]
    attributes = info["signed_attrs"]
    if isinstance(attributes, core.Void) or not len(attributes):
        raise Invalid("the token has no signed attributes (RFC 3161 §2.4.2 needs them)")
    try:
        content_type = _attribute(attributes, "content_type")
        message_digest = _attribute(attributes, "message_digest")
        digest_name = _hash_name(info["digest_algorithm"])
        signature = bytes(info["signature"].native)
        signature_algorithm = info["signature_algorithm"]
        algorithm_name = str(signature_algorithm["algorithm"].native)
        # The signature covers the DER SET OF, not the [0] IMPLICIT tag the SignerInfo uses.
        to_sign = bytes([0x31]) + bytes(attributes.dump())[1:]
        sid = info["sid"]
    except (ValueError, KeyError) as e:
        raise Malformed(f"the token's SignerInfo cannot be read: {e}") from None
    if [v.native for v in content_type] != ["tst_info"]:
        raise Invalid("the contentType attribute is not id-ct-TSTInfo")
    expected = hashlib.new(digest_name, parsed.tst_info).digest()
    if [v.native for v in message_digest] != [expected]:
        raise Invalid(f"the messageDigest attribute is not the {digest_name} of the TSTInfo: "
                      "the token's content was changed after it was signed")

    signer_der = _find_signer(sid, parsed.certificates)
    origin = "the token"
    if signer_der is None:
        signer_der = _find_signer(sid, chain)
        origin = f"--chain {chain_file}"
    if signer_der is None:
        if not parsed.certificates and chain_file is None:
            raise CannotCheck("the token holds no certificate (it was requested without "
                              "certReq, `openssl ts -query` without -cert): give the TSA's "
                              "certificate with --chain tsa.pem")
        where = "the token" + (f" or {chain_file}" if chain_file is not None else "")
        raise Invalid(f"the signer certificate is not in {where}: the token was signed by "
                      "another TSA, or --chain is another TSA's")
    signer = _load_certificate(signer_der, origin)
    verify_signature(signer_der, signature, to_sign, signature_algorithm, digest_name)
    _check_signing_certificate(attributes, signer_der, signer)
    fields = parsed.fields
    check_tsa_certificate(signer, fields.gen_time)
    if fields.tsa_name is not None and fields.tsa_name != signer.subject:
        raise Invalid(f"the token names the TSA {name_text(fields.tsa_name)}, but was "
                      f"signed by {name_text(signer.subject)}")
    anchor = None
    if chain_file is not None:
        anchor = anchor_certificate(signer_der, chain, parsed.certificates, fields.gen_time)
        if anchor.anchor is None:
            raise Invalid(f"the signer certificate ({name_text(signer.subject)}) does not "
                          f"chain to a certificate in {chain_file}: the token is another "
                          "TSA's, or --chain is")
    checked = _check_imprint(fields, file, digest)
    return TokenResult(
        container=container, fields=fields, signature_algorithm=algorithm_name,
        signer=name_text(signer.subject),
        signer_sha256=hashlib.sha256(signer_der).hexdigest(), certificate_origin=origin,
        anchor=anchor, checked=checked)


def _digests_contain(repo: pygit2.Repository, commit: str, line: bytes) -> bool:
    obj = repo[commit]
    assert isinstance(obj, pygit2.Commit)
    try:
        blob = repo[obj.tree["digests.log"].id]
    except KeyError:
        return False
    if not isinstance(blob, pygit2.Blob):
        return False
    data = blob.data
    return data.startswith(line + b"\n") or b"\n" + line + b"\n" in data


def find_in_log(target: str, algorithm: str, digest: str) -> LogResult | None:
    """The first main commit of the log ``target`` (a clone or its URL, as for `stampd audit`)
    whose ``digests.log`` holds ``<algorithm> <digest>``; None if none does.

    The log is audited as `stampd audit` does (every main commit signed by the log's key,
    peer stamps verified); a failure about the commit found or any main commit before it
    makes the publication unproven (`Invalid`); failures elsewhere are only counted."""
    line = f"{algorithm} {digest}".encode()
    try:
        with local_copy(target) as path:
            report = audit(path, target=target)
            repo = open_repository(path)
            index = next((i for i, e in enumerate(report.log)
                          if _digests_contain(repo, e.commit, line)), None)
    except TargetError as e:
        if URL.match(target):
            raise CannotCheck(f"the log: {e.message}") from None
        raise Malformed(f"--log: {e.message}") from None
    except AuditError as e:
        raise CannotCheck(f"the log {target}: {e.message}") from None
    if index is None:
        if report.failures:
            print(f"note: the log has {len(report.failures)} problem(s); run `stampd audit "
                  f"{target}`", file=sys.stderr)
        head = report.log[-1] if report.log else None
        newest = (f"its newest commit {head.commit[:12]} was made at {iso(head.time)}"
                  if head else "it has no commits")
        raise NotLogged(f"{algorithm} {digest} is in no digests.log of {target} ({newest}); "
                        "a token reaches the log with the next log commit: fetch the log "
                        "again later")
    entry = report.log[index]
    before = {e.commit for e in report.log[:index + 1]}
    bad = [f for f in report.failures
           if f.commit == entry.commit or (f.check == MAIN_CHECK and f.commit in before)]
    if bad:
        raise Invalid(f"log commit {entry.commit} holds the imprint, but the log does not "
                      f"verify up to it: {bad[0]}" + (f" (and {len(bad) - 1} more)"
                                                      if len(bad) > 1 else ""))
    return LogResult(target=target, commit=entry.commit, number=entry.number, time=entry.time,
                     fingerprint=report.fingerprint, stamp=entry.stamp,
                     problems=len(report.failures))


# --------------------------------------------------------------------------- manifests


MAX_MANIFEST = 257 * 1024 * 1024  # the server's largest body (256 MiB), its header, signature
MANIFEST_MAGIC = "# stampd manifest v"
_SSH_KEY_NAMESPACE = RECEIPT_NAMESPACE  # manifests are signed in the receipts' namespace


@dataclass(frozen=True)
class SignedManifest:
    """A manifest answer taken apart: its header, the signed text (header and lines, LF line
    ends, a final LF), the lines (after the header), the armored signature, its format."""

    header: Header
    text: str
    lines: str
    signature: str
    format: str  # "openpgp" or "ssh"

    @property
    def body_lines(self) -> list[str]:
        return self.lines[:-1].split("\n")


def is_manifest(data: bytes) -> bool:
    """Whether ``data`` (at least its first few hundred bytes) is a stampd manifest answer."""
    head = data[:200].replace(b"\r\n", b"\n")
    if head.startswith(BEGIN_SIGNED.encode() + b"\n"):
        head = head.partition(b"\n\n")[2]
    return head.startswith(MANIFEST_MAGIC.encode())


def _split_cleartext(text: str) -> tuple[str, str]:
    """(signed text with a final LF, armored signature) of an OpenPGP cleartext message."""
    head, sep, rest = text[len(BEGIN_SIGNED) + 1:].partition("\n\n")
    if not sep or not all(h.startswith("Hash: ") for h in head.split("\n")):
        raise Malformed("bad armor headers in the cleartext-signed manifest")
    body, sep, sig = rest.partition("\n-----BEGIN ")
    if not sep:
        raise Malformed("the cleartext-signed manifest has no signature block")
    sig = "-----BEGIN " + sig
    first = sig.split("\n", 1)[0]
    if first != BEGIN_SIG:
        raise Unsupported(f"the manifest's signature is {first.strip('-')[6:].lower()!r}; "
                          "only OpenPGP and SSH signatures can be checked")
    if not sig.rstrip("\n").endswith(END_SIG) or sig.count("-----BEGIN ") != 1 \
            or BEGIN_SIGNED in body:
        raise Invalid("more than one signed message or signature (only one is allowed)")
    if body.startswith("- ") or "\n- " in body:
        body = "\n".join(line[2:] if line.startswith("- ") else line
                         for line in body.split("\n"))
    return body + "\n", sig


def parse_manifest(data: bytes) -> SignedManifest:
    """The parts of a signed manifest (docs/manifests.md); `Malformed` if it is not one,
    `Unsupported` if it is one stampd verify cannot check (another version, algorithm or
    kind of signature). The lines are checked as the server checks them."""
    if len(data) > MAX_MANIFEST:
        raise Malformed(f"larger than {MAX_MANIFEST} bytes: not a manifest")
    try:
        text = data.decode("utf-8").replace("\r\n", "\n")
    except UnicodeDecodeError:
        raise Malformed("not UTF-8 text: not a manifest") from None
    if text.startswith(BEGIN_SIGNED + "\n"):
        signed, signature = _split_cleartext(text)
        fmt = "openpgp"
    else:
        at = text.find("\n-----BEGIN ")
        if at < 0:
            raise Malformed("the manifest has no signature")
        signed, signature = text[:at + 1], text[at + 1:]
        first = signature.split("\n", 1)[0]
        if first != SSH_BEGIN:
            raise Unsupported(f"the manifest's signature is {first.strip('-')[6:].lower()!r}"
                              "; only OpenPGP and SSH signatures can be checked")
        if not signature.rstrip("\n").endswith(SSH_END) or signature.count("-----BEGIN ") != 1:
            raise Invalid("more than one signature (only one is allowed)")
        fmt = "ssh"
    if not signed.startswith(MANIFEST_MAGIC):
        raise Malformed("no '# stampd manifest v1' line: not a manifest")
    if not signed.startswith(MANIFEST_MAGIC + "1\n"):
        raise Unsupported(f"{signed.split(chr(10), 1)[0]!r}: only version 1 manifests can be "
                          "checked")
    second = signed.split("\n", 2)[1]
    if second.startswith("# algorithm: ") and second[13:] not in MANIFEST_ALGORITHMS:
        raise Unsupported(f"the manifest's algorithm is {second[13:][:40]!r}; only sha256 "
                          "and sha512 can be checked")
    try:
        header = parse_header(signed)
        lines = signed[len(header.text()):]
        if lines.count("\n") != header.lines:
            raise Invalid(f"the header says {header.lines} lines, but "
                          f"{lines.count(chr(10))} follow it")
        check_lines(lines, header.algorithm)
    except MalformedManifest as e:
        raise Malformed(f"not a manifest: {e}") from None
    return SignedManifest(header, signed, lines, signature, fmt)


def ssh_keygen_verify(key: SshPublicKey, namespace: str, payload: bytes, signature: str
                      ) -> tuple[bool, str]:
    """(whether ``ssh-keygen -Y verify`` accepts ``signature`` over ``payload`` by ``key`` in
    ``namespace``, its last line of output)."""
    with tempfile.TemporaryDirectory(prefix=KEYRING_PREFIX) as tmp:
        signers, sig = Path(tmp) / "allowed_signers", Path(tmp) / "payload.sig"
        signers.write_text(f'signer@stampd namespaces="{namespace}" '
                           f"{key.to_line(comment=False)}\n", encoding="ascii")
        sig.write_text(signature, encoding="ascii")
        try:
            r = subprocess.run(["ssh-keygen", "-Y", "verify", "-n", namespace, "-f",
                                str(signers), "-I", "signer@stampd", "-s", str(sig)],
                               input=payload, capture_output=True, timeout=300, check=False)
        except FileNotFoundError:
            raise CannotCheck("ssh-keygen is not installed (OpenSSH 8.2 or later)") from None
    detail = r.stderr.decode("utf-8", "replace").strip().splitlines()
    return r.returncode == 0, detail[-1] if detail else str(r.returncode)


def verify_manifest_signature(manifest: SignedManifest, *, openpgp: bytes | None = None,
                              ssh: Sequence[SshPublicKey] = (), origin: str) -> str:
    """The fingerprint of the key that signed ``manifest``, a key of ``openpgp`` (armored) or
    ``ssh``: one signature over exactly the signed text, by the key the header names; an
    OpenPGP one a text signature (01) made in the header's second. Raise `Invalid`."""
    h = manifest.header
    if manifest.format == "ssh":
        key = next((k for k in ssh if k.fingerprint == h.key), None)
        if key is None:
            raise Invalid(f"the manifest names key {h.key}, which is not in the {origin}")
        ok, detail = ssh_keygen_verify(key, _SSH_KEY_NAMESPACE, manifest.text.encode("utf-8"),
                                       manifest.signature)
        if not ok:
            raise Invalid(f"the SSH signature does not verify with the {origin}: {detail}")
        return key.fingerprint
    if openpgp is None:
        raise Invalid(f"the manifest is OpenPGP-signed, and the {origin} holds no OpenPGP key")
    with gpg_checks(), TempGpgHome(KEYRING_PREFIX) as home:
        if not import_keys(home, openpgp):
            raise Invalid(f"the {origin} holds no OpenPGP public key")
        pinned = {fpr for key in home.list_keys() for fpr in key.fingerprints}
        ok, status = home.verify_detached(canonical_text(manifest.text), manifest.signature)
    sig = only_signature(status, ok)
    if sig.primary not in pinned:
        raise Invalid(f"signed by {sig.primary}, which is not in the {origin}")
    if h.key not in (sig.fingerprint, sig.primary):
        raise Invalid(f"signed by {sig.fingerprint}, but the manifest names key {h.key}")
    if sig.sig_class != SIG_TEXT:
        raise Invalid(f"signature class {sig.sig_class} is not a text signature (01)")
    if sig.created != h.time:
        raise Invalid(f"signature made at {sig.created}, but the manifest says {h.time}")
    return sig.primary


@dataclass(frozen=True)
class FilesChecked:
    directory: Path
    checked: int
    changed: list[str]
    missing: list[str]
    unchecked: list[str]  # lines that name no file inside the directory

    @property
    def ok(self) -> bool:
        return not (self.changed or self.missing or self.unchecked)


def check_files(manifest: SignedManifest, directory: Path) -> FilesChecked:
    """Hash every file the manifest names, relative to ``directory`` (a progress line on a
    terminal); what is changed, missing, or cannot be checked (no name, a name leading
    outside the directory)."""
    entries = []
    unchecked = []
    for n, line in enumerate(manifest.body_lines, 1):
        digest, name = parse_line(line)
        parts = name.split("/") if name is not None else []
        if name is None or name.startswith("/") or ".." in parts:
            unchecked.append(name if name is not None else f"line {n} (no name)")
        else:
            entries.append((name, digest))
    changed, missing = [], []
    progress = Progress("checking", len(entries))
    try:
        for i, (name, digest) in enumerate(entries):
            try:
                actual = checksum_file_digest(directory / name, manifest.header.algorithm)
            except OSError:
                missing.append(name)
            else:
                if actual != digest:
                    changed.append(name)
            progress.update(i + 1)
    finally:
        progress.close()
    return FilesChecked(directory, len(entries), changed, missing, unchecked)


def _digest_in_manifest(manifest: SignedManifest, file: Path | None, digest: str | None
                        ) -> str | None:
    if file is not None:
        value, what = file_digest(file, manifest.header.algorithm), f"file {file}"
    elif digest is not None:
        value, what = normalise_digest(digest), "the given digest"
    else:
        return None
    for n, line in enumerate(manifest.body_lines, 1):
        found, name = parse_line(line)
        if found == value:
            return f"{what}: line {n}" + (f" ({name})" if name is not None else "")
    raise Invalid(f"{manifest.header.algorithm} {value} ({what}) is not in the manifest")


@dataclass(frozen=True)
class ManifestResult:
    manifest: SignedManifest
    signer: str
    key_origin: str
    matched: str | None  # --file/--digest: the line found
    files: FilesChecked | None


def verify_manifest(data: bytes, *, key_file: Path | None = None,
                    directory: Path | None = None, file: Path | None = None,
                    digest: str | None = None) -> ManifestResult:
    """Check a signed manifest (and with ``directory`` the files it names); raise a
    `VerifyError` unless the manifest is valid. The files' result is returned, not raised."""
    manifest = parse_manifest(data)
    h = manifest.header
    openpgp: bytes | None = None
    ssh: list[SshPublicKey] = []
    if key_file is not None:
        raw = read_key_file(key_file)
        origin = f"key file {key_file}"
        if b"-----BEGIN PGP PUBLIC KEY BLOCK-----" in raw:
            openpgp = raw
        ssh = ssh_keys_from(raw.decode("ascii", "replace"))
    elif manifest.format == "ssh":
        ssh = ssh_keys_from(fetch_allowed_signers(h.server))
        origin = f"fetched from {h.server.rstrip('/')}/v1/keys/allowed_signers"
    else:
        openpgp = fetch_public_key(h.server)
        origin = f"fetched from {public_key_url(h.server)}"
    signer = verify_manifest_signature(manifest, openpgp=openpgp, ssh=ssh, origin=origin)
    matched = _digest_in_manifest(manifest, file, digest)
    files = check_files(manifest, directory) if directory is not None else None
    return ManifestResult(manifest, signer, origin, matched, files)


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
                          file=args.file, digest=args.digest)
    if args.key is None:
        print(f"note: the server key was {res.key_origin} (trusting that server); "
              "use --key KEYFILE to check against a key you hold", file=sys.stderr)
    print("\n".join(report_manifest(res)))
    f = res.files
    if f is not None and (f.changed or f.missing):
        names = [*f.changed, *f.missing]
        raise Invalid(f"{len(names)} of {f.checked} files do not match the manifest: "
                      + ", ".join(names[:5]) + (", ..." if len(names) > 5 else ""))
    if f is not None and f.unchecked:
        raise Unsupported(f"{len(f.unchecked)} line(s) name no file inside {f.directory}: "
                          "not checked")
    return 0


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


def cmd_verify(args: argparse.Namespace) -> int:
    """``stampd verify TARGET [--file F | --digest HEX] [--key KEYFILE] [--repo DIR]
    [--chain PEM] [--log LOG] [--dir DIR]``: 0 when valid; otherwise raise a `VerifyError`
    (exit status 1, 2, or 3 for a valid token not yet in the log)."""
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
        res = verify_receipt(receipt_text(data), key_file=args.key, file=args.file,
                             digest=args.digest)
        if args.key is None:
            print(f"note: the server key was {res.key_origin} (trusting that server); "
                  "use --key KEYFILE to check against a key you hold", file=sys.stderr)
        lines = report_receipt(res)
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
        if args.key is None:
            raise Malformed("a git tag or commit stamp needs --key KEYFILE (the server's "
                            "public key)")
        lines = report_git(verify_git(args.repo, args.target, args.key))
    print("\n".join(lines))
    return 0
