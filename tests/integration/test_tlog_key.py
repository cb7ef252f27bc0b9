"""The transparency log's key (`formats.keys.TLOG_KEY`) with real ssh-agents and real
worker processes: its start-up check (a note signature, checked as plain Ed25519), its worker
signs checkpoint notes (`NoteJob`) that `formats.note` opens with its verifier key
(`tlog_vkey`), and nothing else; no other key's worker signs notes. A refused job is refused
as malformed and the workers go on serving."""

from __future__ import annotations

import asyncio
import base64
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from formats import note
from formats.jobs import MalformedMessage, NoteJob, ReceiptJob
from formats.keys import PRIMARY, TLOG, TLOG_KEY, ed25519_public_key, tlog_vkey
from keystore.keyset import KeyUnusable, SshKeyStore, ensure_extra_keys, key_dir
from server.dispatch.socket import SocketDispatcher
from server.errors import SigningFailed
from tests.helpers import agent_home, seed_data_dir, short_tmpdir, terminate
from workers.agents.ssh import SshAgent
from workers.config import DispatchConfig, WorkerConfig
from workers.loop import sign_many
from workers.signer import NoteSigner
from workers.worker import check_key, load_signer

UID = "stampd test <t@stampd.invalid>"
ORIGIN = "127.0.0.1:8080/tlog"
CHECKPOINT = f"{ORIGIN}\n7\nqUWxPL3Ns2ChdvTs+jMm+GCSbNFWlfKoBl+GjvdaQwA=\n"


@pytest.fixture
def home() -> Iterator[Path]:
    """A short private home for the agents; no agent may outlive the test."""
    with agent_home("tl") as path:
        yield path


def _tlog_key(keys: Path) -> SshKeyStore:
    ensure_extra_keys(keys, [TLOG_KEY], UID, None)
    return SshKeyStore(key_dir(keys, TLOG_KEY))


def _config(home: Path, directory: Path, name: str = "t:1:0", key_id: str = TLOG_KEY.id,
            fmt: str = "ssh", role: str | None = TLOG,
            socket: Path | None = None) -> WorkerConfig:
    return WorkerConfig(name, home, directory,
                        DispatchConfig("socket", socket=socket or home / "unused.sock"),
                        key_id=key_id, format=fmt, role=role)  # type: ignore[arg-type]


def _check_note(store: SshKeyStore, text: str, signature_b64: str) -> None:
    """``signature_b64`` is the log key's Ed25519 signature of ``text``: it verifies with
    ``cryptography`` against id.pub, and `formats.note` opens the signed note with the key's
    verifier key."""
    signature = base64.b64decode(signature_b64, validate=True)
    assert len(signature) == 64
    public_line = store.public_key_file.read_text()
    Ed25519PublicKey.from_public_bytes(ed25519_public_key(public_line)).verify(
        signature, text.encode())
    vkey = tlog_vkey(ORIGIN, public_line)
    verifier = note.Ed25519Verifier.from_vkey(vkey)
    signed = note.Note(text, (note.Signature(ORIGIN, verifier.key_id, signature),)).encode()
    opened = note.open_note(signed, [verifier])
    assert opened.text == text and len(opened.verified) == 1


def test_the_verifier_key(tmp_path: Path) -> None:
    store = _tlog_key(tmp_path / "keys")
    assert store.dir.name == "tlog-ed25519"
    vkey = tlog_vkey(ORIGIN, store.public_key_file.read_text())
    name, key_id, b64 = vkey.split("+", 2)
    assert name == ORIGIN and len(key_id) == 8
    raw = base64.b64decode(b64)
    assert raw[0] == 0x01 and raw[1:] == ed25519_public_key(store.public_key_file.read_text())
    assert note.VerifierKey.parse(vkey).encode() == vkey
    with pytest.raises(ValueError):
        tlog_vkey("bad origin", store.public_key_file.read_text())
    other = SshKeyStore(tmp_path / "ecdsa")
    other.ensure("ecdsa-p256", "x")
    with pytest.raises(ValueError, match="ssh-ed25519"):
        tlog_vkey(ORIGIN, other.public_key_file.read_text())


def test_the_start_up_check_makes_a_note_signature(tmp_path: Path, home: Path) -> None:
    store = _tlog_key(tmp_path / "keys")
    assert check_key(_config(home, store.dir)) == store.public_key().fingerprint

    # Another key's id.pub: caught, and the way out named.
    other = _tlog_key(tmp_path / "other")
    store.public_key_file.write_text(other.public_key_file.read_text())
    with pytest.raises(KeyUnusable) as caught:
        check_key(_config(home, store.dir))
    assert "STAMPD_TLOG=off" in caught.value.message and "\n" not in caught.value.message

    # A log key that is not Ed25519 cannot sign notes.
    ecdsa = SshKeyStore(tmp_path / "ecdsa" / "tlog-ed25519")
    ecdsa.ensure("ecdsa-p256", "x")
    with pytest.raises(KeyUnusable, match="must be ssh-ed25519"):
        check_key(_config(home, ecdsa.dir))


