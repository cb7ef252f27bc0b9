"""The checks on a server's answers, before anything is stored: a ``stamp-tag-v1`` or
``stamp-branch-v1`` git object checked as ``git timestamp`` does (all but its signature's
verification, which `client.stamp.trust` does), and a signed files manifest from
``POST /v1/manifests``. Each raises `AnswerRefused`."""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass

from client.stamp.errors import AnswerRefused, StampFailed
from client.verify.errors import CannotCheck, VerifyError
from client.verify.manifest import SignedManifest, parse_manifest, verify_manifest_signature
from formats.sshsig import SshPublicKey

MAX_STAMP = 8000
CLOCK_SKEW = 30  # seconds; a time must lie strictly within this of our clock
PGP = ("-----BEGIN PGP SIGNATURE-----", "-----END PGP SIGNATURE-----")
SSH = ("-----BEGIN SSH SIGNATURE-----", "-----END SSH SIGNATURE-----")
_ARMOR_LINE = re.compile(r"[A-Za-z0-9+/=]+")


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

