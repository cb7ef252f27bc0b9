"""Who may sign a repository's commits and tags (``stampd verify --signers FILE``), and their
signatures checked at a time the caller gives -- the time a stamp proves -- rather than the
date the signer wrote.

``--signers`` is an ssh-keygen allowed-signers file (SSH signatures, ``gpg.format=ssh``) or an
OpenPGP key file or keyring (armored or binary, as ``gpg --export`` writes it); it may be given
twice, once of each. An **SSH** signature is checked with ``ssh-keygen -Y verify -n git -f FILE
-I PRINCIPAL -Overify-time=T``: the key must be on a line of the file whose ``valid-after`` and
``valid-before`` hold T (`formats.allowed_signers` reads the lines to choose the principal and
to name the bound in a refusal; ssh-keygen decides). An **OpenPGP** signature is checked by gpg
in a keyring of the file alone (batched, one ``gpg --verify-files`` per 200), and its key's
validity at T from gpg's listing (`formats.gpgkeys`: created, not expired, no revocation that
applies at T). gpg's own verdict on the key (expired or revoked *now*) is not what counts.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from client.gpg import GpgError, TempGpgHome
from client.verify.covering import gpg_verify_many
from client.verify.errors import CannotCheck, Malformed
from client.verify.keys import KEYRING_PREFIX, MAX_KEY
from formats.allowed_signers import AllowedSigner, parse_allowed_signers, ssh_time
from formats.gitobjects import split_signed
from formats.gpgkeys import GpgKey, describe, parse_key_listing
from formats.gpgstatus import KEY_ENDED, SignatureTally
from formats.sshsig import SshSigError, SshSignature

NAMESPACE = "git"
_GOOD = re.compile(r'Good "git" signature for (.+) with (\S+) key (SHA256:[A-Za-z0-9+/=]+)')
_IDENT = re.compile(rb"(\S+) (.*) (\d{1,12}) ([+-]\d{4})")

Validity = Callable[[int], str | None]


def iso(t: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


@dataclass(frozen=True)
class Signers:
    """The keys of ``--signers``: an allowed-signers file and/or an OpenPGP key file."""

    ssh_file: Path | None = None
    ssh: tuple[AllowedSigner, ...] = ()
    openpgp_file: Path | None = None
    openpgp: bytes | None = None


def _is_openpgp(data: bytes) -> bool:
    """Armored, or a binary public key packet first (old format tag 6, or new format)."""
    return b"-----BEGIN PGP PUBLIC KEY BLOCK-----" in data or \
        data[:1] in (b"\x98", b"\x99", b"\x9a", b"\xc6")


def load_signers(paths: Sequence[Path]) -> Signers:
    """Read ``--signers`` files: at most one allowed-signers file and one OpenPGP key file."""
    ssh_file = openpgp_file = None
    ssh: tuple[AllowedSigner, ...] = ()
    openpgp = None
    for path in paths:
        try:
            data = path.read_bytes()[:MAX_KEY * 16 + 1]
        except OSError as e:
            raise Malformed(f"cannot read --signers {path}: {e.strerror}") from None
        if data[8:12] == b"KBXf":
            raise Malformed(f"--signers {path} is a GnuPG keybox (pubring.kbx); export the "
                            f"keys: gpg --export KEYIDS > signers.gpg")
        if _is_openpgp(data):
            if openpgp_file is not None:
                raise Malformed("--signers: give one OpenPGP key file (put the keys in one: "
                                "gpg --export KEYIDS > signers.gpg)")
            openpgp_file, openpgp = path, data
            continue
        lines, unread = parse_allowed_signers(data.decode("utf-8", "replace"))
        if not lines and not unread:
            raise Malformed(f"--signers {path} holds neither an allowed-signers line nor an "
                            "OpenPGP key")
        if ssh_file is not None:
            raise Malformed("--signers: give one allowed-signers file")
        ssh_file, ssh = path, tuple(lines)
    return Signers(ssh_file, ssh, openpgp_file, openpgp)


@dataclass(frozen=True)
class Signed:
    """A signed tag or commit as its signer made it."""

    oid: str
    kind: str  # "commit" or "tag"
    fmt: str  # "ssh" or "openpgp"
    payload: bytes
    signature: bytes
    ident: str  # committer / tagger, without the date
    date: int  # committer / tagger date: the signer's word

    def name(self) -> str:
        return f"{self.kind} {self.oid}"


def signed_object(oid: str, kind: str, body: bytes, object_format: str) -> Signed | str:
    """The signed object, or why it is none (unsigned, several signatures, another format)."""
    if kind not in ("commit", "tag"):
        return f"a {kind}, not a commit or tag"
    payload, signature, count = split_signed(kind, body, object_format)
    if signature is None:
        return "not signed"
    if count > 1:
        return "more than one signature (only one is allowed)"
    first = signature.split(b"\n", 1)[0]
    fmt = {b"-----BEGIN SSH SIGNATURE-----": "ssh",
           b"-----BEGIN PGP SIGNATURE-----": "openpgp"}.get(first)
    if fmt is None:
        return f"signed in a format stampd cannot check ({first.decode('ascii', 'replace')})"
    field = b"committer " if kind == "commit" else b"tagger "
    header = body.split(b"\n\n", 1)[0]
    line = next((h for h in header.split(b"\n") if h.startswith(field)), None)
    m = _IDENT.fullmatch(line) if line is not None else None
    if m is None:
        return f"no {field.decode().strip()} line"
    return Signed(oid, kind, fmt, payload, signature, m.group(2).decode("utf-8", "replace"),
                  int(m.group(3)))


@dataclass(frozen=True)
class Identified:
    """Who made a signature, and when their key was valid (`valid_at`)."""

    signer: str  # principal or user id
    key: str  # SHA256:... or the OpenPGP (sub)key fingerprint
    source: str  # where the key is: "signers.txt line 3", "signers.gpg"
    window: str  # its validity in words
    valid_at: Validity
    end: int | None = None  # when it stopped being valid, where known


@dataclass(frozen=True)
class Outcome:
    """The check of one signature at a time: ``ok``, else ``reason``."""

    ok: bool
    reason: str | None = None
    said: str | None = None  # the checker's own words (ssh-keygen's line)


# --------------------------------------------------------------------------- SSH


def identify_ssh(signed: Signed, signers: Signers) -> Identified | str:
    """The allowed-signers lines of the key that made an SSH signature; a refusal when the
    signature names another namespace or a key the file does not hold (a key ssh-keygen may
    know in a line this parser passes over, a certificate, is left to it: `lines` empty)."""
    if signers.ssh_file is None:
        return "SSH-signed, and --signers holds no allowed-signers file"
    try:
        sig = SshSignature.from_armored(signed.signature.decode("ascii", "replace"))
    except SshSigError as e:
        return f"its SSH signature cannot be read: {e}"
    if sig.namespace != NAMESPACE:
        return f"its SSH signature is for namespace {sig.namespace!r}, not {NAMESPACE!r}"
    fpr = sig.public_key.fingerprint
    lines = [s for s in signers.ssh if s.key.blob == sig.public_key.blob
             and s.allows_namespace(NAMESPACE)]
    where = signers.ssh_file.name
    if not lines:
        return Identified("?", fpr, f"{where} (no line read for this key)", "as ssh-keygen says",
                          lambda t: None)

    def valid_at(t: int) -> str | None:
        reasons = [s.refusal_at(t) for s in lines]
        if any(r is None for r in reasons):
            return None
        return "; ".join(f"{where} line {s.line}: {r}" for s, r in zip(lines, reasons,
                                                                        strict=True))

    ends = [s.valid_before for s in lines]
    end = None if any(e is None for e in ends) else max(e for e in ends if e is not None)
    first = lines[0]
    return Identified(first.identity, fpr,
                      f"{where} line{'s' if len(lines) > 1 else ''} "
                      f"{', '.join(str(s.line) for s in lines)}",
                      "; ".join(s.window() for s in lines), valid_at, end)


def ssh_check(signed: Signed, signers: Signers, who: Identified, t: int,
              sig: Path | None = None) -> Outcome:
    """``ssh-keygen -Y verify -Overify-time=T`` of the signature with the --signers file
    (``sig``: the signature already written to a file)."""
    assert signers.ssh_file is not None
    if sig is None:
        with tempfile.TemporaryDirectory(prefix=KEYRING_PREFIX) as tmp:
            path = Path(tmp) / "object.sig"
            path.write_bytes(signed.signature)
            return ssh_check(signed, signers, who, t, path)
    identity = who.signer
    if identity == "?":  # a key only ssh-keygen reads the line of: it names the principal
        identity = _find_principal(sig, signers.ssh_file, t) or "?"
        if identity == "?":
            return Outcome(False, f"no principal of {signers.ssh_file} is allowed to sign with "
                           f"{who.key} at {iso(t)}")
    else:
        for s in signers.ssh:
            if s.key.fingerprint == who.key and s.refusal_at(t) is None:
                identity = s.identity
                break
    r = _ssh_keygen(["-Y", "verify", "-n", NAMESPACE, "-f", str(signers.ssh_file), "-I",
                     identity, "-s", str(sig), f"-Overify-time={ssh_time(t)}"], signed.payload)
    out = (r.stdout + r.stderr).decode("utf-8", "replace")
    good = _GOOD.findall(out)
    last = out.strip().splitlines()[-1] if out.strip() else str(r.returncode)
    if r.returncode != 0 or len(good) != 1:
        return Outcome(False, f"ssh-keygen -Y verify at {iso(t)}: {last}", last)
    if good[0][2] != who.key:
        return Outcome(False, f"ssh-keygen names the key {good[0][2]}, not {who.key}", last)
    return Outcome(True, said=last)


def _ssh_keygen(args: list[str], stdin: bytes) -> subprocess.CompletedProcess[bytes]:
    try:
        return subprocess.run(["ssh-keygen", *args], input=stdin, capture_output=True,
                              timeout=300, check=False)
    except FileNotFoundError:
        raise CannotCheck("ssh-keygen is not installed (OpenSSH 8.2 or later)") from None


def _find_principal(sig: Path, signers: Path, t: int) -> str | None:
    r = _ssh_keygen(["-Y", "find-principals", "-f", str(signers), "-s", str(sig),
                     f"-Overify-time={ssh_time(t)}"], b"")
    found = r.stdout.decode("utf-8", "replace").split()
    return found[0] if r.returncode == 0 and found else None


def ssh_check_many(jobs: Sequence[tuple[Signed, Identified, int]], signers: Signers
                   ) -> list[Outcome]:
    """`ssh_check` of each (object, signer, time), several ssh-keygen at once."""
    with tempfile.TemporaryDirectory(prefix=KEYRING_PREFIX) as tmp:
        paths = []
        for i, (signed, _, _) in enumerate(jobs):
            paths.append(Path(tmp) / f"{i}.sig")
            paths[-1].write_bytes(signed.signature)
        with ThreadPoolExecutor(max_workers=(os.cpu_count() or 2) + 1) as pool:
            return list(pool.map(lambda i: ssh_check(jobs[i][0], signers, jobs[i][1],
                                                     jobs[i][2], paths[i]), range(len(jobs))))


# --------------------------------------------------------------------------- OpenPGP


def _validsig_expiry(tally: SignatureTally) -> int | None:
    for record in tally.records:
        if record[0] == "VALIDSIG" and len(record) > 4 and record[4].isdigit() \
                and int(record[4]) > 0:
            return int(record[4])
    return None


def identify_openpgp(objects: Sequence[Signed], signers: Signers
                     ) -> list[Identified | str]:
    """Each OpenPGP signature checked by gpg in a keyring of the --signers key file alone:
    who made it and when their key was valid, or why it does not verify. gpg's complaint that
    the key is expired or revoked *now* (EXPKEYSIG, REVKEYSIG) is no refusal here: the key's
    state at the stamp's time is (`formats.gpgkeys`)."""
    if not objects:
        return []
    if signers.openpgp is None or signers.openpgp_file is None:
        return ["OpenPGP-signed, and --signers holds no OpenPGP key file"] * len(objects)
    where = signers.openpgp_file.name
    try:
        with TempGpgHome(KEYRING_PREFIX) as home:
            if not home.import_keys(signers.openpgp).ok and not home.list_keys():
                raise Malformed(f"--signers {signers.openpgp_file} holds no OpenPGP public key")
            keys = {k.primary.fingerprint: k for k in parse_key_listing(home.key_listing())}
            tallies = gpg_verify_many(home, [(o.payload, o.signature) for o in objects])
    except GpgError as e:
        raise CannotCheck(e.message) from None
    out: list[Identified | str] = []
    for tally in tallies:
        if tally is None or tally.newsig != 1:
            out.append("not exactly one OpenPGP signature")
            continue
        errors = [e for e in tally.errors if e not in KEY_ENDED]
        if len(tally.valid_sigs) != 1 or errors:
            reason = ", ".join(sorted(set(errors))) or "no valid signature"
            if "NO_PUBKEY" in errors or "ERRSIG" in errors:
                reason += f": signed by a key that is not in {where}"
            out.append(f"the OpenPGP signature does not verify ({reason})")
            continue
        sig = tally.valid_sigs[0]
        key: GpgKey | None = keys.get(sig.primary)
        if key is None:
            out.append(f"signed by {sig.primary}, which is not in {where}")
            continue
        expiry = _validsig_expiry(tally)
        out.append(_identified(key, sig.fingerprint, expiry, where))
    return out


def _identified(key: GpgKey, signing: str, sig_expiry: int | None, where: str) -> Identified:
    def valid_at(t: int) -> str | None:
        refusal = key.refusal_at(signing, t)
        if refusal is None and sig_expiry is not None and t >= sig_expiry:
            return f"the signature itself expired at {iso(sig_expiry)}"
        return refusal

    life = key.life_of(signing) or key.primary
    ends = [e for e in (key.primary.end(), life.end(), sig_expiry) if e is not None]
    parts = [f"created {iso(life.created)}"]
    if life.expires is not None or key.primary.expires is not None:
        parts.append(f"expires {iso(min(e for e in (life.expires, key.primary.expires) if e))}")
    parts += [describe(r) for r in (*key.primary.revocations, *(
        life.revocations if life is not key.primary else ()))]
    uid = key.uids[0] if key.uids else key.primary.fingerprint
    what = signing if signing == key.primary.fingerprint else \
        f"{signing} (subkey of {key.primary.fingerprint})"
    return Identified(uid, what, where, ", ".join(parts), valid_at, min(ends) if ends else None)
