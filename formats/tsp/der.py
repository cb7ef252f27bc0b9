"""The DER building blocks of tokens: constructed levels joined from their children's DER,
and the constant parts encoded once.

All DER is built and parsed with asn1crypto, never by hand. Like OpenSSL, asn1crypto writes the
SHA-2 AlgorithmIdentifiers with NULL parameters (RFC 5754 §2 says to accept both forms).
"""

from __future__ import annotations

import functools
from datetime import UTC, datetime, timedelta

from asn1crypto import algos, core

from formats.tsp.errors import TspError

__all__ = [
    "digest_algorithm_identifier",
    "encoded",
    "sequence",
    "set_of",
    "set_of_contents",
    "time_choice",
]

_UTC_TIME_LIMIT = datetime(2050, 1, 1, tzinfo=UTC)  # RFC 5280 §4.1.2.5


# The parts of every token that are the same for a certificate (or an algorithm, a policy) are
# encoded once and kept as DER bytes (`encoded`, `digest_algorithm_identifier` and the caches
# of formats.tsp.tstinfo and formats.tsp.token). The parts that change from token to token
# (imprint, serial, genTime, nonce, messageDigest, signature) are each encoded by the
# asn1crypto type of their field (`core.Integer(serial).dump()`...). Each constructed level is
# a generic asn1crypto value of its tag whose contents are its children's DER joined
# (`sequence`, `set_of`; asn1crypto's implicit or explicit tagging where the schema tags it),
# so asn1crypto still writes every tag and length and the schema's order and optional fields
# are kept by hand, where each level is built. Why not fill asn1crypto's schema classes
# (tsp.TSTInfo, cms.SignerInfo...): setting a field converts, checks, tags and deep-copies the
# value, and a value as built is encoded again each time its parent asks. build_token took
# 5.3 ms with every part built from native values in one tree, 0.52 ms with the constant parts
# loaded back from their DER into the schema classes (some 1,950 Python calls a token), and
# about 0.12 ms built as here (some 440 calls, most of them in the `dump` of each level;
# `python -m bench.build_token`, whose fake signer's `ecdsa_signature`, made the same way, is
# counted in). test_tsp.py holds the tokens byte for byte to ones built the plain way, from
# native values.


def sequence(*parts: bytes, **tagging: int) -> bytes:
    """The DER ``SEQUENCE`` of the DER ``parts`` (``tagging``: its implicit or explicit tag)."""
    return bytes(core.Sequence(contents=b"".join(parts), **tagging).dump())


def set_of(*parts: bytes) -> bytes:
    """The DER ``SET OF`` the DER ``parts``, sorted as DER (and asn1crypto) sort them."""
    return set_of_contents(b"".join(sorted(parts)))


def set_of_contents(contents: bytes, **tagging: int) -> bytes:
    """The DER ``SET OF`` whose contents are ``contents``, elements already in order
    (``tagging`` as `sequence`)."""
    return bytes(core.SetOf(contents=contents, **tagging).dump())


@functools.lru_cache(maxsize=32)
def encoded(kind: type[core.Asn1Value], value: object) -> bytes:
    """The DER of a simple value (an OID, a version) from its native value, once."""
    return bytes(kind(value).dump())


@functools.lru_cache(maxsize=8)
def digest_algorithm_identifier(name: str) -> bytes:
    """The DER ``DigestAlgorithmIdentifier`` of the hash ``name``, once."""
    return bytes(algos.DigestAlgorithm({"algorithm": name}).dump())


def time_choice(choice: type[core.Choice], generalized: str, moment: datetime) -> core.Choice:
    """``moment`` as UTCTime before 2050 and GeneralizedTime from then on (RFC 5280 §4.1.2.5,
    RFC 5652 §11.3), in whole seconds; ``generalized`` is the choice's name for the latter."""
    if moment.utcoffset() != timedelta(0):
        raise TspError("times must be aware datetimes in UTC")
    moment = moment.replace(microsecond=0)
    if moment < _UTC_TIME_LIMIT:
        return choice(name="utc_time", value=moment)
    return choice(name=generalized, value=moment)
