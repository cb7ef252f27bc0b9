"""The server's signing keys on disk: each extra key (and the log's and the witness's key) in its
own directory of the key store (``keys/<id>/``, `formats.keys.KeySpec.id`), made on first start
(`ensure_extra_keys`), found (`stored_key_specs`) and read into the public view every process
shares (`served_keys`, `formats.keys.ServedKey`); the TSA key's directory also holds its
certificate chain (`TSA_CHAIN_FILE`, written by `workers.tsa`). What the keys are and what
they may sign is the pure key model, `formats.keys`.

The key store is below the workers (``keystore``): the command line makes and lists keys with
it, the service reads the public halves it serves (`server.signing_keys`), and each worker
loads its key from it into its agent.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

from formats.keys import (
    MAIL_KEY,
    PRIMARY,
    SSH_TYPES,
    STAMPS,
    TLOG_KEY,
    WITNESS_KEY,
    KeySpec,
    ServedKey,
    spec_of,
)
from formats.sshsig import SshPublicKey, allowed_signers_line
from keystore.gnupg import GpgError, TempGnupgHome
from keystore.store import KeyStore, KeyStoreError, ensure_files

CHECK_PRINCIPAL = "key-check@stampd.invalid"  # the one signer of a start-up check's SSHSIG

TSA_CHAIN_FILE = "tsa-chain.pem"
"""The TSA's certificates in its key's directory, PEM, the TSA certificate first (written and
read by `workers.tsa`; served by the server, `server.stamping.rfc3161`)."""


class KeyUnusable(KeyStoreError):
    """A served key cannot sign: its secret key file is unreadable or corrupt, holds another key
    than its public key file, or its agent cannot sign with it. ``message`` is one line that
    names the key, its file and what to do."""

    def __init__(self, key_id: str, key_file: Path, reason: str) -> None:
        self.key_id = key_id
        self.key_file = key_file
        self.reason = " ".join(reason.split())
        if key_id == PRIMARY:
            todo = ("restore the key files from a backup (a new key would not match the stamps "
                    "already issued)")
        elif key_id == TLOG_KEY.id:
            todo = ("restore the key files from a backup (a new key would not match the log's "
                    "checkpoints already published), or set STAMPD_TLOG=off")
        elif key_id == WITNESS_KEY.id:
            todo = ("restore the key files from a backup (the logs witnessed know the old key), "
                    "or turn the witness off (STAMPD_WITNESS=off, no STAMPD_WITNESS_FOR)")
        elif key_id == MAIL_KEY.id:
            todo = ("restore the key files from a backup (the receipts already mailed name the "
                    "old key), or turn the mail listener off (no STAMPD_MAIL_LISTEN)")
        else:
            fmt, _, algo = key_id.partition("-")
            todo = (f"restore the key files from a backup, or remove {fmt}:{algo} from "
                    "STAMPD_EXTRA_KEYS")
        where = "" if str(key_file) in self.reason else f" with {key_file}"
        super().__init__(f"key {key_id} cannot sign{where}: {self.reason}; {todo}")


class SshKeyStore:
    """``<dir>/id`` (private, 0600, unencrypted: protect the file) and ``<dir>/id.pub``."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory

    @property
    def private_key_file(self) -> Path:
        return self.dir / "id"

    @property
    def public_key_file(self) -> Path:
        return self.dir / "id.pub"

    def ensure(self, algo: str, comment: str, need_secret: bool = True) -> bool:
        """Generate the key when the store holds none; see `ensure_files`."""
        return ensure_files(self.private_key_file, self.public_key_file, need_secret,
                            lambda: self._generate(algo, comment))

    def _generate(self, algo: str, comment: str) -> None:
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = self.dir / "id.tmp"
        for f in (tmp, tmp.with_suffix(".tmp.pub")):
            f.unlink(missing_ok=True)
        r = subprocess.run(["ssh-keygen", "-q", *SSH_TYPES[algo], "-N", "", "-C", comment,
                            "-f", str(tmp)], capture_output=True, timeout=120, check=False,
                           stdin=subprocess.DEVNULL)
        if r.returncode != 0:
            raise KeyStoreError(f"ssh-keygen could not make a {algo} key: {r.stderr.decode()!r}")
        os.chmod(tmp, 0o600)
        os.replace(tmp.with_suffix(".tmp.pub"), self.public_key_file)
        os.replace(tmp, self.private_key_file)

    def public_key(self) -> SshPublicKey:
        try:
            return SshPublicKey.from_line(self.public_key_file.read_text())
        except (OSError, ValueError) as e:
            raise KeyStoreError(f"cannot read {self.public_key_file}: {e}") from None

    def verify(self, message: bytes, signature: str, namespace: str) -> None:
        """Check an armored SSHSIG over ``message`` against the public key file
        (``ssh-keygen -Y verify``, OpenSSH 8.1); `KeyStoreError` saying why it does not verify."""
        line = allowed_signers_line(CHECK_PRINCIPAL, self.public_key().to_line(comment=False),
                                    namespace)
        with tempfile.TemporaryDirectory(prefix="stampd-c") as tmp:
            signers, sig = Path(tmp) / "allowed_signers", Path(tmp) / "message.sig"
            signers.write_text(line + "\n")
            sig.write_text(signature)
            try:
                r = subprocess.run(["ssh-keygen", "-Y", "verify", "-f", str(signers), "-I",
                                    CHECK_PRINCIPAL, "-n", namespace, "-s", str(sig)],
                                   input=message, capture_output=True, timeout=60, check=False)
            except (OSError, subprocess.SubprocessError) as e:
                raise KeyStoreError(f"cannot run ssh-keygen -Y verify: {e}") from None
        if r.returncode != 0:
            why = " ".join(r.stderr.decode("utf-8", "replace").split())[-300:]
            raise KeyStoreError(f"its signature does not verify with the public key "
                                f"{self.public_key_file} ({why or f'exit {r.returncode}'})")


