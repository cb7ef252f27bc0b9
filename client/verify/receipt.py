"""Digest receipts (see `formats.receipts`), signed with OpenPGP or SSH.

A receipt is valid when its statement parses, exactly one signature verifies over exactly that
statement, the signing key is the one the statement names in ``key:`` (and, with ``--key``, a
key of that file; else a key pinned in the repository or fetched from the server it names,
`client.verify.trust`), an OpenPGP signature is a text signature made in the second the statement
gives as ``time:``, and -- with ``--file`` or ``--digest`` -- the digest matches. (An SSH
signature carries no time: the statement's time is the stamp's.)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from client.gpg import TempGpgHome
from client.verify.errors import Invalid, Malformed
from client.verify.inputs import file_digest, normalise_digest, read_target
from client.verify.keys import (
    KEYRING_PREFIX,
    SIG_TEXT,
    accepted_signature,
    gpg_checks,
    load_keyring,
    ssh_keygen_verify,
    ssh_keys_from,
)
from client.verify.trust import server_keys
from formats.cleartext import canonical_text
from formats.gpgstatus import ValidSig
from formats.receipts import (
    HEADER,
    RECEIPT_NAMESPACE,
    SSH_BEGIN,
    MalformedReceipt,
    Statement,
    parse_statement,
    split_receipt,
)

MAX_RECEIPT = 64 * 1024


@dataclass(frozen=True)
class ReceiptResult:
    statement: Statement
    signature: ValidSig
    key_origin: str
    checked: str | None  # what the digest was compared with, if anything
    fetched: bool = False  # the key was fetched from the server just now, and trusted so


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


MAX_ERROR_TEXT = 1024  # a plain-text error answer longer than this is not taken for one


def server_error(data: bytes) -> str | None:
    """What a server's error answer saved in place of a receipt is and says (``curl`` without
    ``--fail`` writes it to the file): an RFC 9457 problem (JSON with ``status`` and ``title``
    or ``detail``), or a short plain text with no signature in it; None for anything else.
    A receipt is never taken for one: it has ``-----BEGIN``."""
    text = data[:MAX_RECEIPT].decode("utf-8", errors="replace").strip()
    if not text or "-----BEGIN" in text or text.startswith(HEADER):
        return None
    if text.startswith("{"):
        try:
            problem = json.loads(text)
        except ValueError:
            return None
        if not isinstance(problem, dict) or not isinstance(problem.get("status"), int):
            return None
        if not isinstance(problem.get("title"), str) and not isinstance(problem.get("detail"),
                                                                        str):
            return None
        said = ": ".join(str(problem[k]) for k in ("title", "detail")
                         if isinstance(problem.get(k), str) and problem[k])
        return f"a server's error answer, not a receipt: HTTP {problem['status']} {said!r}"
    if len(data) > MAX_ERROR_TEXT or len(text.splitlines()) > 3:
        return None
    if any(not c.isprintable() for c in text.replace("\n", " ")):
        return None
    quoted = " ".join(text.split())
    return f"no receipt but a short text, likely a server's error answer: {quoted!r}"


def parse_receipt(text: str) -> tuple[Statement, str, str]:
    """(statement, its text, armored signature); `Malformed` if it is not a receipt."""
    try:
        statement_text, signature = split_receipt(text)
        return parse_statement(statement_text), statement_text, signature
    except MalformedReceipt as e:
        raise Malformed(str(e)) from None


def verify_ssh_receipt(statement: Statement, statement_text: str, signature: str,
                       key_file: Path | None, repo: Path = Path(".")) -> ReceiptResult:
    """An SSH-signed receipt: ``ssh-keygen -Y verify -n stampd`` with the key that has the
    stated fingerprint. (An SSH signature carries no time: the statement's time is the
    stamp, as with a git object's tagger time.)"""
    fetched = False
    if key_file is not None:
        try:
            data, origin = key_file.read_text(errors="replace"), f"key file {key_file}"
        except OSError as e:
            raise Malformed(f"cannot read key file {key_file}: {e.strerror}") from None
        keys = ssh_keys_from(data)
    else:
        trusted = server_keys("ssh", repo, statement.server)
        keys, origin, fetched = list(trusted.ssh), trusted.origin, trusted.fetched
    key = next((k for k in keys if k.fingerprint == statement.key), None)
    if key is None:
        raise Invalid(f"the receipt names key {statement.key}, which is not in the {origin}")
    ok, detail = ssh_keygen_verify(key, RECEIPT_NAMESPACE, statement_text.encode(), signature)
    if not ok:
        raise Invalid(f"the SSH signature does not verify: {detail}")
    sig_info = ValidSig(fingerprint=key.fingerprint, created=statement.time, sig_class="ssh",
                        primary=key.fingerprint)
    return ReceiptResult(statement=statement, signature=sig_info, key_origin=origin,
                         checked=None, fetched=fetched)


def verify_receipt(text: str, *, key_file: Path | None = None, file: Path | None = None,
                   digest: str | None = None, repo: Path = Path(".")) -> ReceiptResult:
    """Check a receipt completely, with the ``key_file``, else the keys pinned in ``repo`` or
    fetched from the server it names; raise a `VerifyError` unless it is valid."""
    statement, statement_text, signature = parse_receipt(text)
    expected = normalise_digest(digest) if digest is not None else None
    if signature.startswith(SSH_BEGIN):
        res = verify_ssh_receipt(statement, statement_text, signature, key_file, repo)
        return ReceiptResult(statement, res.signature, res.key_origin,
                             _check_digest(statement, file, expected), res.fetched)
    trusted = None if key_file is not None else server_keys("openpgp", repo, statement.server)
    with gpg_checks(), TempGpgHome(KEYRING_PREFIX) as home:
        origin = (load_keyring(home, key_file) if trusted is None else
                  load_keyring(home, None, trusted.openpgp, trusted.origin))
        pinned = {fpr for key in home.list_keys() for fpr in key.fingerprints}
        # Verify the detached signature over exactly the statement we parsed (in the canonical
        # form a cleartext signature covers), so what was checked is what is reported.
        ok, status = home.verify_detached(canonical_text(statement_text), signature)
    sig = accepted_signature(status, ok, keys=pinned, origin=origin, sig_class=SIG_TEXT,
                             made=statement.time, stated_by="the receipt")
    if sig.fingerprint != statement.key:
        raise Invalid(f"signed by {sig.fingerprint}, but the receipt names key {statement.key}")
    return ReceiptResult(statement=statement, signature=sig, key_origin=origin,
                         checked=_check_digest(statement, file, expected),
                         fetched=trusted is not None and trusted.fetched)


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
