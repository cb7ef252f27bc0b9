"""``stampd stamp --tag NAME [COMMIT]`` and ``stampd stamp --branch NAME [COMMIT]``: obtain a git
stamp from any stampd (or Zeitgitter) server, check it as ``git timestamp`` does, and store it.

The requests are Zeitgitter's ``stamp-tag-v1`` and ``stamp-branch-v1`` (docs/protocol.md), with
stampd's ``format=ssh`` and ``key=SHA256:...`` for SSH-signed stamps, and with 64-digit ids in a
SHA-256 repository (``git rev-parse --show-object-format``). The answer is refused, and nothing is
stored, unless: HTTP 200 without redirect; at most 8000 bytes of printable ASCII and LF; it
starts with exactly the lines asked for (``object/type/tag`` or ``tree/parent``) and the server
key's user id as tagger/author/committer; every time is 10 digits in zone ``+0000`` within 30 s
of this computer's clock; exactly one signature, armored without headers, where git reads it
(``gpgsig-sha256`` in a SHA-256 repository); and it verifies over the object without it, with
the trusted key: OpenPGP (binary signature 0x00, made within 30 s of now, by the pinned key or a
key of ``--key FILE``) or SSH (``ssh-keygen -Y verify -n git`` against the trusted key's
allowed-signers line). Only then is it stored with git plumbing: ``git mktag`` +
``git update-ref refs/tags/NAME NEW ""`` (the tag must not exist) or ``git hash-object -t commit
-w`` + ``git update-ref refs/heads/NAME NEW OLD``. A branch stamp's parents are the branch's
previous head and the stamped commit: the branch is a merge chain, as ``git timestamp`` builds it.

Trust (as ``git timestamp``: trust on first use): the server's OpenPGP key comes from
``get-public-key-v1``; its fingerprint is pinned in the repository's git config as
``timestamper.<server>.keyid`` (the name and variable ``git timestamp`` uses, read from any git
config scope, so a pin ``git timestamp`` made is honoured), and a later key that does not match
the pin is refused. ``--key FILE`` trusts that key file instead (OpenPGP: an armored public key;
SSH: a ``.pub`` or allowed-signers file) and fetches no key. SSH stamps use the server's SSH key
named by ``--key SHA256:...``, else the one pinned as ``timestamper.<server>.sshkey``, else its
first (which is then pinned); its allowed-signers line comes from ``GET
/v1/keys/allowed_signers`` and must have that fingerprint.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from client.checksums import ALGORITHMS, FilesError, Progress, Skipped, collect, hash_files
from client.errors import CommandError
from client.fetch import FetchError, http_request
from client.gpg import GpgError, TempGpgHome
from client.verify.errors import CannotCheck, VerifyError
from client.verify.keys import KEYRING_PREFIX, fetch_allowed_signers, fetch_public_key
from client.verify.keys import ssh_keys_from as _ssh_keys_from
from client.verify.manifest import SignedManifest, parse_manifest, verify_manifest_signature
from formats.gitobjects import OBJECT_FORMATS, SHA1
from formats.manifests import Header
from formats.sshsig import SshPublicKey, SshSigError, SshSignature

MAX_STAMP = 8000
CLOCK_SKEW = 30  # seconds; a time must lie strictly within this of our clock
HTTP_TIMEOUT = 30.0
SERVER_ENV = "STAMPD_SERVER"
PGP = ("-----BEGIN PGP SIGNATURE-----", "-----END PGP SIGNATURE-----")
SSH = ("-----BEGIN SSH SIGNATURE-----", "-----END SSH SIGNATURE-----")
SSH_NAMESPACE = "git"
_NAME = re.compile(r"[_a-zA-Z][-._a-zA-Z0-9]{0,99}")
_ARMOR_LINE = re.compile(r"[A-Za-z0-9+/=]+")


class StampFailed(CommandError):
    """No stamp: ``stampd stamp: <message>``, exit status 1 (the server could not be reached
    or answered an error, the server's key changed, git or gpg failed)."""


class UsageError(StampFailed):
    """An unusable argument or repository (no server, a bad name, an unknown commit, a tag
    that exists, a commit the branch stamps already): exit status 2."""

    exit_code = 2


class AnswerRefused(StampFailed):
    """The server answered, but not with a stamp that passes the checks: exit status 3;
    nothing was stored."""

    exit_code = 3
    kind = "refused"


# --------------------------------------------------------------------------- checking answers


@dataclass(frozen=True)
class Checked:
    """An answer that passed every check but the signature's: the object, the signed bytes
    (the object without its signature), the armored signature, the tagger/committer time."""

    text: str
    payload: bytes
    signature: str
    time: int


def _common_checks(text: str) -> None:
    if len(text) > MAX_STAMP:
        raise AnswerRefused(f"the answer is longer than {MAX_STAMP} bytes")
    if not re.fullmatch(r"[ -~\n]*", text):
        raise AnswerRefused("the answer holds characters other than printable ASCII and LF")


def _identity(text: str, pos: int, field: str, uid: str, now: int) -> tuple[int, int]:
    """(time, position after the line) of the ``<field> <uid> <time> +0000`` line at ``pos``."""
    m = re.compile(rf"{field} {re.escape(uid)} (\d{{10}}) \+0000\n").match(text, pos)
    if not m:
        line = text[pos:].split("\n", 1)[0]
        raise AnswerRefused(f"expected '{field} {uid} <10-digit time> +0000', got "
                            f"{line[:120]!r}")
    t = int(m.group(1))
    if abs(t - now) >= CLOCK_SKEW:
        raise AnswerRefused(f"the {field} time {t} is {t - now:+d} s off this computer's clock")
    return t, m.end()


def _signature_lines(text: str) -> int:
    return sum(1 for line in text.split("\n")
               if re.fullmatch(r"-----BEGIN [A-Z0-9 ]+-----", line.lstrip(" ")))


def _check_armor(lines: list[str], fmt: str) -> None:
    """The armor's body lines: no armor headers (OpenPGP: exactly one empty line first)."""
    body = lines
    if fmt == "openpgp":
        if not lines or lines[0] != "":
            raise AnswerRefused("the OpenPGP armor has headers (or lacks its empty line)")
        body = lines[1:]
    if not body or any(not _ARMOR_LINE.fullmatch(line) for line in body):
        raise AnswerRefused("the signature's armor is not base64 lines")


def check_tag_answer(text: str, *, commit: str, tagname: str, uid: str, fmt: str,
                     now: int) -> Checked:
    """Check a ``stamp-tag-v1`` answer as ``git timestamp`` does (all but the signature's
    verification). Raises `AnswerRefused`."""
    _common_checks(text)
    lead = f"object {commit}\ntype commit\ntag {tagname}\n"
    if not text.startswith(lead):
        raise AnswerRefused(f"the tag does not start with 'object {commit}', 'type commit', "
                            f"'tag {tagname}': a stamp of something else")
    t, pos = _identity(text, len(lead), "tagger", uid, now)
    if not text.startswith("\n", pos):
        raise AnswerRefused("the tagger line is not followed by the blank line")
    begin, end = PGP if fmt == "openpgp" else SSH
    start = text.find(f"\n{begin}\n", pos)
    if start < 0:
        other = SSH[0] if fmt == "openpgp" else PGP[0]
        if other in text:
            raise AnswerRefused(f"the tag carries {other[11:-5].lower()} (asked for {fmt})")
        raise AnswerRefused(f"the tag carries no '{begin}'")
    if _signature_lines(text) != 1:
        raise AnswerRefused("the tag carries more than one signature")
    armor = text[start + 1:]
    lines = armor.split("\n")
    if lines[-1] != "" or lines[-2] != end:
        raise AnswerRefused(f"the tag does not end with '{end}'")
    _check_armor(lines[1:-2], fmt)
    return Checked(text=text, payload=text[:start + 1].encode("ascii"), signature=armor,
                   time=t)


def check_branch_answer(text: str, *, tree: str, commit: str, parent: str | None, uid: str,
                        fmt: str, header: str, now: int) -> Checked:
    """Check a ``stamp-branch-v1`` answer as ``git timestamp`` does (all but the signature's
    verification); ``header`` is where git reads the signature (``gpgsig`` or
    ``gpgsig-sha256``). Raises `AnswerRefused`."""
    _common_checks(text)
    lead = f"tree {tree}\n" + (f"parent {parent}\n" if parent else "") + f"parent {commit}\n"
    if not text.startswith(lead):
        raise AnswerRefused("the commit does not start with the tree and parent lines asked "
                            "for: a stamp of something else")
    _, pos = _identity(text, len(lead), "author", uid, now)
    t, pos = _identity(text, pos, "committer", uid, now)
    begin, end = PGP if fmt == "openpgp" else SSH
    first = f"{header} {begin}\n"
    if not text.startswith(first, pos):
        line = text[pos:].split("\n", 1)[0]
        raise AnswerRefused(f"expected '{first.strip()}' after the committer line, got "
                            f"{line[:80]!r}")
    closing = text.find(f"\n {end}\n", pos)
    if closing < 0:
        raise AnswerRefused(f"the {header} header does not end with ' {end}'")
    after = closing + len(end) + 3
    folded = text[pos + len(first):closing + 1].split("\n")[:-1]
    if any(not line.startswith(" ") for line in folded):
        raise AnswerRefused(f"the {header} header is not folded with one space")
    lines = [line[1:] for line in folded]
    _check_armor(lines, fmt)
    if not text.startswith("\n", after):
        raise AnswerRefused(f"more headers follow {header}")
    if _signature_lines(text[:pos] + text[after:]) or "\ngpgsig" in text[after:]:
        raise AnswerRefused("the commit carries more than one signature")
    signature = "\n".join([begin, *lines, end]) + "\n"
    return Checked(text=text, payload=(text[:pos] + text[after:]).encode("ascii"),
                   signature=signature, time=t)


# --------------------------------------------------------------------------- trusted keys


@dataclass(frozen=True)
class OpenPgpTrust:
    fingerprints: frozenset[str]  # every (sub)key fingerprint of the trusted keys
    primary: str
    uid: str
    armored: bytes
    origin: str
    pins: tuple[tuple[str, str], ...] = ()  # git config to write once a stamp is stored


@dataclass(frozen=True)
class SshTrust:
    key: SshPublicKey
    origin: str
    pins: tuple[tuple[str, str], ...] = ()


def pin_name(server: str) -> str:
    """The git config subsection ``git timestamp`` pins a server's key under: the URL without
    scheme and trailing slashes, every character other than 0-9 and a-z as ``-``."""
    name = re.sub(r"^https?://", "", server).rstrip("/")
    return "".join(c if c.isdigit() or "a" <= c <= "z" else "-" for c in name)


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
                            f"key of {server}, now pinned as {variable}", pins)
    if not trust.primary.endswith(pinned.upper()) or len(pinned) < 16:
        raise StampFailed(f"the key of {server} is {trust.primary}, not the pinned {pinned} "
                          f"(git config {variable}); if you trust the new key, remove the pin "
                          f"with git config --unset {variable} (add --global where it is "
                          "set there)")
    return OpenPgpTrust(trust.fingerprints, trust.primary, trust.uid, armored,
                        f"key of {server}, pinned as {variable}")


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
                        ((variable, served[0].fingerprint),))
    found = next((k for k in served if k.fingerprint == wanted), None)
    if found is None:
        where = "given" if key else f"pinned as {variable}"
        raise StampFailed(f"{server} does not serve the SSH key {wanted} ({where})")
    return SshTrust(found, f"SSH key of {server}, {'given' if key else 'pinned'}")


