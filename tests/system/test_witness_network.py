"""Three stampd servers, each a log witnessed by the other two (issue 24's network): every
checkpoint gets the two cosignatures, a proof carries them, the cosignatures verify with
`cryptography` on the spec's message (c2sp.org/tlog-cosignature), `stampd stamp --quorum-wait`
keeps a cosigned proof, `stampd verify --policy` accepts it under a 2-of-3 policy and names the
time the quorum had seen it, and `stampd audit` finds each witness's view consistent.

The log and witness keys are made here before the servers start, by the key store `stampd
serve` makes them with (``keys/tlog-ed25519/id`` and ``keys/witness-ed25519/id``), so that each
server can be started knowing the others' verifier keys."""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import struct
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    PublicFormat,
    load_ssh_private_key,
)

from client.audit.state import SeenCheckpoints, SeenLog
from formats.keys import TLOG_KEY, WITNESS_KEY, KeySpec, ed25519_public_key, tlog_vkey, witness_vkey
from formats.note import Note, Signature, VerifierKey, ed25519_signer, parse_note, sign_note
from formats.tlog.checkpoint import Checkpoint
from formats.tlog.proof import TlogProof
from keystore.keyset import SshKeyStore, key_dir
from stampd import cli
from tests.helpers import Server, free_port, make_repo, seed_data_dir, start_server

COMMIT_INTERVAL = 2  # seconds between git log commits (the audit needs one)
WAIT = 30.0  # seconds the test waits for cosignatures at most (bounded; no timing asserted)


@dataclass
class Host:
    port: int
    data: Path
    log_vkey: str
    witness_vkey: str
    witness_public: bytes
    server: Server | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def keygen(keys: Path, spec: KeySpec) -> str:
    """The public line of the key ``spec`` made in the key store ``keys`` as `stampd serve`
    makes it (`SshKeyStore.ensure`)."""
    store = SshKeyStore(key_dir(keys, spec))
    store.ensure(spec.algo, "test")
    return store.public_key_file.read_text()


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as r:
        return bytes(r.read())


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Host]]:
    hosts = []
    for i in range(3):
        port = free_port()
        data = seed_data_dir(tmp_path_factory.mktemp(f"wn{i}") / "data")
        log_pub = keygen(data / "keys", TLOG_KEY)
        witness_pub = keygen(data / "keys", WITNESS_KEY)
        hosts.append(Host(port, data, tlog_vkey(f"127.0.0.1:{port}/tlog", log_pub),
                          witness_vkey(f"127.0.0.1:{port}/witness", witness_pub),
                          ed25519_public_key(witness_pub)))
    try:
        for h in hosts:
            others = [o for o in hosts if o is not h]
            h.server = start_server(h.data, workers=1, port=h.port,
                                    commit_interval=COMMIT_INTERVAL, extra_env={
                "STAMPD_TLOG": "on",
                "STAMPD_WITNESS_FOR": ",".join(o.log_vkey for o in others),
                "STAMPD_WITNESSES": ",".join(f"{o.url}={o.witness_vkey}" for o in others),
                # (short: a witness that is not up yet when its log's first checkpoint goes out
                # is asked again soon)
                "STAMPD_WITNESS_RETRY_MAX": "1",
            }, wait=False)
        for h in hosts:
            assert h.server is not None
            h.server.wait_ready()
        yield hosts
    finally:
        for h in hosts:
            if h.server is not None:
                h.server.stop()
                shutil.rmtree(h.server.runtime_dir, ignore_errors=True)


def cosigners(note: bytes, hosts: list[Host]) -> dict[str, int]:
    """The hosts whose witness cosigned ``note``, and when; each cosignature verified here
    with `cryptography` on the message the spec defines (not with stampd's code)."""
    parsed = parse_note(note)
    found = {}
    for sig in parsed.signatures:
        for h in hosts:
            if sig.name == f"127.0.0.1:{h.port}/witness":
                (t,) = struct.unpack(">Q", sig.signature[:8])
                message = b"cosignature/v1\ntime %d\n" % t + parsed.text.encode()
                Ed25519PublicKey.from_public_bytes(h.witness_public).verify(
                    sig.signature[8:], message)  # raises InvalidSignature when it fails
                found[h.url] = t
    return found


