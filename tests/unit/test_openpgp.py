"""Pure tests of OpenPGP packet building (formats.openpgp) and S-expressions
(formats.sexp).

No gpg here: these pin the byte layout. tests/integration/test_agents.py checks the same code
against a real gpg-agent and ``gpg --verify``.
"""

from __future__ import annotations

import base64
import hashlib

import pytest

from formats import openpgp
from formats.openpgp import (
    H_SHA256,
    H_SHA384,
    H_SHA512,
    PK_DSA,
    PK_ECDSA,
    PK_EDDSA,
    PK_RSA,
    KeyInfo,
    armor_signature,
    crc24,
    dearmor_signature,
    detached_signature,
    encode_mpi,
    encode_packet,
    hash_algo_for,
    signature_digest,
    signature_hashed_part,
    signature_packet,
)
from formats.sexp import SexpError, parse_canonical_sexp, signature_values

FPR = "0123456789ABCDEF0123456789ABCDEF01234567"
GRIP = "FEDCBA9876543210FEDCBA9876543210FEDCBA98"


def key(algo: int = PK_EDDSA, bits: int = 255, curve: str | None = "ed25519") -> KeyInfo:
    return KeyInfo(
        fingerprint=FPR, keygrip=GRIP, pubkey_algo=algo, bits=bits, curve=curve, uid="T <t@e>"
    )


def read_new_format_packet(data: bytes) -> tuple[int, bytes, bytes]:
    """Independent decoder of one new-format packet: (tag, body, rest)."""
    assert data[0] & 0xC0 == 0xC0, "not a new-format packet"
    tag = data[0] & 0x3F
    first = data[1]
    if first < 192:
        length, start = first, 2
    elif first < 224:
        length, start = ((first - 192) << 8) + data[2] + 192, 3
    else:
        assert first == 255, "partial lengths are not used for signatures"
        length, start = int.from_bytes(data[2:6], "big"), 6
    return tag, data[start : start + length], data[start + length :]


def read_mpis(data: bytes) -> list[int]:
    values = []
    while data:
        bits = int.from_bytes(data[:2], "big")
        size = (bits + 7) // 8
        value = int.from_bytes(data[2 : 2 + size], "big")
        assert value.bit_length() == bits, "MPI bit count must be that of the value"
        values.append(value)
        data = data[2 + size :]
    return values


# ---------------------------------------------------------------------------------------------
# MPIs, lengths, CRC-24


@pytest.mark.parametrize(
    ("value", "encoded"),
    [
        (0, "0000"),
        (1, "000101"),
        (0x7F, "00077f"),
        (0x80, "000880"),
        (511, "000901ff"),  # the example of RFC 4880 3.2
        (0x0100, "00090100"),
        (int.from_bytes(b"\x00\x00\x01\x02", "big"), "00090102"),  # leading zero bytes dropped
        (int.from_bytes(b"\x00" + b"\xff" * 31, "big"), "00f8" + "ff" * 31),
        (2**255, "0100" + "80" + "00" * 31),
    ],
)
def test_encode_mpi(value: int, encoded: str) -> None:
    assert encode_mpi(value).hex() == encoded


def test_encode_mpi_of_32_byte_strings_with_leading_zeros() -> None:
    # EdDSA r/s and ECDSA values are fixed-size strings; their MPI drops the leading zeros.
    for raw in (b"\x00" + b"\x42" * 31, b"\x00\x00\x00\x01" + bytes(28), b"\x00\x80" + bytes(30)):
        value = int.from_bytes(raw, "big")
        mpi = encode_mpi(value)
        stripped = raw.lstrip(b"\x00")
        assert mpi[2:] == stripped
        assert int.from_bytes(mpi[:2], "big") == value.bit_length()
        assert read_mpis(mpi) == [value]


def test_encode_mpi_rejects_negative_and_huge() -> None:
    with pytest.raises(ValueError):
        encode_mpi(-1)
    with pytest.raises(ValueError):
        encode_mpi(1 << 0x10000)
    assert len(encode_mpi((1 << 0xFFFF) - 1)) == 2 + 8192