def verify_openpgp(checked: Checked, trust: OpenPgpTrust, now: int) -> str:
    """The signing key's fingerprint; `AnswerRefused` unless exactly one binary signature by
    the trusted key, made within the clock skew, verifies."""
    try:
        with TempGpgHome(KEYRING_PREFIX) as home:
            home.import_keys(trust.armored)
            ok, status = home.verify_detached(checked.payload, checked.signature)
    except GpgError as e:
        raise StampFailed(e.message) from None
    if status.newsig > 1 or len(status.valid_sigs) > 1:
        raise AnswerRefused("more than one signature")
    if not ok or len(status.valid_sigs) != 1:
        reason = ", ".join(sorted(set(status.errors))) or "no valid signature"
        raise AnswerRefused(f"the signature does not verify with the {trust.origin} ({reason})")
    sig = status.valid_sigs[0]
    if sig.primary not in trust.fingerprints and sig.fingerprint not in trust.fingerprints:
        raise AnswerRefused(f"signed by {sig.primary}, not by the {trust.origin}")
    if sig.sig_class != "00":
        raise AnswerRefused(f"signature class {sig.sig_class} is not a binary signature (00)")
    if abs(sig.created - now) >= CLOCK_SKEW:
        raise AnswerRefused(f"the signature was made {sig.created - now:+d} s off this "
                            "computer's clock")
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
    with tempfile.TemporaryDirectory(prefix="stampd-s") as tmp:
        signers, sig = Path(tmp) / "allowed_signers", Path(tmp) / "stamp.sig"
        signers.write_text(f'stamp@stampd namespaces="{SSH_NAMESPACE}" '
                           f"{trust.key.to_line(comment=False)}\n", encoding="ascii")
        sig.write_text(checked.signature, encoding="ascii")
        try:
            r = subprocess.run(["ssh-keygen", "-Y", "verify", "-n", SSH_NAMESPACE, "-f",
                                str(signers), "-I", "stamp@stampd", "-s", str(sig)],
                               input=checked.payload, capture_output=True, timeout=60,
                               check=False)
        except FileNotFoundError:
            raise StampFailed("ssh-keygen is not installed (OpenSSH 8.2 or later)") from None
    if r.returncode != 0:
        detail = r.stderr.decode("utf-8", "replace").strip().splitlines()
        raise AnswerRefused("the SSH signature does not verify with the "
                            f"{trust.origin}: {detail[-1] if detail else r.returncode}")
    return trust.key.fingerprint


