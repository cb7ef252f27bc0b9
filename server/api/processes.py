"""Several HTTP processes on one host: `stampd serve` with ``--api-processes N`` (N > 1).

    stampd serve ─┬─ python -m server.api.processes  (HTTP process 0) ─┐ run/dispatch.sock,
                  ├─ python -m server.api.processes  (HTTP process 1) ─┤ run/dispatch-1.sock
                  └─ python -m workers.pool ─ workers, each connected to ┘ every one

- **The port.** The supervisor binds N listening sockets to the same address with
  ``SO_REUSEPORT`` and hands one to each HTTP process (an inherited descriptor): the kernel
  spreads new connections over them. A socket outlives its process, so connections that arrive
  while a process restarts wait in its backlog and are served by the replacement.
- **The workers.** HTTP process *n* runs its own dispatcher on its own Unix socket
  (`Settings.dispatch_socket_of`); every worker connects to all of them and takes jobs from
  each in turn (`workers.link.Dispatchers`). A stamp is signed by whichever worker is free.
- **What stays single.** One journal: on SQLite this process keeps the host's one journal
  writer (`server.stamping.journal_host.JournalHost`), which commits the rows every HTTP
  process sends it together, one fsync for all; on PostgreSQL each process commits its own
  groups. One log writer and one cross-stamper: the process that
  holds the log lock (`server.log.leader.FileLeader`; with database dispatch the PostgreSQL
  advisory lock), which another takes over when it dies.
- **Metrics and /readyz** add up, or check, every process (`server.api.siblings`).

Each HTTP process gets its `ApiProcessConfig` as JSON on stdin, like the workers get theirs: its
number, the descriptor of its listening socket, the log level and the settings (which may hold
secrets: a pipe keeps them out of command lines and environments). It reads no ``STAMPD_*``
variable. It dies with the supervisor (SIGKILL, ``PR_SET_PDEATHSIG``: as the one HTTP process of
a server killed with SIGKILL would; its pending stamps are settled as after such a crash, see
`server.log.committer`). The supervisor restarts one that exits while the server runs, and
stops all of them (SIGTERM: each finishes its requests) when it is told to stop.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

from server.settings import Settings
from workers import memory
from workers.agents.base import die_with_parent

log = logging.getLogger(__name__)

EXIT_CONFIG = 2
RESTART_DELAY = 1.0  # seconds before a process that exited is started again
STOP_TIMEOUT = 30.0  # seconds an HTTP process has to finish its requests when stopped
LISTEN_BACKLOG = 4096
SWITCH_INTERVAL = 0.0005  # seconds (sys.setswitchinterval) in an HTTP process: see run_uvicorn


def setup_logging(level: str) -> None:
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("alembic").setLevel(logging.WARNING)


def run_uvicorn(app: Any, settings: Settings, sock: socket.socket | None = None) -> None:
    """Serve ``app`` with uvicorn as stampd does: on ``sock`` when given (an HTTP process of
    several), else on the settings' host and port."""
    import uvicorn

    from server.api.httpproto import InvalidRequestLog, StampdHttpProtocol

    logging.getLogger("uvicorn.error").addFilter(InvalidRequestLog())
    # A thread that holds the GIL (a manifest's million lines checked, its index built) gives
    # it up when another thread has waited this long: CPython's 5 ms made the event loop wait
    # that long at each of its turns, and a stamp served meanwhile take hundreds of ms more
    # (`python -m bench.manifest_flood`).
    sys.setswitchinterval(SWITCH_INTERVAL)
    memory.fix_thresholds()  # (freed manifests go back to the system: workers.memory)

    config = uvicorn.Config(app, host=settings.host, port=settings.port, loop="uvloop",
                            http=StampdHttpProtocol,
                            timeout_keep_alive=int(settings.keepalive_timeout),
                            access_log=False, proxy_headers=False, backlog=LISTEN_BACKLOG,
                            log_level="warning")
    uvicorn.Server(config).run(sockets=None if sock is None else [sock])


