"""formats.tlog.witness: the add-checkpoint request, its checks in the spec's order (each
refusal its own type), the 409 size body and the cosignature lines; and the witness's
settings, key and job (settings, keyset, formats.jobs). Logs are made with ``cryptography``
Ed25519 keys and `formats.note.sign_note` (tests.helpers.WitnessedLog)."""

from __future__ import annotations

import base64
import hashlib
import os
from pathlib import Path

import pytest

from formats.jobs import CosignJob, MalformedMessage, job_from_dict
from formats.note import ED25519_COSIGNATURE, Ed25519Verifier, VerifierKey
from formats.tlog.checkpoint import cosign
from formats.tlog.merkle import MAX_PROOF_HASHES
from formats.tlog.witness import (
    MAX_REQUEST_BYTES,
    AddCheckpoint,
    BadLogSignature,
    InconsistentCheckpoint,
    MalformedWitnessRequest,
    SizeConflict,
    UnknownLog,
    WitnessRecord,
    check_add_checkpoint,
    encode_size,
    parse_cosignatures,
    parse_size,
)
from tests.helpers import WitnessedLog

LOG = WitnessedLog("example.org/unit", leaves=32, seed=bytes(32))
TRUSTED = {LOG.origin: [Ed25519Verifier.from_vkey(LOG.vkey)]}


def check(body: bytes, record: WitnessRecord | None) -> int:
    return check_add_checkpoint(AddCheckpoint.parse(body), TRUSTED, record).size


def record(size: int) -> WitnessRecord:
    return WitnessRecord(size, LOG.root(size))


def test_requests_round_trip() -> None:
    for old, new in ((0, 0), (0, 5), (5, 5), (3, 17), (16, 32)):
        body = LOG.request(old, new)
        request = AddCheckpoint.parse(body)
        assert request.encode() == body
        assert request.old_size == old and request.proof == LOG.proof(old, new)
        assert request.checkpoint == LOG.checkpoint(new)


@pytest.mark.parametrize("body", [
    b"",
    b"old 1",  # no empty line
    b"new 1\n\n",
    b"old -1\n\n",
    b"old 01\n\n",
    b"old 1.0\n\n",
    b"old  1\n\n",
    b"old \xc3\xa9\n\n",
    b"old 1\n" + b"AAAA\n\n",  # a proof line of 3 bytes
    b"old 1\n" + b"!!!\n\n",
    b"old 1\n" + (base64.b64encode(bytes(32)) + b"\n") * (MAX_PROOF_HASHES + 1) + b"\n",
    b"old 1\n\n" + b"x" * MAX_REQUEST_BYTES,
])
def test_malformed_requests_are_400(body: bytes) -> None:
    with pytest.raises(MalformedWitnessRequest):
        AddCheckpoint.parse(body)


def test_limits() -> None:
    full = (bytes(32),) * MAX_PROOF_HASHES
    assert AddCheckpoint.parse(AddCheckpoint(1, full, b"x\n").encode()).proof == full
    with pytest.raises(MalformedWitnessRequest):
        AddCheckpoint(-1, (), b"")
    with pytest.raises(MalformedWitnessRequest):
        AddCheckpoint(1, (bytes(31),), b"")


def test_a_chain_passes() -> None:
    assert check(LOG.request(0, 0), None) == 0
    assert check(LOG.request(0, 4), None) == 4
    assert check(LOG.request(4, 4), record(4)) == 4  # the same checkpoint again
    assert check(LOG.request(4, 19), record(4)) == 19
    assert check(LOG.request(0, 7), record(0)) == 7


def test_a_malformed_checkpoint_is_400() -> None:
    with pytest.raises(MalformedWitnessRequest):
        check(b"old 0\n\nnot a note\n", None)
    with pytest.raises(MalformedWitnessRequest):  # a note whose text is no checkpoint
        check(AddCheckpoint(0, (), LOG.checkpoint(3).replace(b"\n3\n", b"\nthree\n")).encode(),
              None)


def test_an_unknown_origin_is_404() -> None:
    other = WitnessedLog("example.org/other", leaves=4)
    with pytest.raises(UnknownLog):
        check(other.request(0, 2), None)


def test_signatures_are_403() -> None:
    impostor = WitnessedLog(LOG.origin, leaves=32)  # the origin, another key
    with pytest.raises(BadLogSignature):
        check(impostor.request(0, 3), None)
    # the log key's line under another text: a signature that does not verify
    forged = LOG.checkpoint(3).split(b"\n\n")[0] + b"\n\n" + LOG.checkpoint(4).split(b"\n\n")[1]
    with pytest.raises(BadLogSignature):
        check(AddCheckpoint(0, (), forged).encode(), None)


def test_the_order_of_the_checks() -> None:
    # 403 before 400 for old > size (the signature is checked first)
    impostor = WitnessedLog(LOG.origin, leaves=32)
    with pytest.raises(BadLogSignature):
        check(AddCheckpoint(9, (), impostor.checkpoint(3)).encode(), None)
    with pytest.raises(MalformedWitnessRequest):
        check(AddCheckpoint(9, (), LOG.checkpoint(3)).encode(), record(9))
    # 409 before the proof is looked at
    with pytest.raises(SizeConflict) as e:
        check(AddCheckpoint(3, (bytes(32),), LOG.checkpoint(10)).encode(), record(5))
    assert e.value.known == 5


@pytest.mark.parametrize(("old", "new", "known"), [(4, 10, 6), (0, 10, 6), (7, 10, 6),
                                                     (2, 10, None)])
