"""The worker supervisor as a child of ``stampd serve``: forked (or started with its
configuration on stdin), waited for until every key made a good test signature, restarted
when it dies."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time

from procs.forked import Child, fork_child
from procs.restarts import Restarts
from server.errors import CommandFailed
from server.settings import Settings
from workers.config import LOG_LEVELS, DispatchConfig, PoolConfig

log = logging.getLogger("stampd")


# Secrets that child processes must not inherit (they get what they need in their config).
SECRET_ENV = ("STAMPD_PASSPHRASE", "STAMPD_DATABASE_URL")


def child_env() -> dict[str, str]:
    """The environment of the worker processes: ours without the secrets. (They read no
    ``STAMPD_*`` variable; their configuration comes on stdin, see `pool_config`.)"""
    return {k: v for k, v in os.environ.items() if k not in SECRET_ENV}


def pool_config(settings: Settings) -> PoolConfig:
    """What the worker supervisor and its workers need of ``settings``, and the current log
    level (``--log-level`` or ``STAMPD_LOG_LEVEL``). Reads the passphrase file."""
    if settings.dispatch == "database":
        from server.dispatch.database import psycopg_dsn

        dispatch = DispatchConfig("database", dsn=psycopg_dsn(settings.db_url))
    else:
        dispatch = DispatchConfig("socket", socket=settings.serve_socket.resolve())
    level = logging.getLevelName(logging.getLogger().getEffectiveLevel())
    return PoolConfig(
        workers=settings.worker_count,
        keys_dir=settings.keys_dir.resolve(),
        runtime_dir=settings.worker_homes_dir.resolve(),
        dispatch=dispatch,
        extra_keys=tuple(settings.extra_key_specs),
        extra_key_workers=settings.extra_key_workers,
        passphrase=settings.read_passphrase(),
        log_level=level if level in LOG_LEVELS else "INFO",
        tsa_key=settings.tsa_spec,
        tsa_subject=settings.tsa_common_name if settings.tsa_spec is not None else None,
        tsa_days=settings.tsa_cert_days,
    )


class PoolProcess:
    """Runs the worker supervisor as a child process (forked: `workers.pool.forked_pool`; or
    ``python -m workers.pool``, its `PoolConfig` on stdin) and restarts it if it dies
    (`procs.restarts`).

    `start` waits until the first supervisor has checked every key (one test signature each,
    made in the supervisor's agents and verified against the key's public key file) and raises
    `CommandFailed` with its one-line reason when one cannot sign: nothing is served then.
    (The private keys stay out of this process: the supervisor only reports.)"""

    START_TIMEOUT = 300.0  # for the key check; each of its steps has a deadline of its own

    def __init__(self, settings: Settings) -> None:
        self.config = pool_config(settings)
        self.proc: Child | None = None
        self.restarts = Restarts()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="pool-watch", daemon=True)

    def _spawn(self, check_keys: bool = False) -> None:
        self.restarts.started()
        if not check_keys:
            self.proc = self._start(None)
            return
        read_fd, write_fd = os.pipe()
        try:
            self.proc = self._start(write_fd)
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)
        line = _read_report(read_fd, self.START_TIMEOUT)
        if line == "ok":
            return
        proc, self.proc = self.proc, None
        try:
            code = proc.wait(timeout=30 if line else 0.1)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait(timeout=10)
        raise CommandFailed(line or f"the worker supervisor exited with {code} before it "
                            "started its workers")

    def _start(self, report_fd: int | None) -> Child:
        """Fork the supervisor while this process has one thread (its first start: no
        interpreter start and imports, ~0.15 s of CPU), else start ``python -m workers.pool``
        with its configuration on stdin (a restart, from the watching thread); with
        ``report_fd``, it checks the keys first and says how that went there."""
        from workers.pool import forked_pool, send_config

        if threading.active_count() == 1:
            env, config = child_env(), self.config
            return fork_child(lambda: forked_pool(config, env, report_fd))
        report = [] if report_fd is None else ["--check-keys", "--report-fd", str(report_fd)]
        proc = subprocess.Popen([sys.executable, "-m", "workers.pool", *report],
                                stdin=subprocess.PIPE, env=child_env(),
                                pass_fds=() if report_fd is None else (report_fd,))
        send_config(proc, self.config.to_json())
        return proc

    def start(self) -> None:
        self._spawn(check_keys=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stopping.is_set():
            assert self.proc is not None
            code = self.proc.wait()
            if self._stopping.is_set():
                return
            lived, delay = self.restarts.exited()
            log.error("worker supervisor exited with %s after %.1fs; restarting it in %.1fs",
                      code, lived, delay)
            if self._stopping.wait(delay):
                return
            self._spawn()

    def stop(self) -> None:
        self._stopping.set()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def _read_report(fd: int, timeout: float) -> str:
    """The one line the supervisor writes to ``fd`` (then closed); empty when it exited, or
    did not answer within ``timeout`` seconds, without writing one."""
    import select

    deadline = time.monotonic() + timeout
    data = b""
    try:
        while b"\n" not in data:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                break
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            data += chunk
    finally:
        os.close(fd)
    return " ".join(data.decode("utf-8", "replace").partition("\n")[0].split())
