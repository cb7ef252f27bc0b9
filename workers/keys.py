"""The key store: one directory holding the server's signing key, read-only at run time.

Layout of ``<data_dir>/keys/``::

    secret-key.asc   the OpenPGP secret key (mode 0600); only worker processes read it
    pubkey.asc       the public key, served by get-public-key-v1 and written into the log

The key is generated on first start inside a throw-away GNUPGHOME by gpg itself and exported
straight to the file, so it never passes through the HTTP process.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from server.errors import KeyStoreError

log = logging.getLogger(__name__)

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


@contextlib.contextmanager
def scratch_gnupghome() -> Iterator[Path]:
    """A private, short-lived GNUPGHOME whose agent (if any starts) is killed on exit."""
    home = Path(tempfile.mkdtemp(prefix="stampd-g"))
    os.chmod(home, 0o700)
    try:
        yield home
    finally:
        subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "all"],
                       capture_output=True, timeout=30, check=False)
        shutil.rmtree(home, ignore_errors=True)


def _gpg(home: Path, *args: str, input: bytes | None = None, pass_fd: int | None = None,
         timeout: float = 300) -> subprocess.CompletedProcess[bytes]:
    cmd = ["gpg", "--homedir", str(home), "--batch", "--no-tty", "--yes", *args]
    return subprocess.run(cmd, input=input, capture_output=True, timeout=timeout, check=False,
                          pass_fds=(pass_fd,) if pass_fd is not None else ())


def _parse_colons(text: str) -> tuple[str, str, int, int, str | None]:
    """(fingerprint, uid, algo, bits, curve) of the signing key in `--with-colons` output."""
    primary: list[str] | None = None
    fpr: str | None = None
    uid: str | None = None
    signing: tuple[str, int, int, str | None] | None = None
    current: list[str] | None = None
    for line in text.splitlines():
        f = line.split(":")
        if f[0] in ("pub", "sec"):
            primary = current = f
        elif f[0] in ("sub", "ssb"):
            current = f
        elif f[0] == "fpr" and current is not None:
            if current is primary and fpr is None:
                fpr = f[9]
            caps = current[11] if len(current) > 11 else ""
            if signing is None and "s" in caps:
                signing = (f[9], int(current[3]), int(current[2]),
                           (current[16] if len(current) > 16 else "") or None)
        elif f[0] == "uid" and uid is None:
            uid = f[9].replace("\\x3a", ":")
    if fpr is None or uid is None or signing is None:
        raise KeyStoreError("the key store holds no signing-capable OpenPGP key with a user id")
    return signing[0], uid, signing[1], signing[2], signing[3]


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

    def ensure(self, uid: str, algo: str = "ed25519", passphrase: str | None = None) -> bool:
        """Generate the key unless one exists. True if it was generated now."""
        if self.exists():
            return False
        self.generate(uid, algo, passphrase)
        return True

    def generate(self, uid: str, algo: str = "ed25519", passphrase: str | None = None) -> None:
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        with scratch_gnupghome() as home:
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
        """Take a secret key from ``key_file`` (armored or binary) into the store."""
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        with scratch_gnupghome() as home:
            if passphrase is None:
                r = _gpg(home, "--import", str(key_file))
            else:
                r = self._with_passphrase(home, passphrase, "--import", str(key_file))
            if r.returncode != 0:
                raise KeyStoreError(f"gpg could not import {key_file}: {r.stderr.decode()!r}")
            self._export(home, passphrase)

    def _with_passphrase(self, home: Path, passphrase: str, *args: str
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

    def _export(self, home: Path, passphrase: str | None) -> None:
        listing = _gpg(home, "--with-colons", "--fingerprint", "--list-secret-keys")
        fpr = _parse_colons(listing.stdout.decode())[0]
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
    with scratch_gnupghome() as home:
        r = _gpg(home, "--with-colons", "--fingerprint", "--show-keys",
                 input=armored.encode("utf-8", "replace"))
    if r.returncode != 0 or not r.stdout:
        raise KeyStoreError(f"not a usable OpenPGP public key: {r.stderr.decode()[-300:]!r}")
    if any(line.startswith("sec") for line in r.stdout.decode().splitlines()):
        raise KeyStoreError("refusing a secret key where a public key is expected")
    fpr, uid, algo, bits, curve = _parse_colons(r.stdout.decode())
    return PublicKey(fingerprint=fpr, uid=uid, algo=algo, bits=bits, curve=curve,
                     armored=armored)
