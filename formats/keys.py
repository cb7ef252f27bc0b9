"""The key model of a server: which keys it signs with, for what, and how verifiers name them
(pure: no files, no agents; `keystore.keyset` makes and reads the keys on disk).

The primary OpenPGP key signs stamps; ``STAMPD_EXTRA_KEYS`` lists extra keys as
``<format>:<algorithm>`` (`parse_extra_keys`), e.g. ``openpgp:rsa4096,ssh:ed25519``, each with
an id of its own (`KeySpec.id`: ``<format>-<algorithm>``, its directory in the key store). Keys
are separated by purpose (`ServedKey.purpose`): `STAMPS`; `RFC3161`, the TSA key's, tokens only;
`TLOG`, the transparency log's key (`TLOG_KEY`), checkpoint notes only (`tlog_vkey`: its C2SP
verifier key); `WITNESS`, the witness key (`WITNESS_KEY`), cosignatures of other logs'
checkpoints only (`witness_vkey`); `MAIL`, the mail key (`MAIL_KEY`, OpenPGP), the receipts
answered to mail (docs/mail.md) only. A request that names a key of another purpose is refused.
SSH keys carry no user id: stamps made with them use the primary key's user id.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

from formats import note
from formats.sshsig import SshPublicKey, SshReader, SshSigError, allowed_signers_line

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
MAIL = "mail"  # the mail key: the receipts of mail stamped (STAMPD_MAIL_LISTEN) only


@dataclass(frozen=True)
class KeySpec:
    format: str  # "openpgp" | "ssh"
    algo: str
    role: str | None = None  # one purpose of its own (`TLOG`, `WITNESS`, `MAIL`); None: extra

    @property
    def id(self) -> str:
        """The key's name: its directory in the key store, its worker's and registry's id."""
        return f"{self.role or self.format}-{self.algo}"


# The transparency log's key: signs checkpoint notes only (`formats.jobs.NoteJob`).
TLOG_KEY = KeySpec("ssh", "ed25519", role=TLOG)
# The witness's key: signs cosignatures only (`formats.jobs.CosignJob`).
WITNESS_KEY = KeySpec("ssh", "ed25519", role=WITNESS)
# The mail key: signs the receipts answered to mail (`formats.jobs.ReceiptJob`), an OpenPGP
# key, since the reply is a cleartext-signed message `gpg --verify` checks (docs/mail.md).
MAIL_KEY = KeySpec("openpgp", "ed25519", role=MAIL)
ROLE_KEYS = (TLOG_KEY, WITNESS_KEY, MAIL_KEY)


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
    # STAMPS, RFC3161 (the TSA key: tokens only), TLOG (the log key: checkpoint notes only),
    # WITNESS (the witness key: cosignatures only) or MAIL (the mail key: mail receipts only)
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
    signing checkpoint notes only, and the witness and mail keys likewise. A key registry
    knows no purpose: the settings and the role keys' reserved ids do."""
    roles = {spec.id: spec.role for spec in ROLE_KEYS}
    return [replace(k, purpose=RFC3161) if k.id == tsa_key_id
            else replace(k, purpose=roles[k.id] or STAMPS) if k.id in roles else k
            for k in keys]


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


def allowed_signers(keys: Sequence[ServedKey]) -> str:
    """The ``allowed_signers`` file of the SSH keys among ``keys`` (for git's
    ``gpg.ssh.allowedSignersFile`` and ``ssh-keygen -Y verify``); empty when there is none."""
    return "".join(k.allowed_signers(SSH_NAMESPACES) or "" for k in keys)
