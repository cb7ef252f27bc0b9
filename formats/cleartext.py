"""OpenPGP cleartext signatures (RFC 4880 section 7), built in-process.

The signed text is hashed in canonical form: lines end in CR LF, trailing spaces and tabs are
removed, and the line ending before ``-----BEGIN PGP SIGNATURE-----`` is not part of it. The
signature is a text signature (type 0x01). ``gpg --verify receipt.asc`` checks the result.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from formats.openpgp import (
    H_SHA256,
    H_SHA384,
    H_SHA512,
    KeyInfo,
    detached_signature,
    hash_algo_for,
)

SIG_TEXT = 0x01
ARMOR_HASH_NAMES = {H_SHA256: "SHA256", H_SHA384: "SHA384", H_SHA512: "SHA512"}
BEGIN_SIGNED = "-----BEGIN PGP SIGNED MESSAGE-----"


def canonical_text(text: str) -> bytes:
    """The bytes a cleartext signature covers: CR LF line ends, no trailing whitespace, no
    final line ending."""
    # The common case: no line ends in white space (any CR takes the general path).
    # Substring searches, not a regex: for a 74 MB manifest 0.13 s instead of 0.4 s.
    if not ("\r" in text or " \n" in text or "\t\n" in text or text.endswith((" ", "\t"))):
        return text.removesuffix("\n").replace("\n", "\r\n").encode("utf-8")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return "\r\n".join(line.rstrip(" \t\r") for line in lines).encode("utf-8")


PIECE = 1 << 20  # characters made canonical at a time (`canonical_pieces`)


def _plain(text: str) -> bool:
    """No CR and no line ending in white space: the canonical form only changes LF to CR LF."""
    return not ("\r" in text or " \n" in text or "\t\n" in text
                or text.endswith((" ", "\t")))


def canonical_pieces(texts: Sequence[str]) -> Iterator[bytes]:
    """`canonical_text` of the concatenated ``texts``, a piece at a time: a long text (a
    manifest) is never copied whole, once as CR LF text and again as bytes."""
    if not all(_plain(t) for t in texts):
        yield canonical_text("".join(texts))
        return
    last = len(texts) - 1
    for n, text in enumerate(texts):
        end = len(text) - 1 if n == last and text.endswith("\n") else len(text)
        for i in range(0, end, PIECE):
            yield text[i:min(end, i + PIECE)].replace("\n", "\r\n").encode("utf-8")


def dash_escape(text: str) -> str:
    if not text.startswith("-") and "\n-" not in text:
        return text if text.endswith("\n") else text + "\n"
    return "".join(("- " + line if line.startswith("-") else line) + "\n"
                   for line in text.rstrip("\n").split("\n"))


def clearsign_parts(text: str | Sequence[str], key: KeyInfo, created: int,
                    sign: Callable[[int, bytes], Sequence[int]]) -> tuple[str, str]:
    """(armor head, signature block) of ``text`` cleartext-signed: the message is the head,
    ``text`` dash-escaped, then the signature block. ``text`` may come in parts (a manifest's
    header and its lines), hashed a piece at a time, not joined."""
    parts = (text,) if isinstance(text, str) else text
    signature = detached_signature(canonical_pieces(parts), key, created, sign,
                                   sig_type=SIG_TEXT)
    return f"{BEGIN_SIGNED}\nHash: {ARMOR_HASH_NAMES[hash_algo_for(key)]}\n\n", signature


def clearsign(text: str, key: KeyInfo, created: int,
              sign: Callable[[int, bytes], Sequence[int]]) -> str:
    """``text`` (LF line ends) as a cleartext-signed message by ``key`` made at ``created``."""
    head, signature = clearsign_parts(text, key, created, sign)
    return head + dash_escape(text) + signature