def test_the_note_signer_signs_notes_only(tmp_path: Path, home: Path) -> None:
    store = _tlog_key(tmp_path / "keys")
    agent = SshAgent(home)
    try:
        agent.start()
        signer, fingerprint = load_signer(agent, _config(home, store.dir))
        assert isinstance(signer, NoteSigner) and fingerprint == store.public_key().fingerprint
        _check_note(store, CHECKPOINT, signer.build(NoteJob(CHECKPOINT)))
        with pytest.raises(MalformedMessage, match="signs log checkpoints only"):
            signer.build(ReceiptJob("stampd receipt v1\n", 1))
        # In one batch: the receipt refused, the notes signed.
        other = CHECKPOINT.replace("\n7\n", "\n8\n")
        frames = [{"id": 1, **NoteJob(CHECKPOINT).to_dict()},
                  {"id": 2, **ReceiptJob("stampd receipt v1\n", 1).to_dict()},
                  {"id": 3, **NoteJob(other).to_dict()}]
        one, two, three = sign_many(signer, frames)
        assert one.object is not None and three.object is not None
        _check_note(store, CHECKPOINT, one.object)
        _check_note(store, other, three.object)
        assert two.object is None and "signs log checkpoints only" in str(two.error)
    finally:
        agent.stop()


async def _serve_both(sock: Path, workers: list[subprocess.Popen[bytes]],
                      store: SshKeyStore) -> None:
    dispatcher = SocketDispatcher(sock, sign_timeout=60, max_attempts=1)
    await dispatcher.start()
    try:
        deadline = time.monotonic() + 120
        while dispatcher.keys_served() != {PRIMARY, TLOG_KEY.id}:
            assert all(w.poll() is None for w in workers), "a worker exited"
            assert time.monotonic() < deadline, "the workers did not connect"
            await asyncio.sleep(0.1)
        names = set(dispatcher.workers)

        signed = await dispatcher.sign(NoteJob(CHECKPOINT), key=TLOG_KEY.id)
        _check_note(store, CHECKPOINT, signed.text)
        with pytest.raises(SigningFailed, match="the log key signs log checkpoints only"):
            await dispatcher.sign(ReceiptJob("stampd receipt v1\n", 1), key=TLOG_KEY.id)
        with pytest.raises(SigningFailed, match="does not sign log checkpoints"):
            await dispatcher.sign(NoteJob(CHECKPOINT), key=PRIMARY)

        # Both go on serving, the same processes.
        again = await dispatcher.sign(NoteJob(CHECKPOINT), key=TLOG_KEY.id)
        assert again.text == signed.text  # (Ed25519 is deterministic)
        receipt = await dispatcher.sign(ReceiptJob("stampd receipt v1\n", 1), key=PRIMARY)
        assert "BEGIN PGP SIGNATURE" in receipt.text
        assert set(dispatcher.workers) == names
        assert all(w.poll() is None for w in workers)
    finally:
        await dispatcher.stop()


def test_workers_refuse_each_others_jobs_and_go_on(tmp_path: Path, home: Path) -> None:
    keys = seed_data_dir(tmp_path / "d") / "keys"
    store = _tlog_key(keys)
    run = short_tmpdir("tlr")
    sock = run / "dispatch.sock"
    homes = [home / "w0", home / "w1"]
    configs = [_config(homes[0], keys, "t:1:0", PRIMARY, "openpgp", None, sock),
               _config(homes[1], store.dir, "t:1:1", socket=sock)]
    workers: list[subprocess.Popen[bytes]] = []
    try:
        for h, config in zip(homes, configs, strict=True):
            h.mkdir(mode=0o700)
            proc = subprocess.Popen([sys.executable, "-m", "workers.worker"],
                                    stdin=subprocess.PIPE)
            workers.append(proc)
            assert proc.stdin is not None
            proc.stdin.write(config.to_json().encode())
            proc.stdin.close()
        asyncio.run(_serve_both(sock, workers, store))
    finally:
        for proc in workers:
            terminate(proc)
        shutil.rmtree(run, ignore_errors=True)


def test_a_first_start_makes_and_registers_the_log_key(tmp_path: Path) -> None:
    """With the log on, start-up (`server.commands._prepare`) generates the log key beside
    the others, registers it and serves it: marked as signing checkpoints only, no allowed
    signer; the pool starts its workers like an extra key's, with its role."""
    from formats.keys import allowed_signers, with_purposes
    from server import db
    from server.commands import _prepare
    from server.settings import Settings
    from server.signing_keys import registered
    from server.supervisor import pool_config

    data = seed_data_dir(tmp_path / "d")
    settings = Settings(data_dir=data, tlog=True, tsa=False, extra_keys="")
    keys = _prepare(settings)
    store = SshKeyStore(data / "keys" / "tlog-ed25519")
    assert store.public_key_file.is_file() and store.private_key_file.stat().st_mode & 0o077 == 0
    log = next(k for k in keys if k.id == TLOG_KEY.id)
    assert (log.format, log.purpose, log.fingerprint) == ("ssh", TLOG,
                                                          store.public_key().fingerprint)
    assert allowed_signers(keys) == ""
    engine = db.make_engine(settings.db_url)
    try:
        theirs = {k.id: k for k in with_purposes(registered(engine), None)}
    finally:
        engine.dispose()
    assert theirs[TLOG_KEY.id].purpose == TLOG
    assert theirs[TLOG_KEY.id].fingerprint == log.fingerprint
    assert tlog_vkey(settings.tlog_origin, log.public).startswith("127.0.0.1:8080/tlog+")
    pool = pool_config(settings)
    assert TLOG_KEY in pool.extra_keys
    assert pool.worker_config("w", tmp_path / "h", TLOG_KEY).role == TLOG
    # A second start keeps the key.
    _prepare(settings)
    assert store.public_key().fingerprint == log.fingerprint
