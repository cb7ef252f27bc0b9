"""The Unix-socket plumbing both agents' protocols stand on (gpg-agent's Assuan in
:mod:`workers.agents.gpg`, the ssh-agent protocol in :mod:`workers.agents.ssh`).

`AgentSocket`: one Unix socket to an agent, a deadline on every request, and a connection that,
once broken, fails every later call at once instead of talking on out of step. `DEFAULT_TIMEOUT`
is a request's deadline unless an agent is given another. `check_socket_path`: a path that
fits ``sockaddr_un`` (`SUN_PATH_MAX`); `remove_stale_socket`: a dead agent's socket file
removed before a new agent binds there.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from workers.errors import AgentError

DEFAULT_TIMEOUT = 30.0
"""Seconds one agent request may take before the connection is given up."""

SUN_PATH_MAX = 107  # sockaddr_un.sun_path is 108 bytes including the terminating NUL


def check_socket_path(path: Path, error: type[AgentError]) -> None:
    """Raise ``error`` unless a Unix socket can be bound or reached at ``path``."""
    if len(os.fsencode(path)) > SUN_PATH_MAX:
        raise error(f"agent socket path is longer than {SUN_PATH_MAX} bytes: {path}; "
                    "use a shorter home directory")


class AgentSocket:
    agent_name = "agent"
    error: type[AgentError] = AgentError  # what subclasses raise; set by each protocol

    def __init__(self, sock: socket.socket, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        """Take over ``sock``, a socket already connected to the agent."""
        if timeout <= 0:
            raise ValueError("timeout must be positive")
        self._sock: socket.socket | None = sock
        self._timeout = timeout
        self._broken: str | None = None
        self._lock = threading.Lock()

    @classmethod
    def open(cls, path: Path, *, timeout: float = DEFAULT_TIMEOUT, **kwargs: Any) -> Self:
        """Connect to the agent socket at ``path``."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout)
            sock.connect(os.fspath(path))
        except OSError as exc:
            sock.close()
            raise cls.error(f"cannot connect to {cls.agent_name} at {path}: {exc}") from exc
        return cls(sock, timeout=timeout, **kwargs)

    @property
    def timeout(self) -> float:
        """Seconds one request may take (default 30)."""
        return self._timeout

    @timeout.setter
    def timeout(self, value: float) -> None:
        if value <= 0:
            raise ValueError("timeout must be positive")
        self._timeout = value

    @property
    def closed(self) -> bool:
        """True once the connection is closed or broken."""
        return self._sock is None

    def close(self) -> None:
        """Close the socket (the agent drops the session). Idempotent."""
        sock, self._sock = self._sock, None
        if self._broken is None:
            self._broken = "connection closed"
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # -- for the protocols ----------------------------------------------------------------

    def _fail(self, reason: str, cause: BaseException | None = None) -> Exception:
        """Mark the connection unusable; the error to raise."""
        if self._broken is None:
            self._broken = reason
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()
        error = self.error(f"{self.agent_name} connection failed: {reason}")
        error.__cause__ = cause
        return error

    def _check_usable(self) -> socket.socket:
        if self._sock is None:
            raise self.error(f"{self.agent_name} connection unusable: {self._broken}")
        return self._sock

    def _send(self, data: bytes) -> None:
        sock = self._check_usable()
        try:
            sock.settimeout(self._timeout)
            sock.sendall(data)
        except OSError as exc:
            raise self._fail(f"send: {exc}", exc) from exc

    def _recv(self, size: int, deadline: float) -> bytes:
        """Some bytes (at most ``size``) before ``deadline``; never empty."""
        sock = self._check_usable()
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise self._fail(f"no answer within {self._timeout:g} s")
        try:
            sock.settimeout(remaining)
            chunk = sock.recv(size)
        except TimeoutError as exc:
            raise self._fail(f"no answer within {self._timeout:g} s", exc) from exc
        except OSError as exc:
            raise self._fail(f"receive: {exc}", exc) from exc
        if not chunk:
            raise self._fail("agent closed the connection")
        return chunk


def remove_stale_socket(path: Path, error: type[AgentError], agent: str) -> None:
    """Remove a socket file no agent serves (a dead agent's); raise ``error`` when a live
    ``agent`` still listens on it. Agents will not bind over an existing socket."""
    if not (path.exists() or path.is_symlink()):
        return
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(1.0)
        probe.connect(os.fspath(path))
    except OSError:
        path.unlink()  # stale socket of a dead agent
    else:
        raise error(f"another {agent} already listens on {path}")
    finally:
        probe.close()
