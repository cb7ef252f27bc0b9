"""The supervisor: starts N signing workers, reaps and respawns them, stops them on SIGTERM.

Each worker gets a fresh private home (mode 0700) under the runtime directory. When a worker
exits for any reason, the supervisor kills the gpg-agent it left behind (recorded in
``<home>/agent.pid``), removes the home with the imported key, and starts a replacement after a
short backoff that grows while workers keep dying young.

Run as ``python -m workers.pool`` (by ``stampd serve``), the supervisor reads its `PoolConfig`
as JSON from stdin; ``stampd worker`` runs a `WorkerPool` in its own process. Each worker gets
its `WorkerConfig` the same way, on the stdin of ``python -m workers.worker``; its command line
only names it (``--name``, ``--home``, ``--key-id``) for ``ps`` and ``pgrep``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from workers.config import ConfigError, PoolConfig
from workers.keys.keyset import KeySpec
from workers.worker import AGENT_PID_FILE, EXIT_CONFIG

log = logging.getLogger(__name__)

STOP_DEADLINE = 10.0
MAX_BACKOFF = 5.0


@dataclass
class Slot:
    index: int
    key: KeySpec | None = None  # None: the primary key
    proc: subprocess.Popen[bytes] | None = None
    home: Path | None = None
    started: float = 0.0
    due: float = 0.0  # when to (re)start
    quick_deaths: int = 0
    restarts: int = 0


class WorkerPool:
    def __init__(self, config: PoolConfig, env: Mapping[str, str] | None = None) -> None:
        """``env``: the environment of the workers (default: this process's), to which the
        pool adds ``GNUPGHOME``. Their configuration does not travel in it."""
        self.config = config
        self.env = dict(os.environ if env is None else env)
        self.slots = [Slot(i) for i in range(config.workers)]
        # Every extra key gets workers of its own (each with its own agent).
        for spec in config.extra_keys:
            for _ in range(config.extra_key_workers):
                self.slots.append(Slot(len(self.slots), spec))
        self.runtime = config.runtime_dir
        self._stopping = False

    # -- worker lifecycle ------------------------------------------------------------------
    def _spawn(self, slot: Slot) -> None:
        self.runtime.mkdir(parents=True, exist_ok=True)
        home = Path(tempfile.mkdtemp(prefix=f"stampd-w{slot.index}-", dir=self.runtime))
        os.chmod(home, 0o700)
        name = f"{os.uname().nodename}:{os.getpid()}:{slot.index}"
        config = self.config.worker_config(name, home, slot.key)
        proc = subprocess.Popen(
            [sys.executable, "-m", "workers.worker", "--name", name, "--home", str(home),
             "--key-id", config.key_id],
            stdin=subprocess.PIPE,
            env={**self.env, "GNUPGHOME": str(home)},
            preexec_fn=_unblock_signals,  # the supervisor blocks these for sigtimedwait
        )
        slot.proc, slot.home, slot.started = proc, home, time.monotonic()
        send_config(proc, config.to_json())
        log.info("started worker %d (pid %d)", slot.index, proc.pid)

    def _cleanup(self, slot: Slot) -> None:
        if slot.home is None:
            return
        pid_file = slot.home / AGENT_PID_FILE
        try:
            agent_pid = int(pid_file.read_text())
        except (OSError, ValueError):
            agent_pid = 0
        if agent_pid and _is_agent_of(agent_pid, slot.home):
            with contextlib.suppress(ProcessLookupError):
                os.kill(agent_pid, signal.SIGKILL)
        shutil.rmtree(slot.home, ignore_errors=True)
        slot.home = None

    def _reap(self) -> None:
        now = time.monotonic()
        for slot in self.slots:
            if slot.proc is None or slot.proc.poll() is None:
                continue
            code = slot.proc.returncode
            lived = now - slot.started
            self._cleanup(slot)
            slot.proc = None
            if self._stopping:
                continue
            slot.quick_deaths = slot.quick_deaths + 1 if lived < 5.0 else 0
            backoff = min(0.1 * 2 ** slot.quick_deaths, MAX_BACKOFF) if slot.quick_deaths else 0
            slot.due = now + backoff
            slot.restarts += 1
            log.warning("worker %d exited with %s after %.1fs; restarting in %.1fs",
                        slot.index, code, lived, backoff)

    def _start_due(self) -> None:
        now = time.monotonic()
        for slot in self.slots:
            if slot.proc is None and not self._stopping and slot.due <= now:
                self._spawn(slot)

    # -- main loop ---------------------------------------------------------------------------
    def run(self) -> int:
        watched = WATCHED
        signal.pthread_sigmask(signal.SIG_BLOCK, watched)
        parent = os.getppid()
        try:
            self._start_due()
            while not self._stopping:
                info = signal.sigtimedwait(list(watched), 0.5)
                if info is not None and info.si_signo in (signal.SIGTERM, signal.SIGINT):
                    log.info("supervisor: stopping on signal %d", info.si_signo)
                    self._stopping = True
                    break
                if os.getppid() != parent and parent != 1:
                    log.warning("supervisor: parent process is gone; stopping")
                    self._stopping = True
                    break
                self._reap()
                self._start_due()
        finally:
            self.stop()
        return 0

    def stop(self) -> None:
        self._stopping = True
        for slot in self.slots:
            if slot.proc is not None and slot.proc.poll() is None:
                slot.proc.terminate()
        deadline = time.monotonic() + STOP_DEADLINE
        for slot in self.slots:
            if slot.proc is None:
                continue
            try:
                slot.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("worker %d did not stop in time; killing it", slot.index)
                slot.proc.kill()
                slot.proc.wait(timeout=10)
        for slot in self.slots:
            self._cleanup(slot)
            slot.proc = None


WATCHED = {signal.SIGCHLD, signal.SIGTERM, signal.SIGINT}


def _unblock_signals() -> None:
    signal.pthread_sigmask(signal.SIG_UNBLOCK, WATCHED)


def _is_agent_of(pid: int, home: Path) -> bool:
    """Is ``pid`` a gpg-agent or ssh-agent serving ``home``? (Guards against a reused PID.)"""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    is_agent = bool(cmdline) and cmdline[0].endswith((b"gpg-agent", b"ssh-agent"))
    return is_agent and str(home).encode() in b" ".join(cmdline)


def send_config(proc: subprocess.Popen[bytes], config_json: str) -> None:
    """Write a child's configuration to its stdin and close it. (A child that died before
    reading it is reaped and restarted like any other.)"""
    assert proc.stdin is not None
    try:
        with proc.stdin:
            proc.stdin.write(config_json.encode())
    except BrokenPipeError:
        log.warning("process %d exited before reading its configuration", proc.pid)


def main() -> int:
    try:
        config = PoolConfig.from_json(sys.stdin.buffer.read())
    except ConfigError as e:
        print(f"workers.pool: bad configuration on stdin: {e}", file=sys.stderr)
        return EXIT_CONFIG
    logging.basicConfig(level=config.log_level,
                        format="%(asctime)s supervisor %(levelname)s %(message)s")
    return WorkerPool(config).run()


if __name__ == "__main__":
    sys.exit(main())
