"""The log's side of the witness protocol (server.tlog.witness_client) without a server: the
witness settings, the backoff, the published policy, merging cosignatures into a note, reading
a witness's answer, the state file, and the sender against witnesses on loopback
(tests.helpers.LocalWitness: the pure protocol checks and a `cryptography` key) over real
tiles on disk."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from pydantic import ValidationError

from formats.note import (
    ED25519_COSIGNATURE,
    Ed25519Verifier,
    Signature,
    VerifierKey,
    ed25519_signer,
    parse_note,
    sign_note,
)
from formats.tlog.checkpoint import Checkpoint, CosignatureVerifier, cosign
from formats.tlog.witness import SIZE_CONTENT_TYPE, encode_size
from server.setting_values import WitnessConfig, parse_witnesses, redact_userinfo
from server.settings import Settings
from server.tlog.store import TileReader, TileWriter
from server.tlog.witness_client import (
    Backoff,
    CosignatureRefused,
    Offered,
    WitnessFailed,
    WitnessSender,
    WitnessState,
    merge_cosignatures,
    policy_text,
    state_items,
    states_of,
    verified_cosignatures,
)
from tests.helpers import LocalWitness

ORIGIN = "log.test/tlog"


def _key(label: str) -> tuple[Ed25519PrivateKey, bytes]:
    key = Ed25519PrivateKey.from_private_bytes(hashlib.sha256(label.encode()).digest())
    return key, key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


LOG_KEY, LOG_PUBLIC = _key("log")
LOG_VKEY = VerifierKey(ORIGIN, 0x01, LOG_PUBLIC).encode()
LOG = Ed25519Verifier.from_vkey(LOG_VKEY)


def _cosigner(name: str) -> tuple[Ed25519PrivateKey, bytes, str]:
    key, public = _key(name)
    return key, public, VerifierKey(name, ED25519_COSIGNATURE, public).encode()


W1_KEY, W1_PUBLIC, W1_VKEY = _cosigner("w1.test")
W2_KEY, W2_PUBLIC, W2_VKEY = _cosigner("w2.test")


def signed(text: str) -> bytes:
    return sign_note(text, [ed25519_signer(ORIGIN, LOG_PUBLIC, LOG_KEY.sign)]).encode()


def cosig(key: Ed25519PrivateKey, public: bytes, name: str, text: str, t: int = 1700000000,
          ) -> Signature:
    return cosign(text, name, public, t, key.sign)


TEXT = Checkpoint(ORIGIN, 3, hashlib.sha256(b"three").digest()).body()


# -- settings ---------------------------------------------------------------------------------
def test_witnesses_are_parsed_from_url_and_vkey() -> None:
    ws = parse_witnesses(f" http://127.0.0.1:9/w/={W1_VKEY}, https://w2.example={W2_VKEY} ")
    assert [(w.url, w.name) for w in ws] == [("http://127.0.0.1:9/w", "w1.test"),
                                            ("https://w2.example", "w2.test")]
    assert ws[0].verifier.key.public_key == W1_PUBLIC
    assert parse_witnesses("") == []


@pytest.mark.parametrize(("spec", "says"), [
    ("http://w.test", "use URL=VKEY"),
    (f"ftp://w.test={W1_VKEY}", "must start with http"),
    ("http://w.test=w1+12345678+AAAA", "not a cosignature verifier key"),
    (f"http://w.test={LOG_VKEY}", "not a cosignature verifier key"),  # a log key (0x01)
    (f"http://a.test={W1_VKEY},http://b.test={W1_VKEY}", "listed twice"),
    ("http://a.test=" + VerifierKey("none", ED25519_COSIGNATURE, W1_PUBLIC).encode(),
     "reserved"),
])
def test_bad_witnesses_are_refused_in_one_line(spec: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_witnesses(spec)
    with pytest.raises(ValidationError, match=says):
        Settings(witnesses=spec, tlog=True)


def test_the_quorum_is_a_majority_unless_set() -> None:
    specs = [f"http://a.test={W1_VKEY}", f"http://b.test={W2_VKEY}",
             "http://c.test=" + _cosigner("w3.test")[2]]
    assert Settings(tlog=True).quorum == 0
    assert [Settings(witnesses=",".join(specs[:n]), tlog=True).quorum
            for n in (1, 2, 3)] == [1, 2, 2]
    assert Settings(witnesses=",".join(specs), witness_quorum=3, tlog=True).quorum == 3
    with pytest.raises(ValidationError, match="more than the 2 witnesses"):
        Settings(witnesses=",".join(specs[:2]), witness_quorum=3, tlog=True)
    with pytest.raises(ValidationError, match="STAMPD_TLOG=on"):
        Settings(witnesses=specs[0], tlog=False)


def test_the_witness_option_is_repeatable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STAMPD_TLOG", "on")
    from server import commands
    from stampd.cli import parser

    args = parser(commands).parse_args(
        ["serve", "--witness", f"http://a.test={W1_VKEY}", "--witness",
         f"http://b.test={W2_VKEY}", "--data-dir", "/nonexistent"])
    assert [w.name for w in commands.build_settings(args).witness_list] == ["w1.test", "w2.test"]


SECRET = "s3cret-T0KEN"


def test_a_witness_url_is_published_and_logged_without_its_credentials(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """``https://user:password@host/`` as a witness's URL: the credentials go with each request
    (HTTP basic authentication) and nowhere else: not in the policy, the states (/readyz, the
    status page, the state file), the log's warnings, nor a settings error's message."""
    spec = f"https://ops:{SECRET}@w1.example/sub={W1_VKEY}"
    (w,) = parse_witnesses(spec)
    assert w.public_url == "https://w1.example/sub" and w.credentials == ("ops", SECRET)
    assert WitnessConfig("http://h.test", W1_VKEY).credentials is None
    assert redact_userinfo("GET https://a:b@c@h.test:8/x?y=z@ and http://h.test/") == (
        "GET https://h.test:8/x?y=z@ and http://h.test/")
    assert policy_text(LOG_VKEY, "http://log.test/tlog", [w], 1) == (
        f"log {LOG_VKEY} http://log.test/tlog\n"
        f"witness w1.test {W1_VKEY} https://w1.example/sub\n"
        "group witnesses 1 w1.test\nquorum witnesses\n")
    for bad in (f"https://ops:{SECRET}@w1.example", f"ftp://ops:{SECRET}@w1.example={W1_VKEY}",
                f"https://ops:{SECRET}@w1.example=w1+12345678+AAAA",
                f"{spec},https://ops:{SECRET}@w2.example={W1_VKEY}"):
        with pytest.raises(ValueError) as e:
            parse_witnesses(bad)
        assert SECRET not in str(e.value)

    witness = LocalWitness("w1.test")
    witness.trust(LOG_VKEY)
    log = Log(tmp_path / "tlog")
    configs = [WitnessConfig(f"http://ops:{SECRET}@127.0.0.1:{witness.port}", witness.vkey)]
    reported: list[str] = []  # (what the other HTTP processes are told: state_items)

    async def run() -> None:
        sender = WitnessSender(configs, log.reader.node_reader, log.on_cosigned, timeout=0.5)
        state = sender.states()[0]
        try:
            sender.offer(log.grow(2))
            await _until(lambda: state.cosigned_size == 2, "a cosignature")
            witness.set_mode("refusing")
            sender.offer(log.grow(1))
            await _until(lambda: state.errors == 1, "a refusal")
            reported.append(json.dumps(state_items(sender.states())))
        finally:
            await sender.stop()

    try:
        with caplog.at_level("INFO"):  # (httpx logs each request's URL at INFO)
            asyncio.run(run())
    finally:
        witness.close()
    expected = "Basic " + base64.b64encode(f"ops:{SECRET}".encode()).decode()
    assert witness.authorizations and set(witness.authorizations) == {expected}
    assert "w1.test" in caplog.text and "HTTP Request: POST" in caplog.text
    assert SECRET not in caplog.text
    assert reported and SECRET not in reported[0]
    (state,) = states_of(json.loads(reported[0]), configs)
    assert state.url == f"http://127.0.0.1:{witness.port}" and state.cosigned_size == 2


# -- pure pieces --------------------------------------------------------------------------------
def test_backoff_doubles_to_its_limit() -> None:
    assert [Backoff(1, 30).delay(n) for n in range(8)] == [0, 1, 2, 4, 8, 16, 30, 30]
    assert Backoff(0.5, 1).delay(1000) == 1


def test_the_policy_names_log_witnesses_and_quorum() -> None:
    ws = [WitnessConfig("http://a.test", W1_VKEY), WitnessConfig("http://b.test", W2_VKEY)]
    assert policy_text(LOG_VKEY, "http://log.test/tlog", ws, 2) == (
        f"log {LOG_VKEY} http://log.test/tlog\n"
        f"witness w1.test {W1_VKEY} http://a.test\n"
        f"witness w2.test {W2_VKEY} http://b.test\n"
        "group witnesses 2 w1.test w2.test\n"
        "quorum witnesses\n")
    assert policy_text(LOG_VKEY, "http://log.test/tlog", [], 0) == (
        f"log {LOG_VKEY} http://log.test/tlog\nquorum none\n")


def test_cosignatures_go_after_the_log_signature_one_per_key() -> None:
    note = signed(TEXT)
    a1 = cosig(W1_KEY, W1_PUBLIC, "w1.test", TEXT, 1)
    a2 = cosig(W1_KEY, W1_PUBLIC, "w1.test", TEXT, 2)
    b = cosig(W2_KEY, W2_PUBLIC, "w2.test", TEXT)
    once = merge_cosignatures(note, [b], LOG, ["w1.test", "w2.test"])
    twice = merge_cosignatures(once, [a1], LOG, ["w1.test", "w2.test"])
    again = merge_cosignatures(twice, [a2], LOG, ["w1.test", "w2.test"])
    sigs = parse_note(again).signatures
    assert [s.name for s in sigs] == [ORIGIN, "w1.test", "w2.test"]
    assert sigs[1] == a2 and sigs[0] == parse_note(note).signatures[0]
    assert parse_note(again).text == TEXT
    assert merge_cosignatures(again, [a2], LOG) == again


NOW = 1700000000  # the log's clock in the pure tests (the time `cosig` dates by default)


def test_an_answer_counts_only_valid_cosignatures_of_this_checkpoint() -> None:
    v1 = CosignatureVerifier.from_vkey(W1_VKEY)
    good = cosig(W1_KEY, W1_PUBLIC, "w1.test", TEXT)
    other = cosig(W2_KEY, W2_PUBLIC, "w2.test", TEXT)
    assert verified_cosignatures((other.line() + good.line()).encode(), TEXT, v1,
                                 now=NOW, skew=60) == [good]
    with pytest.raises(WitnessFailed, match=r"no valid cosignature by w1\.test"):
        verified_cosignatures(other.line().encode(), TEXT, v1, now=NOW, skew=60)
    stale = cosig(W1_KEY, W1_PUBLIC, "w1.test",
                  Checkpoint(ORIGIN, 2, hashlib.sha256(b"two").digest()).body())
    with pytest.raises(WitnessFailed, match="no valid cosignature"):
        verified_cosignatures(stale.line().encode(), TEXT, v1, now=NOW, skew=60)
    with pytest.raises(WitnessFailed, match="not cosignature lines"):
        verified_cosignatures(b"\x00garbage\n", TEXT, v1, now=NOW, skew=60)


def test_a_cosignature_dated_outside_the_window_is_refused() -> None:
    """A cosignature's time is an upper bound verifiers rely on: one dated more than ``skew``
    seconds from the log's clock (2**63 - 1, 1970, a minute and a second off) is refused,
    though its signature verifies; one within the window is taken."""
    v1 = CosignatureVerifier.from_vkey(W1_VKEY)
    for t in (2**63 - 1, 1, 0, NOW - 61, NOW + 61):
        line = cosig(W1_KEY, W1_PUBLIC, "w1.test", TEXT, t).line().encode()
        with pytest.raises(CosignatureRefused, match="outside"):
            verified_cosignatures(line, TEXT, v1, now=NOW, skew=60)
    for t in (NOW - 60, NOW + 60):
        ok = cosig(W1_KEY, W1_PUBLIC, "w1.test", TEXT, t)
        assert verified_cosignatures(ok.line().encode(), TEXT, v1, now=NOW, skew=60) == [ok]
    # of several, the one in the window
    far = cosig(W1_KEY, W1_PUBLIC, "w1.test", TEXT, 1)
    near = cosig(W1_KEY, W1_PUBLIC, "w1.test", TEXT, NOW)
    assert verified_cosignatures((near.line() + far.line()).encode(), TEXT, v1, now=NOW,
                                 skew=60) == [near]


def test_the_reported_states_are_read_back_for_the_configured_witnesses() -> None:
    ws = [WitnessConfig("http://a.test", W1_VKEY), WitnessConfig("http://b.test", W2_VKEY)]
    assert states_of(None, ws) == [WitnessState("w1.test", "http://a.test"),
                                   WitnessState("w2.test", "http://b.test")]
    a = WitnessState("w1.test", "http://a.test", cosigned_size=7, cosigned_at=5.0, errors=2)
    gone = WitnessState("old.test", "http://old.test", errors=9)
    items = json.loads(json.dumps(state_items([a, gone])))  # (as a report carries them)
    assert states_of(items, ws) == [a, WitnessState("w2.test", "http://b.test")]
    assert a.lag(10) == 3 and WitnessState("x", "y").lag(10) == 10 and a.lag(None) is None
    assert states_of("not a list", ws)[0] == WitnessState("w1.test", "http://a.test")
    assert states_of([{"name": "w1.test"}], ws)[0] == WitnessState("w1.test", "http://a.test")


# -- the sender ---------------------------------------------------------------------------------
class Log:
    """A log on disk: tiles written by TileWriter, checkpoints signed by the log key."""

    def __init__(self, root: Path) -> None:
        self.writer = TileWriter(root, sync=False)
        self.reader = TileReader(root)
        self.published: list[tuple[Offered, list[Signature]]] = []

    def grow(self, n: int) -> Offered:
        first = self.writer.size
        self.writer.append(first, [b"entry %d" % i for i in range(first, first + n)])
        text = Checkpoint(ORIGIN, self.writer.size, self.writer.root_hash()).body()
        note = signed(text)
        self.writer.publish(note)
        return Offered.of(note, LOG)

    async def on_cosigned(self, offered: Offered, sigs: list[Signature]) -> None:
        self.published.append((offered, sigs))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def witnesses() -> Iterator[list[LocalWitness]]:
    made = [LocalWitness("w1.test"), LocalWitness("w2.test", slow_seconds=1.0)]
    for w in made:
        w.trust(LOG_VKEY)
    yield made
    for w in made:
        w.close()


async def _until(predicate, what: str, timeout: float = 10) -> None:  # type: ignore[no-untyped-def]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def _verify_cosignature(w: LocalWitness, text: str, sig: Signature) -> int:
    """The timestamp of a cosignature, checked by `cryptography` on the spec's message."""
    (t,) = struct.unpack(">Q", sig.signature[:8])
    message = b"cosignature/v1\ntime %d\n" % t + text.encode()
    Ed25519PublicKey.from_public_bytes(w.public).verify(sig.signature[8:], message)
    return int(t)