# --------------------------------------------------------------------------- git and HTTP


def git(repo: Path, *args: str, input: str | None = None, failure: type[StampFailed] =
        StampFailed) -> str:
    try:
        r = subprocess.run(["git", "-C", str(repo), *args], input=input, capture_output=True,
                           text=True, timeout=60, check=False)
    except FileNotFoundError:
        raise StampFailed("git is not installed") from None
    if r.returncode != 0:
        detail = r.stderr.strip().splitlines()
        raise failure(f"git {' '.join(args[:2])}: {detail[-1] if detail else r.returncode}")
    return r.stdout.strip()


def git_config(repo: Path, name: str) -> str | None:
    try:
        return git(repo, "config", "--get", name) or None
    except StampFailed:
        return None


def resolve(repo: Path, name: str, kind: str) -> str | None:
    try:
        return git(repo, "rev-parse", "--verify", "--quiet", f"{name}^{{{kind}}}")
    except StampFailed:
        return None


def server_url(repo: Path, given: str | None) -> str:
    """``--server``, else ``$STAMPD_SERVER``, else ``git config timestamp.server`` (its first
    entry, as ``git timestamp`` takes for one tag or branch); ``https://`` is added to a URL
    without a scheme, as ``git timestamp`` does."""
    server = given or os.environ.get(SERVER_ENV) or git_config(repo, "timestamp.server")
    if not server:
        raise UsageError(f"no server: give --server URL, set {SERVER_ENV}, or git config "
                         "timestamp.server URL")
    server = server.split(",")[0].strip()
    if "://" not in server:
        server = "https://" + server
    parts = urllib.parse.urlsplit(server)
    if parts.scheme not in ("http", "https") or not parts.hostname \
            or any(not ("!" <= c <= "~") for c in server):
        raise UsageError(f"the server must be an http:// or https:// URL, not {server!r}")
    return server


