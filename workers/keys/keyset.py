"""The set of signing keys a server holds: the primary OpenPGP key plus optional extra keys.

``STAMPD_EXTRA_KEYS`` lists extra keys as ``<format>:<algorithm>``, e.g.
``openpgp:rsa4096,ssh:ed25519,ssh:ecdsa-p256``. Each lives in its own directory of the key
store (``keys/<format>-<algorithm>/``) and gets its own pool of workers, each with its own agent
(gpg-agent or ssh-agent). Requests pick a key by fingerprint (``key=``) or format
(``format=ssh``); without either, the primary OpenPGP key signs, so Zeitgitter clients see no
change. SSH keys carry no user id: stamps made with them use the primary key's user id as
tagger/committer, and the object's time is the stamp (an SSH signature has no time of its own).

Keys with a role of their own are not extra keys: the transparency log's key (`TLOG_KEY`,
``STAMPD_TLOG``: an Ed25519 key in ``keys/tlog-ed25519/``, held by ssh-agent like the SSH extra
keys) signs the log's checkpoint notes and nothing else (`tlog_vkey`: its C2SP verifier key);
the witness key (`WITNESS_KEY`, ``STAMPD_WITNESS``: ``keys/witness-ed25519/``) signs cosignatures
of other logs' checkpoints and nothing else (`witness_vkey`).
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from formats import note
from formats.sshsig import SshPublicKey, SshReader, SshSigError, allowed_signers_line
from workers.errors import WorkerError
from workers.keys.gnupg import GpgError, TempGnupgHome
from workers.keys.store import KeyStore, KeyStoreError, ensure_files

PRIMARY = "primary"
SSH_TYPES = {
    "ed25519": ["-t", "ed25519"],
    "ecdsa-p256": ["-t", "ecdsa", "-b", "256"],
    "ecdsa-p384": ["-t", "ecdsa", "-b", "384"],
    "ecdsa-p521": ["-t", "ecdsa", "-b", "521"],
    "rsa": ["-t", "rsa", "-b", "3072"],
    "rsa4096": ["-t", "rsa", "-b", "4096"],
}
SSH_NAMESPACES = "git,stampd"  # what the server's SSH keys are allowed to sign

# What a served key signs: stamps (OpenPGP receipts, tags, branch commits, manifests), RFC
# 3161 time-stamp tokens only (the TSA key: STAMPD_TSA_KEY), or the transparency log's
# checkpoint notes only (the log key: STAMPD_TLOG). Keys are separated by purpose, so a
# request that names the TSA key or the log key with ``key=`` is refused.
STAMPS = "stamps"
RFC3161 = "rfc3161"
TLOG = "tlog"
WITNESS = "witness"  # the witness key: cosignatures of other logs' checkpoints only


CHECK_PRINCIPAL = "key-check@stampd.invalid"  # the one signer of a start-up check's SSHSIG


class TsaError(WorkerError, ValueError):
    """A key that cannot be a TSA key, or a certificate chain that does not fit the key
    (`workers.tsa`; here so that a worker that is no TSA need not import that module)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = " ".join(message.split())


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
        else:
            fmt, _, algo = key_id.partition("-")
            todo = (f"restore the key files from a backup, or remove {fmt}:{algo} from "
                    "STAMPD_EXTRA_KEYS")
        where = "" if str(key_file) in self.reason else f" with {key_file}"
        super().__init__(f"key {key_id} cannot sign{where}: {self.reason}; {todo}")


@dataclass(frozen=True)
class KeySpec:
    format: str  # "openpgp" | "ssh"
    algo: str
    role: str | None = None  # one purpose of its own (`TLOG`, `WITNESS`); None: an extra key

    @property
    def id(self) -> str:
        """The key's name: its directory in the key store, its worker's and registry's id."""
        return f"{self.role or self.format}-{self.algo}"


# The transparency log's key: signs checkpoint notes only (`formats.jobs.NoteJob`).
TLOG_KEY = KeySpec("ssh", "ed25519", role=TLOG)
# The witness's key: signs cosignatures only (`formats.jobs.CosignJob`).
WITNESS_KEY = KeySpec("ssh", "ed25519", role=WITNESS)
ROLE_KEYS = (TLOG_KEY, WITNESS_KEY)


def spec_of(key_id: str) -> KeySpec:
    """The spec of the key named ``key_id`` (not the primary key's)."""
    for spec in ROLE_KEYS:
        if key_id == spec.id:
            return spec
    fmt, _, algo = key_id.partition("-")
    return KeySpec(fmt, algo)


def parse_extra_keys(spec: str) -> list[KeySpec]:
    keys: list[KeySpec] = []
    for item in filter(None, (i.strip() for i in spec.split(","))):
        fmt, sep, algo = item.partition(":")
        if not sep or fmt not in ("openpgp", "ssh") or not re.fullmatch(r"[a-z0-9-]+", algo):
            raise ValueError(f"extra key {item!r}: use openpgp:<algorithm> or ssh:<type>")
        if fmt == "ssh" and algo not in SSH_TYPES:
            raise ValueError(f"SSH key type {algo!r}: use one of {', '.join(SSH_TYPES)}")
        k = KeySpec(fmt, algo)
        if k in keys:
            raise ValueError(f"extra key {item} listed twice")
        keys.append(k)
    return keys


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


