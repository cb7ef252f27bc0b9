"""RFC 3161 under faults: mutated and random queries, TSA workers and agents killed under load,
and tokens published in a log that a peer cross-stamps and `stampd audit` checks.

Real processes throughout: stampd servers (stopped by PID at teardown), their workers and
gpg-agents, `openssl ts` for queries and verification, git for the clone. Nothing is mocked.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import os
import random
import signal
import sqlite3
import subprocess
import threading
import urllib.parse
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pygit2
from asn1crypto import cms, core, tsp
from cryptography import x509
from rfc3161_client import VerifierBuilder, decode_timestamp_response

from formats.tsp.response import TimeStampResp
from tests.helpers import (
    Server,
    branch,
    free_port,
    pid_gone,
    run_stampd,
    seed_data_dir,
    stamp_tag,
    start_server,
    wait_for,
)

TSQ = "application/timestamp-query"
TSR = "application/timestamp-reply"
TSA_KEY = "openpgp-nistp256"
MAX_BODY = 1000  # STAMPD_MAX_BODY's default: larger bodies may be answered 413
ALGORITHMS = ("sha256", "sha384", "sha512")


# -- helpers ----------------------------------------------------------------------------------
def openssl(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=60, check=False)


def make_query(tmp: Path, name: str, alg: str, digest: bytes, *, cert: bool = True,
               nonce: bool = True) -> bytes:
    """A DER TimeStampReq made by `openssl ts -query`, also left in ``tmp/name``."""
    args = ["ts", "-query", "-digest", digest.hex(), f"-{alg}", "-out", name]
    args += ["-cert"] if cert else []
    args += [] if nonce else ["-no_nonce"]
    r = openssl(*args, cwd=tmp)
    assert r.returncode == 0, r.stderr
    return (tmp / name).read_bytes()


@dataclass
class Answer:
    body: bytes  # what was sent
    status: int
    ctype: str
    reply: bytes


def post(port: int, body: bytes, path: str = "/") -> Answer:
    """POST one query on a connection of its own (bounded by its timeout)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": TSQ})
        r = conn.getresponse()
        return Answer(body, r.status, r.getheader("Content-Type", ""), r.read())
    finally:
        conn.close()


def parse_reply(reply: bytes) -> TimeStampResp:
    """A TimeStampResp, no trailing bytes: the status, and the token (if any) as sigstore's
    rfc3161-client decodes it, its TSTInfo as asn1crypto does (asn1crypto parses lazily;
    ``native`` forces a parse: not of the whole token, which takes 40 ms)."""
    resp = TimeStampResp.load(reply, strict=True)
    _ = resp["status"].native
    if has_token(resp):
        decode_timestamp_response(reply)
        _ = tst_info(resp).native
    return resp


def has_token(resp: TimeStampResp) -> bool:
    return not isinstance(resp["time_stamp_token"], core.Void)


def granted(resp: TimeStampResp) -> bool:
    return resp["status"]["status"].native in ("granted", "granted_with_mods")


def tst_info(resp: TimeStampResp) -> tsp.TSTInfo:
    signed = resp["time_stamp_token"]["content"]
    assert isinstance(signed, cms.SignedData)
    return signed["encap_content_info"]["content"].parsed


def tsa_rows(server: Server) -> list[tuple[int, str]]:
    with contextlib.closing(sqlite3.connect(server.data_dir / "stampd.sqlite3")) as db:
        return db.execute("select id, state from stamps where kind = 'tsa' order by id"
                          ).fetchall()


