"""A large manifest checked in a process of its own: ``python -m workers.manifest_check``.

Checking a manifest (`formats.manifests.parse_body`: every line a checksum line, the digests
packed) and building its digest index rows (`formats.manifests.buckets`) takes seconds of CPU
for a million lines (about 7 s on a 2-core machine), nearly all of it holding the GIL. Done in
a thread of an HTTP process it stalled that process's event loop, and so every request it
served, for as long (a digest stamp waited up to half a second beside 8 manifests). An HTTP
process hands a manifest of `IN_PROCESS_MAX` bytes or more to a child of its own
(`check_elsewhere`), which exits when it has answered: the pages it used go back to the system
with it, and a server idles at the size it had before.

The child reads the body from stdin (a 64-bit big-endian length, then the bytes; the HTTP
process writes them a MiB at a time while its event loop goes on) and writes its answer to
stdout: one line of JSON, then, if the manifest is good, its index rows. The JSON is
``{"algorithm": ..., "lines": N, "rows": R}`` for a good manifest, ``{"error": MESSAGE, "bad":
[LINE, ...], "count": N}`` for a malformed one (`formats.manifests.MalformedManifest`). Each
row is a byte with the length of its prefix, the prefix, a 32-bit big-endian length of its
packed digests, and the digests.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from dataclasses import dataclass
from typing import IO

from formats.manifests import (
    Buckets,
    MalformedManifest,
    bucket_key,
    buckets,
    key_prefix,
    parse_body,
)
from workers.errors import WorkerError

IN_PROCESS_MAX = 1 << 20  # smaller manifests are checked in the HTTP process (~25 ms a MiB)
WRITE = 1 << 20  # bytes of the body written to the child at a time
NICE = 10  # the check's niceness above the HTTP process's
EXIT_WAIT = 10.0  # seconds the child may take to exit once it has answered
_LENGTH = struct.Struct(">Q")
_ROW = struct.Struct(">I")


class CheckFailed(WorkerError):
    """The checking process ended without an answer (killed, out of memory)."""


@dataclass(frozen=True)
class Checked:
    """A good manifest: its algorithm, how many lines it has, its digest index rows."""

    algorithm: str
    lines: int
    rows: Buckets


def _answer(body: bytearray, out: IO[bytes]) -> None:
    try:
        manifest = parse_body(body)
    except MalformedManifest as e:
        out.write(json.dumps({"error": str(e), "bad": e.bad, "count": e.count}).encode()
                  + b"\n")
        return
    del body[:]
    rows = buckets(manifest.digests, manifest.width)
    out.write(json.dumps({"algorithm": manifest.algorithm, "lines": manifest.lines,
                          "rows": len(rows)}).encode() + b"\n")
    for key, digests in rows:
        prefix = key_prefix(key)
        out.write(bytes((len(prefix),)) + prefix + _ROW.pack(len(digests)))
        out.write(digests)


def main() -> int:
    # Batch work beside the HTTP processes and workers, whose answers are awaited: on a busy
    # host the scheduler gives them the cores first.
    os.nice(NICE)
    head = _read_fd(0, _LENGTH.size)
    if head is None:
        return 2  # the HTTP process went away
    body = _read_fd(0, _LENGTH.unpack(head)[0])
    if body is None:
        return 2
    _answer(body, sys.stdout.buffer)
    sys.stdout.buffer.flush()
    return 0


def _read_fd(fd: int, n: int) -> bytearray | None:
    """``n`` bytes from ``fd``, read straight into one buffer; None at an early end."""
    data = bytearray(n)
    with memoryview(data) as view:
        got = 0
        while got < n:
            k = os.readv(fd, [view[got:]])
            if not k:
                return None
            got += k
    return data


def _exact(f: IO[bytes], n: int) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise CheckFailed("the manifest check ended before its answer")
    return data


def check_elsewhere(body: bytearray, python: str = sys.executable) -> Checked:
    """Check ``body`` in a child process (blocking: call it in a thread). Raises
    `MalformedManifest` as `parse_body` does, `CheckFailed` if the child gave no answer.
    ``body`` is left as it was (a good one is then the manifest's lines as they are)."""
    try:
        proc = subprocess.Popen([python, "-m", "workers.manifest_check"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, close_fds=True)
    except OSError as e:
        raise CheckFailed(f"cannot start the manifest check: {e}") from e
    assert proc.stdin is not None and proc.stdout is not None
    try:
        try:
            with proc.stdin:
                proc.stdin.write(_LENGTH.pack(len(body)))
                with memoryview(body) as view:  # (the GIL is let go while each MiB is written)
                    for at in range(0, len(body), WRITE):
                        proc.stdin.write(view[at:at + WRITE])
        except BrokenPipeError:
            pass  # the child is gone: its answer, or none, says why
        with proc.stdout:
            checked = _read_answer(proc.stdout)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    try:
        proc.wait(timeout=EXIT_WAIT)
    except subprocess.TimeoutExpired:  # (it has answered: what it does now changes nothing)
        proc.kill()
        proc.wait()
    return checked


def _read_answer(out: IO[bytes]) -> Checked:
    head = json.loads(out.readline() or b"null")
    if not isinstance(head, dict):
        raise CheckFailed("the manifest check ended before its answer")
    if "error" in head:
        raise MalformedManifest(head["error"], head["bad"], head["count"])
    rows: Buckets = []
    for _ in range(head["rows"]):
        prefix = _exact(out, _exact(out, 1)[0])
        (size,) = _ROW.unpack(_exact(out, _ROW.size))
        rows.append((bucket_key(prefix), _exact(out, size)))
    return Checked(head["algorithm"], head["lines"], rows)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError:
        os._exit(2)  # the HTTP process went away