@dataclass(frozen=True)
class ServedKey:
    """The public view of one signing key (what the HTTP process and the log know)."""

    id: str
    format: str  # "openpgp" | "ssh"
    fingerprint: str  # 40 hex (OpenPGP) or SHA256:... (SSH)
    algorithm: str
    public: str  # armored OpenPGP key or an OpenSSH public key line
    uid: str  # the user id written into stamps made with this key
    primary: bool = False
    # STAMPS, RFC3161 (the TSA key: tokens only), TLOG (the log key: checkpoint notes only) or
    # WITNESS (the witness key: cosignatures only)
    purpose: str = STAMPS

    def allowed_signers(self, namespaces: str | None = None) -> str | None:
        """The ``gpg.ssh.allowedSignersFile`` line for an SSH key (principal: the email of
        the server's user id). None for an OpenPGP key, for the TSA key, which signs RFC 3161
        tokens only, and for the log key, which signs checkpoint notes only: no verifier should
        take an SSH signature of either as a stamp."""
        if self.format != "ssh" or self.purpose != STAMPS:
            return None
        principal = self.uid.rsplit("<", 1)[-1].rstrip(">") or "stampd@localhost"
        return allowed_signers_line(principal, self.public.strip(), namespaces) + "\n"

    @property
    def log_name(self) -> str:
        """File name of this key in the log repository's ``keys/`` directory."""
        return f"{self.id}.{'asc' if self.format == 'openpgp' else 'pub'}"


def with_purposes(keys: Sequence[ServedKey], tsa_key_id: str | None) -> list[ServedKey]:
    """``keys`` with the TSA key (id ``tsa_key_id``; None: RFC 3161 is off) marked as signing
    RFC 3161 tokens only, and the log key (id ``TLOG_KEY.id``, whatever the settings) as
    signing checkpoint notes only. A key registry knows no purpose: the settings and the log
    key's reserved id do."""
    return [replace(k, purpose=RFC3161) if k.id == tsa_key_id
            else replace(k, purpose=TLOG) if k.id == TLOG_KEY.id
            else replace(k, purpose=WITNESS) if k.id == WITNESS_KEY.id else k for k in keys]


def tlog_vkey(origin: str, public_line: str) -> str:
    """The C2SP signed-note verifier key of the log key: ``<origin>+<key id>+<base64(0x01 ||
    Ed25519 public key)>``, ``public_line`` its OpenSSH public key line (``id.pub``,
    `ServedKey.public`); ValueError when that is not an Ed25519 key or ``origin`` no valid key
    name (`formats.note.MalformedVerifierKey`)."""
    return note.VerifierKey(origin, note.ED25519, ed25519_public_key(public_line)).encode()


def witness_vkey(name: str, public_line: str) -> str:
    """The C2SP verifier key of the witness key, for logs and their verifiers:
    ``<name>+<key id>+<base64(0x04 || Ed25519 public key)>`` (c2sp.org/tlog-cosignature);
    ValueError as `tlog_vkey`."""
    return note.VerifierKey(name, note.ED25519_COSIGNATURE,
                            ed25519_public_key(public_line)).encode()


def ed25519_public_key(public_line: str) -> bytes:
    """The 32-byte Ed25519 public key of an OpenSSH public key line; ValueError for another
    key type."""
    key = SshPublicKey.from_line(public_line)
    if key.key_type != "ssh-ed25519":
        raise SshSigError(f"the log key must be ssh-ed25519, not {key.key_type}")
    reader = SshReader(key.blob, "public key")
    reader.text()
    return reader.string()


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


def allowed_signers(keys: Sequence[ServedKey]) -> str:
    """The ``allowed_signers`` file of the SSH keys among ``keys`` (for git's
    ``gpg.ssh.allowedSignersFile`` and ``ssh-keygen -Y verify``); empty when there is none."""
    return "".join(k.allowed_signers(SSH_NAMESPACES) or "" for k in keys)


def served_keys(keys_dir: Path, specs: list[KeySpec]) -> list[ServedKey]:
    """Every key the server signs with, the primary first (public parts only)."""
    primary = KeyStore(keys_dir).public_key()
    out = [ServedKey(PRIMARY, "openpgp", primary.fingerprint, primary.algorithm,
                     primary.armored, primary.uid, primary=True)]
    for spec in specs:
        if spec.format == "openpgp":
            pk = KeyStore(key_dir(keys_dir, spec)).public_key()
            out.append(ServedKey(spec.id, "openpgp", pk.fingerprint, pk.algorithm, pk.armored,
                                 pk.uid))
        else:
            sk = SshKeyStore(key_dir(keys_dir, spec)).public_key()
            out.append(ServedKey(spec.id, "ssh", sk.fingerprint, sk.key_type,
                                 sk.to_line(comment=False) + "\n", primary.uid,
                                 purpose=spec.role or STAMPS))
    return out
