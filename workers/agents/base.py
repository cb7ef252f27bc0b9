"""What the gpg-agent and ssh-agent support shares.

`AgentSocket`: one Unix socket to an agent, a deadline on every request, and a connection that,
once broken, fails every later call at once instead of talking on out of step.

`AgentProcess`: an agent started as our own child in a private home: its PID, whether it runs,
and stopping it for sure (a polite request, then SIGTERM, then SIGKILL, each waited for a
bounded time; a finalizer as the safety net that kills and reaps it and removes its socket).
The agent dies with its parent: SIGKILL when the process that started it is gone
(`die_with_parent`, Linux), so a worker killed with SIGKILL does not leave its agent serving.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from workers.errors import AgentError

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 30.0
STOP_GRACE = 5.0  # seconds an agent gets to exit after each step of stop()
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_PR_SET_NAME = 15


def _find_prctl() -> Callable[..., int] | None:
    """libc's prctl(2), looked up once, before any fork (a forked child must not load it)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # pragma: no cover - every Linux libc has it
        return None


_prctl = _find_prctl()


def set_process_name(name: str) -> None:
    """Name this process as ``ps -o comm``, ``top`` and ``/proc/PID/comm`` show it (Linux
    keeps 15 bytes; elsewhere nothing): a forked process is otherwise named as its parent."""
    if _prctl is not None:
        _prctl(_PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)


def die_with_parent(sig: int = signal.SIGKILL) -> Callable[[], None]:
    """A ``preexec_fn`` for `subprocess.Popen`: the child gets ``sig`` when the process that
    starts it (this one) is gone. (Linux ``prctl(PR_SET_PDEATHSIG)``; elsewhere nothing.)

    The signal comes when the *thread* that forked the child ends, so start such children
    from a thread that lives as long as they should: the main thread. The setting survives
    ``exec`` (of anything but set-user-ID programs). A parent that died before the child set
    it is caught too: the child then kills itself at once."""
    parent = os.getpid()

    def preexec() -> None:
        if _prctl is not None and _prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0) == 0 \
                and os.getppid() != parent:
            os.kill(os.getpid(), sig)

    return preexec


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


def stderr_tail(result: subprocess.CompletedProcess[bytes], lines: int = 5) -> str:
    """The last lines of a tool's stderr, on one line (for error messages)."""
    text = result.stderr.decode("utf-8", "replace").strip().splitlines()
    return " | ".join(text[-lines:])


def reap_agent(proc: subprocess.Popen[bytes], owner_pid: int, socket_path: Path,
               name: str) -> None:
    """Kill and reap the agent unless it is gone; the safety net of `AgentProcess`."""
    if os.getpid() != owner_pid:  # a forked child must not kill its parent's agent
        return
    if proc.poll() is None:
        proc.kill()
        try:
            proc.wait(STOP_GRACE)
        except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL is not ignorable
            log.error("%s survived SIGKILL", name, extra={"pid": proc.pid})
    if proc.stdout is not None:
        proc.stdout.close()
    with contextlib.suppress(OSError):  # the home may be gone already
        socket_path.unlink(missing_ok=True)


class AgentProcess:
    agent_name = "agent"
    error: type[AgentError] = AgentError  # (each agent's own)
    # Steps of stop() after _ask_to_exit(): None waits without a signal.
    stop_signals: tuple[int | None, ...] = (signal.SIGTERM, signal.SIGKILL)

    def __init__(self, home: Path) -> None:
        self.home = Path(home)
        self._proc: subprocess.Popen[bytes] | None = None
        self._pid: int | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None
        self._connections: weakref.WeakSet[AgentSocket] = weakref.WeakSet()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(home={str(self.home)!r}, pid={self._pid})"

    def start(self) -> None:
        raise NotImplementedError

    @property
    def pid(self) -> int:
        """The agent's process id."""
        if self._pid is None:
            raise self.error(f"{self.agent_name} for {self.home} is not running")
        return self._pid

    @property
    def running(self) -> bool:
        """True while the started agent process is alive."""
        return self._proc is not None and self._proc.poll() is None

    def stop(self) -> None:
        """Stop the agent and wait until its process is gone. Idempotent. Open connections
        from ``connect()`` are closed first."""
        proc = self._proc
        if proc is None:
            return
        for conn in list(self._connections):
            conn.close()
        self._ask_to_exit(proc)
        for sig in self.stop_signals:
            if proc.poll() is not None:
                break
            if sig is not None:
                proc.send_signal(sig)
            try:
                proc.wait(STOP_GRACE)
                break
            except subprocess.TimeoutExpired:
                log.warning("%s slow to exit", self.agent_name,
                            extra={"pid": proc.pid, "signal": sig})
        if self._finalizer is not None:
            self._finalizer()  # reaps for sure and removes the socket the agent leaves behind
        log.info(f"{self.agent_name} stopped",
                 extra={"pid": proc.pid, "home": str(self.home), "status": proc.returncode})
        self._proc = None
        self._pid = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # -- for the agents -------------------------------------------------------------------

    def _ask_to_exit(self, proc: subprocess.Popen[bytes]) -> None:
        """A polite request before the signals (none by default)."""

    def _watch(self, proc: subprocess.Popen[bytes], socket_path: Path) -> None:
        """Register the safety net for a freshly started agent."""
        self._finalizer = weakref.finalize(self, reap_agent, proc, os.getpid(), socket_path,
                                           self.agent_name)

    def _require_running(self) -> None:
        if self._proc is None:
            raise self.error(f"{self.agent_name} for {self.home} is not started")
        status = self._proc.poll()
        if status is not None:
            raise self.error(f"{self.agent_name} for {self.home} died (status {status})")

    def _check_home(self) -> None:
        try:
            info = self.home.stat()
        except OSError as exc:
            raise self.error(f"agent home {self.home} is unusable: {exc}") from exc
        if not stat.S_ISDIR(info.st_mode):
            raise self.error(f"agent home {self.home} is not a directory")
        if info.st_mode & 0o077:
            raise self.error(f"agent home {self.home} must be private (mode 0700)")
