"""stampd as a log whose checkpoints are witnessed: a real `stampd serve` (STAMPD_TLOG=on, two
HTTP processes) sends each checkpoint to three witnesses written here (tests.helpers.
LocalWitness: the pure protocol checks, a `cryptography` key), publishes their cosignatures on
the checkpoint and so in every proof, checked by `cryptography` on the spec's message; one
witness down, slow, answering garbage or refusing never stops stamping or readiness, shows on
/readyz, /metrics and the status page, and is caught up when it returns. And the published
policy (/tlog/policy). The third witness's URL carries credentials, which go with each request
to it and are published nowhere."""

from __future__ import annotations

import base64
import http.client
import json
import re
import secrets
import struct
import time
from collections.abc import Iterator
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from formats.note import Ed25519Verifier, parse_note
from formats.tlog.checkpoint import Checkpoint, CosignatureVerifier
from formats.tlog.proof import TlogProof, verify_proof
from tests.helpers import LocalWitness, Server, seed_data_dir, start_server, wait_for

NAMES = ("a.witness.test", "b.witness.test", "c.witness.test")
SECRET = "s3cret-T0KEN"  # the password in the third witness's URL


@pytest.fixture(scope="module")
def witnesses() -> Iterator[list[LocalWitness]]:
    made = [LocalWitness(name, slow_seconds=2.5) for name in NAMES]
    yield made
    for w in made:
        w.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory,
           witnesses: list[LocalWitness]) -> Iterator[Server]:
    data = seed_data_dir(tmp_path_factory.mktemp("witnessed"))
    a, b, c = witnesses
    args = ("--witness", a.spec, "--witness", b.spec, "--witness",
            f"http://ops:{SECRET}@127.0.0.1:{c.port}={c.vkey}")
    s = start_server(data, workers=1, api_processes=2, args=args, extra_env={
        "STAMPD_TLOG": "on", "STAMPD_WITNESS_TIMEOUT": "1",
        "STAMPD_WITNESS_RETRY_BASE": "0.2", "STAMPD_WITNESS_RETRY_MAX": "1"})
    try:
        log_vkey = get(s, "/tlog/vkey")[2].decode().strip()
        for w in witnesses:  # (until now they answered 404: an unknown log)
            w.trust(log_vkey)
        yield s
    finally:
        s.stop()


def get(server: Server, path: str, accept: str = "*/*") -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        conn.request("GET", path, headers={"Accept": accept})
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def stamp(server: Server) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        conn.request("POST", "/v1/stamps", body=f"sha256={secrets.token_hex(32)}",
                     headers={"Content-Type": "application/x-www-form-urlencoded",
                              "Accept": "application/json"})
        r = conn.getresponse()
        body = json.loads(r.read())
    finally:
        conn.close()
    assert r.status == 200, body
    return int(body["serial"])


def cosigners(note: bytes, witnesses: list[LocalWitness]) -> dict[str, int]:
    """The witnesses whose cosignature on ``note`` verifies with `cryptography` on the
    spec's message (``cosignature/v1``, ``time <t>``, the checkpoint), with its time."""
    parsed = parse_note(note)
    out: dict[str, int] = {}
    for w in witnesses:
        key = Ed25519PublicKey.from_public_bytes(w.public)
        for s in parsed.signatures:
            if s.name != w.name:
                continue
            (t,) = struct.unpack(">Q", s.signature[:8])
            message = b"cosignature/v1\ntime %d\n" % t + parsed.text.encode()
            key.verify(s.signature[8:], message)  # (raises if it does not verify)
            out[w.name] = int(t)
    return out


def checkpoint(server: Server) -> tuple[Checkpoint, bytes]:
    status, _, note = get(server, "/tlog/checkpoint")
    assert status == 200
    return Checkpoint.parse(parse_note(note).text), note


def wait_cosigned(server: Server, witnesses: list[LocalWitness], names: set[str],
                  min_size: int) -> bytes:
    """The checkpoint once it is of ``min_size`` or more and carries (at least) the
    cosignatures of ``names``."""
    found: list[bytes] = []

    def ready() -> bool:
        cp, note = checkpoint(server)
        if cp.size >= min_size and names <= set(cosigners(note, witnesses)):
            found.append(note)
            return True
        return False

    wait_for(ready, timeout=30, what=f"cosignatures of {sorted(names)} at size {min_size}")
    return found[0]


