"""Canonical S-expressions, as gpg-agent returns them.

gpg-agent answers ``PKSIGN`` with a libgcrypt signature in canonical S-expression form
(Rivest's ``csexp``): every atom is ``<decimal length>:<raw bytes>``, lists are parenthesised
and there is no whitespace, e.g.::

    (7:sig-val(5:eddsa(1:r32:<32 bytes>)(1:s32:<32 bytes>)))
    (7:sig-val(3:rsa(1:s256:<256 bytes>)))
    (7:sig-val(5:ecdsa(1:r32:<32 bytes>)(1:s32:<32 bytes>)))
    (7:sig-val(3:dsa(1:r32:...)(1:s32:...)))

Atoms are arbitrary binary data. Integers are big-endian octet strings that may be shorter than
the group order or carry a leading zero byte (libgcrypt's two's-complement form);
:func:`signature_values` reads them as unsigned integers, which is what OpenPGP MPIs need.
``READKEY`` answers with the public key in the same form, which :func:`public_key` turns into
the X.509 ``SubjectPublicKeyInfo`` a TSA certificate carries::

    (public-key(ecc(curve10:NIST P-256)(q65:<04 || x || y>)))
    (public-key(rsa(n385:<modulus>)(e3:<exponent>)))

Everything here is pure: no I/O.
"""

from __future__ import annotations

from typing import TypeAlias

__all__ = [
    "SExp",
    "SexpError",
    "parse_canonical_sexp",
    "public_key",
    "signature_values",
]

SExp: TypeAlias = bytes | list["SExp"]
"""A parsed S-expression: an atom (``bytes``) or a list of S-expressions."""

# A list nested deeper than this is not a signature: refuse it instead of recursing forever.
_MAX_DEPTH = 32
# Length prefixes longer than this many digits cannot describe anything gpg-agent sends.
_MAX_LENGTH_DIGITS = 9


class SexpError(ValueError):
    """The bytes are not a canonical S-expression, or not the expected signature shape."""


def parse_canonical_sexp(data: bytes) -> list[SExp]:
    """Parse one canonical S-expression that must be a list and fill all of ``data``.

    Returns the top-level list, atoms as ``bytes``, nested lists as ``list``. Display hints
    (``[hint]atom``) are rejected: gpg-agent never sends them in signatures.
    """
    data = bytes(data)
    stack: list[list[SExp]] = []
    result: list[SExp] | None = None
    pos = 0
    end = len(data)
    while pos < end:
        if result is not None:
            raise SexpError(f"trailing data after S-expression at offset {pos}")
        char = data[pos]
        if char == 0x28:  # "("
            if len(stack) >= _MAX_DEPTH:
                raise SexpError(f"S-expression nested deeper than {_MAX_DEPTH}")
            new: list[SExp] = []
            if stack:
                stack[-1].append(new)
            stack.append(new)
            pos += 1
        elif char == 0x29:  # ")"
            if not stack:
                raise SexpError(f"unbalanced ')' at offset {pos}")
            done = stack.pop()
            if not stack:
                result = done
            pos += 1
        elif 0x30 <= char <= 0x39:  # a digit: "<length>:<bytes>"
            if not stack:
                raise SexpError("S-expression must be a list")
            colon = data.find(b":", pos, pos + _MAX_LENGTH_DIGITS + 1)
            digits = data[pos:colon] if colon >= 0 else b""
            if not digits.isdigit():
                raise SexpError(f"bad atom length at offset {pos}")
            if len(digits) > 1 and digits[0] == 0x30:
                raise SexpError(f"atom length with a leading zero at offset {pos}")
            length = int(digits)
            start = colon + 1
            if start + length > end:
                raise SexpError(f"atom at offset {pos} runs past the end of the data")
            stack[-1].append(data[start : start + length])
            pos = start + length
        else:
            raise SexpError(f"unexpected byte 0x{char:02x} at offset {pos}")
    if stack or result is None:
        raise SexpError("truncated S-expression")
    return result


def _find(items: list[SExp], name: bytes) -> list[SExp] | None:
    """The first sublist of ``items`` whose first element is the atom ``name``."""
    for item in items:
        if isinstance(item, list) and item and item[0] == name:
            return item
    return None


def _integer(params: list[SExp], name: str) -> int:
    entry = _find(params, name.encode())
    if entry is None or len(entry) != 2 or not isinstance(entry[1], bytes):
        raise SexpError(f"signature lacks the parameter {name!r}")
    if not entry[1]:
        raise SexpError(f"signature parameter {name!r} is empty")
    return int.from_bytes(entry[1], "big")


# Signature algorithms libgcrypt names in a sig-val, and their values in OpenPGP MPI order.
_PARAMETERS: dict[str, tuple[str, ...]] = {
    "rsa": ("s",),
    "dsa": ("r", "s"),
    "ecdsa": ("r", "s"),
    "eddsa": ("r", "s"),
}