def post(server: str, form: dict[str, str]) -> str:
    try:
        body = http_request(server, form=form, timeout=HTTP_TIMEOUT, limit=MAX_STAMP)
    except FetchError as e:
        if e.status is not None:
            raise StampFailed(f"{server} answered HTTP {e.status}: {e.reason}") from None
        raise StampFailed(f"cannot reach {server}: {e.reason}") from None
    if len(body) > MAX_STAMP:
        raise AnswerRefused(f"the answer is longer than {MAX_STAMP} bytes")
    return body.decode("latin-1")


# --------------------------------------------------------------------------- the command


@dataclass(frozen=True)
class Stored:
    kind: str  # "tag" or "branch"
    ref: str
    oid: str
    old: str | None  # the branch's previous head
    commit: str
    time: int
    signer: str  # fingerprint of the key that signed
    origin: str  # where the trusted key came from
    server: str


def stamp(repo: Path, *, server: str | None, tag: str | None, branch: str | None,
          commit: str = "HEAD", fmt: str | None = None, key: str | None = None,
          clock: Callable[[], float] = time.time) -> Stored:
    """Obtain, check and store one tag or branch stamp; raise a `StampFailed`."""
    if (tag is None) == (branch is None):
        raise UsageError("give exactly one of --tag NAME and --branch NAME")
    name = tag if tag is not None else branch
    assert name is not None
    if fmt is None:
        fmt = "ssh" if key is not None and key.startswith("SHA256:") else "openpgp"
    if fmt not in ("openpgp", "ssh"):
        raise UsageError(f"--format must be openpgp or ssh, not {fmt!r}")
    if fmt == "openpgp" and key is not None and key.startswith("SHA256:"):
        raise UsageError("an SSH key fingerprint (--key SHA256:...) goes with --format ssh")
    git(repo, "rev-parse", "--git-dir", failure=UsageError)
    ref = f"refs/tags/{name}" if tag is not None else f"refs/heads/{name}"
    if not _NAME.fullmatch(name) or ".." in name \
            or subprocess.run(["git", "check-ref-format", ref], capture_output=True,
                              check=False).returncode != 0:
        raise UsageError(f"{name!r} is not a valid {'tag' if tag else 'branch'} name for a "
                         "stamp ([_a-zA-Z][-._a-zA-Z0-9]{0,99}, no '..')")
    try:
        object_format = git(repo, "rev-parse", "--show-object-format")
    except StampFailed:
        object_format = SHA1  # git before 2.25 knows only SHA-1
    if object_format not in OBJECT_FORMATS:
        raise UsageError(f"repositories with {object_format} object ids cannot be stamped")
    header = OBJECT_FORMATS[object_format][1]
    target = resolve(repo, commit, "commit")
    tree = resolve(repo, commit, "tree")
    if target is None or tree is None:
        raise UsageError(f"{commit!r} is not a commit in {repo}")
    url = server_url(repo, server)

    form = {"request": "stamp-tag-v1" if tag else "stamp-branch-v1", "commit": target}
    old = None
    if tag is not None:
        form["tagname"] = tag
        if resolve(repo, ref, "object") is not None:
            raise UsageError(f"tag {tag} exists already")
    else:
        form["tree"] = tree
        old = resolve(repo, ref, "commit")
        if old is not None:
            if old == target:
                raise UsageError(f"{commit} is the head of {name}: a branch cannot stamp itself")
            if target in git(repo, "rev-parse", f"{old}^@").split():
                raise UsageError(f"{target} is stamped on {name} already")
            form["parent"] = old

    # The OpenPGP key gives the user id of the stamps (SSH keys have none), and signs them
    # unless they are SSH-signed.
    pgp = openpgp_trust(repo, url, Path(key) if fmt == "openpgp" and key else None)
    ssh = ssh_trust(repo, url, key) if fmt == "ssh" else None
    if ssh is not None:
        form["format"] = "ssh"
        form["key"] = ssh.key.fingerprint

    answer = post(url, form)
    now = int(clock())
    if tag is not None:
        checked = check_tag_answer(answer, commit=target, tagname=tag, uid=pgp.uid, fmt=fmt,
                                   now=now)
    else:
        checked = check_branch_answer(answer, tree=tree, commit=target, parent=old,
                                      uid=pgp.uid, fmt=fmt, header=header, now=now)
    if ssh is not None:
        signer, origin = verify_ssh(checked, ssh), ssh.origin
    else:
        signer, origin = verify_openpgp(checked, pgp, now), pgp.origin

    if tag is not None:
        oid = git(repo, "mktag", input=answer)
        git(repo, "update-ref", "-m", f"stampd: timestamp of {target}", ref, oid, "")
    else:
        oid = git(repo, "hash-object", "-t", "commit", "-w", "--stdin", input=answer)
        try:
            git(repo, "update-ref", "-m", f"stampd: timestamp of {target}", ref, oid, old or "")
        except StampFailed as e:
            raise StampFailed(f"{name} moved meanwhile; nothing stored ({e.message})") from None
    # Trust on first use: the keys are pinned once a stamp they signed is stored.
    for variable, value in pgp.pins + (ssh.pins if ssh is not None else ()):
        git(repo, "config", "--local", variable, value)
    return Stored(kind="tag" if tag else "branch", ref=ref, oid=oid, old=old, commit=target,
                  time=checked.time, signer=signer, origin=origin, server=url)


