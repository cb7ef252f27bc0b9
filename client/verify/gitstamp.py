"""Tag and commit stamps in a git repository, checked with the real git and gpg.

A git target (a tag or commit in ``--repo``) is checked with ``git verify-tag --raw`` or
``git verify-commit --raw`` against the ``--key`` file only, else against the keys pinned in
the repository by ``stampd stamp`` or ``stampd hook install`` (`client.verify.trust`: a git
stamp names no server, so every server's pinned key counts; none is fetched). OpenPGP: the
tagger/committer time must be the signature's creation time. SSH (``-----BEGIN SSH
SIGNATURE-----``): ``--key`` is a ``.pub`` or allowed-signers file, git checks with
``gpg.format=ssh`` and an allowed-signers file of only those keys (namespace ``git``); the
signature, which carries no time, covers the tagger/committer time. A stamp signed in any
other way (X.509, an OpenPGP message) is "unsupported".
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from client.gpg import SignatureStatus, TempGpgHome
from client.verify.errors import CannotCheck, Invalid, Malformed, Unsupported
from client.verify.keys import (
    KEYRING_PREFIX,
    MAX_KEY,
    SIG_BINARY,
    accepted_signature,
    gpg_checks,
    load_keyring,
    ssh_keys_from,
)
from client.verify.trust import repository_keys
from formats.gpgstatus import ValidSig


@dataclass(frozen=True)
class GitResult:
    kind: str  # "tag" or "commit"
    oid: str
    name: str  # tag name, or the target as given
    stamped: str  # the commit the stamp is about
    signer: str
    time: int
    signature: ValidSig
    key_origin: str


def _git(repo: Path, *args: str, env: dict[str, str] | None = None
         ) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                              timeout=60, env=env, check=False)
    except FileNotFoundError:
        raise CannotCheck("git is not installed") from None


def resolve_git_object(repo: Path, target: str) -> tuple[str, str]:
    """(object id, type) of a tag or commit named ``target`` in ``repo``."""
    if target.startswith("-"):
        raise Malformed(f"{target!r} is not a receipt file, tag or commit")
    r = _git(repo, "rev-parse", "--verify", "--quiet", f"{target}^{{object}}")
    oid = r.stdout.strip()
    if r.returncode != 0 or not oid:
        raise Malformed(f"{target!r} is neither a receipt file nor a tag or commit in {repo}")
    kind = _git(repo, "cat-file", "-t", oid).stdout.strip()
    if kind not in ("tag", "commit"):
        raise Malformed(f"{target!r} is a {kind or 'unknown object'}, not a tag or commit")
    return oid, kind


def _headers(body: str) -> list[str]:
    return body.split("\n\n", 1)[0].split("\n")


def _identity(line: str) -> tuple[str, int]:
    m = re.fullmatch(r"\S+ (.*) (\d{1,12}) [+-]\d{4}", line)
    if not m:
        raise Malformed(f"bad identity line {line[:100]!r}")
    return m.group(1), int(m.group(2))


# The lines that start a signature block git knows (gpg-interface.c), and the formats
# `stampd verify` checks.
SIGNATURE_STARTS = {
    "-----BEGIN PGP SIGNATURE-----": "openpgp",
    "-----BEGIN PGP MESSAGE-----": None,
    "-----BEGIN SIGNED MESSAGE-----": None,  # X.509 (gpgsm)
    "-----BEGIN SSH SIGNATURE-----": "ssh",
}


def _signature_format(first_line: str, kind: str) -> str:
    """"openpgp" or "ssh" for a signature block starting with ``first_line``; `Unsupported`
    for any other."""
    fmt = SIGNATURE_STARTS.get(first_line)
    if fmt is None:
        what = first_line.strip("-").removeprefix("BEGIN ").lower() or "an unknown signature"
        raise Unsupported(f"the {kind} is signed in a format stampd verify cannot check "
                          f"({what}); only OpenPGP and SSH stamps can be checked")
    return fmt


@dataclass(frozen=True)
class GitObject:
    stamped: str  # the commit the stamp is about
    signer: str
    time: int
    signature: str  # "openpgp" or "ssh"


def describe_git_object(kind: str, body: str) -> GitObject:
    """What a tag or commit stamp says; `Malformed` if unsigned, `Unsupported` if signed in
    a format other than OpenPGP or SSH."""
    headers = _headers(body)
    if kind == "tag":
        starts = [line for line in body.split("\n") if line in SIGNATURE_STARTS
                  or re.fullmatch(r"-----BEGIN [A-Z0-9 ]*SIGNATURE-----", line)]
        if not starts:
            raise Malformed("the tag carries no signature: not a stamp")
        if len(starts) > 1:
            raise Invalid("more than one signature (only one is allowed)")
        fmt = _signature_format(starts[0], kind)
        stamped = next((h[7:] for h in headers if h.startswith("object ")), "")
        ident = next((h for h in headers if h.startswith("tagger ")), None)
    else:
        sig_headers = [h for h in headers if h.startswith(("gpgsig ", "gpgsig-sha256 "))]
        if not sig_headers:
            raise Malformed("the commit carries no signature: not a stamp")
        if len(sig_headers) > 1:
            raise Invalid("more than one signature (only one is allowed)")
        fmt = _signature_format(sig_headers[0].split(" ", 1)[1], kind)
        parents = [h[7:] for h in headers if h.startswith("parent ")]
        stamped = parents[-1] if parents else ""
        ident = next((h for h in headers if h.startswith("committer ")), None)
    if ident is None:
        raise Malformed(f"the {kind} has no {'tagger' if kind == 'tag' else 'committer'} line")
    signer, t = _identity(ident)
    return GitObject(stamped=stamped, signer=signer, time=t, signature=fmt)


_GOOD_SSH = re.compile(r'Good "git" signature for \S+ with \S+ key (SHA256:[A-Za-z0-9+/=]+)')


def verify_git_ssh(repo: Path, oid: str, kind: str, obj: GitObject, key_file: Path | None
                   ) -> tuple[ValidSig, str]:
    """An SSH-signed tag or commit: ``git verify-tag|verify-commit`` with ``gpg.format=ssh``
    and an allowed-signers file holding only the SSH keys of ``key_file`` (else those pinned
    in ``repo``; namespace git). An SSH signature carries no time: the tagger/committer time,
    which it covers, is the stamp's."""
    if key_file is None:
        trusted = repository_keys("ssh", repo)
        keys, origin = list(trusted.ssh), trusted.origin
    else:
        try:
            text = key_file.read_text(encoding="ascii", errors="replace")[:MAX_KEY + 1]
        except OSError as e:
            raise Malformed(f"cannot read key file {key_file}: {e.strerror}") from None
        keys, origin = ssh_keys_from(text), f"key file {key_file}"
    if not keys:
        raise Malformed(f"the {kind} is SSH-signed, and {key_file} holds no SSH public key "
                        "(give the server's allowed-signers line, GET /v1/keys/allowed_signers, "
                        "or its .pub)")
    with tempfile.TemporaryDirectory(prefix=KEYRING_PREFIX) as tmp:
        signers = Path(tmp) / "allowed_signers"
        signers.write_text("".join(f'stamp-{i}@stampd namespaces="git" '
                                   f"{k.to_line(comment=False)}\n"
                                   for i, k in enumerate(keys)), encoding="ascii")
        r = _git(repo, "-c", "gpg.format=ssh", "-c", f"gpg.ssh.allowedSignersFile={signers}",
                 "verify-tag" if kind == "tag" else "verify-commit", "--raw", oid)
    output = r.stdout + r.stderr
    if "ssh-keygen" in output and "No such file" in output:
        raise CannotCheck("ssh-keygen is not installed (OpenSSH 8.2 or later)")
    good = _GOOD_SSH.findall(output)
    if r.returncode != 0 or len(good) != 1:
        detail = output.strip().splitlines()
        raise Invalid(f"the SSH signature does not verify with a key of the {origin}: "
                      f"{detail[-1][:200] if detail else r.returncode}")
    fingerprint = good[0]
    if fingerprint not in {k.fingerprint for k in keys}:
        raise Invalid(f"signed by {fingerprint}, which is not in the {origin}")
    sig = ValidSig(fingerprint=fingerprint, created=obj.time, sig_class="ssh",
                   primary=fingerprint)
    return sig, origin