def test_the_sender_collects_cosignatures_with_consistency_proofs(
        tmp_path: Path, witnesses: list[LocalWitness]) -> None:
    w1, w2 = witnesses
    log = Log(tmp_path / "tlog")
    configs = [WitnessConfig(w.url, w.vkey) for w in witnesses]

    async def run() -> None:
        sender = WitnessSender(configs, log.reader.node_reader, log.on_cosigned, timeout=0.5)
        try:
            first = log.grow(3)
            sender.offer(first)
            await _until(lambda: len(log.published) == 2, "two cosignatures")
            second = log.grow(5)  # 3 -> 8: a consistency proof of several hashes
            sender.offer(second)
            await _until(lambda: len(log.published) == 4, "two more")
        finally:
            await sender.stop()
        for offered, sigs in log.published:
            (sig,) = sigs
            w = w1 if sig.name == w1.name else w2
            _verify_cosignature(w, offered.text, sig)
        assert [(o.checkpoint.size, s[0].name) for o, s in log.published[2:]] in (
            [(8, "w1.test"), (8, "w2.test")], [(8, "w2.test"), (8, "w1.test")])
        # each witness checked the proof from the size it had cosigned (check_add_checkpoint)
        assert w1.requests == [(0, 3), (3, 8)] and w2.requests == [(0, 3), (3, 8)]
        states = states_of(state_items(sender.states()), configs)
        assert [(s.cosigned_size, s.errors) for s in states] == [(8, 0), (8, 0)]

    asyncio.run(run())


