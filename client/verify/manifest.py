"""Signed manifests (``SHA256SUMS.asc``, docs/manifests.md): the manifest taken apart and checked
as the server checks it, its one OpenPGP (cleartext) or SSH signature by the key its header
names, and -- with ``--dir`` -- the files it names, hashed again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from client.checksums import Progress, parse_line
from client.checksums import file_digest as checksum_file_digest
from client.gpg import TempGpgHome
from client.verify.errors import Invalid, Malformed, Unsupported
from client.verify.inputs import file_digest, normalise_digest
from client.verify.keys import (
    KEYRING_PREFIX,
    SIG_TEXT,
    accepted_signature,
    gpg_checks,
    import_keys,
    read_key_file,
    ssh_keygen_verify,
    ssh_keys_from,
)
from client.verify.trust import server_keys
from formats.cleartext import BEGIN_SIGNED, canonical_text
from formats.manifests import ALGORITHMS as MANIFEST_ALGORITHMS
from formats.manifests import Header, MalformedManifest, check_lines, parse_header
from formats.receipts import BEGIN_SIG, END_SIG, RECEIPT_NAMESPACE, SSH_BEGIN, SSH_END
from formats.sshsig import SshPublicKey

MAX_MANIFEST = 257 * 1024 * 1024  # the server's largest body (256 MiB), its header, signature
MANIFEST_MAGIC = "# stampd manifest v"
_SSH_KEY_NAMESPACE = RECEIPT_NAMESPACE  # manifests are signed in the receipts' namespace


@dataclass(frozen=True)
class SignedManifest:
    """A manifest answer taken apart: its header, the signed text (header and lines, LF line
    ends, a final LF), the lines (after the header), the armored signature, its format."""

    header: Header
    text: str
    lines: str
    signature: str
    format: str  # "openpgp" or "ssh"

    @property
    def body_lines(self) -> list[str]:
        return self.lines[:-1].split("\n")


def is_manifest(data: bytes) -> bool:
    """Whether ``data`` (at least its first few hundred bytes) is a stampd manifest answer."""
    head = data[:200].replace(b"\r\n", b"\n")
    if head.startswith(BEGIN_SIGNED.encode() + b"\n"):
        head = head.partition(b"\n\n")[2]
    return head.startswith(MANIFEST_MAGIC.encode())


def _split_cleartext(text: str) -> tuple[str, str]:
    """(signed text with a final LF, armored signature) of an OpenPGP cleartext message."""
    head, sep, rest = text[len(BEGIN_SIGNED) + 1:].partition("\n\n")
    if not sep or not all(h.startswith("Hash: ") for h in head.split("\n")):
        raise Malformed("bad armor headers in the cleartext-signed manifest")
    body, sep, sig = rest.partition("\n-----BEGIN ")
    if not sep:
        raise Malformed("the cleartext-signed manifest has no signature block")
    sig = "-----BEGIN " + sig
    first = sig.split("\n", 1)[0]
    if first != BEGIN_SIG:
        raise Unsupported(f"the manifest's signature is {first.strip('-')[6:].lower()!r}; "
                          "only OpenPGP and SSH signatures can be checked")
    if not sig.rstrip("\n").endswith(END_SIG) or sig.count("-----BEGIN ") != 1 \
            or BEGIN_SIGNED in body:
        raise Invalid("more than one signed message or signature (only one is allowed)")
    if body.startswith("- ") or "\n- " in body:
        body = "\n".join(line[2:] if line.startswith("- ") else line
                         for line in body.split("\n"))
    return body + "\n", sig


def parse_manifest(data: bytes) -> SignedManifest:
    """The parts of a signed manifest (docs/manifests.md); `Malformed` if it is not one,
    `Unsupported` if it is one stampd verify cannot check (another version, algorithm or
    kind of signature). The lines are checked as the server checks them."""
    if len(data) > MAX_MANIFEST:
        raise Malformed(f"larger than {MAX_MANIFEST} bytes: not a manifest")
    try:
        text = data.decode("utf-8").replace("\r\n", "\n")
    except UnicodeDecodeError:
        raise Malformed("not UTF-8 text: not a manifest") from None
    if text.startswith(BEGIN_SIGNED + "\n"):
        signed, signature = _split_cleartext(text)
        fmt = "openpgp"
    else:
        at = text.find("\n-----BEGIN ")
        if at < 0:
            raise Malformed("the manifest has no signature")
        signed, signature = text[:at + 1], text[at + 1:]
        first = signature.split("\n", 1)[0]
        if first != SSH_BEGIN:
            raise Unsupported(f"the manifest's signature is {first.strip('-')[6:].lower()!r}"
                              "; only OpenPGP and SSH signatures can be checked")
        if not signature.rstrip("\n").endswith(SSH_END) or signature.count("-----BEGIN ") != 1:
            raise Invalid("more than one signature (only one is allowed)")
        fmt = "ssh"
    if not signed.startswith(MANIFEST_MAGIC):
        raise Malformed("no '# stampd manifest v1' line: not a manifest")
    if not signed.startswith(MANIFEST_MAGIC + "1\n"):
        raise Unsupported(f"{signed.split(chr(10), 1)[0]!r}: only version 1 manifests can be "
                          "checked")
    second = signed.split("\n", 2)[1]
    if second.startswith("# algorithm: ") and second[13:] not in MANIFEST_ALGORITHMS:
        raise Unsupported(f"the manifest's algorithm is {second[13:][:40]!r}; only sha256 "
                          "and sha512 can be checked")
    try:
        header = parse_header(signed)
        lines = signed[len(header.text()):]
        if lines.count("\n") != header.lines:
            raise Invalid(f"the header says {header.lines} lines, but "
                          f"{lines.count(chr(10))} follow it")
        check_lines(lines, header.algorithm)
    except MalformedManifest as e:
        raise Malformed(f"not a manifest: {e}") from None
    return SignedManifest(header, signed, lines, signature, fmt)


def verify_manifest_signature(manifest: SignedManifest, *, openpgp: bytes | None = None,
                              ssh: Sequence[SshPublicKey] = (), origin: str) -> str:
    """The fingerprint of the key that signed ``manifest``, a key of ``openpgp`` (armored) or
    ``ssh``: one signature over exactly the signed text, by the key the header names; an
    OpenPGP one a text signature (01) made in the header's second. Raise `Invalid`."""
    h = manifest.header
    if manifest.format == "ssh":
        key = next((k for k in ssh if k.fingerprint == h.key), None)
        if key is None:
            raise Invalid(f"the manifest names key {h.key}, which is not in the {origin}")
        ok, detail = ssh_keygen_verify(key, _SSH_KEY_NAMESPACE, manifest.text.encode("utf-8"),
                                       manifest.signature)
        if not ok:
            raise Invalid(f"the SSH signature does not verify with the {origin}: {detail}")
        return key.fingerprint
    if openpgp is None:
        raise Invalid(f"the manifest is OpenPGP-signed, and the {origin} holds no OpenPGP key")
    with gpg_checks(), TempGpgHome(KEYRING_PREFIX) as home:
        if not import_keys(home, openpgp):
            raise Invalid(f"the {origin} holds no OpenPGP public key")
        pinned = {fpr for key in home.list_keys() for fpr in key.fingerprints}
        ok, status = home.verify_detached(canonical_text(manifest.text), manifest.signature)
    sig = accepted_signature(status, ok, keys=pinned, origin=origin, sig_class=SIG_TEXT,
                             made=h.time, stated_by="the manifest")
    if h.key not in (sig.fingerprint, sig.primary):
        raise Invalid(f"signed by {sig.fingerprint}, but the manifest names key {h.key}")
    return sig.primary


