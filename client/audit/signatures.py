"""Keys and signatures of the log: temporary single-key keyrings (`Keyrings`) and
`verify_commit`, the real ``git verify-commit --raw`` with ``gpg`` in one of them (no agent is
started; the repository's config cannot choose the verifying program), and `verify_cleartext`
(an email timestamper's reply).

A key that is revoked or expired *now* does not make every signature it ever made a bad one
(docs/signatures.md, the rule `stampd verify --signers` applies). git fails anything but
GOODSIG, and gpg counts EXPKEYSIG and REVKEYSIG among its failures; where they are gpg's only
complaint beside a VALIDSIG, the key's state when it signed decides (`formats.gpgkeys`): valid
before its expiry or a soft revocation (superseded, no longer used), never after a hard one
(compromised, or no reason)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from client.audit.errors import AuditError, KeyFileError
from client.gpg import GpgError, SignatureStatus, TempGpgHome
from formats.gpgkeys import GpgKey, parse_key_listing
from formats.gpgstatus import ValidSig

GIT_TIMEOUT = 120.0


@dataclass(frozen=True)
class Keyring:
    """A GNUPGHOME holding exactly one public key, and that key as gpg lists it (its expiry
    and revocations; None where the listing did not name it)."""

    home: Path
    fingerprint: str
    key: GpgKey | None = None



@dataclass(frozen=True)
class SignatureCheck:
    """The outcome of `git verify-commit --raw` in one keyring."""

    valid: bool
    fingerprint: str | None  # primary key fingerprint from VALIDSIG
    created: int | None
    problem: str | None


class Keyrings:
    """Temporary single-key GNUPGHOMEs, one per distinct armored key; removed on `close`."""

    def __init__(self) -> None:
        self._homes: list[TempGpgHome] = []
        self._cache: dict[bytes, Keyring | KeyFileError] = {}

    def close(self) -> None:
        for home in self._homes:
            home.close()
        self._homes.clear()

    def __enter__(self) -> Keyrings:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def get(self, armored: bytes) -> Keyring:
        """The keyring of ``armored``; raise `KeyFileError` unless it holds exactly one key."""
        digest = hashlib.sha256(armored).digest()
        if digest not in self._cache:
            try:
                self._cache[digest] = self._create(armored)
            except KeyFileError as e:
                self._cache[digest] = e
        found = self._cache[digest]
        if isinstance(found, KeyFileError):
            raise found
        return found

    def _create(self, armored: bytes) -> Keyring:
        # No agent or dirmngr (a public keyring needs none; gpg.conf says so to the gpg that
        # git starts too); no trust database.
        try:
            home = TempGpgHome("stampd-a", conf=("trust-model always",))
            self._homes.append(home)
            if not home.import_keys(armored).ok:
                raise KeyFileError("is not an armored OpenPGP public key")
            keys = home.list_keys()
            listed = {k.primary.fingerprint: k for k in parse_key_listing(home.key_listing())}
        except GpgError as e:
            raise AuditError(e.message) from None
        if len(keys) != 1:
            raise KeyFileError(f"holds {len(keys)} public keys, expected exactly one")
        return Keyring(home.path, keys[0].fingerprint, listed.get(keys[0].fingerprint))


def _gpg_problem(status: SignatureStatus, fingerprint: str) -> str:
    """A short explanation of why gpg did not accept a signature."""
    for words in status.records:
        if len(words) < 2:
            continue
        kw = words[0]
        # ERRSIG <keyid> <pkalgo> <hashalgo> <class> <time> <rc> [<fpr>]
        rc = words[6] if kw == "ERRSIG" and len(words) > 6 else None
        signer = words[7] if rc is not None and len(words) > 7 and words[7] != "-" \
            else words[1]
        if kw == "BADSIG":
            return "BAD signature (the commit was changed after it was signed)"
        if rc == "9" or kw == "NO_PUBKEY":
            return f"made by key {signer}, not by {fingerprint}"
        if kw == "EXPKEYSIG":
            return f"made by expired key {words[1]}"
        if kw == "REVKEYSIG":
            return f"made by revoked key {words[1]}"
        if kw == "EXPSIG":
            return "the signature has expired"
        if kw == "ERRSIG":
            return f"gpg cannot check the signature by {signer} (ERRSIG rc={rc})"
    return "gpg did not accept the signature"


def verify_commit(git_dir: Path, commit: str, keyring: Keyring) -> SignatureCheck:
    """`git verify-commit --raw` with ``keyring`` as GNUPGHOME; parse gpg's status lines."""
    env = {**os.environ, "GNUPGHOME": str(keyring.home), "LC_ALL": "C"}
    r = subprocess.run(
        ["git", "-c", "gpg.program=gpg", "-c", "gpg.openpgp.program=gpg",
         "--git-dir", str(git_dir), "verify-commit", "--raw", commit],
        capture_output=True, env=env, timeout=GIT_TIMEOUT, check=False,
    )
    status = SignatureStatus.parse(r.stderr.decode("utf-8", "replace"))
    # (git exits 1 for a good signature by a key that has ended since: judged below)
    ended = r.returncode != 0 and status.only_key_ended
    if (r.returncode != 0 and not ended) or not status.validsig:
        return SignatureCheck(False, None, None, _gpg_problem(status, keyring.fingerprint))
    good = status.validsig if ended else status.goodsig  # (no GOODSIG beside REVKEYSIG...)
    if status.validsig != 1 or good != 1:
        return SignatureCheck(False, None, None, f"holds {max(status.validsig, good)} "
                              "signatures, expected one")
    if not status.valid_sigs:  # a VALIDSIG line gpg would not write
        return SignatureCheck(False, None, None, "gpg's VALIDSIG status line is malformed")
    sig = status.valid_sigs[0]
    if ended and (refusal := _ended_then(status, sig, keyring)) is not None:
        return SignatureCheck(False, None, None, refusal)
    return SignatureCheck(True, sig.primary, sig.created, None)