def report(res: Stored) -> list[str]:
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(res.time))
    lines = [f"{res.kind} stamp:     {res.ref} = {res.oid}",
             f"stamps commit: {res.commit}"]
    if res.old:
        lines.append(f"chained on:    {res.old}")
    lines += [f"time:          {when} ({res.time})",
              f"key:           {res.signer} ({res.origin})",
              f"server:        {res.server}"]
    return lines


# --------------------------------------------------------------------------- files


MANIFEST_SLACK = 64 * 1024  # bytes an answer may have beyond the lines sent (header, signature)


@dataclass(frozen=True)
class Written:
    path: Path
    files: int
    skipped: list[Skipped]
    header: Header
    signer: str
    origin: str
    url: str


def _same_server(a: str, b: str) -> bool:
    pa, pb = urllib.parse.urlsplit(a), urllib.parse.urlsplit(b)
    return (pa.scheme.lower(), pa.netloc.lower(), pa.path.rstrip("/")) \
        == (pb.scheme.lower(), pb.netloc.lower(), pb.path.rstrip("/"))


def check_manifest_answer(data: bytes, *, body: str, algorithm: str, fmt: str, server: str,
                          openpgp: bytes | None, ssh: SshPublicKey | None, origin: str,
                          asked: int, now: int) -> tuple[SignedManifest, str]:
    """(the manifest, its signer's fingerprint) when ``data`` is a signed manifest of exactly
    ``body``, by the trusted key, from ``server``, made between ``asked`` and ``now`` (within
    the clock skew); `AnswerRefused` otherwise."""
    try:
        manifest = parse_manifest(data)
        if manifest.format != fmt:
            raise AnswerRefused(f"the manifest is {manifest.format}-signed (asked for {fmt})")
        signer = verify_manifest_signature(manifest, openpgp=openpgp,
                                           ssh=[ssh] if ssh is not None else [], origin=origin)
    except CannotCheck as e:  # gpg or ssh-keygen missing: not the answer's fault
        raise StampFailed(e.message) from None
    except VerifyError as e:
        raise AnswerRefused(e.message) from None
    h = manifest.header
    if manifest.lines != body:
        sent = body.count("\n")
        raise AnswerRefused(f"the lines signed are not the {sent} lines sent ({h.lines} lines "
                            "signed): a stamp of another manifest")
    if h.algorithm != algorithm:
        raise AnswerRefused(f"the header says algorithm {h.algorithm}, not {algorithm}")
    if not asked - CLOCK_SKEW < h.time < now + CLOCK_SKEW:
        raise AnswerRefused(f"the manifest's time {h.time} is off this computer's clock "
                            f"(asked at {asked}, answered by {now}; {CLOCK_SKEW} s allowed)")
    if not _same_server(h.server, server):
        raise AnswerRefused(f"the manifest names the server {h.server}, not {server}")
    return manifest, signer


