"""The key store: one directory holding the server's signing key, read-only at run time.

Layout of ``<data_dir>/keys/``::

    secret-key.asc   the OpenPGP secret key (mode 0600); only worker processes read it
    pubkey.asc       the public key, served by get-public-key-v1 and written into the log

The key is generated on first start inside a throw-away GNUPGHOME by gpg itself and exported
straight to the file, so it never passes through the HTTP process.
"""

from __future__ import annotations

import logging
import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from formats.gpglisting import Key, KeyPart, ListingError, parse_key_listing
from keystore.errors import KeysError
from keystore.gnupg import GnupgHome, GpgError, TempGnupgHome

log = logging.getLogger(__name__)


class KeyStoreError(KeysError):
    """The key store is missing, unreadable or inconsistent (a configuration error)."""


ALGO_NAMES = {1: "rsa", 17: "dsa", 19: "ecdsa", 22: "eddsa"}


@dataclass(frozen=True)
class PublicKey:
    fingerprint: str
    uid: str
    algo: int
    bits: int
    curve: str | None
    armored: str

    @property
    def algorithm(self) -> str:
        name = ALGO_NAMES.get(self.algo, str(self.algo))
        return f"{name} ({self.curve})" if self.curve else f"{name}{self.bits}"


def _gpg(home: GnupgHome, *args: str, input: bytes | None = None, pass_fd: int | None = None,
         timeout: float = 300) -> subprocess.CompletedProcess[bytes]:
    try:
        return home.gpg("--yes", *args, input=input, timeout=timeout,
                        pass_fds=(pass_fd,) if pass_fd is not None else ())
    except GpgError as e:
        raise KeyStoreError(e.message) from None


def _listed(listing: bytes) -> list[Key]:
    try:
        return parse_key_listing(listing)
    except ListingError as e:
        raise KeyStoreError(f"stampd cannot sign with this key: its {e}") from None


def _signing_key(keys: list[Key]) -> tuple[KeyPart, str]:
    """The first key or subkey of a listing that can sign (`formats.gpglisting.KeyPart.can_sign`:
    as the worker's agent chooses it), and the listing's first user id."""
    signing = next((k.signing_key for k in keys if k.signing_key is not None), None)
    uid = next((u for k in keys for u in k.uids), None)
    if signing is None or uid is None:
        raise KeyStoreError("the key store holds no signing-capable OpenPGP key with a user id")
    return signing, uid


def ensure_files(secret: Path, public: Path, need_secret: bool,
                 generate: Callable[[], None]) -> bool:
    """The key-generation rule of every key store: generate only where neither half of the
    key exists; a public key alone is kept (a host that does not sign needs no more), and a
    missing half that is needed is an error, never a reason to make a different key."""
    if secret.exists() and public.exists():
        return False
    if not secret.exists() and not public.exists():
        generate()
        return True
    if not public.exists():
        raise KeyStoreError(f"{public} is missing beside {secret}: restore it (a new key "
                            "would not match the stamps already issued)")
    if need_secret:
        raise KeyStoreError(f"{secret} is missing: this host has only the public key "
                            "(an API host runs with --no-workers); restore the secret key "
                            "to sign here")
    return False



