"""The worker's connections to the dispatchers of this host's HTTP processes (`Dispatchers`):
one Unix socket each, jobs in frames (`formats.jobs`) taken from them in turn, each answer sent
back on the connection its job came on.
"""

from __future__ import annotations

import logging
import select
import socket
import time
from pathlib import Path
from typing import Any

from formats.jobs import Busy, FrameBuffer, Paused

log = logging.getLogger(__name__)

# Bytes asked of the dispatcher socket at a time. Python allocates the whole size for every
# recv: 1 MiB was an mmap, a page fault and a munmap per read (about 12 us); 64 KiB comes from
# the heap. A large manifest job arrives in more reads, appended to one buffer.
RECV_SIZE = 1 << 16


class Dispatchers:
    """The worker's connections to the dispatchers of this host's HTTP processes: one Unix
    socket each (`DispatchConfig.sockets`). Jobs are taken from them in turn and each answer
    goes back on the connection its job came on. A connection that drops (its HTTP process
    died; the dispatcher gives the jobs it held to other workers) is tried again every
    `RETRY` seconds while the others are served; the worker stops when none has been left
    for `ALONE_FOR` seconds (an HTTP process is restarted within about a second; when the
    server stops, the supervisor stops the workers in that time).

    ``hello`` is the frame sent first on every new connection."""

    RETRY = 0.2
    CONNECT_DELAY = 0.1  # at most, between tries at start (the dispatchers listen within ~1 s)
    ALONE_FOR = 5.0

    def __init__(self, paths: tuple[Path, ...], hello: bytes, name: str) -> None:
        self.paths = paths
        self.hello = hello
        self.name = name
        self.links: dict[Path, tuple[socket.socket, FrameBuffer]] = {}
        self.lost: dict[Path, float] = {}  # path -> when to try it again (monotonic)
        self._turn = 0
        # While this worker signs a manifest of one dispatcher, the others are told (`Busy`)
        # and take back the jobs they had sent it: ``told`` are those connections, and
        # ``dropping`` the ones whose jobs are dropped until their `Paused` arrives (how many
        # are still to come: each `Busy` is answered with one).
        self.told: set[Path] = set()
        self.dropping: dict[Path, int] = {}
        self.busy_with: Path | None = None  # whose manifest (told from its frame's head on)

    def connect(self, deadline: float) -> None:
        """Connect to every dispatcher; wait (bounded) until at least one answers. Those that
        do not yet are tried again while serving. Raises what the last attempt raised when
        none answered by ``deadline``."""
        delay = 0.05
        while True:
            error: OSError | None = None
            for path in self.paths:
                try:
                    self._open(path)
                except (FileNotFoundError, ConnectionRefusedError) as e:
                    error = e
                    self.lost[path] = 0.0
            if self.links or error is None:
                return
            if time.monotonic() > deadline:
                raise error
            time.sleep(delay)
            delay = min(delay * 2, self.CONNECT_DELAY)

    def _open(self, path: Path) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(str(path))
            sock.sendall(self.hello)
        except OSError:
            sock.close()
            raise
        self.lost.pop(path, None)
        self.links[path] = (sock, FrameBuffer())
        self.told.discard(path)  # (a new connection: its dispatcher knows nothing of before)
        self.dropping.pop(path, None)
        if self.busy_with is not None and path != self.busy_with:  # (back while we are busy)
            self.told.add(path)
            self.dropping[path] = 1
            self.answer(path, Busy(True).frame())

    def drop(self, path: Path, why: str, expected: bool = False) -> None:
        sock, _ = self.links.pop(path)
        sock.close()
        self.told.discard(path)
        self.dropping.pop(path, None)
        if path == self.busy_with:  # (its manifest will not come: the others may send)
            self.free()
        self.lost[path] = time.monotonic() + self.RETRY
        if expected:
            log.info("worker %s: dispatcher %s stopped (%s)", self.name, path.name, why)
        else:
            log.warning("worker %s: dispatcher %s %s", self.name, path.name, why)

    def _retry_lost(self) -> None:
        now = time.monotonic()
        for path, when in list(self.lost.items()):
            if when <= now:
                try:
                    self._open(path)
                    log.info("worker %s: dispatcher %s is back", self.name, path.name)
                except OSError:
                    self.lost[path] = now + self.RETRY

    def _ready_frames(self) -> tuple[Path, list[dict[str, Any]]] | None:
        """Every whole job already received on one connection, taking the connections in
        turn."""
        paths = list(self.links)
        for i in range(len(paths)):
            path = paths[(self._turn + i) % len(paths)]
            frames = self.links[path][1]
            messages = []
            while (message := frames.next()) is not None:
                if Paused.is_one(message):
                    if self.dropping.get(path, 0) > 1:
                        self.dropping[path] -= 1
                    else:
                        self.dropping.pop(path, None)
                elif path not in self.dropping:
                    messages.append(message)
                # (else a job its dispatcher took back when told `Busy`: another worker
                # signs it)
            if frames.awaiting_lines and path not in self.dropping:
                # A manifest's head has come, its lines are coming: the other dispatchers
                # hear it now, not once its lines are in (127 MiB take a while, and another
                # process's manifest could be sent to the last free worker meanwhile).
                self.busy_for(path)
            if messages:
                self._turn = (self._turn + i + 1) % len(paths)
                return path, messages
        return None

    def next_jobs(self, timeout: float) -> tuple[Path, list[dict[str, Any]]] | None:
        """The jobs that have arrived on one connection (at least one), and that connection;
        None after ``timeout`` seconds with none, or when no connection is left (`links` is
        then empty)."""
        found = self._ready_frames()
        if found is not None:
            return found
        if self.lost:
            self._retry_lost()
        if not self.links:
            return None
        by_fd = {sock: path for path, (sock, _) in self.links.items()}
        ready, _, _ = select.select(list(by_fd), [], [], timeout)
        for sock in ready:
            path = by_fd[sock]
            try:
                data = sock.recv(RECV_SIZE)
            except OSError as e:
                self.drop(path, f"cannot be read from ({e.strerror})")
                continue
            if not data:
                # A dispatcher that stops removes its socket first (a server stopping, or an
                # HTTP process restarted on purpose): expected, so not a warning. One whose
                # socket is still there hung up without stopping: its HTTP process died.
                self.drop(path, "closed the connection", expected=not path.exists())
                continue
            self.links[path][1].feed(data)
        return self._ready_frames()

    def answer(self, path: Path, frame: bytes) -> None:
        link = self.links.get(path)
        if link is None:
            return  # its dispatcher is gone, and gave the job to another worker
        try:
            link[0].sendall(frame)
        except OSError as e:
            self.drop(path, f"cannot be written to ({e.strerror})")

    def busy_for(self, path: Path) -> None:
        """A manifest of ``path``'s dispatcher is about to keep this worker busy: tell every
        other dispatcher (`Busy`), which takes back the jobs it sent here."""
        self.busy_with = path
        for other in list(self.links):
            if other != path and other not in self.told:
                self.told.add(other)
                self.dropping[other] = self.dropping.get(other, 0) + 1
                self.answer(other, Busy(True).frame())

    def free(self) -> None:
        """The manifest is signed: the dispatchers told `busy_for` may send jobs again."""
        self.busy_with = None
        for path in list(self.told):
            self.told.discard(path)
            self.answer(path, Busy(False).frame())

    def close(self) -> None:
        for sock, _ in self.links.values():
            sock.close()
        self.links.clear()