def post_manifest(server: str, body: bytes, query: dict[str, str]) -> bytes:
    url = server.rstrip("/") + "/v1/manifests"
    if query:
        url += "?" + urllib.parse.urlencode(query)
    limit = len(body) + MANIFEST_SLACK
    try:
        answer = http_request(url, data=body, content_type="text/plain", limit=limit,
                              timeout=HTTP_TIMEOUT + len(body) / (1 << 20))
    except FetchError as e:
        if e.status is not None:
            raise StampFailed(f"{url} answered HTTP {e.status}: {e.reason}") from None
        raise StampFailed(f"cannot reach {server}: {e.reason}") from None
    if len(answer) > limit:
        raise AnswerRefused(f"the answer is more than {MANIFEST_SLACK} bytes longer than the "
                            "manifest sent")
    return answer


def _write_atomically(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent or Path("."))
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _in_repository(repo: Path) -> bool:
    try:
        git(repo, "rev-parse", "--git-dir")
    except StampFailed:
        return False
    return True


def stamp_files(paths: list[Path], *, server: str | None, output: Path | None = None,
                algorithm: str = "sha256", fmt: str | None = None, key: str | None = None,
                repo: Path = Path("."), clock: Callable[[], float] = time.time) -> Written:
    """Hash the files under ``paths``, have one manifest of them stamped, check the answer and
    only then write it to ``output`` (default ``SHA256SUMS.asc``); raise a `StampFailed`."""
    if algorithm not in ALGORITHMS:
        raise UsageError(f"--algorithm must be sha256 or sha512, not {algorithm!r}")
    if fmt is None:
        fmt = "ssh" if key is not None and key.startswith("SHA256:") else "openpgp"
    if fmt == "openpgp" and key is not None and key.startswith("SHA256:"):
        raise UsageError("an SSH key fingerprint (--key SHA256:...) goes with --format ssh")
    if output is None:
        output = Path(f"{algorithm.upper()}SUMS.asc")
    if output.is_dir():
        raise UsageError(f"-o {output} is a directory")
    url = server_url(repo, server)
    try:
        files, skipped = collect(paths, exclude=output)
        size = sum(f.size for f in files)
        lines = hash_files(files, algorithm, Progress("hashing", len(files), size))
    except FilesError as e:
        raise UsageError(e.message) from None
    body = "\n".join(lines) + "\n"

    query: dict[str, str] = {}
    pins: tuple[tuple[str, str], ...] = ()
    openpgp: bytes | None = None
    ssh: SshPublicKey | None = None
    if fmt == "ssh":
        trust = ssh_trust(repo, url, key)
        ssh, origin, pins = trust.key, trust.origin, trust.pins
        query = {"format": "ssh", "key": trust.key.fingerprint}
    else:
        pgp = openpgp_trust(repo, url, Path(key) if key else None)
        openpgp, origin, pins = pgp.armored, pgp.origin, pgp.pins

    asked = int(clock())
    answer = post_manifest(url, body.encode("utf-8"), query)
    manifest, signer = check_manifest_answer(
        answer, body=body, algorithm=algorithm, fmt=fmt, server=url, openpgp=openpgp, ssh=ssh,
        origin=origin, asked=asked, now=int(clock()))
    try:
        _write_atomically(output, answer)
    except OSError as e:
        raise StampFailed(f"cannot write {output}: {e.strerror} (the manifest is stamped: "
                          f"GET {url.rstrip('/')}/v1/manifests/{manifest.header.serial})"
                          ) from None
    # Trust on first use, as for git stamps: the key is pinned in the repository's config (a
    # pin in any git config scope is honoured); outside a repository nothing is pinned.
    if pins and _in_repository(repo):
        for variable, value in pins:
            git(repo, "config", "--local", variable, value)
    elif pins:
        origin = (origin.split(", now pinned")[0] + " (not pinned: no git repository here; "
                  "give --key to trust a key you hold)")
    return Written(output, len(files), skipped, manifest.header, signer, origin, url)