@pytest.mark.parametrize(
    ("length", "header"),
    [
        (0, "c200"),
        (100, "c264"),  # RFC 4880 4.2.3 examples: 100, 1723, 100000
        (191, "c2bf"),
        (192, "c2c000"),
        (1723, "c2c5fb"),
        (8383, "c2dfff"),
        (8384, "c2ff000020c0"),
        (100000, "c2ff000186a0"),
    ],
)
def test_packet_length_encoding(length: int, header: str) -> None:
    packet = encode_packet(2, b"\xaa" * length)
    assert packet[: len(header) // 2].hex() == header
    assert len(packet) == len(header) // 2 + length
    tag, body, rest = read_new_format_packet(packet)
    assert (tag, len(body), rest) == (2, length, b"")


def test_encode_packet_rejects_bad_tag() -> None:
    with pytest.raises(ValueError):
        encode_packet(64, b"")


def test_crc24_known_vectors() -> None:
    assert crc24(b"") == 0xB704CE  # the initial value
    assert crc24(b"123456789") == 0x21CF02  # CRC-24/OPENPGP check value


def test_crc24_matches_bitwise_definition() -> None:
    def bitwise(data: bytes) -> int:  # RFC 4880 6.1, literally
        crc = 0xB704CE
        for byte in data:
            crc ^= byte << 16
            for _ in range(8):
                crc <<= 1
                if crc & 0x1000000:
                    crc ^= 0x1864CFB
        return crc & 0xFFFFFF

    for data in (b"\x00", b"\xff" * 7, bytes(range(256)), b"stampd"):
        assert crc24(data) == bitwise(data)


# ---------------------------------------------------------------------------------------------
# Armor


@pytest.mark.parametrize("size", [1, 47, 48, 49, 95, 96, 97, 119, 600])
def test_armor_layout_without_headers(size: int) -> None:
    packet = bytes((i * 7 + 3) % 256 for i in range(size))
    text = armor_signature(packet)
    assert text.startswith("-----BEGIN PGP SIGNATURE-----\n\n")
    assert text.endswith("\n-----END PGP SIGNATURE-----\n")
    assert "Version" not in text and "Comment" not in text
    lines = text.split("\n")
    assert lines[1] == "" and lines[-1] == ""
    body, checksum = lines[2:-3], lines[-3]
    assert all(0 < len(line) <= 64 for line in body)
    assert all(len(line) == 64 for line in body[:-1])
    assert checksum == "=" + base64.b64encode(crc24(packet).to_bytes(3, "big")).decode()
    assert base64.b64decode("".join(body)) == packet
    assert text.isascii() and "\r" not in text
    assert dearmor_signature(text) == packet


def test_dearmor_accepts_gpg_style_headers_and_checks_crc() -> None:
    packet = b"\xc2\x03abc"
    text = armor_signature(packet)
    with_headers = text.replace("-----\n\n", "-----\nVersion: GnuPG v2\n\n", 1)
    assert dearmor_signature(with_headers.replace("\n", "\r\n")) == packet
    body = text.split("\n")
    body[-3] = "=AAAA"
    with pytest.raises(ValueError, match="checksum"):
        dearmor_signature("\n".join(body))
    with pytest.raises(ValueError):
        dearmor_signature("-----BEGIN PGP MESSAGE-----\n\nAAAA\n-----END PGP MESSAGE-----\n")


# ---------------------------------------------------------------------------------------------
# Hash choice


@pytest.mark.parametrize(
    ("algo", "bits", "curve", "expected"),
    [
        (PK_EDDSA, 255, "ed25519", H_SHA256),
        (PK_ECDSA, 256, "nistp256", H_SHA256),
        (PK_ECDSA, 256, "brainpoolP256r1", H_SHA256),
        (PK_ECDSA, 256, "secp256k1", H_SHA256),
        (PK_ECDSA, 384, "nistp384", H_SHA384),
        (PK_ECDSA, 384, "brainpoolP384r1", H_SHA384),
        (PK_ECDSA, 521, "nistp521", H_SHA512),
        (PK_ECDSA, 512, "brainpoolP512r1", H_SHA512),
        (PK_ECDSA, 320, "brainpoolP320r1", H_SHA384),  # unknown curves: by order size
        (PK_EDDSA, 448, "ed448", H_SHA512),
        (PK_RSA, 4096, None, H_SHA256),
        (PK_DSA, 3072, None, H_SHA256),
        (PK_DSA, 1024, None, H_SHA256),
    ],
)
def test_hash_algo_for(algo: int, bits: int, curve: str | None, expected: int) -> None:
    assert hash_algo_for(key(algo, bits, curve)) == expected


# ---------------------------------------------------------------------------------------------
# KeyInfo


def test_key_info_key_id_and_validation() -> None:
    assert key().key_id == "89ABCDEF01234567"
    with pytest.raises(ValueError, match="fingerprint"):
        KeyInfo(FPR.lower(), GRIP, PK_RSA, 2048, None, "u")
    with pytest.raises(ValueError, match="keygrip"):
        KeyInfo(FPR, GRIP[:-1], PK_RSA, 2048, None, "u")
    with pytest.raises(ValueError, match="algorithm"):
        KeyInfo(FPR, GRIP, 18, 255, "cv25519", "u")  # ECDH cannot sign


# ---------------------------------------------------------------------------------------------
# Signature packet


def test_hashed_part_bytes() -> None:
    hashed = signature_hashed_part(key(), 0x5F5E1000, H_SHA256)
    assert hashed.hex() == (
        "04" "00" "16" "08"  # version 4, binary document, EdDSA, SHA-256
        "001d"  # 29 bytes of hashed subpackets
        "05" "02" "5f5e1000"  # signature creation time
        "16" "21" "04" + FPR.lower()  # issuer fingerprint, v4
    )  # fmt: skip


def test_hashed_part_rejects_bad_input() -> None:
    with pytest.raises(ValueError):
        signature_hashed_part(key(), -1, H_SHA256)
    with pytest.raises(ValueError):
        signature_hashed_part(key(), 2**32, H_SHA256)
    with pytest.raises(ValueError):
        signature_hashed_part(key(), 0, 2)  # SHA-1 is not offered
    with pytest.raises(ValueError):
        signature_hashed_part(key(), 0, H_SHA256, sig_type=256)


@pytest.mark.parametrize("hash_algo", [H_SHA256, H_SHA384, H_SHA512])
def test_signature_digest_includes_v4_trailer(hash_algo: int) -> None:
    hashed = signature_hashed_part(key(), 1_700_000_000, hash_algo, sig_type=0x01)
    name = {H_SHA256: "sha256", H_SHA384: "sha384", H_SHA512: "sha512"}[hash_algo]
    trailer = b"\x04\xff" + len(hashed).to_bytes(4, "big")
    expected = hashlib.new(name, b"payload\r\n" + hashed + trailer).digest()
    assert signature_digest(b"payload\r\n", hashed, hash_algo) == expected


@pytest.mark.parametrize(
    ("algo", "values"),
    [
        (PK_EDDSA, [int.from_bytes(b"\x00" + b"\x11" * 31, "big"), 0]),
        (PK_ECDSA, [1, 2**255 + 1]),
        (PK_DSA, [3, 4]),
        (PK_RSA, [int.from_bytes(b"\x00\x00" + b"\x99" * 254, "big")]),
    ],
)
def test_signature_packet_structure(algo: int, values: list[int]) -> None:
    signer = key(algo, 256, None)
    hashed = signature_hashed_part(signer, 1_700_000_000, H_SHA256)
    digest = signature_digest(b"data", hashed, H_SHA256)
    packet = signature_packet(hashed, digest, signer, values)

    tag, body, rest = read_new_format_packet(packet)
    assert (tag, rest) == (2, b"")
    assert body.startswith(hashed)
    body = body[len(hashed) :]
    unhashed_len = int.from_bytes(body[:2], "big")
    assert body[2 : 2 + unhashed_len].hex() == "0910" + FPR[-16:].lower()  # issuer key id
    body = body[2 + unhashed_len :]
    assert body[:2] == digest[:2]
    assert read_mpis(body[2:]) == values


def test_signature_packet_rejects_mismatches() -> None:
    signer = key()
    hashed = signature_hashed_part(signer, 1, H_SHA256)
    digest = signature_digest(b"", hashed, H_SHA256)
    with pytest.raises(ValueError, match="needs 2"):
        signature_packet(hashed, digest, signer, [1])
    with pytest.raises(ValueError, match="digest"):
        signature_packet(hashed, digest[:20], signer, [1, 2])
    with pytest.raises(ValueError, match="public-key algorithm"):
        signature_packet(hashed, digest, key(PK_RSA, 2048, None), [1])
    with pytest.raises(ValueError, match="version 4"):
        signature_packet(b"\x03" + hashed[1:], digest, signer, [1, 2])
    with pytest.raises(ValueError, match="length"):
        signature_packet(hashed + b"\x00", digest, signer, [1, 2])
    with pytest.raises(ValueError, match="negative"):
        signature_packet(hashed, digest, signer, [1, -2])


def test_detached_signature_calls_sign_with_the_digest_and_is_byte_exact() -> None:
    signer = key(PK_ECDSA, 384, "nistp384")
    calls: list[tuple[int, bytes]] = []

    def sign(hash_algo: int, digest: bytes) -> list[int]:
        calls.append((hash_algo, digest))
        return [int.from_bytes(b"\x00" + b"\x01" * 47, "big"), 0xABCDEF]

    text = detached_signature(b"object 0\n", signer, 1_700_000_000, sign)
    hashed = signature_hashed_part(signer, 1_700_000_000, H_SHA384)
    assert calls == [(H_SHA384, signature_digest(b"object 0\n", hashed, H_SHA384))]
    packet = dearmor_signature(text)
    assert packet == signature_packet(hashed, calls[0][1], signer, sign(0, b""))
    # A golden vector: any change of the byte layout must be deliberate.
    assert text == (
        "-----BEGIN PGP SIGNATURE-----\n"
        "\n"
        "wmcEABMJAB0FAmVT8QAWIQQBI0VniavN7wEjRWeJq83vASNFZwAKCRCJq83vASNF\n"
        "Z/RMAXEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEB\n"
        "AQEBAQAYq83v\n"
        "=xv+7\n"
        "-----END PGP SIGNATURE-----\n"
    )


def test_detached_signature_refuses_wrong_value_count() -> None:
    with pytest.raises(ValueError, match="needs 1"):
        detached_signature(b"", key(PK_RSA, 2048, None), 0, lambda _h, _d: [1, 2])


def test_hash_tables_agree() -> None:
    for algo, name in openpgp.HASH_NAMES.items():
        assert hashlib.new(name).digest_size == openpgp.HASH_SIZES[algo]


# ---------------------------------------------------------------------------------------------
# Canonical S-expressions


def atom(data: bytes) -> bytes:
    return str(len(data)).encode() + b":" + data


def test_parse_nested_lists_and_binary_atoms() -> None:
    tricky = b"(x)9:\n\r%25\x00" + bytes(range(256))
    text = b"(" + atom(b"a") + b"(" + atom(tricky) + b"()" + b")" + atom(b"") + b")"
    assert parse_canonical_sexp(text) == [b"a", [tricky, []], b""]


@pytest.mark.parametrize(
    "bad",
    [
        b"",
        b"(",
        b"(1:a",
        b")",
        b"(1:a))",
        b"(1:a)(1:b)",
        b"1:a",
        b"(3:ab)",
        b"(01:a)",
        b"(1a)",
        b"( 1:a)",
        b"([4:text]1:a)",
        b"(9999999999:a)",
        b"(" * 40 + b")" * 40,
    ],
)
def test_parse_rejects_malformed(bad: bytes) -> None:
    with pytest.raises(SexpError):
        parse_canonical_sexp(bad)


def test_signature_values_eddsa_with_leading_zero_bytes() -> None:
    r = b"\x00\x00" + bytes(range(1, 31))
    s = bytes(range(200, 232))
    # ")" and ":" inside binary atoms must not confuse the parser.
    s = b")" + s[1:15] + b":(" + s[17:]
    sexp = b"(7:sig-val(5:eddsa" + b"(1:r" + atom(r) + b")(1:s" + atom(s) + b")))"
    assert signature_values(sexp) == ("eddsa", [int.from_bytes(r, "big"), int.from_bytes(s, "big")])


def test_signature_values_ecdsa_twos_complement_padding() -> None:
    r = b"\x00\x80" + b"\x01" * 31  # two's-complement form: a zero byte before a set top bit
    s = b"\x7f" + b"\x02" * 31
    sexp = b"(7:sig-val(5:ecdsa(1:r" + atom(r) + b")(1:s" + atom(s) + b")))"
    algo, values = signature_values(sexp)
    assert algo == "ecdsa"
    assert values == [int.from_bytes(r[1:], "big"), int.from_bytes(s, "big")]
    assert encode_mpi(values[0])[:2] == (256).to_bytes(2, "big")


def test_signature_values_rsa_and_dsa() -> None:
    s = b"\x00\x07" + b"\xee" * 510
    assert signature_values(b"(7:sig-val(3:rsa(1:s" + atom(s) + b")))") == (
        "rsa",
        [int.from_bytes(s, "big")],
    )
    dsa = b"(7:sig-val(3:dsa(1:r2:\x01\x02)(1:s1:\x03)))"
    assert signature_values(dsa) == ("dsa", [0x0102, 3])
    # Parameter order in the S-expression does not matter; OpenPGP order does.
    swapped = b"(7:sig-val(3:dsa(1:s1:\x03)(1:r2:\x01\x02)))"
    assert signature_values(swapped) == ("dsa", [0x0102, 3])


def test_signature_values_generic_ecc_with_flags() -> None:
    sexp = b"(7:sig-val(3:ecc(5:flags5:eddsa)(1:r1:\x05)(1:s1:\x06)))"
    assert signature_values(sexp) == ("eddsa", [5, 6])
    assert signature_values(b"(7:sig-val(3:ecc(1:r1:\x05)(1:s1:\x06)))")[0] == "ecdsa"


@pytest.mark.parametrize(
    "bad",
    [
        b"(7:enc-val(3:rsa(1:s1:\x01)))",
        b"(7:sig-val)",
        b"(7:sig-val3:rsa)",
        b"(7:sig-val(3:elg(1:r1:\x01)(1:s1:\x01)))",
        b"(7:sig-val(3:rsa(1:r1:\x01)))",
        b"(7:sig-val(5:ecdsa(1:r1:\x01)))",
        b"(7:sig-val(5:ecdsa(1:r0:)(1:s1:\x01)))",
        b"(7:sig-val(5:ecdsa(1:r(1:x))(1:s1:\x01)))",
    ],
)
def test_signature_values_rejects_wrong_shapes(bad: bytes) -> None:
    with pytest.raises(SexpError):
        signature_values(bad)