def signature_values(sexp_bytes: bytes) -> tuple[str, list[int]]:
    """Algorithm name and signature values of a ``(sig-val ...)`` from gpg-agent.

    The values come back as non-negative integers in OpenPGP MPI order: RSA ``[s]``;
    DSA, ECDSA and EdDSA ``[r, s]``. EdDSA ``r`` and ``s`` are the 32-byte native encodings
    read as big-endian numbers, exactly how OpenPGP v4 (algorithm 22) stores them. Other
    elements of the algorithm list (``flags``, ``hash-algo``...) are ignored.
    """
    top = parse_canonical_sexp(sexp_bytes)
    if not top or top[0] != b"sig-val":
        raise SexpError("not a sig-val S-expression")
    if len(top) < 2 or not isinstance(top[1], list) or not top[1]:
        raise SexpError("sig-val lacks an algorithm list")
    algo_atom = top[1][0]
    if not isinstance(algo_atom, bytes):
        raise SexpError("sig-val algorithm name is not an atom")
    algo = algo_atom.decode("ascii", "replace").lower()
    params = top[1][1:]
    if algo == "ecc":  # libgcrypt's generic name; EdDSA signatures carry (flags eddsa)
        flags = _find(params, b"flags")
        algo = "eddsa" if flags is not None and b"eddsa" in flags[1:] else "ecdsa"
    names = _PARAMETERS.get(algo)
    if names is None:
        raise SexpError(f"unsupported signature algorithm {algo!r}")
    return algo, [_integer(params, name) for name in names]


# Curve names libgcrypt and gpg use for the curves a TSA key may have → the X.509 (RFC 5480)
# name asn1crypto knows. READKEY spells them "NIST P-256"; key listings "nistp256".
_X509_CURVES: dict[str, str] = {
    "nist p-256": "secp256r1",
    "nistp256": "secp256r1",
    "prime256v1": "secp256r1",
    "secp256r1": "secp256r1",
    "1.2.840.10045.3.1.7": "secp256r1",
    "nist p-384": "secp384r1",
    "nistp384": "secp384r1",
    "secp384r1": "secp384r1",
    "1.3.132.0.34": "secp384r1",
}


def _atom(params: list[SExp], name: bytes) -> bytes:
    entry = _find(params, name)
    if entry is None or len(entry) != 2 or not isinstance(entry[1], bytes) or not entry[1]:
        raise SexpError(f"public key lacks the parameter {name.decode()!r}")
    return entry[1]


def public_key(sexp_bytes: bytes) -> bytes:
    """The DER ``SubjectPublicKeyInfo`` of a ``(public-key ...)`` from gpg-agent's ``READKEY``.

    ECDSA keys on NIST P-256 and P-384 (``(ecc (curve ...) (q 04...))``, the curve named as
    libgcrypt or gpg spells it) and RSA keys (``(rsa (n ...) (e ...))``); :class:`SexpError`
    for anything else (ed25519, other curves, DSA) or a malformed expression.
    """
    # (asn1crypto: imported only where a TSA key is read)
    from formats.tsp.certificates import ec_public_key_info, rsa_public_key_info
    from formats.tsp.errors import TspError

    top = parse_canonical_sexp(sexp_bytes)
    if not top or top[0] != b"public-key":
        raise SexpError("not a public-key S-expression")
    if len(top) < 2 or not isinstance(top[1], list) or not top[1]:
        raise SexpError("public-key lacks an algorithm list")
    algo_atom = top[1][0]
    if not isinstance(algo_atom, bytes):
        raise SexpError("public-key algorithm name is not an atom")
    algo = algo_atom.decode("ascii", "replace").lower()
    params = top[1][1:]
    try:
        if algo in ("ecc", "ecdsa"):
            curve = _atom(params, b"curve").decode("ascii", "replace")
            x509_curve = _X509_CURVES.get(curve.lower())
            if x509_curve is None:
                raise SexpError(f"unsupported curve {curve!r} (NIST P-256 or P-384 only)")
            flags = _find(params, b"flags")
            if flags is not None and b"eddsa" in flags[1:]:
                raise SexpError("an EdDSA key is not an ECDSA key")
            return ec_public_key_info(x509_curve, _atom(params, b"q"))
        if algo == "rsa":
            n = int.from_bytes(_atom(params, b"n"), "big")
            e = int.from_bytes(_atom(params, b"e"), "big")
            return rsa_public_key_info(n, e)
    except TspError as exc:
        raise SexpError(f"unusable {algo} public key: {exc}") from exc
    raise SexpError(f"unsupported public-key algorithm {algo!r} (ECDSA or RSA only)")