def verify_openpgp(public_key_file: Path, message: bytes, signature: str,
                   fingerprint: str) -> None:
    """Check an armored detached OpenPGP signature over ``message``: made by the key
    ``fingerprint`` (the signing key or subkey) of ``public_key_file``, with gpg in a throw-away
    keyring that holds nothing else; `KeyStoreError` saying why it does not verify."""
    try:
        with TempGnupgHome("stampd-c") as home:
            imported = home.import_keys(public_key_file.read_bytes())
            if not imported.ok:
                raise KeyStoreError(f"cannot read the public key {public_key_file}")
            _ok, status = home.verify_detached(message, signature)
    except OSError as e:
        raise KeyStoreError(f"cannot read the public key {public_key_file}: {e}") from None
    except GpgError as e:
        raise KeyStoreError(e.message) from None
    if not any(v.fingerprint == fingerprint.upper() for v in status.valid_sigs):
        why = ", ".join(status.errors) or "no valid signature"
        raise KeyStoreError(f"its signature does not verify with the public key "
                            f"{public_key_file} ({why})")


def key_dir(keys_dir: Path, spec: KeySpec) -> Path:
    return keys_dir / spec.id


def ensure_extra_keys(keys_dir: Path, specs: list[KeySpec], uid: str,
                      passphrase: str | None, need_secret: bool = True) -> None:
    for spec in specs:
        if spec.format == "openpgp":
            KeyStore(key_dir(keys_dir, spec)).ensure(uid, spec.algo, passphrase, need_secret)
        else:
            SshKeyStore(key_dir(keys_dir, spec)).ensure(spec.algo, f"stampd {uid}",
                                                        need_secret)


def stored_key_specs(keys_dir: Path) -> list[KeySpec]:
    """The extra keys a key directory holds (``<format>-<algorithm>/`` with a public key),
    and the log key (``tlog-ed25519/``), whether or not the settings name them."""
    found: list[KeySpec] = []
    for sub in sorted(keys_dir.glob("*-*")):
        spec = spec_of(sub.name)
        fmt, algo = spec.format, spec.algo
        ssh = fmt == "ssh" and algo in SSH_TYPES and SshKeyStore(sub).public_key_file.is_file()
        pgp = fmt == "openpgp" and KeyStore(sub).public_key_file.is_file()
        if ssh or pgp:
            found.append(spec)
    return found


def served_keys(keys_dir: Path, specs: list[KeySpec]) -> list[ServedKey]:
    """Every key the server signs with, the primary first (public parts only)."""
    primary = KeyStore(keys_dir).public_key()
    out = [ServedKey(PRIMARY, "openpgp", primary.fingerprint, primary.algorithm,
                     primary.armored, primary.uid, primary=True)]
    for spec in specs:
        if spec.format == "openpgp":
            pk = KeyStore(key_dir(keys_dir, spec)).public_key()
            out.append(ServedKey(spec.id, "openpgp", pk.fingerprint, pk.algorithm, pk.armored,
                                 pk.uid, purpose=spec.role or STAMPS))
        else:
            sk = SshKeyStore(key_dir(keys_dir, spec)).public_key()
            out.append(ServedKey(spec.id, "ssh", sk.fingerprint, sk.key_type,
                                 sk.to_line(comment=False) + "\n", primary.uid,
                                 purpose=spec.role or STAMPS))
    return out
