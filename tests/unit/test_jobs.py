"""The job contract: every message encodes and decodes to itself; malformed ones are refused."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

import pytest

from formats.frames import MAX_FRAME, FrameBuffer, frame
from formats.jobs import (
    CommitJob,
    CosignJob,
    Hello,
    MalformedMessage,
    ManifestJob,
    NoteJob,
    ReceiptJob,
    RelayedJob,
    Result,
    TagJob,
    TimestampJob,
    decode_job,
    decode_job_frame,
    encode_job,
    job_frame,
    job_frame_parts,
    job_message,
)
from formats.keys import PRIMARY, ServedKey
from formats.manifests import parse_body
from formats.receipts import Statement
from server.errors import MalformedAnswer
from server.stamping.requests import (
    BranchRequest,
    DigestRequest,
    ManifestRequest,
    StampContext,
    TagRequest,
)
from server.stamping.rfc3161 import TimestampRequest

C, T, P = "c" * 40, "e" * 40, "a" * 40
OPENPGP = ServedKey(PRIMARY, "openpgp", "F" * 40, "eddsa (ed25519)", "pub", "K <k@v>",
                    primary=True)
SSH = ServedKey("ssh-ed25519", "ssh", "SHA256:x", "ssh-ed25519", "ssh-ed25519 AAAA", "U <u@v>")


def ctx(t: int = 0, url: str = "u", key: ServedKey = OPENPGP, serial: int = 1) -> StampContext:
    return StampContext(time=t, serial=serial, key=key, url=url)
JOBS = [
    TagJob(C, "v1", 1_700_000_000, "msg\n"),
    TagJob(C, "v1", 1_700_000_000, "msg\n", uid="X <x@y>"),
    CommitJob(T, (P, C), 5, "m\n"),
    CommitJob(T, (), 5, "m\n", uid="X <x@y>"),
    TagJob("c" * 64, "v1", 1_700_000_000, "msg\n", object_format="sha256"),
    CommitJob("e" * 64, ("a" * 64, "c" * 64), 5, "m\n", uid="X <x@y>", object_format="sha256"),
    ReceiptJob("stampd receipt v1\n", 7),
    TimestampJob("sha256", "ab" * 32, 1, 1_700_000_000, "1.2.3.4", cert_req=False),
    TimestampJob("sha512", "0f" * 64, (1 << 160) - 1, 9, "2.25.1", accuracy=1,
                 nonce=str(1 << 159), cert_req=True),
    NoteJob("example.com/log\n42\nqUWxPL3Ns2ChdvTs+jMm+GCSbNFWlfKoBl+GjvdaQwA=\n"),
    NoteJob("\u00fcn\u00efc\u00f6d\u00e9 origin\n"),
]


@pytest.mark.parametrize("job", JOBS, ids=lambda j: f"{j.op}-{getattr(j, 'uid', None)}-"
                                                   f"{getattr(j, 'object_format', None)}")
def test_jobs_round_trip(job: TagJob | CommitJob | ReceiptJob | TimestampJob | NoteJob
                         ) -> None:
    assert decode_job(encode_job(job)) == job
    buf = FrameBuffer()
    data = job_frame(42, job)
    buf.feed(data[:3])
    assert buf.next() is None  # half a header
    buf.feed(data[3:])
    message = buf.next()
    assert message is not None and decode_job_frame(message) == (42, job)
    assert buf.next() is None


@pytest.mark.parametrize("payload", [
    "[]", "not json", '{"op": "sign"}', '{"op": "tag", "commit": 1}',
    '{"op": "tag", "commit": "c", "tagname": "t", "time": "1", "message": "m"}',
    '{"op": "tag", "commit": "c", "tagname": "t", "time": true, "message": "m"}',
    '{"op": "commit", "tree": "t", "parents": "p", "time": 1, "message": "m"}',
    *(json.dumps({"op": "tag", "commit": "c" * 40, "tagname": "t", "time": 1, "message": "m",
                  **bad})
      for bad in [{"commit": "c" * 39}, {"commit": "C" * 40}, {"commit": "c" * 64},
                  {"object_format": "sha256"}, {"object_format": "sha512"},
                  {"object_format": 1}]),
    *(json.dumps({"op": "commit", "tree": "e" * 64, "parents": ["a" * 64], "time": 1,
                  "message": "m", "object_format": "sha256", **bad})
      for bad in [{"tree": "e" * 40}, {"parents": ["a" * 64, "c" * 40]}, {"object_format": None}]),
    '{"op": "receipt", "time": 1}',
    '{"op": "note"}', '{"op": "note", "text": 1}', '{"op": "note", "text": ""}',
    '{"op": "note", "text": "no newline"}',
    *(json.dumps({"op": "timestamp", "hash_algorithm": "sha256", "digest": "ab" * 32,
                  "serial": 1, "time": 1, "policy": "1.2.3", "cert_req": False, **bad})
      for bad in [{"hash_algorithm": "md5"}, {"digest": "AB" * 32}, {"digest": "ab" * 31},
                  {"serial": -1}, {"serial": 1 << 160}, {"serial": "1"}, {"time": 1.5},
                  {"policy": "1.2.x"}, {"policy": 123}, {"accuracy": -1}, {"accuracy": "1"},
                  {"nonce": 5}, {"nonce": "05"}, {"nonce": "-1"}, {"nonce": str(1 << 160)},
                  {"cert_req": 1}, {"cert_req": None}]),
])
def test_malformed_jobs_are_refused(payload: str) -> None:
    with pytest.raises(MalformedMessage):
        decode_job(payload)


TAG: dict[str, Any] = {"op": "tag", "commit": C, "tagname": "t", "time": 1, "message": "m"}
TSP: dict[str, Any] = {"op": "timestamp", "hash_algorithm": "sha256", "digest": "ab" * 32,
                       "serial": 1, "time": 1, "policy": "1.2.3", "cert_req": False}


@pytest.mark.parametrize("message, why", [
    # (the database's payload is decoded straight into its job, a frame's object by its op)
    ([], ("Expected `object`, got `array`", "not a JSON object")),
    ({"commit": C}, ("Object missing required field `op`", "unknown job type None")),
    ({"op": "sign"}, ("Invalid value 'sign' - at `$.op`", "unknown job type 'sign'")),
    ({**TAG, "commit": 1}, "Expected `str`, got `int` - at `$.commit`"),
    ({**TAG, "time": "1"}, "Expected `int`, got `str` - at `$.time`"),
    ({**TAG, "time": True}, "Expected `int`, got `bool` - at `$.time`"),
    ({**TAG, "time": 1.0}, "Expected `int`, got `float` - at `$.time`"),
    ({k: v for k, v in TAG.items() if k != "message"}, "missing required field `message`"),
    ({**TAG, "uid": 5}, "Expected `str | null`, got `int` - at `$.uid`"),
    ({**TAG, "commit": "C" * 40}, "a sha1 object id is 40 lowercase hex digits"),
    ({**TAG, "object_format": "sha256"}, "a sha256 object id is 64 lowercase hex digits"),
    ({**TAG, "object_format": "sha512"}, "unknown object format 'sha512'"),
    ({"op": "commit", "tree": T, "parents": "p", "time": 1, "message": "m"},
     "Expected `array`, got `str` - at `$.parents`"),
    ({"op": "commit", "tree": T, "parents": [P, 1], "time": 1, "message": "m"},
     "Expected `str`, got `int` - at `$.parents[1]`"),
    ({"op": "receipt", "time": 1}, "missing required field `text`"),
    ({"op": "note", "text": "no newline"}, "a note's text ends in a newline"),
    ({"op": "cosign", "body": "b\n", "timestamp": 0}, "cosignature timestamp 0 out of range"),
    ({"op": "manifest", "algorithm": "sha256", "time": 1, "server": "u", "serial": 1,
      "key": "F"}, "missing required field `lines`"),
    ({**TSP, "cert_req": 1}, "Expected `bool`, got `int` - at `$.cert_req`"),
    ({k: v for k, v in TSP.items() if k != "cert_req"}, "missing required field `cert_req`"),
    ({**TSP, "hash_algorithm": "md5"}, "unknown hash algorithm 'md5'"),
    ({**TSP, "nonce": "05"}, "the nonce must be a decimal number of at most 160 bits"),
    ({**TSP, "accuracy": -1}, "the accuracy must not be negative"),
])
def test_malformed_jobs_say_what_is_wrong(message: object, why: str | tuple[str, str]
                                          ) -> None:
    """Each refusal names the field and what is wrong with it, in the database's
    ``jobs.payload`` and in a socket frame alike (but for the type of the job itself)."""
    db, socket = why if isinstance(why, tuple) else (why, why)
    with pytest.raises(MalformedMessage, match=re.escape(db)):
        decode_job(json.dumps(message))
    with pytest.raises(MalformedMessage, match=re.escape(socket)):
        [got] = frames_of(FrameBuffer(), frame(message if isinstance(message, list)
                                               else {"id": 3, **message}))
        decode_job_frame(got)


@pytest.mark.parametrize("data, why", [
    (b"not json", "not JSON: JSON is malformed"),
    (b'{"op": "note", "text": "\xff"}', "not JSON: Invalid UTF-8"),
])
def test_malformed_json_is_refused(data: bytes, why: str) -> None:
    with pytest.raises(MalformedMessage, match=re.escape(why)):
        decode_job(data)
    with pytest.raises(MalformedMessage, match=re.escape(why)):
        frames_of(FrameBuffer(), len(data).to_bytes(4, "big") + data)


@pytest.mark.parametrize("message, why", [
    ({"id": "1", **TAG}, "field 'id' must be an integer"),
    ({"id": True, **TAG}, "field 'id' must be an integer"),
])
def test_a_job_frame_without_an_integer_id_is_refused(message: dict[str, object],
                                                      why: str) -> None:
    with pytest.raises(MalformedMessage, match=why):
        decode_job_frame(message)


@pytest.mark.parametrize("cls, message, why", [
    (Hello, {"id": 1}, "expected a hello"),
    (Hello, {"hello": {"worker": "w", "pid": "7", "fingerprint": "F", "key": "k"}},
     "Expected `int`, got `str` - at `$.pid`"),
    (Hello, {"hello": {"worker": "w", "pid": 7, "key": "k"}},
     "missing required field `fingerprint`"),
    (Result, {"id": 1}, "a result has either an object or an error"),
    (Result, {"id": 1, "object": "o", "error": "e"}, "a result has either an object or an error"),
    (Result, {"id": 1, "object": 5}, "Expected `str | null`, got `int` - at `$.object`"),
    (Result, {"object": "o"}, "missing required field `id`"),
])
def test_malformed_answers_are_refused(cls: type[Hello] | type[Result],
                                       message: dict[str, object], why: str) -> None:
    with pytest.raises(MalformedMessage, match=re.escape(why)):
        cls.from_dict(message)


def test_non_ascii_text_is_utf8_and_escaped_text_still_decodes() -> None:
    """msgspec writes a non-ASCII character as its UTF-8 (the stdlib encoder wrote ``\\u00e9``):
    the same JSON text, so a ``jobs.payload`` written before decodes to the same job."""
    job = TagJob(C, "v1", 1, "m\u00e9\n", uid="J\u00f6rg <j@x>")
    assert encode_job(job) == (f'{{"op":"tag","commit":"{C}","tagname":"v1","time":1,'
                               '"message":"m\u00e9\\n","uid":"J\u00f6rg <j@x>"}')
    assert decode_job(json.dumps(job.to_dict())) == job  # (ensure_ascii: as written before)
    assert Result(1, object="\u00e9").frame()[4:] == '{"id":1,"object":"\u00e9"}'.encode()


def test_every_message_frame_is_as_documented() -> None:
    """The frames docs/jobs.md shows, byte for byte."""
    assert Hello("w", 7, "F", "primary").frame()[4:] == \
        b'{"hello":{"worker":"w","pid":7,"fingerprint":"F","key":"primary"}}'
    assert Result(3, object="o").frame()[4:] == b'{"id":3,"object":"o"}'
    assert Result(3, error="e").frame()[4:] == b'{"id":3,"error":"e"}'
    assert job_frame(5, ReceiptJob("r\n", 7))[4:] == \
        b'{"id":5,"op":"receipt","text":"r\\n","time":7}'
    assert job_frame(5, CosignJob("b\n", 9))[4:] == \
        b'{"id":5,"op":"cosign","body":"b\\n","timestamp":9}'
    assert job_frame(5, JOBS[7])[4:] == (
        b'{"id":5,"op":"timestamp","hash_algorithm":"sha256","digest":"' + b"ab" * 32
        + b'","serial":1,"time":1700000000,"policy":"1.2.3.4","cert_req":false}')
    assert job_frame(5, JOBS[8])[4:].endswith(
        b'"policy":"2.25.1","cert_req":true,"accuracy":1,"nonce":"%d"}' % (1 << 159))
    head, _ = job_frame_parts(5, ManifestJob("sha256", 1, "u", 2, "F", "x\n"))
    assert head[4:] == (b'{"id":5,"op":"manifest","algorithm":"sha256","time":1,"server":"u",'
                        b'"serial":2,"key":"F","lines_bytes":2}')


def test_sha1_jobs_are_encoded_as_before() -> None:
    """The job of a 40-hex request carries no ``object_format``: its JSON is what it was."""
    assert encode_job(TagJob(C, "v1", 1, "m\n")) == \
        f'{{"op":"tag","commit":"{C}","tagname":"v1","time":1,"message":"m\\n"}}'
    assert encode_job(CommitJob(T, (P, C), 5, "m\n", "X <x@y>")) == \
        f'{{"op":"commit","tree":"{T}","parents":["{P}","{C}"],"time":5,"message":"m\\n",' \
        '"uid":"X <x@y>"}'
    c64 = "c" * 64
    assert encode_job(TagJob(c64, "v1", 1, "m\n", object_format="sha256")) == \
        f'{{"op":"tag","commit":"{c64}","tagname":"v1","time":1,"message":"m\\n",' \
        '"object_format":"sha256"}'


def test_sha256_jobs_build_what_git_writes_there() -> None:
    """A SHA-256 commit carries its signature in ``gpgsig-sha256`` and is named by SHA-256; a
    tag is signed as in SHA-1 repositories."""
    sig = "-----BEGIN PGP SIGNATURE-----\n\nAAAA\n-----END PGP SIGNATURE-----\n"
    commit = CommitJob("e" * 64, ("a" * 64,), 5, "m\n", object_format="sha256")
    signed = commit.embed(commit.payload("U <u@v>"), sig)
    assert signed == (f"tree {'e' * 64}\nparent {'a' * 64}\nauthor U <u@v> 5 +0000\n"
                      "committer U <u@v> 5 +0000\ngpgsig-sha256 -----BEGIN PGP SIGNATURE-----\n"
                      " \n AAAA\n -----END PGP SIGNATURE-----\n\nm\n").encode()
    assert commit.object_id(signed) == hashlib.sha256(
        b"commit %d\0" % len(signed) + signed).hexdigest()
    old = CommitJob(T, (P,), 5, "m\n")
    assert old.embed(old.payload("U <u@v>"), sig).count(b"\ngpgsig -----BEGIN") == 1
    assert old.object_id(b"x") == hashlib.sha1(b"commit 1\0x").hexdigest()
    tag = TagJob("c" * 64, "t", 5, "m\n", object_format="sha256")
    signed = tag.embed(tag.payload("U <u@v>"), sig)
    assert signed.endswith(b"\nm\n" + sig.encode())
    assert tag.object_id(signed) == hashlib.sha256(b"tag %d\0" % len(signed) + signed).hexdigest()


def test_sha256_requests_make_sha256_jobs() -> None:
    c, t, p = "c" * 64, "e" * 64, "a" * 64
    assert TagRequest(c, "v1").job(ctx()).object_format == "sha256"
    job = BranchRequest(c, t, p).job(ctx())
    assert job.object_format == "sha256" and job.parents == (p, c)
    assert TagRequest(C, "v1").job(ctx()).object_format == "sha1"


def test_hello_and_results() -> None:
    buf = FrameBuffer()
    buf.feed(Hello("w", 7, "F" * 40, "primary").frame() + Result(3, object="obj").frame()
             + Result(4, error="bad").frame())
    assert Hello.from_dict(buf.next() or {}) == Hello("w", 7, "F" * 40, "primary")
    assert Result.from_dict(buf.next() or {}) == Result(3, object="obj")
    assert Result.from_dict(buf.next() or {}) == Result(4, error="bad")
    with pytest.raises(MalformedMessage):
        Result.from_dict({"id": 1})
    with pytest.raises(MalformedMessage):
        Hello.from_dict({"id": 1})


def test_oversized_frame_is_refused() -> None:
    buf = FrameBuffer()
    buf.feed((1 << 21).to_bytes(4, "big"))
    with pytest.raises(MalformedMessage):
        buf.next()
    assert json.loads(frame({"a": 1})[4:]) == {"a": 1}


H256 = "ab" * 32
# A manifest job of about 1.4 MB: its frame is larger than MAX_FRAME.
BIG_MANIFEST = ManifestJob("sha256", 1_700_000_000, "http://s/", 9, "F" * 40,
                           "".join(f"{H256} *f{i:05}\n" for i in range(19_000)))


def frames_of(buf: FrameBuffer, data: bytes, step: int = 1 << 20) -> list[dict[str, object]]:
    """What ``buf`` makes of ``data`` fed in pieces, as a socket gives it."""
    out = []
    for i in range(0, len(data), step):
        buf.feed(data[i:i + step])
        while (message := buf.next()) is not None:
            out.append(message)
    return out


@pytest.mark.parametrize("step", [1 << 20, 65536, 7777])
def test_manifest_job_round_trip_over_the_worker_buffer(step: int) -> None:
    head, pieces = job_frame_parts(7, BIG_MANIFEST)
    raw = b"".join(pieces)
    # The lines follow the frame as raw UTF-8: the frame is the header fields, not the lines.
    assert raw == BIG_MANIFEST.lines.encode() and len(head) < 300
    assert json.loads(head[4:])["lines_bytes"] == len(raw)
    data = job_frame(7, BIG_MANIFEST)
    assert data == head + raw
    assert decode_job(encode_job(BIG_MANIFEST)) == BIG_MANIFEST  # (PostgreSQL: one JSON)
    buf = FrameBuffer()
    # Frames before and after it on the same stream come through around it.
    stream = job_frame(6, JOBS[0]) + data + job_frame(8, JOBS[6])
    got = frames_of(buf, stream, step)
    assert [decode_job_frame(m) for m in got] == [(6, JOBS[0]), (7, BIG_MANIFEST), (8, JOBS[6])]
    assert not buf.buf and buf.next() is None
    header = BIG_MANIFEST.header()
    assert header.lines == 19_000 and header.key == "F" * 40
    answer = f"BEGIN\n{header.text()}SIG\n"  # what a worker sends back: no lines
    parts = BIG_MANIFEST.signed(answer)
    assert "".join(parts) == f"BEGIN\n{header.text()}{BIG_MANIFEST.lines}SIG\n"
    assert parts[1] is BIG_MANIFEST.lines  # (kept, not copied)


def test_non_ascii_manifest_lines_are_counted_in_bytes() -> None:
    job = ManifestJob("sha256", 1, "u", 1, "F" * 40, f"{H256} *\u00e9t\u00e9\n" * 3)
    head, pieces = job_frame_parts(1, job)
    assert json.loads(head[4:])["lines_bytes"] == len(job.lines.encode()) == len(
        b"".join(pieces))
    [message] = frames_of(FrameBuffer(), job_frame(1, job), 5)
    assert decode_job_frame(message) == (1, job)


def manifest_head(**fields: object) -> bytes:
    head = {k: v for k, v in BIG_MANIFEST.to_dict().items() if k != "lines"}
    return frame({"id": 1, **head, **fields})


@pytest.mark.parametrize("head, raw, why", [
    (manifest_head(lines_bytes=0), b"", "out of range"),
    (manifest_head(lines_bytes=(256 << 20) + 1), b"", "out of range"),
    (manifest_head(lines_bytes="3"), b"", "integer"),
    (manifest_head(lines_bytes=3, lines="x\n"), b"", "either"),
    (manifest_head(lines_bytes=3), b"\xff\xfe\n", "not UTF-8"),
])
def test_malformed_manifest_frames_are_refused(head: bytes, raw: bytes, why: str) -> None:
    with pytest.raises(MalformedMessage, match=why):
        frames_of(FrameBuffer(), head + raw)


def test_no_frame_exceeds_max_frame_on_the_socket() -> None:
    # Neither side reads a frame larger than MAX_FRAME (a manifest's lines are not in its
    # frame): refused at the header, before its body is read.
    text = "x" * MAX_FRAME
    for large in (job_frame(1, ReceiptJob(text, 5)), Result(1, object=text).frame(),
                  frame({"id": 1, "op": "manifest", "junk": text})):
        buf = FrameBuffer()
        buf.feed(large[:4])
        with pytest.raises(MalformedMessage, match="too large"):
            buf.next()
    # Up to MAX_FRAME, any frame is taken.
    base = len(job_frame(1, ReceiptJob("", 5))) - 4
    exact = job_frame(1, ReceiptJob("x" * (MAX_FRAME - base), 5))
    assert len(exact) - 4 == MAX_FRAME
    assert [decode_job_frame(m)[0] for m in frames_of(FrameBuffer(), exact)] == [1]


def test_each_request_knows_its_kind_row_and_job() -> None:
    tag, branch, digest = TagRequest(C, "v1"), BranchRequest(C, T, P), DigestRequest("sha256",
                                                                                       "d" * 64)
    assert [r.kind for r in (tag, branch, digest)] == ["tag", "branch", "digest"]
    assert tag.journal_fields() == {"commit": C, "tagname": "v1"}
    assert branch.journal_fields() == {"commit": C, "tree": T, "parent": P}
    assert digest.journal_fields() == {"algorithm": "sha256", "digest": "d" * 64}
    job = tag.job(ctx(url="http://s/"))
    assert isinstance(job, TagJob) and job.message.startswith(f"Timestamp of commit {C}\nby http")
    assert job.uid is None  # an OpenPGP key's user id is its own
    commit = branch.job(ctx(url="http://s/", key=SSH))
    assert isinstance(commit, CommitJob) and commit.parents == (P, C) and commit.uid == "U <u@v>"
    assert BranchRequest(C, T).job(ctx()).parents == (C,)
    at = ctx(t=9, url="http://s/", serial=4)
    statement = Statement(algorithm="sha256", digest="d" * 64, time=9, server="http://s/",
                          serial=4, key="F" * 40)
    assert digest.job(at) == ReceiptJob(statement.text(), 9)
    outcome = digest.outcome(at, digest.job(at), "signed")
    assert outcome.answer == (statement, "signed") and outcome.stored == "signed"


def test_a_request_said_serial_free_builds_the_same_job_whatever_its_serial() -> None:
    """What lets a tag or branch stamp be one call to the coordinator (`Stamper`): its job is
    built before its row has a serial. One whose job names the serial does not say so."""
    requests = [TagRequest(C, "v1"), BranchRequest(C, T, P), BranchRequest(C, T),
                DigestRequest("sha256", "d" * 64),
                ManifestRequest(parse_body(f"{'d' * 64}  f\n".encode()))]
    for req in requests:
        for key in (OPENPGP, SSH):
            jobs = {req.job(ctx(t=9, url="http://s/", serial=n, key=key)) for n in (0, 1, 7)}
            assert (len(jobs) == 1) == req.serial_free, req
    assert TimestampRequest.serial_free is False  # (the token's serial number is the row's)


def test_a_malformed_manifest_answer_is_a_signing_failure() -> None:
    req = ManifestRequest(parse_body(("d" * 64 + "  file\n").encode()))
    at = ctx(url="http://s/")
    with pytest.raises(MalformedAnswer) as raised:
        req.outcome(at, req.job(at), "not a signed manifest")
    assert raised.value.message == "the worker's answer was malformed" and raised.value.detail


def test_a_worker_builds_every_kind_of_job() -> None:
    """Each job class names its kind; a signer has a method for every kind (and batches only
    kinds that exist), so nothing branches on a job's type."""
    from formats.jobs import _JOB_TYPES
    from workers.signer import CosignSigner, NoteSigner, OpenPgpSigner, Signer

    kinds = {cls.kind for cls in _JOB_TYPES.values()}
    assert kinds == {"git", "receipt", "manifest", "timestamp", "note", "cosign"}
    assert TagJob.kind == CommitJob.kind  # signed together in one batch
    # Note signatures are the log key's alone: its signer builds them and nothing else.
    assert set(Signer().builders()) == kinds - {NoteJob.kind, "cosign"}
    # Cosignatures are the witness key's alone, likewise.
    assert set(object.__new__(CosignSigner).builders()) == {"cosign"}
    assert set(object.__new__(NoteSigner).builders()) == {NoteJob.kind}
    assert object.__new__(NoteSigner).batch_builders() == {}
    assert set(object.__new__(OpenPgpSigner).batch_builders()) == {"git", "timestamp"}


def test_a_relayed_job_reaches_its_worker_as_the_job_itself_would() -> None:
    """A job through the host's coordinator (several HTTP processes) is encoded once, by its
    HTTP process, and handed on with the coordinator's id: the same frame, lines and all."""
    for job in [*JOBS, BIG_MANIFEST]:
        message = job_message(job)
        lines = job.lines.encode() if isinstance(job, ManifestJob) and isinstance(
            job.lines, str) else b""
        relayed = RelayedJob(memoryview(message), memoryview(lines))
        assert relayed.is_manifest == isinstance(job, ManifestJob)
        head, pieces = job_frame_parts(9, relayed)
        assert head + b"".join(pieces) == job_frame(9, job)
    with pytest.raises(MalformedMessage, match="not a job"):
        RelayedJob(b'{"id":1}')
    with pytest.raises(MalformedMessage, match="has lines"):
        RelayedJob(job_message(JOBS[0]), b"lines")