@dataclass(frozen=True)
class ApiProcessConfig:
    """What HTTP process ``index`` of ``count`` is told on its stdin."""

    index: int
    count: int
    listen_fd: int
    log_level: str
    settings: dict[str, Any]  # Settings.model_dump(mode="json")

    def to_json(self) -> str:
        return json.dumps({"index": self.index, "count": self.count,
                           "listen_fd": self.listen_fd, "log_level": self.log_level,
                           "settings": self.settings})

    @classmethod
    def from_json(cls, text: str | bytes) -> ApiProcessConfig:
        try:
            d = json.loads(text)
            config = cls(int(d["index"]), int(d["count"]), int(d["listen_fd"]),
                         str(d["log_level"]), dict(d["settings"]))
        except (ValueError, KeyError, TypeError):  # (never quote it: it may hold secrets)
            raise ValueError("not an HTTP process configuration") from None
        if not 0 <= config.index < config.count:
            raise ValueError("process number out of range")
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
    """The supervisor's side: starts, restarts and stops the HTTP processes. Run it from the
    main thread (`run`): the processes die with the thread that started them."""

    def __init__(self, settings: Settings, socks: list[socket.socket], log_level: str,
                 env: dict[str, str]) -> None:
        self.settings = settings
        self.socks = socks
        self.log_level = log_level
        self.env = env
        self.procs: list[subprocess.Popen[bytes] | None] = [None] * len(socks)
        self.stopping = threading.Event()

    def spawn(self, index: int) -> None:
        sock = self.socks[index]
        config = ApiProcessConfig(index, len(self.socks), sock.fileno(), self.log_level,
                                  self.settings.model_dump(mode="json"))
        proc = subprocess.Popen(
            [sys.executable, "-m", "server.api.processes", "--index", str(index)],
            stdin=subprocess.PIPE, env=self.env, pass_fds=(sock.fileno(),),
            preexec_fn=die_with_parent())
        assert proc.stdin is not None
        try:
            proc.stdin.write(config.to_json().encode())
            proc.stdin.close()
        except BrokenPipeError:
            pass  # it died at once; the loop restarts it
        self.procs[index] = proc

    def run(self, poll: float = 0.2) -> None:
        """Start every process, restart those that exit, until `stopping` is set; then stop
        them all."""
        try:
            for i in range(len(self.socks)):
                self.spawn(i)
            died: dict[int, float] = {}
            while not self.stopping.wait(poll):
                now = time.monotonic()
                for i, proc in enumerate(self.procs):
                    if i in died:
                        if now >= died[i]:
                            del died[i]
                            self.spawn(i)
                    elif proc is not None and proc.poll() is not None:
                        log.error("HTTP process %d (pid %d) exited with %s; restarting it",
                                  i, proc.pid, proc.returncode)
                        died[i] = now + RESTART_DELAY
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


def serve_processes(settings: Settings, log_level: str, env: dict[str, str]) -> None:
    """Bind the port, run ``settings.api_process_count`` HTTP processes until SIGTERM or
    SIGINT, then stop them (they finish their requests first)."""
    socks = listeners(settings.host, settings.port, settings.api_process_count)
    host = None
    if settings.shared_journal:  # one journal writer for every HTTP process of this host
        from server import db
        from server.stamping.journal_host import JournalHost

        host = JournalHost(settings.journal_socket, lambda: db.make_engine(settings.db_url))
        host.start()
    procs = ApiProcesses(settings, socks, log_level, env)

    def _stop(_signum: int, _frame: object) -> None:
        procs.stopping.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        procs.run()
    finally:
        for sock in socks:
            sock.close()
        if host is not None:  # (after every HTTP process stopped: nothing more to record)
            host.stop()


# -- the HTTP process -------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    """``python -m server.api.processes --index N < config.json``: one HTTP process. (The
    option only labels it for ``ps``.)"""
    ap = argparse.ArgumentParser(prog="server.api.processes",
                                 description="one HTTP process of stampd serve; its "
                                 "configuration (JSON) comes on stdin")
    ap.add_argument("--index", type=int, help="label: the process's number")
    args = ap.parse_args(argv)
    try:
        config = ApiProcessConfig.from_json(sys.stdin.buffer.read())
        settings = Settings.model_validate(config.settings)
    except ValueError as e:
        print(f"server.api.processes: bad configuration on stdin: {e}".splitlines()[0],
              file=sys.stderr)
        return EXIT_CONFIG
    if args.index is not None and args.index != config.index:
        print("server.api.processes: --index disagrees with the configuration",
              file=sys.stderr)
        return EXIT_CONFIG
    setup_logging(config.log_level)
    from server.api.app import create_app

    sock = socket.socket(fileno=config.listen_fd)
    run_uvicorn(create_app(settings, process=config.index), settings, sock)
    return 0


if __name__ == "__main__":
    sys.exit(main())
