"""Framing between the dispatcher (HTTP process) and signing workers.

A frame is a 4-byte big-endian length followed by that many bytes of UTF-8 JSON. Messages:

- worker -> dispatcher, first: ``{"hello": {"worker": NAME, "pid": PID, "fingerprint": FPR}}``
- dispatcher -> worker: a job ``{"id": N, "op": "tag" | "commit", "time": T, ...}``
  (``tag``: commit, tagname, message; ``commit``: tree, parents, message)
- worker -> dispatcher: ``{"id": N, "object": TEXT}`` or ``{"id": N, "error": TEXT}`` (a job the
  worker refuses as malformed; a worker that cannot sign exits instead of answering).
"""

from __future__ import annotations

import json
import socket
import struct
from typing import Any

HEADER = struct.Struct(">I")
MAX_FRAME = 1 << 20


class ProtocolError(Exception):
    pass


def encode(message: dict[str, Any]) -> bytes:
    body = json.dumps(message, separators=(",", ":")).encode()
    return HEADER.pack(len(body)) + body


def decode(body: bytes) -> dict[str, Any]:
    message = json.loads(body)
    if not isinstance(message, dict):
        raise ProtocolError("frame is not a JSON object")
    return message


class FrameReader:
    """Buffered frame reader over a blocking socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = bytearray()

    def has_frame(self) -> bool:
        if len(self.buf) < HEADER.size:
            return False
        (size,) = HEADER.unpack_from(self.buf)
        return len(self.buf) >= HEADER.size + size

    def fill(self) -> bool:
        """Read what is available (blocking once); False on EOF."""
        chunk = self.sock.recv(65536)
        if not chunk:
            return False
        self.buf += chunk
        return True

    def next_frame(self) -> dict[str, Any]:
        (size,) = HEADER.unpack_from(self.buf)
        if size > MAX_FRAME:
            raise ProtocolError(f"frame of {size} bytes is too large")
        body = bytes(self.buf[HEADER.size : HEADER.size + size])
        del self.buf[: HEADER.size + size]
        return decode(body)