def test_a_stale_or_rolled_back_old_size_is_409(old: int, new: int, known: int | None) -> None:
    with pytest.raises(SizeConflict) as e:
        check(LOG.request(old, new), None if known is None else record(known))
    assert e.value.known == (known or 0)


def test_inconsistency_is_422() -> None:
    proof = LOG.proof(4, 19)
    with pytest.raises(InconsistentCheckpoint):  # a bad proof
        check(LOG.request(4, 19, proof=(bytes(32), *proof[1:])), record(4))
    with pytest.raises(InconsistentCheckpoint):  # a proof from size 0
        check(LOG.request(0, 19, proof=(bytes(32),)), None)
    fork = LOG.checkpoint(4, root=hashlib.sha256(b"fork").digest())
    with pytest.raises(InconsistentCheckpoint):  # the same size, another root
        check(LOG.request(4, 4, checkpoint=fork, proof=()), record(4))
    with pytest.raises(InconsistentCheckpoint):  # the record of another tree
        check(LOG.request(4, 19), WitnessRecord(4, hashlib.sha256(b"x").digest()))


def test_size_answers() -> None:
    for n in (0, 1, 2**63 - 1):
        assert parse_size(encode_size(n)) == n
    for bad in (b"", b"1", b"01\n", b"-1\n", b"1 \n", b"x\n"):
        with pytest.raises(MalformedWitnessRequest):
            parse_size(bad)


def test_cosignature_lines() -> None:
    body = LOG.checkpoint(3).split(b"\n\n")[0].decode() + "\n"
    line = cosign(body, "w.example/w", LOG.public, 1_800_000_000, LOG.key.sign).line()
    (signature,) = parse_cosignatures(line.encode())
    assert signature.name == "w.example/w"
    key = VerifierKey("w.example/w", ED25519_COSIGNATURE, LOG.public)
    assert signature.key_id == key.key_id
    for bad in (b"", line.encode().rstrip(b"\n"), b"not a line\n"):
        with pytest.raises(MalformedWitnessRequest):
            parse_cosignatures(bad)


def test_cosign_jobs_round_trip_and_refuse_what_is_not_one() -> None:
    job = CosignJob("example.org/unit\n3\nAAAA\n", 1_800_000_000)
    assert job_from_dict(job.to_dict()) == job
    for bad in ({"op": "cosign", "body": "no newline", "timestamp": 1},
                {"op": "cosign", "body": "x\n", "timestamp": 0},
                {"op": "cosign", "body": "x\n", "timestamp": True},
                {"op": "cosign", "body": "x\n", "timestamp": 2**63},
                {"op": "cosign", "body": 3, "timestamp": 1}):
        with pytest.raises(MalformedMessage):
            job_from_dict(bad)


def test_witness_settings() -> None:
    from formats.keys import WITNESS_KEY
    from server.settings import Settings

    off = Settings(own_url="https://stamps.example/")
    assert not off.witness and WITNESS_KEY not in off.extra_key_specs
    on = Settings(own_url="https://stamps.example/", witness_for=f" {LOG.vkey} ,")
    assert on.witness and WITNESS_KEY in on.extra_key_specs
    assert on.witness_name == "stamps.example/witness"
    assert list(on.witnessed) == [LOG.origin]
    assert WITNESS_KEY.id == "witness-ed25519"
    for bad in ("nonsense", LOG.vkey + "," + LOG.vkey,
                VerifierKey("x", ED25519_COSIGNATURE, bytes(32)).encode()):
        with pytest.raises(ValueError, match="witness_for"):
            Settings(witness_for=bad)
    with pytest.raises(ValueError, match="witness_name"):
        Settings(witness=True, witness_name="has space")


def test_an_empty_witness_for_is_a_usage_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``--witness-for ""`` and STAMPD_WITNESS_FOR="" name no log: one line naming the option
    or the variable, exit status 2, nothing made; an unset variable is no witness, as
    before."""
    from server.settings import Settings
    from stampd.cli import EXIT_USAGE, main

    for name in [n for n in os.environ if n.startswith("STAMPD_")]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    data = tmp_path / "d"
    for argv, where in ((["--witness-for", ""], "--witness-for"),
                        (["--witness-for", LOG.vkey, "--witness-for", " "], "--witness-for"),
                        ([], "STAMPD_WITNESS_FOR")):
        if not argv:
            monkeypatch.setenv("STAMPD_WITNESS_FOR", "")
        code = main(["serve", "--data-dir", str(data), *argv])
        err = capsys.readouterr().err
        assert code == EXIT_USAGE, err
        assert err.startswith(f"stampd serve: invalid setting: {where}: ") and \
            err.count("\n") == 1 and "no log" in err, err
        assert not data.exists()
    with pytest.raises(ValueError, match="no log"):
        Settings(witness_for=" , ")
    monkeypatch.delenv("STAMPD_WITNESS_FOR")
    settings = Settings()
    assert not settings.witness and settings.witness_for is None
    assert Settings.model_validate(settings.model_dump(mode="json")) == settings


def test_the_witness_vkey_is_a_cosignature_key() -> None:
    from formats.keys import witness_vkey

    line = "ssh-ed25519 " + base64.b64encode(
        b"\x00\x00\x00\x0bssh-ed25519\x00\x00\x00\x20" + LOG.public).decode()
    key = VerifierKey.parse(witness_vkey("w.example/w", line))
    assert key.sig_type == ED25519_COSIGNATURE and key.public_key == LOG.public