def readyz(server: Server) -> dict[str, Any]:
    status, _, body = get(server, "/readyz")
    answer = json.loads(body)
    assert status == 200, answer  # (a witness never makes the server unready)
    return answer  # type: ignore[no-any-return]


def witness_metrics(server: Server) -> dict[tuple[str, str], float]:
    status, _, body = get(server, "/metrics")
    assert status == 200
    out = {}
    for m in re.finditer(r'^(stampd_witness_\w+)\{witness="([^"]+)"\} (\S+)$', body.decode(),
                         re.M):
        out[(m[1], m[2])] = float(m[3])
    return out


def test_every_checkpoint_and_proof_carries_the_witnesses_cosignatures(
        server: Server, witnesses: list[LocalWitness]) -> None:
    all_names = set(NAMES)
    for _ in range(2):  # each new checkpoint
        serial = stamp(server)
        status, headers, _ = get(server, f"/v1/proofs/{serial}?wait=10")
        assert status == 200
        index = int(headers["x-stampd-log-index"])
        note = wait_cosigned(server, witnesses, all_names, index + 1)
    assert [s.name for s in parse_note(note).signatures] == [
        Checkpoint.parse(parse_note(note).text).origin, *NAMES]  # the log's first
    # The proof of the last stamp now carries them too, and verifies with a 2-of-3 policy.
    _, _, proof = get(server, f"/v1/proofs/{serial}")
    parsed = TlogProof.parse(proof)
    assert set(cosigners(parsed.checkpoint, witnesses)) == all_names
    log_key = Ed25519Verifier.from_vkey(get(server, "/tlog/vkey")[2].decode().strip())
    verifiers = [CosignatureVerifier.from_vkey(w.vkey) for w in witnesses]
    assert parsed.extra is not None
    index_size = verify_proof(proof, parsed.extra, origin=log_key.name, log_keys=[log_key],
                              witnesses=verifiers, quorum=2)
    assert tuple(index_size) == (index, Checkpoint.parse(parse_note(note).text).size)
    # Each witness was sent each checkpoint from the size it had cosigned (it checked the
    # consistency proof): never a size 0 again once it had cosigned.
    for w in witnesses:
        olds = [old for old, _new in w.requests]
        assert olds[1:] == [new for _old, new in w.requests][:-1]
    # Readiness: every witness has cosigned the published checkpoint, as both HTTP processes
    # say (the one that sends from memory, the other from its reports to the coordinator).
    cp, _ = checkpoint(server)
    seen: dict[str, dict[str, Any]] = {}
    for _ in range(40):
        answer = readyz(server)
        this = next(k for k, v in answer["checks"].items()
                    if k.startswith("http:") and v["detail"] == "answering this request")
        seen[this] = answer["witnesses"]
        if len(seen) == 2:
            break
    assert sorted(seen) == ["http:0", "http:1"]
    for state in seen.values():
        assert set(state) == all_names
        for name in NAMES:
            assert state[name]["ok"] and state[name]["cosigned_size"] == cp.size
            assert state[name]["lag"] == 0 and state[name]["last_error"] is None


def test_the_policy_names_the_log_the_witnesses_and_a_majority(
        server: Server, witnesses: list[LocalWitness]) -> None:
    status, headers, body = get(server, "/tlog/policy")
    assert status == 200 and headers["content-type"].startswith("text/plain")
    log_vkey = get(server, "/tlog/vkey")[2].decode().strip()
    assert body.decode() == (
        f"log {log_vkey} {server.url}tlog\n"
        + "".join(f"witness {w.name} {w.vkey} {w.url}\n" for w in witnesses)
        + f"group witnesses 2 {' '.join(NAMES)}\nquorum witnesses\n")


