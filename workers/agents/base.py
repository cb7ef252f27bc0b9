"""What the gpg-agent and ssh-agent support shares, but for the socket itself
(:mod:`workers.agents.unixsocket`).

`AgentProcess`: an agent started as our own child in a private home: its PID, whether it runs,
confirming it started (`AgentProcess._confirm_start`), connections to it (`AgentProcess.connect`,
closed when it stops), and stopping it for sure (a polite request, then SIGTERM, then SIGKILL,
each waited for a bounded time; a finalizer as the safety net that kills and reaps it and
removes its socket). `run_tool`: one run of an agent's tool (gpg, gpgconf, ssh-add, ssh-keygen).
Each agent starts with ``preexec_fn=procs.prctl.die_with_parent()``: SIGKILL when the process
that started it is gone (Linux), so a worker killed with SIGKILL does not leave its agent
serving.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import stat
import subprocess
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Generic, Self, TypeVar

from workers.agents.unixsocket import DEFAULT_TIMEOUT, AgentSocket
from workers.errors import AgentError

log = logging.getLogger(__name__)

ConnectionT = TypeVar("ConnectionT", bound=AgentSocket)
STOP_GRACE = 5.0  # seconds an agent gets to exit after each step of stop()


def run_tool(argv: list[str], *, env: Mapping[str, str], what: str, error: type[AgentError],
             timeout: float, pass_fds: tuple[int, ...] = (), new_session: bool = False
             ) -> subprocess.CompletedProcess[bytes]:
    """Run an agent's tool with stdin closed and its output captured (``new_session``: without
    a controlling terminal); its exit status is the caller's to judge. Failing to run it at all
    (not installed, no end within ``timeout`` seconds) raises ``error``."""
    try:
        return subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, env=env,
                              pass_fds=pass_fds, start_new_session=new_session, timeout=timeout,
                              check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        raise error(f"{what}: cannot run {argv[0]}: {exc}") from exc


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


class AgentProcess(Generic[ConnectionT]):
    agent_name = "agent"
    error: type[AgentError] = AgentError  # (each agent's own)
    connection: type[ConnectionT]  # (each agent's protocol)
    # Steps of stop() after _ask_to_exit(): None waits without a signal.
    stop_signals: tuple[int | None, ...] = (signal.SIGTERM, signal.SIGKILL)

    def __init__(self, home: Path, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        """``timeout`` is passed to every connection."""
        self.home = Path(home)
        self._timeout = timeout
        self._proc: subprocess.Popen[bytes] | None = None
        self._pid: int | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None
        self._connections: weakref.WeakSet[ConnectionT] = weakref.WeakSet()

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
    def socket_path(self) -> Path:
        """Where the agent listens."""
        raise NotImplementedError

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

    def connect(self) -> ConnectionT:
        """A new persistent connection to the agent (timeout preset), closed by `stop`."""
        self._require_running()
        conn = self.connection.open(self.socket_path, timeout=self._timeout,
                                    **self._connection_options())
        self._connections.add(conn)
        return conn

    # -- for the agents -------------------------------------------------------------------

    def _connection_options(self) -> dict[str, Any]:
        """What every connection of `connect` is opened with besides the timeout."""
        return {}

    def _ask_to_exit(self, proc: subprocess.Popen[bytes]) -> None:
        """A polite request before the signals (none by default)."""

    def _confirm_start(self, proc: subprocess.Popen[bytes], socket_path: Path,
                       confirm: Callable[[], None]) -> None:
        """Take on the freshly spawned ``proc`` (the safety net is set at once), then
        ``confirm()`` that it answers on ``socket_path`` as ``proc``; if that raises the
        agent's error, stop it and raise that it did not start."""
        self._proc = proc
        self._finalizer = weakref.finalize(self, reap_agent, proc, os.getpid(), socket_path,
                                           self.agent_name)
        try:
            confirm()
        except self.error as exc:
            status = proc.poll()
            self.stop()
            detail = f" (exited with status {status})" if status is not None else ""
            raise self.error(f"{self.agent_name} for {self.home} did not start{detail}: "
                             f"{exc}") from exc
        self._pid = proc.pid
        log.info(f"{self.agent_name} started", extra={"pid": proc.pid, "home": str(self.home)})

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