@dataclass(frozen=True)
class FilesChecked:
    directory: Path
    checked: int
    changed: list[str]
    missing: list[str]
    unchecked: list[str]  # lines that name no file inside the directory

    @property
    def ok(self) -> bool:
        return not (self.changed or self.missing or self.unchecked)


def check_files(manifest: SignedManifest, directory: Path) -> FilesChecked:
    """Hash every file the manifest names, relative to ``directory`` (a progress line on a
    terminal); what is changed, missing, or cannot be checked (no name, a name leading
    outside the directory)."""
    entries = []
    unchecked = []
    for n, line in enumerate(manifest.body_lines, 1):
        digest, name = parse_line(line)
        parts = name.split("/") if name is not None else []
        if name is None or name.startswith("/") or ".." in parts:
            unchecked.append(name if name is not None else f"line {n} (no name)")
        else:
            entries.append((name, digest))
    changed, missing = [], []
    progress = Progress("checking", len(entries))
    try:
        for i, (name, digest) in enumerate(entries):
            try:
                actual = checksum_file_digest(directory / name, manifest.header.algorithm)
            except OSError:
                missing.append(name)
            else:
                if actual != digest:
                    changed.append(name)
            progress.update(i + 1)
    finally:
        progress.close()
    return FilesChecked(directory, len(entries), changed, missing, unchecked)


def _digest_in_manifest(manifest: SignedManifest, file: Path | None, digest: str | None
                        ) -> str | None:
    if file is not None:
        value, what = file_digest(file, manifest.header.algorithm), f"file {file}"
    elif digest is not None:
        value, what = normalise_digest(digest), "the given digest"
    else:
        return None
    for n, line in enumerate(manifest.body_lines, 1):
        found, name = parse_line(line)
        if found == value:
            return f"{what}: line {n}" + (f" ({name})" if name is not None else "")
    raise Invalid(f"{manifest.header.algorithm} {value} ({what}) is not in the manifest")


@dataclass(frozen=True)
class ManifestResult:
    manifest: SignedManifest
    signer: str
    key_origin: str
    matched: str | None  # --file/--digest: the line found
    files: FilesChecked | None
    fetched: bool = False  # the key was fetched from the server just now, and trusted so


def verify_manifest(data: bytes, *, key_file: Path | None = None,
                    directory: Path | None = None, file: Path | None = None,
                    digest: str | None = None, repo: Path = Path(".")) -> ManifestResult:
    """Check a signed manifest (and with ``directory`` the files it names) with the
    ``key_file``, else the keys pinned in ``repo`` or fetched from the server it names; raise
    a `VerifyError` unless the manifest is valid. The files' result is returned, not
    raised."""
    manifest = parse_manifest(data)
    h = manifest.header
    openpgp: bytes | None = None
    ssh: list[SshPublicKey] = []
    fetched = False
    if key_file is not None:
        raw = read_key_file(key_file)
        origin = f"key file {key_file}"
        if b"-----BEGIN PGP PUBLIC KEY BLOCK-----" in raw:
            openpgp = raw
        ssh = ssh_keys_from(raw.decode("ascii", "replace"))
    else:
        trusted = server_keys(manifest.format, repo, h.server)
        openpgp, ssh, origin, fetched = (trusted.openpgp, list(trusted.ssh), trusted.origin,
                                         trusted.fetched)
    signer = verify_manifest_signature(manifest, openpgp=openpgp, ssh=ssh, origin=origin)
    matched = _digest_in_manifest(manifest, file, digest)
    files = check_files(manifest, directory) if directory is not None else None
    return ManifestResult(manifest, signer, origin, matched, files, fetched)
