"""The server keys ``stampd stamp`` trusts, as ``git timestamp`` does: trust on first use.

The server's OpenPGP key comes from
``get-public-key-v1``; its fingerprint is pinned in the repository's git config as
``timestamper.<server>.keyid`` (the name and variable ``git timestamp`` uses, read from any git
config scope, so a pin ``git timestamp`` made is honoured), and a later key that does not match
the pin is refused. The pinned key itself is kept beside the pin in the git directory
(`pin_keys`, `client.verify.trust`), so that ``stampd verify`` checks offline. ``--key FILE``
trusts that key file instead (OpenPGP: an armored public key; SSH: a ``.pub`` or
allowed-signers file) and fetches no key. SSH stamps use the server's SSH key
named by ``--key SHA256:...``, else the one pinned as ``timestamper.<server>.sshkey``, else its
first (which is then pinned); its allowed-signers line comes from ``GET
/v1/keys/allowed_signers`` and must have that fingerprint.

`verify_openpgp` and `verify_ssh` check an answer's signature with the trusted key.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from client.gpg import GpgError, TempGpgHome
from client.stamp.answers import Checked
from client.stamp.errors import AnswerRefused, StampFailed, UsageError
from client.stamp.git import git, git_config
from client.verify.errors import CannotCheck, Invalid, VerifyError
from client.verify.keys import (
    KEYRING_PREFIX,
    SIG_BINARY,
    BadSignature,
    accepted_signature,
    fetch_allowed_signers,
    fetch_public_key,
    ssh_keygen_verify,
)
from client.verify.keys import ssh_keys_from as _ssh_keys_from
from client.verify.trust import keep_key, pin_name
from formats.sshsig import SshPublicKey, SshSigError, SshSignature

SSH_NAMESPACE = "git"


@dataclass(frozen=True)
class OpenPgpTrust:
    fingerprints: frozenset[str]  # every (sub)key fingerprint of the trusted keys
    primary: str
    uid: str
    armored: bytes
    origin: str
    pins: tuple[tuple[str, str], ...] = ()  # git config to write once a stamp is stored
    server: str | None = None  # the server it is (to be) pinned for; None: a --key file


@dataclass(frozen=True)
class SshTrust:
    key: SshPublicKey
    origin: str
    pins: tuple[tuple[str, str], ...] = ()
    server: str | None = None  # as for OpenPgpTrust


def describe_openpgp(armored: bytes, origin: str) -> OpenPgpTrust:
    try:
        with TempGpgHome(KEYRING_PREFIX) as home:
            home.import_keys(armored)
            keys = home.list_keys()
    except GpgError as e:
        raise StampFailed(e.message) from None
    if not keys:
        raise UsageError(f"the {origin} holds no OpenPGP public key")
    key = keys[0]
    if not key.uids or any(not (" " <= c <= "~") for c in key.uids[0]):
        raise StampFailed(f"the {origin} has no printable user id")
    return OpenPgpTrust(fingerprints=frozenset(f for k in keys for f in k.fingerprints),
                        primary=key.fingerprint, uid=key.uids[0], armored=armored,
                        origin=origin)


def openpgp_trust(repo: Path, server: str, key_file: Path | None) -> OpenPgpTrust:
    """The server's OpenPGP key: ``key_file``'s, or fetched and compared with (or recorded
    as) the pin in git config."""
    if key_file is not None:
        try:
            data = key_file.read_bytes()
        except OSError as e:
            raise UsageError(f"cannot read key file {key_file}: {e.strerror}") from None
        return describe_openpgp(data, f"key file {key_file}")
    try:
        armored = fetch_public_key(server)
    except VerifyError as e:
        raise StampFailed(e.message) from None
    trust = describe_openpgp(armored, f"key of {server}")
    variable = f"timestamper.{pin_name(server)}.keyid"
    pinned = git_config(repo, variable)
    if pinned is None:
        pins = ((variable, trust.primary), (f"timestamper.{pin_name(server)}.name", trust.uid))
        return OpenPgpTrust(trust.fingerprints, trust.primary, trust.uid, armored,
                            f"key of {server}, now pinned as {variable}", pins, server)
    if not trust.primary.endswith(pinned.upper()) or len(pinned) < 16:
        raise StampFailed(f"the key of {server} is {trust.primary}, not the pinned {pinned} "
                          f"(git config {variable}); if you trust the new key, remove the pin "
                          f"with git config --unset {variable} (add --global where it is "
                          "set there)")
    return OpenPgpTrust(trust.fingerprints, trust.primary, trust.uid, armored,
                        f"key of {server}, pinned as {variable}", server=server)


def ssh_keys_in_file(path: Path) -> list[SshPublicKey]:
    try:
        text = path.read_text(encoding="ascii", errors="replace")
    except OSError as e:
        raise UsageError(f"cannot read key file {path}: {e.strerror}") from None
    keys = _ssh_keys_from(text)
    if not keys:
        raise UsageError(f"{path} holds no SSH public key (give a .pub or an allowed-signers "
                         "file)")
    return keys


def ssh_trust(repo: Path, server: str, key: str | None) -> SshTrust:
    """The server's SSH key: from a key file, or the fingerprint given, pinned or the first
    (then pinned), with its allowed-signers line fetched from the server."""
    if key is not None and not key.startswith("SHA256:"):
        return SshTrust(ssh_keys_in_file(Path(key))[0], f"key file {key}")
    variable = f"timestamper.{pin_name(server)}.sshkey"
    wanted = key or git_config(repo, variable)
    try:
        served = _ssh_keys_from(fetch_allowed_signers(server))
    except VerifyError as e:
        raise StampFailed(e.message) from None
    if not served:
        raise StampFailed(f"{server} has no SSH key (GET /v1/keys/allowed_signers)")
    if wanted is None:
        return SshTrust(served[0], f"first SSH key of {server}, now pinned as {variable}",
                        ((variable, served[0].fingerprint),), server)
    found = next((k for k in served if k.fingerprint == wanted), None)
    if found is None:
        where = "given" if key else f"pinned as {variable}"
        raise StampFailed(f"{server} does not serve the SSH key {wanted} ({where})")
    pinned = git_config(repo, variable) == found.fingerprint
    return SshTrust(found, f"SSH key of {server}, {'given' if key else 'pinned'}",
                    server=server if pinned else None)


def pin_keys(repo: Path, *trusted: OpenPgpTrust | SshTrust | None) -> None:
    """Trust on first use, once a stamp the keys signed is stored in ``repo``: write the pins
    of keys first fetched now (``pins``) to its git config, and keep each key pinned for its
    server beside the pin (`client.verify.trust.keep_key`), for ``stampd verify`` offline."""
    for trust in trusted:
        if trust is None:
            continue
        for variable, value in trust.pins:
            git(repo, "config", "--local", variable, value)
        if trust.server is None:
            continue
        if isinstance(trust, OpenPgpTrust):
            fmt, key = "openpgp", trust.armored
        else:
            fmt, key = "ssh", (trust.key.to_line(comment=False) + "\n").encode("ascii")
        try:
            keep_key(repo, trust.server, fmt, key)
        except OSError as e:
            raise StampFailed(f"the stamp is stored, but the server key could not be kept in "
                              f"the repository: {e.strerror or e}") from None


def verify_openpgp(checked: Checked, trust: OpenPgpTrust, what: str) -> str:
    """The signing key's fingerprint; `AnswerRefused` unless the signature is accepted as
    ``stampd verify`` accepts it (`client.verify.keys.accepted_signature`): one good binary
    signature by the trusted key, made in the second the tagger/committer line gives (which
    `client.stamp.answers` found within the clock skew); ``what``: "tag" or "commit"."""
    try:
        with TempGpgHome(KEYRING_PREFIX) as home:
            home.import_keys(trust.armored)
            ok, status = home.verify_detached(checked.payload, checked.signature)
    except GpgError as e:
        raise StampFailed(e.message) from None
    try:
        sig = accepted_signature(status, ok, keys=trust.fingerprints, origin=trust.origin,
                                 sig_class=SIG_BINARY, made=checked.time,
                                 stated_by=f"the {what}")
    except BadSignature as e:
        raise AnswerRefused(f"the signature does not verify with the {trust.origin} "
                            f"({e.reason})") from None
    except Invalid as e:
        raise AnswerRefused(e.message) from None
    return sig.primary


def verify_ssh(checked: Checked, trust: SshTrust) -> str:
    """The signing key's fingerprint; `AnswerRefused` unless the SSHSIG (namespace git) is
    by the trusted key and ``ssh-keygen -Y verify`` accepts it."""
    try:
        parsed = SshSignature.from_armored(checked.signature)
    except (SshSigError, ValueError) as e:
        raise AnswerRefused(f"the SSH signature cannot be read: {e}") from None
    if parsed.public_key.fingerprint != trust.key.fingerprint:
        raise AnswerRefused(f"signed by {parsed.public_key.fingerprint}, not by the "
                            f"{trust.origin} ({trust.key.fingerprint})")
    if parsed.namespace != SSH_NAMESPACE:
        raise AnswerRefused(f"the SSH signature's namespace is {parsed.namespace!r}, not 'git'")
    try:
        ok, detail = ssh_keygen_verify(trust.key, SSH_NAMESPACE, checked.payload,
                                       checked.signature)
    except CannotCheck as e:  # ssh-keygen missing: not the answer's fault
        raise StampFailed(e.message) from None
    if not ok:
        raise AnswerRefused("the SSH signature does not verify with the "
                            f"{trust.origin}: {detail}")
    return trust.key.fingerprint

