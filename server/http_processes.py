"""Several HTTP processes on one host: `stampd serve` with ``--api-processes N`` (N > 1).

    stampd serve ─┬─ its fork "stampd-api" ─┬─ fork "stampd-http-0" ─┐
    (coordinator) │  (starts, restarts and  └─ fork "stampd-http-1" ─┤ each connected once
                  │   stops the HTTP processes)                       ├ to run/serve.sock
                  └─ fork "stampd-pool" ─ forks "stampd-worker" ──────┘ (stampd serve)

- **The port.** The supervisor binds N listening sockets to the same address with
  ``SO_REUSEPORT``; HTTP process *n* serves on socket *n* (and closes the others): the kernel
  spreads new connections over them. A socket outlives its process, so connections that arrive
  while a process restarts wait in its backlog and are served by the replacement.
- **Forked, not started.** An HTTP process imports FastAPI, SQLAlchemy, uvicorn and the app:
  about a second of CPU. The *HTTP manager* (`manage`) imports them once and forks each HTTP
  process from itself, at the start and at every restart. It is forked from the supervisor
  at the start of `stampd serve`, while the supervisor has one thread and before it has read a
  key or a passphrase (`ApiManager`); it takes the listening sockets and the settings with it
  and drops the data directory's locks. It stays single-threaded, as forking needs. Where the
  supervisor cannot fork safely (another thread runs) and when the manager died, it is started
  as ``python -m server.http_processes`` instead, its `ApiManagerConfig` as JSON on stdin (the
  settings may hold secrets: a pipe keeps them out of command lines and environments) and the
  sockets inherited.
- **Names.** The manager is called ``stampd-api`` and HTTP process *n* ``stampd-http-n``
  (``/proc/PID/comm``, as ``ps -o comm`` and ``top`` show them; the command line stays the
  supervisor's).
- **The workers.** The host's one dispatcher runs in the coordinator; every worker connects
  once, to it (`Settings.serve_socket`, `workers.link.DispatcherLink`), and each HTTP
  process hands it its jobs over its connection to the coordinator
  (`server.coordinator.HostDispatcher`). A stamp is signed by whichever worker is free.
- **What stays single.** The host's coordinator (`server.coordinator.Coordinator`), in the
  supervisor: it runs the dispatcher, counts the budgets every HTTP process shares, and on
  SQLite it is the host's one journal writer, which commits the rows every HTTP process sends
  it together, one fsync for all; on PostgreSQL each process commits its own groups. One log
  writer and one cross-stamper: the process that holds the log lock
  (`server.leadership.FileLeader`; with database dispatch the PostgreSQL advisory lock), which
  another takes over when it dies.
- **Metrics and /readyz** add up, or check, every process (`server.runtime.siblings`).

Each process dies with its parent (SIGKILL, ``PR_SET_PDEATHSIG``): an HTTP process as the one
HTTP process of a server killed with SIGKILL would (its pending stamps are settled as after
such a crash, see `server.gitlog.committer`). The manager restarts an HTTP process that exits
while the server runs, and the supervisor a manager that exits; told to stop, the supervisor
stops the manager, which stops every HTTP process (SIGTERM: each finishes its requests).
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from procs import memory
from procs.forked import Child, fork_child, stop_child
from procs.prctl import die_with_parent, set_process_name
from procs.restarts import Restarts
from server.settings import Settings

log = logging.getLogger(__name__)

EXIT_CONFIG = 2
STOP_TIMEOUT = 30.0  # seconds an HTTP process has to finish its requests when stopped
LISTEN_BACKLOG = 4096
SWITCH_INTERVAL = 0.0005  # seconds (sys.setswitchinterval) in an HTTP process: see run_uvicorn
MANAGER_NAME = "stampd-api"
HTTP_NAME = "stampd-http-{}"  # (process n's name: at most 15 bytes, as Linux keeps)


def setup_logging(level: str) -> None:
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("alembic").setLevel(logging.WARNING)


def run_uvicorn(app: Any, settings: Settings, sock: socket.socket | None = None) -> None:
    """Serve ``app`` with uvicorn as stampd does: on ``sock`` when given (an HTTP process of
    several), else on the settings' host and port."""
    # anyio's asyncio backend (Starlette's streamed answers and threads use it) is imported
    # at its first use otherwise: 50 ms holding the event loop at the first manifest answered.
    import anyio._backends._asyncio  # noqa: F401
    import uvicorn

    from server.runtime.httpproto import InvalidRequestLog, StampdHttpProtocol

    logging.getLogger("uvicorn.error").addFilter(InvalidRequestLog())
    # A thread that holds the GIL (a manifest's million lines checked, its index built) gives
    # it up when another thread has waited this long: CPython's 5 ms made the event loop wait
    # that long at each of its turns, and a stamp served meanwhile take hundreds of ms more
    # (`python -m bench.manifest_flood`).
    sys.setswitchinterval(SWITCH_INTERVAL)
    memory.fix_thresholds()  # (freed manifests go back to the system: procs.memory)
    # What is there now (the modules, the app) stays for the process's life: the collector
    # no longer walks it. A full collection walked ~120,000 objects, 80-115 ms holding the
    # GIL on a busy 2-core host, and a manifest's index rows set one off now and then. (No
    # collection first: it took 136 ms at every start, for the little garbage of imports.)
    gc.freeze()

    config = uvicorn.Config(app, host=settings.host, port=settings.port, loop="uvloop",
                            http=StampdHttpProtocol,
                            timeout_keep_alive=int(settings.keepalive_timeout),
                            access_log=False, proxy_headers=False, backlog=LISTEN_BACKLOG,
                            log_level="warning")
    uvicorn.Server(config).run(sockets=None if sock is None else [sock])