def _ended_then(status: SignatureStatus, sig: ValidSig, keyring: Keyring) -> str | None:
    """Why ``sig``, good but by a key that has ended by now (`formats.gpgstatus.KEY_ENDED`),
    was not made while the key was valid (None: it was)."""
    refusal = "the key's listing is missing" if keyring.key is None \
        else keyring.key.refusal_at(sig.fingerprint, sig.created)
    return None if refusal is None else f"{_gpg_problem(status, keyring.fingerprint)}: {refusal}"



@dataclass(frozen=True)
class ClearCheck:
    """The outcome of ``gpg --verify`` of a clear-signed message in one keyring."""

    valid: bool
    fingerprint: str | None  # primary key fingerprint from VALIDSIG
    created: int | None
    text: str  # the signed text as gpg reads it (dash-escaping undone, LF line ends)
    problem: str | None


def verify_cleartext(block: bytes, keyring: Keyring) -> ClearCheck:
    """Verify a clear-signed message with the real gpg in ``keyring`` (its one key): exactly
    one good signature."""
    fd, name = tempfile.mkstemp(suffix=".txt", dir=keyring.home)
    os.close(fd)
    try:
        r = subprocess.run(["gpg", "--homedir", str(keyring.home), "--batch", "--no-tty",
                            "--no-autostart", "--status-fd", "1", "--trust-model", "always",
                            "--yes", "--output", name, "--decrypt", "-"], input=block,
                           capture_output=True, timeout=GIT_TIMEOUT, check=False)
        text = Path(name).read_bytes().decode("utf-8", "replace").replace("\r\n", "\n")
    except FileNotFoundError:
        raise AuditError("gpg is not installed") from None
    except subprocess.TimeoutExpired:
        raise AuditError("gpg did not finish in time") from None
    finally:
        os.unlink(name)
    status = SignatureStatus.parse(r.stdout.decode("utf-8", "replace"))
    sigs = status.valid_sigs
    ended = status.only_key_ended
    if r.returncode != 0 or len(sigs) != 1 or status.newsig > 1 or (status.errors and not ended):
        return ClearCheck(False, None, None, text, _gpg_problem(status, keyring.fingerprint)
                          if status.errors or not sigs else "more than one signature")
    if ended and (refusal := _ended_then(status, sigs[0], keyring)) is not None:
        return ClearCheck(False, None, None, text, refusal)
    return ClearCheck(True, sigs[0].primary, sigs[0].created, text, None)