@pytest.mark.parametrize(("mode", "says"), [
    ("down", "cannot connect"), ("slow", "no answer within 1 s"),
    ("garbage", "not cosignature lines"), ("refusing", "HTTP 403"),
])
def test_a_failing_witness_never_stops_stamping_and_is_named(
        server: Server, witnesses: list[LocalWitness], mode: str, says: str) -> None:
    a, b, c = witnesses
    before = witness_metrics(server).get(("stampd_witness_errors_total", c.name), 0)
    c.set_mode(mode)
    try:
        serial = stamp(server)  # stamping goes on
        status, headers, _ = get(server, f"/v1/proofs/{serial}?wait=10")
        assert status == 200
        size = int(headers["x-stampd-log-index"]) + 1
        wait_cosigned(server, witnesses, {a.name, b.name}, size)  # the others cosign it

        def named() -> bool:
            c_state = readyz(server)["witnesses"][c.name]
            return (not c_state["ok"] and says in (c_state["last_error"] or "")
                    and c_state["consecutive_errors"] > 0 and c_state["lag"] > 0)

        wait_for(named, timeout=30, what=f"readyz naming {c.name} ({mode})")

        def shown() -> bool:
            """As /readyz and /metrics say it, whichever process answers: the sending one from
            memory, the other from its last report to the coordinator (sent on each change)."""
            answer = readyz(server)
            assert answer["ready"] is True
            metrics = witness_metrics(server)
            return (says in answer["witnesses"][c.name]["detail"]
                    and metrics[("stampd_witness_errors_total", c.name)] > before
                    and metrics[("stampd_witness_lag_entries", c.name)] > 0)

        wait_for(shown, timeout=10, what=f"/readyz and /metrics naming {c.name} ({mode})")
        metrics = witness_metrics(server)
        assert metrics[("stampd_witness_lag_entries", a.name)] == 0 or \
            metrics[("stampd_witness_cosigned_size", a.name)] >= size
        _, _, page = get(server, "/", accept="text/html")
        table = re.search(r'<table id="witnesses">.*?</table>', page.decode(), re.S)
        assert table is not None and c.name in table[0] and "failed in a row" in table[0]
    finally:
        c.set_mode("good")
    # Back: the log catches it up on the current checkpoint, with no new stamp.
    cp, _ = checkpoint(server)
    wait_cosigned(server, witnesses, set(NAMES), cp.size)
    wait_for(lambda: readyz(server)["witnesses"][c.name]["ok"], timeout=10,
             what=f"{c.name} ok again")
    assert witness_metrics(server)[("stampd_witness_last_cosigned_timestamp_seconds",
                                    c.name)] > 0


def test_a_witness_dating_its_cosignatures_1970_is_refused_and_named(
        server: Server, witnesses: list[LocalWitness]) -> None:
    """Its cosignatures verify but are dated 1 (1970): none is published, /readyz says why
    and /metrics counts them; with its clock right again it is caught up."""
    a, b, c = witnesses
    before = witness_metrics(server).get(
        ("stampd_witness_refused_cosignatures_total", c.name), 0)
    c.clock = lambda: 1
    try:
        serial = stamp(server)
        status, headers, _ = get(server, f"/v1/proofs/{serial}?wait=10")
        assert status == 200
        size = int(headers["x-stampd-log-index"]) + 1
        wait_cosigned(server, witnesses, {a.name, b.name}, size)

        def named() -> bool:
            state = readyz(server)["witnesses"][c.name]
            return not state["ok"] and "outside" in state["detail"] and state["lag"] > 0

        wait_for(named, timeout=30, what=f"readyz naming {c.name}'s cosignature time")
        assert readyz(server)["witnesses"][c.name]["refused_cosignatures"] > 0
        assert witness_metrics(server)[("stampd_witness_refused_cosignatures_total",
                                        c.name)] > before
        assert c.name not in cosigners(checkpoint(server)[1], witnesses)
    finally:
        c.clock = time.time
    cp, _ = checkpoint(server)
    note = wait_cosigned(server, witnesses, set(NAMES), cp.size)
    assert cosigners(note, witnesses)[c.name] > 1


def test_credentials_in_a_witness_url_are_sent_and_published_nowhere(
        server: Server, witnesses: list[LocalWitness]) -> None:
    c = witnesses[2]
    cp, _ = checkpoint(server)
    wait_cosigned(server, witnesses, {c.name}, cp.size)
    assert c.authorizations[-1] == "Basic " + base64.b64encode(f"ops:{SECRET}".encode()).decode()
    for path, accept in (("/tlog/policy", "*/*"), ("/readyz", "*/*"), ("/metrics", "*/*"),
                         ("/", "text/html"), ("/stamp", "text/html"), ("/verify", "text/html")):
        status, _, body = get(server, path, accept)
        assert status == 200, path
        assert SECRET.encode() not in body and b"ops:" not in body, path
    assert readyz(server)["witnesses"][c.name]["url"] == c.url
    assert f"witness {c.name} {c.vkey} {c.url}\n".encode() in get(server, "/tlog/policy")[2]
    for f in (server.data_dir / "run").rglob("*"):  # (nothing of the host's written down)
        if f.is_file():
            assert SECRET.encode() not in f.read_bytes(), f
    # (c failed in every way above: each failure was logged, by name and URL)
    assert c.name in server.log_path.read_text() and SECRET not in server.log_path.read_text()