def test_a_witness_that_knows_a_size_is_asked_again_from_it(
        tmp_path: Path, witnesses: list[LocalWitness]) -> None:
    """A fresh sender (a restarted log) starts from 0; the witness answers 409 with its size
    and the sender tries once more from it, with the consistency proof from that size."""
    w1 = witnesses[0]
    log = Log(tmp_path / "tlog")
    configs = [WitnessConfig(w1.url, w1.vkey)]

    async def run() -> None:
        for grow in (4, 6):
            sender = WitnessSender(configs, log.reader.node_reader, log.on_cosigned,
                                   timeout=0.5)
            try:
                sender.offer(log.grow(grow))
                state = sender.states()[0]
                await _until(lambda s=state: s.cosigned_size == log.writer.size,
                             "a cosignature")
            finally:
                await sender.stop()

    asyncio.run(run())
    assert w1.requests == [(0, 4), (4, 10)]  # (the 409 of old 0 is not a checked request)
    assert len(log.published) == 2


def test_a_failing_witness_waits_its_backoff_then_gets_the_newest(
        tmp_path: Path, witnesses: list[LocalWitness]) -> None:
    w1, w2 = witnesses
    w1.set_mode("down")
    w2.set_mode("slow")  # (1 s, past the sender's timeout)
    log = Log(tmp_path / "tlog")
    clock = Clock()
    w1.clock = w2.clock = clock  # (their cosignatures are dated by the log's clock)
    configs = [WitnessConfig(w.url, w.vkey) for w in witnesses]

    async def run() -> None:
        sender = WitnessSender(configs, log.reader.node_reader, log.on_cosigned, timeout=0.3,
                               backoff=Backoff(10, 40), clock=clock)
        down, slow = sender.states()
        try:
            sender.offer(log.grow(2))
            await _until(lambda: down.errors == 1 and slow.errors == 1, "two failures")
            assert down.last_error is not None and "connect" in down.last_error
            assert slow.last_error == "no answer within 0.3 s"
            assert down.next_attempt_at == clock.now + 10
            w2.set_mode("good")  # (cosigns once its backoff is over: the next one it is due)
            for mode in ("refusing", "garbage"):
                w1.set_mode(mode)
                sender.offer(log.grow(1))  # a new checkpoint: still in its backoff
                await asyncio.sleep(0.2)
                assert down.errors == down.consecutive_errors
                clock.now += 40
                sender.poke()
                says = "HTTP 403" if mode == "refusing" else "not cosignature lines"
                await _until(lambda says=says: says in (down.last_error or ""), mode)
            assert down.consecutive_errors == 3 and down.next_attempt_at == clock.now + 40
            assert slow.cosigned_size == 4 and slow.errors == 1
            w1.set_mode("good")
            clock.now += 40
            sender.poke()  # no new checkpoint: the current one goes again
            await _until(lambda: down.cosigned_size == slow.cosigned_size == 4, "catching up")
            assert down.consecutive_errors == 0 and down.errors == 3 and down.last_error is None
        finally:
            await sender.stop()

    asyncio.run(run())
    assert w1.requests == [(0, 4)]
    assert {s[0].name for o, s in log.published if o.checkpoint.size == 4} == {"w1.test",
                                                                               "w2.test"}