def fetch_chain(server: Server, path: Path) -> Path:
    r = subprocess.run(["curl", "-sS", "-f", "-o", str(path), server.url + "tsa.pem"],
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    return path


def no_traceback(server: Server) -> None:
    text = server.log_path.read_text(errors="replace")
    assert "Traceback" not in text, text[max(0, text.index("Traceback") - 2000):][:6000]


def tsa_server(data: Path, *, extra_workers: int = 1, commit_interval: float = 3600,
               env: dict[str, str] | None = None, wait: bool = True,
               port: int | None = None) -> Server:
    return start_server(data, workers=1, commit_interval=commit_interval, port=port, wait=wait,
                        extra_env={"STAMPD_TSA": "true",
                                   "STAMPD_EXTRA_KEY_WORKERS": str(extra_workers),
                                   **(env or {})})


# -- 1. fuzz ------------------------------------------------------------------------------------
LENGTH_TAGS = {0x30, 0x31, 0x02, 0x04, 0x05, 0x06, 0x01, 0xA0, 0xA1, 0x80, 0x81}


def _change_length(rng: random.Random, data: bytearray) -> bytearray:
    """Rewrite the length octet after a tag: off by a little, indefinite (BER), long forms
    with absurd values, or too long to fit."""
    spots = [i + 1 for i in range(len(data) - 1) if data[i] in LENGTH_TAGS]
    if not spots:
        return data
    i = rng.choice(spots)
    choice = rng.randrange(6)
    if choice == 0:
        data[i] = (data[i] + rng.choice((-2, -1, 1, 2))) % 256
    elif choice == 1:
        data[i] = 0x80  # indefinite length
    elif choice == 2:
        data[i:i + 1] = bytes([0x81, data[i]])  # non-minimal long form
    elif choice == 3:
        data[i:i + 1] = b"\x84\xff\xff\xff\xff"
    elif choice == 4:
        data[i:i + 1] = b"\x89" + bytes(rng.randrange(256) for _ in range(9))
    else:
        data[i] = 0xFF
    return data


def _mutate(rng: random.Random, data: bytes, corpus: list[bytes]) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 3)):
        if not out:
            out = bytearray(rng.choice(corpus))
        op = rng.randrange(9)
        i = rng.randrange(len(out))
        if op == 0:  # flip bits of a byte
            out[i] ^= rng.randrange(1, 256)
        elif op == 1:  # a random byte
            out[i] = rng.randrange(256)
        elif op == 2:  # truncate
            del out[i:]
        elif op == 3:  # extend
            out += rng.randbytes(rng.randint(1, 40))
        elif op == 4:  # splice with another query
            other = rng.choice(corpus)
            out = out[:i] + other[rng.randrange(len(other)):]
        elif op == 5:
            out = _change_length(rng, out)
        elif op == 6:  # insert
            out[i:i] = rng.randbytes(rng.randint(1, 8))
        elif op == 7:  # delete a range
            del out[i:i + rng.randint(1, 8)]
        else:  # duplicate a range
            j = rng.randrange(i, len(out) + 1)
            out[j:j] = out[i:j]
    return bytes(out)


POLICY = "2.25.178387009458913539541377305212843591845"  # STAMPD_TSA_POLICY's default
SHA256_ALG = bytes.fromhex("300d06096086480165030402010500")  # sha256, NULL parameters


def tlv(tag: int, content: bytes) -> bytes:
    """One DER tag-length-value."""
    n = len(content)
    if n < 0x80:
        return bytes([tag, n]) + content
    size = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return bytes([tag, 0x80 | len(size)]) + size + content


def crafted_queries(tmp: Path) -> dict[bytes, str]:
    """Queries that openssl does not make, and what each is answered: "granted" or the
    failInfo of the rejection (docs/tsa.md)."""

    def query(*fields: bytes, digest: bytes = hashlib.sha256(b"crafted").digest(),
              version: bytes = b"\x01") -> bytes:
        imprint = tlv(0x30, SHA256_ALG + tlv(0x04, digest))
        return tlv(0x30, tlv(0x02, version) + imprint + b"".join(fields))

    def extension(critical: bool) -> bytes:
        flag = b"\x01\x01\xff" if critical else b""
        return tlv(0xA0, tlv(0x30, tlv(0x06, b"\x2a\x03\x04") + flag + tlv(0x04, b"x")))

    policy = tlv(0x06, core.ObjectIdentifier(POLICY).contents)
    cert_req = b"\x01\x01\xff"
    good = query()
    return {
        make_query(tmp, "sha1.tsq", "sha1", hashlib.sha1(b"x").digest()): "bad_alg",
        query(tlv(0x06, b"\x2a\x03\x04")): "unaccepted_policy",
        query(policy): "granted",
        query(version=b"\x02"): "bad_request",
        query(extension(critical=True)): "unaccepted_extensions",  # asn1crypto: bit 16
        query(policy, tlv(0x02, b"\x00" + b"\xff" * 20), cert_req, extension(critical=False)):
            "granted",  # a 160-bit nonce, a non-critical extension
        query(tlv(0x02, b"\x01" + b"\x00" * 20)): "bad_data_format",  # a 161-bit nonce
        query(tlv(0x02, b"\xfe")): "bad_data_format",  # a negative nonce
        query(tlv(0x02, b"\x00\x05")): "bad_data_format",  # BER: a non-minimal integer
        query(b"\x01\x01\x00"): "bad_data_format",  # BER: certReq's default FALSE encoded
        good + b"\x00": "bad_data_format",  # trailing bytes
        b"\x30\x80" + good[2:] + b"\x00\x00": "bad_data_format",  # BER: indefinite length
        query(digest=bytes(31)): "bad_data_format",  # a short digest
    }


