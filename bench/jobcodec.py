"""Encode + decode of the job contract (`formats.jobs`) per message, in-process.

    python -m bench.jobcodec [--repeat R] [--scale S]

Each row is what one job costs the two ends of the wire it crosses, with no I/O: the sending
side's encoding and the receiving side's decoding and checking, as the dispatcher and a worker
call them:

- ``socket``: the dispatcher's `job_frame` (for a manifest, its frame and the raw lines after
  it), then a worker's `FrameBuffer` (``feed``, ``next``) and `decode_job_frame`;
- ``db``: the service's `encode_job` (``jobs.payload``, PostgreSQL), then what a worker's
  `workers.loop.serve_db` does with the row: `decode_frame` of its UTF-8, `job_from_dict`;
- ``result``: a worker's `Result.frame` (a signed tag, ~0.9 KB), then the dispatcher's
  `frame_size`, `decode_frame` and `Result.from_dict`.

It prints the CPU nanoseconds per job (this process's CPU time, so that other processes on a
shared machine count less than in wall time) of the fastest of R runs, so that the numbers of
two commits compare line by line: run both in one session, one after the other.
The decoded job is checked against the one encoded, so a faster codec that decodes something
else fails here.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from formats.frames import HEADER, FrameBuffer, decode_frame, frame_size
from formats.jobs import (
    Job,
    ManifestJob,
    ReceiptJob,
    Result,
    TagJob,
    decode_job,
    decode_job_frame,
    encode_job,
    job_frame,
    job_from_dict,
)

C = "c" * 40
TAG = TagJob(C, "v1.0-timestamp", 1_795_600_000,
             f"Timestamp of commit {C}\nby http://127.0.0.1:8080/ at 2026-11-27 12:00:00 UTC\n")
RECEIPT = ReceiptJob("stampd receipt v1\nalgorithm sha256\ndigest " + "d" * 64
                     + "\ntime 1795600000\nserver http://127.0.0.1:8080/\nserial 12345\n"
                     "key " + "F" * 40 + "\n", 1_795_600_000)
LINES = 10_000
MANIFEST = ManifestJob("sha256", 1_795_600_000, "http://127.0.0.1:8080/", 12345, "F" * 40,
                       "".join(f"{i:064x}  dist/file-{i:05}.tar.gz\n" for i in range(LINES)))
SIGNED = ("object " + C + "\ntype commit\ntag v1.0-timestamp\ntagger stampd <s@h> 1795600000 "
          "+0000\n\n" + TAG.message + "-----BEGIN PGP SIGNATURE-----\n\n"
          + "iHUEABYKAB0WIQT" + "A" * 600 + "\n=abcd\n-----END PGP SIGNATURE-----\n")


def over_socket(job: Job) -> Callable[[], None]:
    def run() -> None:
        buf = FrameBuffer()
        buf.feed(job_frame(7, job))
        message = buf.next()
        assert message is not None
        got = decode_job_frame(message)
        assert got[0] == 7 and got[1] is not job
    return run


def over_db(job: Job) -> Callable[[], None]:
    def run() -> None:
        job_from_dict(decode_frame(encode_job(job).encode()))
    return run


def result() -> None:
    data = Result(7, object=SIGNED).frame()
    size = frame_size(data[:HEADER.size])
    r = Result.from_dict(decode_frame(data[HEADER.size:HEADER.size + size]))
    assert r.id == 7


def check() -> None:
    """The codec under test gives back what it was given."""
    for job in (TAG, RECEIPT, MANIFEST):
        assert decode_job(encode_job(job)) == job
        assert job_from_dict(decode_frame(encode_job(job).encode())) == job
        buf = FrameBuffer()
        buf.feed(job_frame(7, job))
        message = buf.next()
        assert message is not None and decode_job_frame(message) == (7, job)
    data = Result(7, object=SIGNED).frame()
    assert Result.from_dict(decode_frame(data[HEADER.size:])) == Result(7, object=SIGNED)


def per_job(fn: Callable[[], None], n: int, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.process_time_ns()
        for _ in range(n):
            fn()
        best = min(best, (time.process_time_ns() - t0) / n)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=7, help="runs of each row (the fastest counts)")
    ap.add_argument("--scale", type=float, default=1.0, help="multiply the jobs per run")
    args = ap.parse_args()
    check()
    rows = [
        ("tag job, socket", over_socket(TAG), 20_000),
        ("tag job, db", over_db(TAG), 20_000),
        ("receipt job, socket", over_socket(RECEIPT), 20_000),
        ("receipt job, db", over_db(RECEIPT), 20_000),
        ("result frame (signed tag)", result, 20_000),
        (f"manifest job {LINES} lines, socket", over_socket(MANIFEST), 200),
        (f"manifest job {LINES} lines, db", over_db(MANIFEST), 200),
    ]
    print(f"{'CPU ns per job (encode + decode)':<36}{'ns':>12}")
    for name, fn, n in rows:
        print(f"{name:<36}{per_job(fn, max(1, int(n * args.scale)), args.repeat):>12,.0f}")


if __name__ == "__main__":
    main()