class Ahead(LocalWitness):
    """A witness whose first answers are 409s naming the sizes ``claims`` (a size above the
    log's: a witness that lies, or was fed another tree of the origin), then as the spec
    says."""

    claims: list[int]

    def add_checkpoint(self, body: bytes) -> tuple[int, str, bytes]:
        if self.claims:
            return 409, SIZE_CONTENT_TYPE, encode_size(self.claims.pop(0))
        return super().add_checkpoint(body)


def test_a_size_above_the_logs_is_a_hint_not_a_state(tmp_path: Path) -> None:
    """A 409 naming a size above the checkpoint's fails that attempt, and nothing of it is
    kept: the next attempt is sent from the size the witness cosigned for this log (here 0),
    and cosigned."""
    clock = Clock()
    w = Ahead("w1.test")
    w.clock, w.claims = clock, [2**63 - 1]
    w.trust(LOG_VKEY)
    log = Log(tmp_path / "tlog")

    async def run() -> None:
        sender = WitnessSender([WitnessConfig(w.url, w.vkey)], log.reader.node_reader,
                               log.on_cosigned, timeout=0.5, backoff=Backoff(10, 40),
                               clock=clock)
        state = sender.states()[0]
        try:
            sender.offer(log.grow(3))
            await _until(lambda: state.errors == 1, "the refused attempt")
            assert state.last_error is not None and "above" in state.last_error
            clock.now += 10
            sender.poke()  # its backoff is over: the same checkpoint again, from 0
            await _until(lambda: state.cosigned_size == 3, "a cosignature")
        finally:
            await sender.stop()

    try:
        asyncio.run(run())
    finally:
        w.close()
    assert w.requests == [(0, 3)]
    assert [o.checkpoint.size for o, _ in log.published] == [3]


