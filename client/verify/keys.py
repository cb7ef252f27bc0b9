"""The keys ``stampd verify`` checks with: the server's OpenPGP key (a ``--key`` file, or fetched
from the server with ``get-public-key-v1``) imported into a temporary keyring, the server's
SSH keys (a ``.pub`` or allowed-signers file, or ``GET /v1/keys/allowed_signers``), and the
checks every OpenPGP or SSH signature gets with them: exactly one good signature
(`only_signature`) by a trusted key, of the class and made at the time the stamp says
(`accepted_signature`: the one acceptance check of ``stampd verify`` and ``stampd stamp``),
``ssh-keygen -Y verify`` with an allowed-signers file of one key.

Without ``--key`` the keys pinned in the repository are used, else the server's key is fetched
from the server the receipt or manifest names (`client.verify.trust`).
"""

from __future__ import annotations

import contextlib
import subprocess
import tempfile
import urllib.parse
from collections.abc import Collection, Iterator
from pathlib import Path

from client.fetch import FetchError, http_request
from client.gpg import GpgError, GpgHome, Key, SignatureStatus
from client.verify.errors import CannotCheck, Invalid, Malformed
from formats.gpgstatus import ValidSig
from formats.sshsig import KEY_TYPES as SSH_KEY_TYPES
from formats.sshsig import SshPublicKey

MAX_KEY = 256 * 1024
FETCH_TIMEOUT = 10.0
SIG_BINARY = "00"
SIG_TEXT = "01"
KEYRING_PREFIX = "stampd-v"


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


class BadSignature(Invalid):
    """gpg found no good signature, or reported a failure beside it; ``reason``: the keywords
    of what failed (BADSIG, EXPKEYSIG, REVKEYSIG, NO_PUBKEY...), or "no valid signature"."""

    def __init__(self, failed: Collection[str]) -> None:
        self.reason = ", ".join(sorted(set(failed))) or "no valid signature"
        hint = ""
        if {"NO_PUBKEY", "ERRSIG"} & set(failed):
            hint = " (signed by a key that is not the expected one?)"
        super().__init__(f"signature does not verify: {self.reason}{hint}")


def only_signature(status: SignatureStatus, ok: bool) -> ValidSig:
    """The one valid signature; raise `Invalid` for several, `BadSignature` for none or a bad
    one: gpg exits 0 with a ``VALIDSIG`` for a signature by an expired or revoked key too, and
    says so only in the status (EXPKEYSIG, REVKEYSIG)."""
    if status.newsig > 1 or len(status.valid_sigs) > 1:
        raise Invalid("more than one signature (only one is allowed)")
    if not ok or len(status.valid_sigs) != 1 or status.errors:
        raise BadSignature(status.errors)
    return status.valid_sigs[0]


SIG_CLASSES = {SIG_BINARY: "binary", SIG_TEXT: "text"}


def accepted_signature(status: SignatureStatus, ok: bool, *, keys: Collection[str],
                       origin: str, sig_class: str, made: int, stated_by: str) -> ValidSig:
    """The one signature gpg reported (``status``; ``ok``: it exited 0) when it is a stamp's:
    `only_signature`, by a key whose primary fingerprint is one of ``keys`` (the trusted keys
    from ``origin``, primary keys and subkeys), of ``sig_class`` (`SIG_BINARY`, `SIG_TEXT`),
    made in the second ``made`` that ``stated_by`` (``"the receipt"``...) gives. Raise
    `Invalid` (`BadSignature` when gpg did not find it good)."""
    sig = only_signature(status, ok)
    if sig.primary not in keys:
        raise Invalid(f"signed by {sig.primary}, which is not in the {origin}")
    if sig.sig_class != sig_class:
        raise Invalid(f"signature class {sig.sig_class} is not a {SIG_CLASSES[sig_class]} "
                      f"signature ({sig_class})")
    if sig.created != made:
        raise Invalid(f"signature made at {sig.created}, but {stated_by} says {made}")
    return sig


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


def load_keyring(home: GpgHome, key_file: Path | None, armored: bytes | None = None,
                 origin: str = "") -> str:
    """Import the ``--key`` file, else the ``armored`` keys (pinned or fetched: ``origin``
    says which); return where they came from. Raise unless the keyring then holds at least
    one key."""
    if key_file is not None:
        data = read_key_file(key_file)
        origin = f"key file {key_file}"
        if not import_keys(home, data):
            raise Malformed(f"{key_file} holds no OpenPGP public key")
        return origin
    if not armored or not import_keys(home, armored):
        raise CannotCheck(f"the key {origin} could not be imported")
    return origin


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