@dataclass(frozen=True)
class ApiManagerConfig:
    """What a started (not forked) HTTP manager is told on its stdin."""

    listen_fds: tuple[int, ...]  # HTTP process n serves on the n-th
    log_level: str
    settings: dict[str, Any]  # Settings.model_dump(mode="json")

    def to_json(self) -> str:
        return json.dumps({"listen_fds": list(self.listen_fds), "log_level": self.log_level,
                           "settings": self.settings})

    @classmethod
    def from_json(cls, text: str | bytes) -> ApiManagerConfig:
        try:
            d = json.loads(text)
            config = cls(tuple(int(fd) for fd in d["listen_fds"]), str(d["log_level"]),
                         dict(d["settings"]))
        except (ValueError, KeyError, TypeError):  # (never quote it: it may hold secrets)
            raise ValueError("not an HTTP manager configuration") from None
        if not config.listen_fds:
            raise ValueError("no listening socket")
        return config


def listeners(host: str, port: int, count: int) -> list[socket.socket]:
    """``count`` listening sockets on ``host``:``port`` sharing it with ``SO_REUSEPORT`` (port
    0: the first one's port)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(family, socket.SOCK_STREAM)
            socks.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((host, port or (socks[0].getsockname()[1] if len(socks) > 1 else 0)))
            sock.listen(LISTEN_BACKLOG)
            sock.set_inheritable(True)
    except BaseException:
        for sock in socks:
            sock.close()
        raise
    return socks


class ApiProcesses:
    """The HTTP manager's work: forks, restarts and stops the HTTP processes. Runs in a
    single-threaded process (forking needs it) from its main thread (the processes die with
    the thread that forked them)."""

    def __init__(self, settings: Settings, socks: list[socket.socket],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self.socks = socks
        self.procs: list[Child | None] = [None] * len(socks)
        self.restarts = [Restarts(clock=clock) for _ in socks]
        self.stopping = threading.Event()

    def spawn(self, index: int) -> None:
        self._fork(index)
        self.restarts[index].started()

    def _fork(self, index: int) -> None:
        with_parent = die_with_parent()
        # SIGTERM and SIGINT are held across the fork: one that comes meanwhile runs the
        # manager's handler (which then stops the child), or the child's own, never the
        # manager's handler in the child (which would leave it running).
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
        try:
            self.procs[index] = fork_child(lambda: self._serve(index, with_parent, mask))
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)

    def _serve(self, index: int, with_parent: Any, mask: set[int | signal.Signals]) -> int:
        """In HTTP process ``index``: serve on its socket until SIGTERM or SIGINT."""
        with_parent()
        set_process_name(HTTP_NAME.format(index))
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # (uvicorn sets its own handlers)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for i, sock in enumerate(self.socks):
            if i != index:
                sock.close()
        from server.api.app import create_app

        run_uvicorn(create_app(self.settings, process=index), self.settings,
                    self.socks[index])
        return 0

    def run(self, poll: float = 0.2) -> None:
        """Start every process, restart those that exit (`procs.restarts`), until `stopping`
        is set; then stop them all."""
        try:
            for i in range(len(self.socks)):
                self.spawn(i)
            while not self.stopping.wait(poll):
                for i, proc in enumerate(self.procs):
                    if proc is None:
                        if self.restarts[i].due():
                            self.spawn(i)
                    elif proc.poll() is not None:
                        self.procs[i] = None
                        lived, delay = self.restarts[i].exited()
                        log.error("HTTP process %d (pid %d) exited with %s after %.1fs; "
                                  "restarting it in %.1fs", i, proc.pid, proc.returncode,
                                  lived, delay)
        finally:
            self.stop()

    def stop(self) -> None:
        self.stopping.set()
        live = [p for p in self.procs if p is not None and p.poll() is None]
        for p in live:
            p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT
        for p in live:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)


def manage(settings: Settings, socks: list[socket.socket], go_fd: int | None = None) -> int:
    """The HTTP manager (in its own process): import the app once, wait for the go (one byte
    on ``go_fd``; end of file there: the server did not start, exit), then run the HTTP
    processes (`ApiProcesses`) until SIGTERM or SIGINT."""
    set_process_name(MANAGER_NAME)
    procs = ApiProcesses(settings, socks)

    def _stop(_signum: int, _frame: object) -> None:
        procs.stopping.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    import server.api.app  # noqa: F401  (once, here: every HTTP process is forked with it)

    if go_fd is not None:
        try:
            while not procs.stopping.is_set():
                if select.select([go_fd], [], [], 0.2)[0]:
                    if not os.read(go_fd, 1):
                        return 0
                    break
        finally:
            os.close(go_fd)
        if procs.stopping.is_set():
            return 0
    if threading.active_count() != 1:  # (never: nothing here starts a thread)
        log.error("the HTTP manager has threads: it cannot fork the HTTP processes safely")
        return 1
    procs.run()
    return 0


class ApiManager:
    """The supervisor's side: the HTTP manager, forked from `stampd serve` (`start`, before
    anything secret is read or a thread started), started again as ``python -m
    server.http_processes`` when it exits while the server runs, and stopped at the end."""

    def __init__(self, settings: Settings, socks: list[socket.socket], log_level: str,
                 env: dict[str, str]) -> None:
        self.settings = settings
        self.socks = socks
        self.log_level = log_level
        self.env = env
        self.proc: Child | None = None
        self._go: int | None = None
        self.restarts = Restarts()
        self.stopping = threading.Event()

    def start(self) -> None:
        """Fork the manager now if this process has one thread (it waits for `go`); else it
        is started by `go`."""
        if threading.active_count() != 1:
            return
        read_fd, write_fd = os.pipe()
        with_parent = die_with_parent()

        def run() -> int:
            os.close(write_fd)
            with_parent()
            return manage(self.settings, self.socks, read_fd)

        try:
            self.proc = fork_child(run)
        finally:
            os.close(read_fd)
        self.restarts.started()
        self._go = write_fd

    def go(self) -> None:
        """Let the manager start the HTTP processes."""
        if self._go is not None:
            fd, self._go = self._go, None
            try:
                os.write(fd, b"1")
            except BrokenPipeError:
                pass  # it died already: `run` starts another
            finally:
                os.close(fd)
        elif self.proc is None:
            self._exec()

    def _exec(self) -> None:
        config = ApiManagerConfig(tuple(s.fileno() for s in self.socks), self.log_level,
                                  self.settings.model_dump(mode="json"))
        proc = subprocess.Popen([sys.executable, "-m", "server.http_processes"],
                                stdin=subprocess.PIPE, env=self.env,
                                pass_fds=config.listen_fds, preexec_fn=die_with_parent())
        assert proc.stdin is not None
        try:
            proc.stdin.write(config.to_json().encode())
            proc.stdin.close()
        except BrokenPipeError:
            pass  # it died at once; `run` starts another
        self.proc = proc
        self.restarts.started()

    def run(self, poll: float = 0.2) -> None:
        """Let the manager go, start it again when it exits (`procs.restarts`), until
        `stopping` is set; then stop it (it stops the HTTP processes)."""
        try:
            self.go()
            while not self.stopping.wait(poll):
                if self.proc is None:
                    if self.restarts.due():
                        self._exec()
                elif self.proc.poll() is not None:
                    proc, self.proc = self.proc, None
                    lived, delay = self.restarts.exited()
                    log.error("the HTTP manager (pid %d) exited with %s after %.1fs; starting "
                              "it again in %.1fs", proc.pid, proc.returncode, lived, delay)
        finally:
            self.stop()

    def stop(self) -> None:
        """Stop the manager (it stops the HTTP processes first), or let a forked one that
        never got its go exit."""
        self.stopping.set()
        if self._go is not None:
            os.close(self._go)  # (end of file: it exits)
            self._go = None
        if self.proc is not None:
            stop_child(self.proc, STOP_TIMEOUT + 10)


def serve_processes(manager: ApiManager, settings: Settings) -> None:
    """Run the HTTP processes through ``manager`` until SIGTERM or SIGINT, then stop them
    (they finish their requests first). This process runs the host's coordinator meanwhile
    (`server.coordinator`: the budgets, the workers' dispatcher on socket dispatch, and on
    SQLite the one journal writer)."""
    from server import db
    from server.budgets import HostBudgets
    from server.coordinator import Coordinator
    from server.dispatch.socket import socket_dispatcher

    host = Coordinator(settings.serve_socket,
                       (lambda: db.make_engine(settings.db_url)) if settings.shared_journal
                       else None, HostBudgets(settings, time.time),
                       (lambda: socket_dispatcher(settings, listen=False))
                       if settings.dispatch == "socket"
                       else None)
    host.start()

    def _stop(_signum: int, _frame: object) -> None:
        manager.stopping.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        manager.run()
    finally:  # (after every HTTP process stopped: nothing more to record)
        host.stop()


# -- a started HTTP manager -------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    """``python -m server.http_processes < config.json``: the HTTP manager, started (not
    forked) by `ApiManager`."""
    argparse.ArgumentParser(prog="server.http_processes",
                            description="the HTTP manager of stampd serve: forks its HTTP "
                            "processes; its configuration (JSON) comes on stdin"
                            ).parse_args(argv)
    try:
        config = ApiManagerConfig.from_json(sys.stdin.buffer.read())
        settings = Settings.model_validate(config.settings)
    except ValueError as e:
        print(f"server.http_processes: bad configuration on stdin: {e}".splitlines()[0],
              file=sys.stderr)
        return EXIT_CONFIG
    setup_logging(config.log_level)
    socks = [socket.socket(fileno=fd) for fd in config.listen_fds]
    return manage(settings, socks)


if __name__ == "__main__":
    sys.exit(main())