def test_cosignatures_dated_outside_the_window_are_refused_and_counted(
        tmp_path: Path, witnesses: list[LocalWitness]) -> None:
    """A witness dating its cosignatures 2**63 - 1, then 1 (1970): each answer is a failure
    that says why, counted in ``refused_cosignatures``, and nothing is published; once its
    clock is right it is cosigned."""
    w1 = witnesses[0]
    clock = Clock()
    log = Log(tmp_path / "tlog")

    async def run() -> None:
        sender = WitnessSender([WitnessConfig(w1.url, w1.vkey)], log.reader.node_reader,
                               log.on_cosigned, timeout=0.5, backoff=Backoff(10, 40),
                               clock=clock, cosignature_skew=60)
        state = sender.states()[0]
        try:
            sender.offer(log.grow(3))
            for n, t in enumerate((2**63 - 1, 1), start=1):
                w1.clock = lambda t=t: t
                if n > 1:
                    clock.now += 40  # (past its backoff)
                    sender.poke()
                await _until(lambda n=n: state.errors == n, f"refusal {n}")
                assert state.refused_cosignatures == n and state.cosigned_size is None
                assert state.last_error is not None and "outside" in state.last_error
                assert str(t) in state.last_error
            w1.clock = clock
            clock.now += 40
            sender.poke()
            await _until(lambda: state.cosigned_size == 3, "a cosignature")
            assert state.refused_cosignatures == 2 and state.consecutive_errors == 0
        finally:
            await sender.stop()

    asyncio.run(run())
    ((offered, (sig,)),) = log.published
    assert _verify_cosignature(w1, offered.text, sig) == clock.now