def fuzz_bodies(rng: random.Random, corpus: list[bytes], n: int) -> list[bytes]:
    bodies: list[bytes] = [
        b"", b"\x00", b"\x30", b"\x30\x00", b"\x30\x80\x00\x00", b"\x30\x84\xff\xff\xff\xff",
        b"\x30\x80" * 400,  # deep indefinite-length nesting (BER), under the size limit
        b"\x30\x81\x7f" * 300,  # deep nesting with lengths that do not add up
        b"\x30\x03junk", b"-----BEGIN TSQ-----\n",
        corpus[0] + b"\x00",  # trailing bytes
        corpus[0] * 2,  # two queries in one body
    ]
    bodies += corpus  # the originals: granted
    while len(bodies) < n:
        kind = rng.random()
        if kind < 0.08:
            bodies.append(rng.randbytes(rng.randint(0, 300)))
        elif kind < 0.11:  # larger than the body limit: 413 allowed
            bodies.append(rng.randbytes(rng.randint(MAX_BODY + 1, 4000)))
        elif kind < 0.14:  # a valid prefix then junk up to the limit and past it
            bodies.append(rng.choice(corpus) + rng.randbytes(rng.randint(800, 1200)))
        else:
            bodies.append(_mutate(rng, rng.choice(corpus), corpus))
    return bodies


def test_fuzzed_queries_get_a_parsable_reply_and_only_grants_are_journalled(
    tmp_path: Path, server_factory: list[Server]
) -> None:
    """~400 bodies made from real `openssl ts -query` queries (every algorithm, with and
    without nonce and certReq) and hand-made ones (policy, extensions, nonces, BER) by
    flipping, truncating, extending, splicing and re-lengthing them, plus random bytes, sent 4
    at a time to `/` and `/tsr`: each is answered, below 500 (413 only when over the body
    limit), with a TimeStampResp that parses: granted with a token, or a rejection with one
    failInfo (the unchanged seeds: the documented one); granted tokens answer exactly the
    imprint and nonce the body asked for; the journal holds one `tsa` row per granted token and
    no other, whose ids are the tokens' serial numbers; the server logged no Traceback."""
    server = tsa_server(seed_data_dir(tmp_path / "data"))
    server_factory.append(server)
    server.wait_ready(workers=2)
    rng = random.Random(3161)
    expected = {make_query(tmp_path, f"q-{alg}-{cert}-{nonce}.tsq", alg,
                           hashlib.new(alg, f"{alg}{cert}{nonce}".encode()).digest(),
                           cert=cert, nonce=nonce): "granted"
                for alg in ALGORITHMS for cert in (True, False) for nonce in (True, False)}
    expected |= crafted_queries(tmp_path)
    corpus = list(expected)
    bodies = fuzz_bodies(rng, corpus, 400)
    paths = [rng.choice(("/", "/tsr")) for _ in bodies]
    before = tsa_rows(server)

    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda bp: post(server.port, *bp), zip(bodies, paths, strict=True),
                                timeout=300))

    assert len(answers) == len(bodies)
    grants: list[tuple[Answer, TimeStampResp]] = []
    statuses: dict[str, int] = {}
    for n, a in enumerate(answers):
        where = f"body {n} ({len(a.body)} bytes {a.body[:40].hex()}...)"
        assert a.status < 500, f"{where}: HTTP {a.status} {a.reply[:200]!r}"
        assert a.status == 200 or (a.status == 413 and len(a.body) > MAX_BODY), \
            f"{where}: HTTP {a.status}"
        assert a.ctype == TSR, f"{where}: Content-Type {a.ctype}"
        resp = parse_reply(a.reply)
        state = resp["status"]["status"].native
        statuses[state] = statuses.get(state, 0) + 1
        if granted(resp):
            assert a.status == 200 and has_token(resp), where
            grants.append((a, resp))
            outcome = "granted"
        else:
            assert state == "rejection", f"{where}: {state}"
            assert not has_token(resp), where
            fail_info = resp["status"]["fail_info"].native
            assert fail_info and len(fail_info) == 1, f"{where}: failInfo {fail_info}"
            (outcome,) = fail_info
        if a.body in expected:
            assert outcome == expected[a.body], f"{where}: {outcome}, not {expected[a.body]}"
    # Most mutations are refused.
    assert statuses.get("rejection", 0) >= len(bodies) // 2, statuses

    # A granted token answers what the body asked (the body was a valid query, then).
    serials = []
    for a, resp in grants:
        query = tsp.TimeStampReq.load(a.body)
        info = tst_info(resp)
        assert info["message_imprint"].dump() == query["message_imprint"].dump()
        assert info["nonce"].native == query["nonce"].native
        serials.append(info["serial_number"].native)
    assert len(set(serials)) == len(serials), "a serial number was reused"

    # One journal row per granted token, none for a refusal; a token's serial is its row.
    rows = [r for r in tsa_rows(server) if r not in before]
    assert len(rows) == len(grants), (len(rows), statuses)
    assert sorted(serials) == [r[0] for r in rows]

    # OpenSSL reads a sample of the replies too.
    sample = answers[::25] + [a for a, _ in grants[:3]]
    for i, a in enumerate(sample):
        (tmp_path / f"r{i}.tsr").write_bytes(a.reply)
        r = openssl("ts", "-reply", "-in", f"r{i}.tsr", "-text", cwd=tmp_path)
        assert r.returncode == 0 and "Status: " in r.stdout, r.stdout + r.stderr

    assert server.proc.poll() is None
    server.wait_ready(workers=2, timeout=30)
    no_traceback(server)


