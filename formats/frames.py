"""Frames: how the messages of the job contract (`formats.jobs`) and the coordinator's calls
(`server.coordinator.wire`) travel over a Unix socket, and what reads them back.

A frame is a 4-byte big-endian length (`HEADER`), then that many bytes of UTF-8 JSON, an
object, at most `MAX_FRAME` bytes. A manifest job's lines are not in its JSON: they follow its
frame as raw UTF-8, as many bytes as its ``lines_bytes`` says, so that neither side escapes,
copies or parses them as JSON; `FrameBuffer` gathers them into one buffer of their size and
gives them to the job as its ``lines``. docs/jobs.md shows every message.
"""

from __future__ import annotations

import struct
from typing import Any

import msgspec

HEADER = struct.Struct(">I")
MAX_FRAME = 1 << 20
# A manifest job carries a whole manifest: at most MAX_MANIFEST_TEXT bytes of UTF-8 (the
# ceiling of STAMPD_MAX_MANIFEST_BYTES). Over the socket they follow its frame as raw bytes
# (`formats.jobs.job_frame_parts`); in a ``jobs.payload`` (PostgreSQL) its JSON may be larger
# than MAX_FRAME, and only its (`decode_frame`).
MAX_MANIFEST_TEXT = 256 << 20
MANIFEST_OP = "manifest"  # the one job whose frame may be followed by raw bytes

_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder()  # a frame's object, as a dict (`decode_frame`)


class MalformedMessage(ValueError):
    """A message that is not what the job contract says (bad JSON, a missing or mistyped
    field, an unknown job type, an oversized frame)."""


def frame(message: object) -> bytes:
    """``message`` (a message, or a dict of them) as a frame."""
    body = _ENCODER.encode(message)
    return HEADER.pack(len(body)) + body


def int_field(d: dict[str, Any], name: str) -> int:
    """``d[name]``, an integer; `MalformedMessage` if it is missing or not one."""
    value = d.get(name)
    if not isinstance(value, int) or isinstance(value, bool):
        raise MalformedMessage(f"field {name!r} must be an integer")
    return value


def _object(body: str | bytes) -> dict[str, Any]:
    try:
        message = _DECODER.decode(body)
    except msgspec.DecodeError as e:
        raise MalformedMessage(f"not JSON: {e}") from None
    if not isinstance(message, dict):
        raise MalformedMessage("message is not a JSON object")
    return message


def frame_size(header: bytes, limit: int = MAX_FRAME) -> int:
    """The size a frame header announces; `MalformedMessage` beyond ``limit``."""
    (size,) = HEADER.unpack(header)
    if size > limit:
        raise MalformedMessage(f"frame of {size} bytes is too large")
    return int(size)


def decode_frame(body: bytes) -> dict[str, Any]:
    """A frame's object. Only a manifest job may be larger than `MAX_FRAME`."""
    message = _object(body)
    if len(body) > MAX_FRAME and message.get("op") != MANIFEST_OP:
        raise MalformedMessage(f"frame of {len(body)} bytes is too large")
    return message


def _lines_bytes(message: dict[str, Any]) -> int | None:
    """How many raw bytes of lines follow a manifest job's frame (None: not such a frame)."""
    if message.get("op") != MANIFEST_OP or "lines_bytes" not in message:
        return None
    if "lines" in message:
        raise MalformedMessage("a manifest job's frame has either lines or lines_bytes")
    size = int_field(message, "lines_bytes")
    if not 0 < size <= MAX_MANIFEST_TEXT:
        raise MalformedMessage(f"lines_bytes {size} out of range")
    return size


class FrameBuffer:
    """Frames out of a byte stream, sans I/O: `feed` what the socket gave, take `next`.
    A manifest job's lines, which follow its frame as raw bytes (`job_frame`), are gathered
    into one buffer of their size (no growing copies of it) and given to the job as ``lines``
    (its text: the buffer is then released)."""

    def __init__(self, limit: int = MAX_FRAME) -> None:
        self.buf = bytearray()
        self.limit = limit  # the largest frame (its JSON)
        self._job: dict[str, Any] | None = None  # a manifest job waiting for its lines
        self._lines = bytearray()
        self._filled = 0

    @property
    def awaiting_lines(self) -> bool:
        """A manifest job's frame has come (`next` read it) and its lines are still coming."""
        return self._job is not None

    def feed(self, data: bytes) -> None:
        if self._job is not None:
            take = min(len(data), len(self._lines) - self._filled)
            self._lines[self._filled:self._filled + take] = data[:take]
            self._filled += take
            data = data[take:]
        if data:
            self.buf += data

    def next(self) -> dict[str, Any] | None:
        """The next whole job's (or result's) object, or None until more bytes arrive."""
        if self._job is None:
            if len(self.buf) < HEADER.size:
                return None
            size = frame_size(bytes(self.buf[: HEADER.size]), self.limit)
            if len(self.buf) < HEADER.size + size:
                return None
            message = decode_frame(bytes(self.buf[HEADER.size : HEADER.size + size]))
            del self.buf[: HEADER.size + size]
            raw = _lines_bytes(message)
            if raw is None:
                return message
            self._job, self._lines, self._filled = message, bytearray(raw), 0
            rest, self.buf = self.buf, bytearray()
            self.feed(bytes(rest))
        if self._filled < len(self._lines):
            return None
        message, lines = self._job, self._lines
        self._job, self._lines, self._filled = None, bytearray(), 0
        del message["lines_bytes"]
        try:
            message["lines"] = lines.decode("utf-8")
        except UnicodeDecodeError as e:
            raise MalformedMessage(f"a manifest job's lines are not UTF-8: {e}") from None
        return message