def test_offered_keeps_only_the_log_signature() -> None:
    note = merge_cosignatures(signed(TEXT), [cosig(W1_KEY, W1_PUBLIC, "w1.test", TEXT)], LOG)
    offered = Offered.of(note, LOG)
    assert offered.note == signed(TEXT) and offered.checkpoint.size == 3
    assert base64.b64encode(offered.checkpoint.root) == base64.b64encode(
        hashlib.sha256(b"three").digest())


# -- publishing (server.tlog.sequencer.Tlog) ------------------------------------------------------
def test_cosignatures_go_on_the_newest_checkpoint_only_and_to_the_hosts_that_follow(
        tmp_path: Path) -> None:
    """With hosts sharing a database: the sequencer's cosigned note goes into the checkpoint
    row, and a host that follows publishes it again (same size, new note). Cosignatures of
    a checkpoint that is no longer the newest are dropped."""
    import shutil

    from sqlalchemy import insert, select

    from server import db
    from server.models import TlogCheckpoint, TlogEntry
    from server.tlog.sequencer import LogKey, Tlog, TlogConfig
    from tests.helpers import migrated_journal

    shutil.copy(migrated_journal(), tmp_path / "db.sqlite3")
    engine = db.make_engine(f"sqlite:///{tmp_path / 'db.sqlite3'}")

    def tlog(name: str) -> Tlog:
        config = TlogConfig(tmp_path / name, LogKey(LOG_VKEY), {None: "F" * 40}, shared=True)
        return Tlog(engine, None, config,  # type: ignore[arg-type]
                    lambda: True, lambda: False)

    def row_note() -> str:
        with engine.connect() as conn:
            return str(conn.execute(select(TlogCheckpoint.note)).scalar_one())

    try:
        with engine.begin() as conn:
            conn.execute(insert(TlogEntry), [{"idx": i, "entry": b"e%d" % i} for i in range(3)])
        seq, follower = tlog("seq"), tlog("follower")

        def publish(t: Tlog) -> bytes:  # (what Tlog._checkpoint does, the log key signing)
            t._open()
            t._catch_up()
            text = Checkpoint(ORIGIN, t.writer.size, t.writer.root_hash()).body()
            note = signed(text)
            t._store_checkpoint(t.writer.size, note, 1)
            t.writer.publish(note)
            t._published, t._note = t.writer.size, note
            return note

        note = publish(seq)
        follower._open()
        follower._catch_up()
        follower._follow()
        assert follower.writer.read_checkpoint() == note
        text = parse_note(note).text
        a = cosig(W1_KEY, W1_PUBLIC, "w1.test", text)
        assert asyncio.run(seq.add_cosignatures(Offered.of(note, LOG), [a]))
        cosigned = seq.writer.read_checkpoint()
        assert cosigned is not None and parse_note(cosigned).signatures[1] == a
        assert row_note() == cosigned.decode()
        follower._follow()  # the same size, another note: published again
        assert follower.writer.read_checkpoint() == cosigned
        # a newer checkpoint: a late cosignature of the older one changes nothing
        with engine.begin() as conn:
            conn.execute(insert(TlogEntry).values(idx=3, entry=b"e3"))
        newer = publish(seq)
        late = cosig(W2_KEY, W2_PUBLIC, "w2.test", text)
        assert not asyncio.run(seq.add_cosignatures(Offered.of(note, LOG), [late]))
        assert seq.writer.read_checkpoint() == newer and row_note() == newer.decode()
    finally:
        engine.dispose()


def test_the_policy_is_404_without_a_transparency_log() -> None:
    from types import SimpleNamespace

    import httpx
    from fastapi import FastAPI

    from server.api.deps import services
    from server.api.tlog import add_tlog_routes

    app = FastAPI()
    add_tlog_routes(app)
    app.dependency_overrides[services] = lambda: SimpleNamespace(log_key=None)

    async def ask() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://stampd.test") as client:
            return await client.get("/tlog/policy")

    r = asyncio.run(ask())
    assert r.status_code == 404 and r.headers["content-type"].startswith("text/plain")