class KeyStore:
    def __init__(self, directory: Path) -> None:
        self.dir = directory

    @property
    def secret_key_file(self) -> Path:
        return self.dir / "secret-key.asc"

    @property
    def public_key_file(self) -> Path:
        return self.dir / "pubkey.asc"

    def exists(self) -> bool:
        return self.secret_key_file.exists() and self.public_key_file.exists()

    def ensure(self, uid: str, algo: str = "ed25519", passphrase: str | None = None,
               need_secret: bool = True) -> bool:
        """Generate the key when the store holds none (a first start). True if it was
        generated now. A store holding only the public key (an API host's) is never given a
        new key: with ``need_secret`` that is a `KeyStoreError` naming the missing file."""
        return ensure_files(self.secret_key_file, self.public_key_file, need_secret,
                            lambda: self.generate(uid, algo, passphrase))

    def generate(self, uid: str, algo: str = "ed25519", passphrase: str | None = None) -> None:
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        with TempGnupgHome("stampd-g", autostart=True) as home:
            if passphrase is None:
                r = _gpg(home, "--passphrase", "", "--pinentry-mode", "loopback",
                         "--quick-gen-key", uid, algo, "sign", "never")
            else:
                r = self._with_passphrase(home, passphrase, "--quick-gen-key", uid, algo,
                                          "sign", "never")
            if r.returncode != 0:
                raise KeyStoreError(f"gpg could not generate a {algo} key: {r.stderr.decode()!r}")
            self._export(home, passphrase)
        log.info("generated a new %s signing key for %s in %s", algo, uid, self.dir)

    def import_key(self, key_file: Path, passphrase: str | None = None) -> None:
        """Take a secret key from ``key_file`` (armored or binary) into the store. Nothing is
        written unless gpg takes the key: a file that cannot be read or holds no key is a
        `KeyStoreError` of one line."""
        try:
            with open(key_file, "rb"):
                pass
        except OSError as e:
            raise KeyStoreError(f"cannot read {key_file}: {e.strerror}") from None
        with TempGnupgHome("stampd-g", autostart=True) as home:
            if passphrase is None:
                r = _gpg(home, "--import", str(key_file))
            else:
                r = self._with_passphrase(home, passphrase, "--import", str(key_file))
            if r.returncode != 0:
                why = [line.removeprefix("gpg: ") for line in r.stderr.decode(errors="replace")
                       .splitlines() if "keybox" not in line and "Total number" not in line]
                raise KeyStoreError(f"gpg could not import {key_file}: "
                                    f"{'; '.join(why) or f'exit {r.returncode}'}")
            self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            self._export(home, passphrase)

    def _with_passphrase(self, home: GnupgHome, passphrase: str, *args: str
                         ) -> subprocess.CompletedProcess[bytes]:
        rfd, wfd = os.pipe()
        try:
            os.write(wfd, passphrase.encode() + b"\n")
            os.close(wfd)
            wfd = -1
            return _gpg(home, "--pinentry-mode", "loopback", "--passphrase-fd", str(rfd),
                        *args, pass_fd=rfd)
        finally:
            os.close(rfd)
            if wfd >= 0:
                os.close(wfd)

    def _export(self, home: GnupgHome, passphrase: str | None) -> None:
        listing = _gpg(home, "--with-colons", "--fingerprint", "--list-secret-keys")
        fpr = _signing_key(_listed(listing.stdout))[0].fingerprint
        tmp_secret = self.secret_key_file.with_suffix(".tmp")
        fd = os.open(tmp_secret, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.close(fd)
        if passphrase is None:
            r = _gpg(home, "--armor", "--output", str(tmp_secret), "--export-secret-keys", fpr)
        else:
            r = self._with_passphrase(home, passphrase, "--armor", "--output", str(tmp_secret),
                                      "--export-secret-keys", fpr)
        if r.returncode != 0:
            raise KeyStoreError(f"gpg could not export the secret key: {r.stderr.decode()!r}")
        os.chmod(tmp_secret, 0o600)
        pub = _gpg(home, "--armor", "--export", fpr)
        if pub.returncode != 0 or not pub.stdout:
            raise KeyStoreError(f"gpg could not export the public key: {pub.stderr.decode()!r}")
        tmp_pub = self.public_key_file.with_suffix(".tmp")
        tmp_pub.write_bytes(pub.stdout)
        os.replace(tmp_pub, self.public_key_file)
        os.replace(tmp_secret, self.secret_key_file)

    def public_key(self) -> PublicKey:
        """Describe the public key (no secret material is read)."""
        if not self.public_key_file.exists():
            raise KeyStoreError(f"no public key at {self.public_key_file}")
        return describe_public_key(self.public_key_file.read_text())


def describe_public_key(armored: str) -> PublicKey:
    """Fingerprint, user id and algorithm of the signing key in an armored public key."""
    with TempGnupgHome("stampd-g") as home:  # showing keys needs no agent
        r = _gpg(home, "--with-colons", "--fingerprint", "--show-keys",
                 input=armored.encode("utf-8", "replace"))
    if r.returncode != 0 or not r.stdout:
        raise KeyStoreError(f"not a usable OpenPGP public key: {r.stderr.decode()[-300:]!r}")
    keys = _listed(r.stdout)
    if any(k.primary.secret for k in keys):
        raise KeyStoreError("refusing a secret key where a public key is expected")
    signing, uid = _signing_key(keys)
    return PublicKey(fingerprint=signing.fingerprint, uid=uid, algo=signing.algo,
                     bits=signing.bits, curve=signing.curve, armored=armored)