def report_written(res: Written) -> list[str]:
    h = res.header
    return [f"manifest:      {res.path} ({res.files} files, {h.algorithm})",
            f"time:          {h.utc} ({h.time})",
            f"key:           {res.signer} ({res.origin})",
            f"server:        {h.server} (serial {h.serial})"]


def cmd_stamp(args: argparse.Namespace) -> int:
    """``stampd stamp (--tag NAME | --branch NAME) [COMMIT]`` or ``stampd stamp FILE|DIR...
    [-o FILE] [--algorithm sha256|sha512]``, with ``[--server URL] [--format openpgp|ssh]
    [--key FILE|SHA256:...] [--repo DIR]``: 0 when stored; otherwise raise a `StampFailed`
    (exit status 1, 2 or 3)."""
    positional: list[str] = list(getattr(args, "paths", None) or [])
    if args.tag is None and args.branch is None:
        if not positional:
            raise UsageError("give FILE|DIR... to stamp files, or --tag NAME / --branch NAME "
                             "for a git stamp")
        res = stamp_files([Path(p) for p in positional], server=args.server,
                          output=getattr(args, "output", None),
                          algorithm=getattr(args, "algorithm", None) or "sha256",
                          fmt=args.format, key=args.key, repo=args.repo)
        for item in res.skipped:
            print(f"stampd stamp: skipped {item.path}: {item.why}", file=sys.stderr)
        print("\n".join(report_written(res)))
        if res.skipped:
            print(f"skipped:       {len(res.skipped)} (not regular files; named on stderr)")
        return 0
    if getattr(args, "output", None) is not None or getattr(args, "algorithm", None):
        raise UsageError("-o and --algorithm are for stamping files, not git stamps")
    if len(positional) > 1:
        raise UsageError("a git stamp is of one COMMIT")
    res_git = stamp(args.repo, server=args.server, tag=args.tag, branch=args.branch,
                    commit=positional[0] if positional else "HEAD", fmt=args.format,
                    key=args.key)
    print("\n".join(report(res_git)))
    return 0