# -- 2. kill -9 under load ----------------------------------------------------------------------
REQUESTS = 200
THREADS = 8


def tsa_workers(server: Server) -> list[int]:
    return server.key_workers(TSA_KEY)


def agent_of(server: Server, worker: int) -> int | None:
    """The gpg-agent a worker started (its child, serving the worker's home)."""
    for pid in server.agent_pids():
        try:
            ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == worker:
            return pid
    return None


class Counter:
    """Completed requests, for waiting on progress with a bound."""

    def __init__(self) -> None:
        self.n = 0
        self.cond = threading.Condition()

    def add(self) -> None:
        with self.cond:
            self.n += 1
            self.cond.notify_all()

    def wait_for(self, n: int, timeout: float = 60) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: self.n >= n, timeout=timeout), \
                f"only {self.n} of {n} requests done in {timeout}s"


def test_tsa_worker_and_agent_killed_under_load(tmp_path: Path,
                                                server_factory: list[Server]) -> None:
    """Two TSA workers; 200 queries (every algorithm, with and without nonce and certReq) from
    8 threads; one TSA worker is killed with SIGKILL, later the gpg-agent of the other: every
    query is answered 200 with a granted token that verifies against its query (imprint,
    nonce) and the published certificate (rfc3161-client for all, `openssl ts -verify` for a
    sample); serials are unique; the journal holds one signed `tsa` row per token, some
    retried (the kills hit jobs in flight); the killed worker, its agent and the worker whose
    agent was killed are gone, two TSA workers (new PIDs, each with its own agent) serve
    again; the server logged no Traceback."""
    server = tsa_server(seed_data_dir(tmp_path / "data"), extra_workers=2)
    server_factory.append(server)
    server.wait_ready(workers=3)
    wait_for(lambda: len(tsa_workers(server)) == 2, timeout=30, what="two TSA workers")
    chain = fetch_chain(server, tmp_path / "tsa.pem")

    qdir = tmp_path / "q"
    qdir.mkdir()
    specs = [(ALGORITHMS[i % 3], os.urandom(64), i % 2 == 0, i % 4 != 3)
             for i in range(REQUESTS)]

    def query(i: int) -> bytes:
        alg, seed, cert, nonce = specs[i]
        return make_query(qdir, f"{i}.tsq", alg, hashlib.new(alg, seed).digest(), cert=cert,
                          nonce=nonce)

    with ThreadPoolExecutor(2) as pool:
        queries = list(pool.map(query, range(REQUESTS), timeout=120))

    done = Counter()
    answers: list[Answer | None] = [None] * REQUESTS
    todo = iter(range(REQUESTS))
    lock = threading.Lock()
    stop = threading.Event()  # set when the test fails early: the clients give up

    def client() -> None:
        while not stop.is_set():
            with lock:
                i = next(todo, None)
            if i is None:
                return
            try:
                answers[i] = post(server.port, queries[i], "/tsr" if i % 2 else "/")
            except (OSError, http.client.HTTPException) as e:
                answers[i] = Answer(queries[i], 0, repr(e), b"")
            done.add()

    w1, w2 = tsa_workers(server)
    a1, a2 = agent_of(server, w1), agent_of(server, w2)
    assert a1 is not None and a2 is not None, server.agent_pids()
    pool = ThreadPoolExecutor(THREADS)
    try:
        futures = [pool.submit(client) for _ in range(THREADS)]
        done.wait_for(REQUESTS // 5)
        os.kill(w1, signal.SIGKILL)
        done.wait_for(REQUESTS // 2)
        os.kill(a2, signal.SIGKILL)
        for f in futures:
            f.result(timeout=180)
    finally:
        stop.set()
        pool.shutdown(wait=True, cancel_futures=True)

    # Every query answered with a granted token.
    tokens = []
    for i, a in enumerate(answers):
        assert a is not None and a.status == 200, f"query {i}: {a and (a.status, a.ctype)}"
        assert a.ctype == TSR
        resp = parse_reply(a.reply)
        assert granted(resp), f"query {i}: {resp['status'].native}"
        tokens.append(resp)
        (qdir / f"{i}.tsr").write_bytes(a.reply)
    serials = [tst_info(t)["serial_number"].native for t in tokens]
    assert len(set(serials)) == REQUESTS, "a serial number was reused"

    # Every token verifies in-process (rfc3161-client: signature, certificate anchored in the
    # published chain, imprint, nonce), and `openssl ts -verify` checks a sample of them.
    certificate = x509.load_pem_x509_certificate(chain.read_bytes())
    for i, a in enumerate(answers):
        assert a is not None
        request = tsp.TimeStampReq.load(queries[i])
        builder = VerifierBuilder().add_root_certificate(certificate).tsa_certificate(
            certificate)
        if request["nonce"].native is not None:
            builder = builder.nonce(request["nonce"].native)
        assert builder.build().verify(decode_timestamp_response(a.reply),
                                      request["message_imprint"]["hashed_message"].native)

    def verify(i: int) -> str:
        r = openssl("ts", "-verify", "-queryfile", f"{i}.tsq", "-in", f"{i}.tsr",
                    "-CAfile", str(chain), "-untrusted", str(chain), cwd=qdir)
        return "" if "Verification: OK" in r.stdout else f"{i}: {r.stdout}{r.stderr}"

    with ThreadPoolExecutor(2) as vpool:  # every 9th: each algorithm, with and without cert
        failed = [f for f in vpool.map(verify, range(0, REQUESTS, 9), timeout=120) if f]
    assert not failed, failed[:3]

    # The journal: one row per token, its serial, and every outcome recorded as signed.
    wait_for(lambda: all(state == "signed" for _, state in tsa_rows(server)), timeout=30,
             what="every TSA outcome recorded")
    assert sorted(serials) == [row_id for row_id, _ in tsa_rows(server)]

    # The killed worker and its agent are gone; the worker whose agent died exited; the
    # supervisor replaced both, each replacement with an agent of its own.
    wait_for(lambda: all(pid_gone(p) for p in (w1, a1, w2, a2)), timeout=30,
             what="the killed processes to be gone")
    wait_for(lambda: len(tsa_workers(server)) == 2
             and all(agent_of(server, w) for w in tsa_workers(server)), timeout=30,
             what="two TSA workers with agents again")
    assert not {w1, w2} & set(tsa_workers(server))
    server.wait_ready(workers=3, timeout=30)
    # The kills hit jobs in flight: they went to another worker (and took two attempts).
    _status, ready = server.get_json("/readyz")
    assert int(ready["requeued"]) >= 1, ready  # type: ignore[call-overload]
    with contextlib.closing(sqlite3.connect(server.data_dir / "stampd.sqlite3")) as db:
        retried = db.execute("select count(*) from stamps where kind = 'tsa' and attempts >= 2"
                             ).fetchone()[0]
    assert retried >= 1
    log = server.log_path.read_text(errors="replace")
    assert "exited with -9" in log and "exited with 3" in log, log[-6000:]
    no_traceback(server)


# -- 3. published, cross-stamped, audited ----------------------------------------------------
def digests_of(commit: pygit2.Commit) -> str:
    if "digests.log" not in commit.tree:
        return ""
    blob = commit.tree["digests.log"]
    assert isinstance(blob, pygit2.Blob)
    return blob.data.decode()


def stamp_digest(server: Server, algorithm: str, digest: str) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        conn.request("POST", "/v1/stamps", body=urllib.parse.urlencode({algorithm: digest}),
                     headers={"Content-Type": "application/x-www-form-urlencoded"})
        r = conn.getresponse()
        body = r.read()
    finally:
        conn.close()
    assert r.status == 200, body


def covered_by_peer(data: Path, peer: str, line: str) -> Callable[[], bool]:
    """Whether a main commit whose digests.log holds ``line`` is stamped by ``peer`` (a stamp
    on ``<peer>-timestamps`` of that commit or of a later one)."""

    def check() -> bool:
        repo = pygit2.Repository(str(data / "log.git"))
        published = [c.id for c in branch(data, "main") if line in digests_of(c).splitlines()]
        if not published:
            return False
        stamped = [s.parents[-1].id for s in branch(data, f"{peer}-timestamps")]
        return any(s == c or repo.descendant_of(s, c) for s in stamped for c in published)

    return check


def test_tokens_published_cross_stamped_and_audited(tmp_path: Path,
                                                    server_factory: list[Server]) -> None:
    """Server A (TSA on, a log commit every 2 s, peer "bee" = server B) issues sha256 and
    sha384 tokens and a digest stamp; A's log publishes the imprints in digests.log and B
    cross-stamps that commit; a clone of A's log over HTTP passes `stampd audit` (keys from the
    log), which reports peer bee; `stampd verify --log` on the clone finds the sha384 token's
    log commit and B's stamp of it."""
    a_dir = seed_data_dir(tmp_path / "a" / "data")
    b_dir = tmp_path / "b" / "data"  # B generates its own key
    b_port = free_port()
    a = tsa_server(a_dir, commit_interval=2, wait=False,
                   env={"STAMPD_PEERS": f"bee=http://127.0.0.1:{b_port}/"})
    server_factory.append(a)
    b = start_server(b_dir, workers=1, commit_interval=3600, port=b_port, wait=False)
    server_factory.append(b)
    a.wait_ready(workers=2)
    b.wait_ready()

    lines = {}
    for alg, cert in (("sha256", True), ("sha384", False), ("sha384", True)):
        data = tmp_path / f"{alg}-{cert}.txt"
        data.write_bytes(os.urandom(100))
        digest = hashlib.new(alg, data.read_bytes()).digest()
        name = f"{alg}-{cert}"
        make_query(tmp_path, f"{name}.tsq", alg, digest, cert=cert)
        answer = post(a.port, (tmp_path / f"{name}.tsq").read_bytes(), "/tsr")
        assert (answer.status, answer.ctype) == (200, TSR)
        assert granted(parse_reply(answer.reply))
        (tmp_path / f"{name}.tsr").write_bytes(answer.reply)
        lines[name] = f"{alg} {digest.hex()}"
    stamped = os.urandom(64).hex()
    stamp_digest(a, "sha512", stamped)

    wait_for(covered_by_peer(a_dir, "bee", lines["sha384-False"]), timeout=60,
             what="A's commit publishing the sha384 imprint, stamped by B")
    published = "\n".join(digests_of(c) for c in branch(a_dir, "main"))
    for line in [*lines.values(), f"sha512 {stamped}"]:
        assert line in published.splitlines(), line
    # One more log commit, so that the newest one pins B's key (peers/bee.asc).
    stamp_tag(a, "ab" * 20)
    wait_for(lambda: "peers" in branch(a_dir, "main")[0].tree, timeout=30,
             what="B's key pinned in A's log")

    clone = tmp_path / "clone.git"
    r = subprocess.run(["git", "clone", "--quiet", "--mirror", a.url + "log.git", str(clone)],
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    audit = run_stampd(["audit", clone], timeout=120, cwd=Path.cwd())
    assert audit.returncode == 0, audit.stdout + audit.stderr
    assert "peer bee (refs/heads/bee-timestamps)" in audit.stdout, audit.stdout
    assert "OK: no problems found" in audit.stdout, audit.stdout

    chain = fetch_chain(a, tmp_path / "tsa.pem")
    imprint = lines["sha384-False"].split()[1]
    verify = run_stampd(["verify", tmp_path / "sha384-False.tsr", "--digest", imprint,
                         "--chain", chain, "--log", clone], timeout=120, cwd=Path.cwd())
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert "log commit:" in verify.stdout and "peer stamp:    bee at" in verify.stdout, \
        verify.stdout
    for server in (a, b):
        no_traceback(server)
