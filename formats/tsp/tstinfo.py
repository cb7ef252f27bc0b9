"""The ``TSTInfo``, what a token says (RFC 3161 §2.4.2): the hash, the time, a serial and the
policy, as :class:`TokenFields`; :func:`tst_info` encodes them, :func:`tst_info_fields` reads
them back."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from asn1crypto import core, tsp, x509

from formats.tsp.algorithms import HASH_ALGORITHMS, HASH_BY_OID, MAX_NONCE_BITS
from formats.tsp.der import digest_algorithm_identifier, encoded, sequence
from formats.tsp.errors import TspError

__all__ = ["TokenFields", "tst_info", "tst_info_fields"]


@dataclass(frozen=True)
class TokenFields:
    """The content of a ``TSTInfo``.

    ``gen_time`` must be an aware datetime in UTC; it is encoded as GeneralizedTime with its
    microseconds as a fraction without trailing zeros (none at all for a whole second), as
    RFC 3161 §2.4.2 allows. Callers that want whole seconds pass a time with
    ``microsecond=0``. ``tsa_name`` (an ``asn1crypto.x509.Name``) is put in ``tsa`` as a
    directoryName.
    """

    policy: str
    hash_algorithm: str
    digest: bytes
    serial: int
    gen_time: datetime
    accuracy_seconds: int | None = None
    nonce: int | None = None
    tsa_name: x509.Name | None = None

    def __post_init__(self) -> None:
        if self.hash_algorithm not in HASH_ALGORITHMS:
            raise TspError(f"unknown hash algorithm {self.hash_algorithm!r}")
        if len(self.digest) != HASH_ALGORITHMS[self.hash_algorithm][1]:
            raise TspError(f"a {self.hash_algorithm} digest has the wrong length")
        if self.serial < 0 or self.serial.bit_length() > MAX_NONCE_BITS:
            raise TspError("the serial must be a non-negative integer of at most 160 bits")
        if self.gen_time.utcoffset() != timedelta(0):
            raise TspError("gen_time must be an aware datetime in UTC")
        if self.accuracy_seconds is not None and self.accuracy_seconds < 0:
            raise TspError("accuracy must not be negative")
        if self.nonce is not None and (self.nonce < 0 or self.nonce.bit_length() > MAX_NONCE_BITS):
            raise TspError("the nonce must be a non-negative integer of at most 160 bits")


def tst_info(fields: TokenFields) -> bytes:
    """The DER ``TSTInfo`` (version 1, ordering omitted, i.e. false) for ``fields``."""
    try:
        return _tst_info(fields)
    except (TypeError, ValueError) as exc:
        raise TspError(f"cannot encode the TSTInfo: {exc}") from exc


def _tst_info(fields: TokenFields) -> bytes:
    """The DER ``TSTInfo`` of ``fields``: the parts every token of a TSA shares (version,
    policy, imprint algorithm, accuracy, the TSA's name) as `encoded` keeps them, the others
    encoded as the type the schema gives them (ordering, false, is left out as its default)."""
    parts = [
        encoded(tsp.Version, "v1"),
        encoded(core.ObjectIdentifier, fields.policy),
        sequence(digest_algorithm_identifier(fields.hash_algorithm),  # MessageImprint
                 core.OctetString(fields.digest).dump()),
        core.Integer(fields.serial).dump(),
        core.GeneralizedTime(fields.gen_time).dump(),
    ]
    if fields.accuracy_seconds is not None:
        parts.append(_accuracy(fields.accuracy_seconds))
    if fields.nonce is not None:
        parts.append(core.Integer(fields.nonce).dump())
    if fields.tsa_name is not None:
        name = fields.tsa_name  # (one read from a token is still tagged as its directoryName)
        untagged = name.untag() if name.explicit or name.implicit else name
        parts.append(_tsa_name(untagged.dump()))
    return sequence(*parts)


@functools.lru_cache(maxsize=8)
def _accuracy(seconds: int) -> bytes:
    return bytes(tsp.Accuracy({"seconds": seconds}).dump())


@functools.lru_cache(maxsize=8)
def _tsa_name(name_der: bytes) -> bytes:
    """The TSTInfo's ``tsa [0] EXPLICIT GeneralName`` (a directoryName) of a DER Name."""
    name = x509.GeneralName(name="directory_name", value=x509.Name.load(name_der))
    return bytes(name.retag({"explicit": 0}).dump())


def tst_info_fields(tst: tsp.TSTInfo) -> TokenFields:
    """The fields of a parsed ``TSTInfo`` (version 1, a hash algorithm of
    `formats.tsp.algorithms.HASH_ALGORITHMS`), checked as `TokenFields` checks them."""
    if int(tst["version"]) != 1:
        raise TspError("the TSTInfo is not version 1")
    name = HASH_BY_OID.get(tst["message_imprint"]["hash_algorithm"]["algorithm"].dotted)
    if name is None:
        raise TspError("the TSTInfo uses an unknown hash algorithm")
    accuracy = tst["accuracy"].native
    tsa = tst["tsa"]
    return TokenFields(
        policy=tst["policy"].dotted,
        hash_algorithm=name,
        digest=tst["message_imprint"]["hashed_message"].native,
        serial=tst["serial_number"].native,
        gen_time=tst["gen_time"].native.astimezone(UTC),
        accuracy_seconds=accuracy.get("seconds") if accuracy else None,
        nonce=tst["nonce"].native,
        tsa_name=tsa.chosen if tsa.native is not None and tsa.name == "directory_name" else None,
    )