def stamp_digest(h: Host, content: bytes) -> int:
    req = urllib.request.Request(f"{h.url}/v1/stamps", method="POST",
                                 data=f"sha256={hashlib.sha256(content).hexdigest()}".encode(),
                                 headers={"Content-Type": "application/x-www-form-urlencoded",
                                          "Accept": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return int(json.loads(r.read())["serial"])


def wait_cosigned_proof(h: Host, serial: int, hosts: list[Host]) -> tuple[bytes, float]:
    """The stamp's proof once its checkpoint carries both other hosts' cosignatures, and how
    long that took after the proof first existed (printed, never asserted)."""
    first: float | None = None
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        proof = get(f"{h.url}/v1/proofs/{serial}?wait=5")
        first = first or time.monotonic()
        if len(cosigners(TlogProof.parse(proof).checkpoint, hosts)) == 2:
            return proof, time.monotonic() - first
        time.sleep(0.2)
    raise AssertionError(f"no two cosignatures on {h.url}'s proof of {serial} in {WAIT} s")


def test_every_log_is_cosigned_by_the_two_others(hosts: list[Host]) -> None:
    for h in hosts:
        serial = stamp_digest(h, f"witnessed by the others {h.port}".encode())
        proof, took = wait_cosigned_proof(h, serial, hosts)
        cosigned = cosigners(TlogProof.parse(proof).checkpoint, hosts)
        assert set(cosigned) == {o.url for o in hosts if o is not h}
        print(f"{h.url}: proof of {serial} cosigned by both others {took:.2f} s after it "
              "existed")
        # the published checkpoint carries them too, and each witness serves its view
        assert len(cosigners(get(f"{h.url}/tlog/checkpoint"), hosts)) == 2
        policy = get(f"{h.url}/tlog/policy").decode()
        assert policy.count("\nwitness ") == 2 and "quorum witnesses" in policy


def test_stamp_waits_for_the_quorum_and_verify_checks_a_2_of_3_policy(
        hosts: list[Host], tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    a, b, c = hosts
    repo = make_repo(tmp_path / "repo")
    (repo / "release.txt").write_text("a release\n")
    monkeypatch.chdir(repo)
    code = cli.main(["stamp", "release.txt", "--server", a.url, "--quorum-wait", "30"])
    out, err = capsys.readouterr()
    assert code == 0, err
    witnessed = [line for line in out.splitlines() if line.startswith("witnessed:")]
    assert witnessed and "2 of 2 witnesses" in witnessed[0], out + err
    proof = (repo / "SHA256SUMS.asc.tlog-proof").read_bytes()
    times = cosigners(TlogProof.parse(proof).checkpoint, hosts)
    assert set(times) == {b.url, c.url}
    # 2 of 3: b, c and a third witness that never cosigns this log (a's own)
    policy = tmp_path / "policy"
    policy.write_text(f"log {a.log_vkey}\nwitness b {b.witness_vkey}\nwitness c "
                      f"{c.witness_vkey}\nwitness a {a.witness_vkey}\n"
                      "group three 2 a b c\nquorum three\n")
    code = cli.main(["verify", "SHA256SUMS.asc", "--dir", ".", "--policy", str(policy)])
    out, err = capsys.readouterr()
    assert code == 0, err
    line = next(x for x in out.splitlines() if x.startswith("witnessed:"))
    by = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(max(times.values())))
    assert "2 of 3 witnesses" in line and f"by {by}" in line, line
    # all three: the quorum does not hold, and verify says who cosigned
    policy.write_text(policy.read_text().replace("group three 2", "group three all"))
    code = cli.main(["verify", "SHA256SUMS.asc", "--dir", ".", "--policy", str(policy)])
    out, err = capsys.readouterr()
    assert code == 1 and "the policy needs 3 of three" in err, out + err


def audit(h: Host, state: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """`stampd audit` of ``h``'s log (exit status, stdout, stderr), again while it exits 3:
    the git log has no commit yet (it commits every COMMIT_INTERVAL s once it stamped)."""
    deadline = time.monotonic() + WAIT
    while True:
        code = cli.main(["audit", f"{h.url}/log.git", "--state", str(state)])
        out, err = capsys.readouterr()
        if code != 3 or time.monotonic() > deadline:
            return code, out, err
        time.sleep(0.5)


def test_audit_checks_the_witnesses_views(hosts: list[Host], tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    a = hosts[0]
    # Its checkpoint cosigned first: audited while it was sequenced, the checkpoint fetched
    # could be smaller than what the witnesses had seen, and they were then not checked.
    wait_cosigned_proof(a, stamp_digest(a, b"for the git log"), hosts)
    code, out, err = audit(a, tmp_path / "state.json", capsys)
    assert code == 0, out + err
    assert "2 witnesses' consistent" in out, out


def test_witness_views_are_served(hosts: list[Host]) -> None:
    a, b, _ = hosts
    wait_cosigned_proof(a, stamp_digest(a, b"for b's view"), hosts)
    origin = f"127.0.0.1:{a.port}/tlog"
    view = get(f"{b.url}/{hashlib.sha256(origin.encode()).hexdigest()}/checkpoint")
    assert b.url in cosigners(view, hosts)
    assert base64.b64decode(view.split(b"\n")[2]) != b""  # a root hash


def forged_checkpoint(h: Host, size: int) -> bytes:
    """A checkpoint of ``h``'s log at ``size`` with another root, signed by its log key (read
    from its data directory): the evidence of a second history."""
    key = load_ssh_private_key((h.data / "keys" / "tlog-ed25519" / "id").read_bytes(), None)
    assert isinstance(key, Ed25519PrivateKey)
    origin = f"127.0.0.1:{h.port}/tlog"
    body = Checkpoint(origin, size, hashlib.sha256(b"another tree").digest()).body()
    public = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return sign_note(body, [ed25519_signer(origin, public, key.sign)]).encode()


def test_a_second_history_is_refused_by_the_witness_and_caught_by_verify_and_audit(
        hosts: list[Host], tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    a, b, _ = hosts
    wait_cosigned_proof(a, stamp_digest(a, b"before the fork"), hosts)  # (b holds a view)
    origin = f"127.0.0.1:{a.port}/tlog"
    view_url = f"{b.url}/{hashlib.sha256(origin.encode()).hexdigest()}/checkpoint"
    view = get(view_url)
    size = Checkpoint.parse(parse_note(view).text).size
    # the witness: a tree of the size it cosigned, with another root, is refused (422)
    forged = forged_checkpoint(a, size)
    req = urllib.request.Request(f"{b.url}/add-checkpoint", method="POST",
                                 data=b"old %d\n\n" % size + forged)
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(req, timeout=30)
    assert refused.value.code == 422
    assert Checkpoint.parse(parse_note(get(view_url)).text) == \
        Checkpoint.parse(parse_note(view).text)  # nothing stored
    # the audit and verify, holding the forged checkpoint as one seen before
    state = tmp_path / "state.json"
    SeenCheckpoints(state, {origin: SeenLog(a.log_vkey, [forged.decode()])}).save()
    code, out, err = audit(a, state, capsys)
    assert code == 4, out + err  # (exit status 4: two histories)
    assert forged.decode().split("\n")[2] in out and "two histories" in out, out
    repo = make_repo(tmp_path / "repo")
    (repo / "f.txt").write_text("forked?\n")
    monkeypatch.chdir(repo)
    assert cli.main(["stamp", "f.txt", "--server", a.url]) == 0
    capsys.readouterr()
    code = cli.main(["verify", "SHA256SUMS.asc", "--dir", ".", "--state", str(state),
                     "--upgrade-proof"])
    out, err = capsys.readouterr()
    assert code == 1 and "cannot both hold" in err and forged.decode() in err, out + err


def test_attacks_on_a_witness_leave_its_view_and_the_audit_as_they_were(
        hosts: list[Host], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Anyone may send b the checkpoint of a's log that b cosigned, again and again, with
    more signature lines than the log's: a line under b's own name and key ID that does not
    verify, and a line of a key b does not know. b answers each (its cosignature) but keeps
    and serves the checkpoint with the log's signature and its own valid cosignature only, and
    `stampd audit` of a's log (which opens b's view with both keys) passes."""
    a, b, _ = hosts
    wait_cosigned_proof(a, stamp_digest(a, b"before the attacks"), hosts)
    origin = f"127.0.0.1:{a.port}/tlog"
    view_url = f"{b.url}/{hashlib.sha256(origin.encode()).hexdigest()}/checkpoint"
    deadline = time.monotonic() + WAIT
    while b.url not in cosigners(view := get(view_url), hosts):  # (written after its answer)
        assert time.monotonic() < deadline, "b's view of a's log is not cosigned"
        time.sleep(0.2)
    parsed = parse_note(view)
    log_signature = parsed.signatures[0]
    assert log_signature.name == origin
    b_name = f"127.0.0.1:{b.port}/witness"
    b_key = VerifierKey.parse(b.witness_vkey)
    bogus = Signature(b_name, b_key.key_id, bytes(72))
    stranger = Signature("stranger.example/witness", 0x01020304, bytes(72))
    size = Checkpoint.parse(parsed.text).size
    body = b"old %d\n\n" % size + Note(parsed.text, (log_signature, bogus, stranger)).encode()
    for _ in range(5):
        req = urllib.request.Request(f"{b.url}/add-checkpoint", method="POST", data=body)
        with urllib.request.urlopen(req, timeout=30) as r:
            assert r.status == 200
    served = parse_note(get(view_url))
    assert served.text == parsed.text
    assert [(s.name, s.key_id) for s in served.signatures] == [
        (origin, log_signature.key_id), (b_name, b_key.key_id)]
    assert b.url in cosigners(get(view_url), hosts)  # (its own, valid)
    code, out, err = audit(a, tmp_path / "state.json", capsys)
    assert code == 0, out + err
    assert "2 witnesses' consistent" in out, out