def verify_git(repo: Path, target: str, key_file: Path | None) -> GitResult:
    """Check a tag or commit stamp with git against the key file only (None: the keys pinned
    in ``repo``)."""
    oid, kind = resolve_git_object(repo, target)
    body = _git(repo, "cat-file", kind, oid).stdout
    obj = describe_git_object(kind, body)
    if obj.signature == "ssh":
        sig, origin = verify_git_ssh(repo, oid, kind, obj, key_file)
    else:
        sig, origin = verify_git_openpgp(repo, oid, kind, obj, key_file)
    name = target
    if kind == "tag":
        name = next((h[4:] for h in _headers(body) if h.startswith("tag ")), target)
    return GitResult(kind=kind, oid=oid, name=name, stamped=obj.stamped, signer=obj.signer,
                     time=obj.time, signature=sig, key_origin=origin)


def verify_git_openpgp(repo: Path, oid: str, kind: str, obj: GitObject, key_file: Path | None
                       ) -> tuple[ValidSig, str]:
    """An OpenPGP-signed tag or commit: ``git verify-tag|verify-commit --raw`` in a keyring
    holding only ``key_file`` (None: the keys pinned in ``repo``); a binary signature made in
    the tagger/committer second."""
    trusted = repository_keys("openpgp", repo) if key_file is None else None
    with gpg_checks(), TempGpgHome(KEYRING_PREFIX) as home:
        origin = (load_keyring(home, key_file) if trusted is None else
                  load_keyring(home, None, trusted.openpgp, trusted.origin))
        pinned = {fpr for key in home.list_keys() for fpr in key.fingerprints}
        env = {**os.environ, "GNUPGHOME": str(home.path)}
        r = _git(repo, "-c", "gpg.format=openpgp", "-c", "gpg.program=gpg",
                 "-c", "gpg.minTrustLevel=undefined",
                 "verify-tag" if kind == "tag" else "verify-commit", "--raw", oid, env=env)
    sig = accepted_signature(SignatureStatus.parse(r.stderr), r.returncode == 0, keys=pinned,
                             origin=origin, sig_class=SIG_BINARY, made=obj.time,
                             stated_by=f"the {kind}")
    return sig, origin
