"""The worker's one connection to the host's dispatcher (`DispatcherLink`), in ``stampd serve``:
a Unix socket, jobs in frames (`formats.jobs`) and their answers back on it.
"""

from __future__ import annotations

import logging
import select
import socket
import time
from pathlib import Path
from typing import Any

from formats.frames import FrameBuffer

log = logging.getLogger(__name__)

# Bytes asked of the dispatcher socket at a time. Python allocates the whole size for every
# recv: 1 MiB was an mmap, a page fault and a munmap per read (about 12 us); 64 KiB comes from
# the heap. A large manifest job arrives in more reads, appended to one buffer.
RECV_SIZE = 1 << 16


class DispatcherLink:
    """The worker's connection to the host's dispatcher at ``path``, which knows every job of
    the host (one dispatcher, however many HTTP processes: `server.dispatch.socket`). A
    connection that drops (the server stops, or died) is tried again every `RETRY` seconds;
    the worker stops when it has had none for `ALONE_FOR` seconds (when the server stops, the
    supervisor stops the workers within that time).

    ``hello`` is the frame sent first on every new connection."""

    RETRY = 0.2
    CONNECT_DELAY = 0.1  # at most, between tries at start (the dispatcher listens within ~1 s)
    ALONE_FOR = 5.0

    def __init__(self, path: Path, hello: bytes, name: str) -> None:
        self.path = path
        self.hello = hello
        self.name = name
        self.sock: socket.socket | None = None
        self.frames = FrameBuffer()
        self.retry_at = 0.0  # when to try again (monotonic), while not connected

    @property
    def connected(self) -> bool:
        return self.sock is not None

    def connect(self, deadline: float) -> None:
        """Connect, waiting (bounded) for the dispatcher to listen; raises what the last
        attempt raised when it did not by ``deadline``."""
        delay = 0.05
        while True:
            try:
                self._open()
                return
            except (FileNotFoundError, ConnectionRefusedError):
                if time.monotonic() > deadline:
                    raise
            time.sleep(delay)
            delay = min(delay * 2, self.CONNECT_DELAY)

    def _open(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(str(self.path))
            sock.sendall(self.hello)
        except OSError:
            sock.close()
            raise
        self.sock, self.frames = sock, FrameBuffer()

    def drop(self, why: str) -> None:
        """The connection is lost: jobs in flight on it are the dispatcher's to give to another
        worker. A dispatcher that stops removes its socket first (the server stopping):
        expected, so not a warning; one whose socket is still there hung up without
        stopping."""
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        self.retry_at = time.monotonic() + self.RETRY
        if not self.path.exists():
            log.info("worker %s: the dispatcher stopped (%s)", self.name, why)
        else:
            log.warning("worker %s: the dispatcher %s", self.name, why)

    def _retry(self) -> None:
        if time.monotonic() < self.retry_at:
            return
        try:
            self._open()
            log.info("worker %s: the dispatcher is back", self.name)
        except OSError:
            self.retry_at = time.monotonic() + self.RETRY

    def _ready(self) -> list[dict[str, Any]]:
        messages = []
        while (message := self.frames.next()) is not None:
            messages.append(message)
        return messages

    def next_jobs(self, timeout: float) -> list[dict[str, Any]] | None:
        """The jobs that have arrived (at least one); None after ``timeout`` seconds with
        none, or while not connected (`connected` is then false)."""
        messages = self._ready()
        if messages:
            return messages
        if self.sock is None:
            self._retry()
            if self.sock is None:
                return None
        ready, _, _ = select.select([self.sock], [], [], timeout)
        if ready:
            try:
                data = self.sock.recv(RECV_SIZE)
            except OSError as e:
                self.drop(f"cannot be read from ({e.strerror})")
                return None
            if not data:
                self.drop("closed the connection")
                return None
            self.frames.feed(data)
        return self._ready() or None

    def answer(self, frame: bytes) -> None:
        if self.sock is None:
            return  # (the dispatcher is gone, and gave the jobs to another worker)
        try:
            self.sock.sendall(frame)
        except OSError as e:
            self.drop(f"cannot be written to ({e.strerror})")

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
