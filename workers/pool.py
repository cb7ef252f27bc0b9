"""The supervisor: starts N signing workers, reaps and respawns them, stops them on SIGTERM.

Each worker gets a fresh private home (mode 0700) under the runtime directory: by default
``<data_dir>/run/workers``, made private (0700) by the supervisor (`prepare_runtime_dir`). The
home holds an imported copy of the secret key. When a worker exits for any reason, the
supervisor kills the agent it left behind (recorded in ``<home>/agent.pid``), removes the home
with the key, and starts a replacement at once, or after a short backoff that grows while
workers keep dying young (`procs.restarts`, the policy of every supervised process).

Homes must not outlive their workers, even when the supervisor is killed with SIGKILL:

- the workers die with the supervisor, and their agents with them (``PR_SET_PDEATHSIG``,
  `procs.prctl.die_with_parent`); a worker that outlives its supervisor all the same
  removes its own home;
- the supervisor holds a lock (``flock``) on every home it made, for as long as the home is
  in use; at start it removes every home under the runtime directory that nobody holds
  (`sweep_stale_homes`: those of a supervisor killed before it could clean up), after killing
  an agent still serving it. The lock, not a PID, tells a stale home from one of another live
  supervisor sharing the directory.

Keys that cannot sign. Before it starts any worker, the supervisor can check every key it
serves (`WorkerPool.prepare` with ``check_keys``): one test signature per key, made through an
agent in a home of its own and verified against the key's public key file (`check_key`); the
first key that fails stops the start with `KeyUnusable`, one line naming the key file. Later, a
worker that cannot load its key exits with `EXIT_KEY_UNUSABLE` and leaves the reason in its
home: the supervisor logs one warning per key (not one per attempt) and retries that key's
workers with a backoff of at most `MAX_KEY_BACKOFF` seconds, while the other keys' workers go on
serving. A key whose workers keep dying young for another reason (its agent keeps failing) is
reported the same way, after `FAILING_AFTER` deaths in a row.

Forked by ``stampd serve`` (`forked_pool`), or run as ``python -m workers.pool`` (by ``stampd
serve`` when it restarts it), which reads its `PoolConfig` as JSON from stdin, the supervisor
is named ``stampd-pool`` (`run_pool`); ``stampd worker`` runs a `WorkerPool` in its own
process. The supervisor forks each worker, which runs `workers.worker.begin` with its
`WorkerConfig` (`_forked_worker`: no interpreter start and imports, ~0.2 s of CPU each) while
it has one thread; else (forking is not safe then) it starts ``python -m workers.worker`` with
the configuration on its stdin and ``--name``, ``--home``, ``--key-id`` on its command line,
for ``ps``. Either way the worker is named ``stampd-worker`` (``/proc/PID/comm``), and the
INFO line that starts it gives its PID, key and home. With
``--check-keys`` the supervisor checks the keys first, and ``--report-fd N`` has it write one
line to descriptor N before it starts its workers: ``ok``, or why it does not start (it then
exits with `EXIT_KEY_UNUSABLE` or `EXIT_CONFIG`).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import logging
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from formats.keys import PRIMARY, KeySpec
from keystore.keyset import KeyUnusable
from procs.forked import Child, fork_child, start_fresh
from procs.prctl import die_with_parent, set_process_name
from procs.restarts import MAX_BACKOFF, Restarts
from workers.config import ConfigError, PoolConfig, WorkerConfig
from workers.errors import AgentError, TsaError, WorkerError
from workers.status import (
    AGENT_PID_FILE,
    EXIT_AGENT_DIED,
    EXIT_CONFIG,
    EXIT_KEY_UNUSABLE,
    EXIT_NO_DISPATCHER,
    READY,
    UNUSABLE,
    read_status,
)
from workers.worker import begin, check_key

log = logging.getLogger(__name__)

POOL_NAME = "stampd-pool"  # the supervisor's /proc/PID/comm, as ps -o comm and top show it
STOP_DEADLINE = 10.0
MAX_KEY_BACKOFF = 30.0  # the longest wait (`procs.restarts`) of a worker that cannot load its key
FAILING_AFTER = 3  # young deaths in a row after which a key is reported as failing
HOME_PREFIX = "stampd-w"  # a home is <runtime dir>/stampd-w<slot>-<8 random characters>
SUN_PATH_MAX = 107  # bytes of a Unix socket path (sockaddr_un.sun_path, less its NUL)
# The longest socket name in a home: gpg-agent's (its socket is in the home unless
# /run/user/<uid> exists); ssh-agent's is "agent.sock".
LONGEST_SOCKET = "S.gpg-agent"


class RuntimeDirError(WorkerError):
    """No usable directory for the workers' homes."""


@dataclass
class Slot:
    index: int
    key: KeySpec | None = None  # None: the primary key
    proc: Child | None = None
    home: Path | None = None
    lock: int = -1  # a descriptor of the home, flock()ed while the home is in use
    restarts: Restarts = field(default_factory=Restarts)  # when to start it (again)

    @property
    def key_id(self) -> str:
        return PRIMARY if self.key is None else self.key.id


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
        # Workers are forked (no interpreter start and imports: ~0.2 s of CPU each) while this
        # process has one thread, else started as ``python -m workers.worker``.
        self.fork = True
        self._prepared = False
        self._stopping = False
        self.failing: dict[str, str] = {}  # key id -> why its workers fail (reported once)

    # -- worker lifecycle ------------------------------------------------------------------
    def _spawn(self, slot: Slot) -> None:
        home, lock = make_home(self.runtime, slot.index)
        name = f"{os.uname().nodename}:{os.getpid()}:{slot.index}"
        config = self.config.worker_config(name, home, slot.key, supervisor=os.getpid())
        die_with_us = die_with_parent()

        def preexec() -> None:
            _unblock_signals()  # the supervisor blocks these for sigtimedwait
            die_with_us()

        env = {**self.env, "GNUPGHOME": str(home)}
        proc: Child
        try:
            if self.fork and threading.active_count() == 1:
                proc = fork_child(lambda: _forked_worker(config, env, preexec))
            else:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "workers.worker", "--name", name, "--home",
                     str(home), "--key-id", config.key_id],
                    stdin=subprocess.PIPE, env=env, preexec_fn=preexec)
                send_config(proc, config.to_json())
        except BaseException:
            shutil.rmtree(home, ignore_errors=True)
            os.close(lock)
            raise
        slot.proc, slot.home, slot.lock = proc, home, lock
        slot.restarts.started()
        log.info("started worker %d (pid %d, key %s, home %s)", slot.index, proc.pid,
                 config.key_id, home)

    def _cleanup(self, slot: Slot) -> None:
        if slot.home is None:
            return
        remove_home(slot.home)
        if slot.lock >= 0:
            os.close(slot.lock)  # (after the removal: nobody sweeps a half-removed home)
        slot.home, slot.lock = None, -1

    def _reap(self) -> None:
        for slot in self.slots:
            if slot.proc is None or slot.proc.poll() is None:
                continue
            code = slot.proc.returncode
            unusable = code == EXIT_KEY_UNUSABLE
            cap = MAX_KEY_BACKOFF if unusable else MAX_BACKOFF
            lived, backoff = slot.restarts.exited(cap)
            home = slot.home
            status = read_status(home) if home is not None else None
            if status is not None and home is not None:  # the same words for every attempt
                status = status.replace(str(home), "<home>")
            self._cleanup(slot)
            slot.proc = None
            if self._stopping:
                continue
            if unusable or slot.restarts.young_deaths >= FAILING_AFTER:
                if unusable and status is not None and status.startswith(UNUSABLE + " "):
                    reason = status[len(UNUSABLE) + 1:]
                else:
                    reason = (f"key {slot.key_id}: its workers keep failing (the last "
                              f"{_exit_reason(code)})")
                self._report_failing(slot.key_id, reason, cap)
                log.info("worker %d (key %s) exited with %s after %.1fs; restarting in %.1fs",
                         slot.index, slot.key_id, code, lived, backoff)
            else:
                log.warning("worker %d exited with %s after %.1fs; restarting in %.1fs",
                            slot.index, code, lived, backoff)

    def _report_failing(self, key_id: str, reason: str, backoff: float) -> None:
        """One warning per key and reason, however often its workers are retried."""
        if self.failing.get(key_id) == reason:
            return
        self.failing[key_id] = reason
        log.warning("%s (its workers are retried, at most %g s apart; the other keys' workers "
                    "go on serving)", reason, backoff)

    def _note_recoveries(self) -> None:
        """A failing key whose worker holds it and has lived past its youth works again."""
        if not self.failing:
            return
        for slot in self.slots:
            if (slot.key_id in self.failing and slot.proc is not None and slot.home is not None
                    and slot.proc.poll() is None and slot.restarts.stable
                    and read_status(slot.home) == READY):
                del self.failing[slot.key_id]
                log.warning("key %s: worker %d holds it again; it signs", slot.key_id,
                            slot.index)

    def _start_due(self) -> None:
        for slot in self.slots:
            if slot.proc is None and not self._stopping and slot.restarts.due():
                self._spawn(slot)

    # -- main loop ---------------------------------------------------------------------------
    def prepare(self, check_keys: bool = False) -> None:
        """Make the runtime directory and sweep the homes a killed supervisor left; with
        ``check_keys``, check every key served (`check_keys`). Raises `RuntimeDirError`,
        `KeyUnusable`, or the agents' errors (an agent that cannot start); starts no worker."""
        try:
            self.runtime = prepare_runtime_dir(self.config.runtime_dir, len(self.slots))
        except OSError as e:
            raise RuntimeDirError(f"no directory for the worker homes: {e}") from None
        for home in sweep_stale_homes(self.runtime):
            log.warning("supervisor: removed the stale worker home %s (its supervisor did not "
                        "clean up)", home)
        if check_keys:
            self.check_keys()
        self._prepared = True

    def check_keys(self) -> None:
        """One test signature with every key served, each through an agent in a home of its
        own, verified against the key's public key file (`workers.worker.check_key`), one key
        after the other; `KeyUnusable` for the first that cannot sign."""
        checked: list[KeySpec | None] = []
        started = time.monotonic()
        for slot in self.slots:
            if slot.key in checked:
                continue
            checked.append(slot.key)
            home, lock = make_home(self.runtime, slot.index)
            name = f"{os.uname().nodename}:{os.getpid()}:check-{slot.key_id}"
            config = self.config.worker_config(name, home, slot.key, supervisor=os.getpid())
            try:
                with _quiet("workers.agents"):  # an agent's start and stop are no news here
                    check_key(config)
            finally:
                remove_home(home)
                os.close(lock)
        log.info("supervisor: every key signs (%s; checked in %.1fs)",
                 ", ".join(PRIMARY if k is None else k.id for k in checked),
                 time.monotonic() - started)

    def run(self) -> int:
        if not self._prepared:
            try:
                self.prepare()
            except RuntimeDirError as e:
                log.error("supervisor: %s", e)
                return EXIT_CONFIG
        watched = WATCHED
        if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:  # (left to the parent: a
            watched = WATCHED - {signal.SIGINT}                 # blocked one stays pending)
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
                self._note_recoveries()
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
_EXITS = {EXIT_KEY_UNUSABLE: "could not load its key",
          EXIT_AGENT_DIED: "exited when its agent failed",
          EXIT_NO_DISPATCHER: "lost its dispatcher or supervisor",
          EXIT_CONFIG: "was given a bad configuration"}


def _exit_reason(code: int | None) -> str:
    if code is not None and code < 0:
        return f"was killed by signal {-code}"
    return _EXITS.get(code or 0, f"exited with status {code}")


@contextlib.contextmanager
def _quiet(logger: str) -> Iterator[None]:
    """Only warnings and errors of ``logger`` while the block runs."""
    target = logging.getLogger(logger)
    level = target.level
    target.setLevel(max(logging.WARNING, target.getEffectiveLevel()))
    try:
        yield
    finally:
        target.setLevel(level)


def _unblock_signals() -> None:
    signal.pthread_sigmask(signal.SIG_UNBLOCK, WATCHED)


def _forked_worker(config: WorkerConfig, env: Mapping[str, str],
                   preexec: Callable[[], None]) -> int:
    """In a worker forked by the supervisor: what ``python -m workers.worker`` would start
    with (``env``, ``/dev/null`` on stdin, no descriptor of the supervisor's beyond stdout and
    stderr: the homes' locks stay the supervisor's), then `workers.worker.begin`."""
    preexec()
    start_fresh(env)
    return begin(config, os.getppid())


# -- homes -------------------------------------------------------------------------------------

def prepare_runtime_dir(wanted: Path, workers: int) -> Path:
    """The directory for the homes of ``workers`` workers: ``wanted``, made (mode 0700, and so
    are the parents it needs) if it is missing; an existing one is left as it is.

    Unless an agent's socket in a home there would not fit a socket path: then a short private
    directory in the system's temp directory, named after ``wanted`` (the next start finds the
    same one, and its stale homes), and a warning that says so. The socket cannot be moved
    out of the home alone: gpg finds its agent by a path derived from the home (GnuPG moves
    it to /run/user/<uid> only where that exists, seldom for a service user), and ssh-agent's
    socket is in the home too."""
    if _longest_socket(wanted, workers) <= SUN_PATH_MAX:
        _make_dirs(wanted)
        return wanted
    digest = hashlib.sha256(os.fsencode(wanted)).hexdigest()[:12]
    short = Path(tempfile.gettempdir()) / f"stampd-{os.geteuid()}-{digest}"
    if _longest_socket(short, workers) > SUN_PATH_MAX:
        raise RuntimeDirError(f"agent sockets in {wanted} (and in {short}) would exceed "
                              f"{SUN_PATH_MAX} bytes: set STAMPD_RUNTIME_DIR to a short directory")
    log.warning("worker homes: agent sockets in %s would exceed %d bytes; the homes go to %s "
                "instead (set STAMPD_RUNTIME_DIR to choose)", wanted, SUN_PATH_MAX, short)
    _make_dirs(short)
    info = short.lstat()  # in a directory others may write to: it must be ours, and private
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o077:
        raise RuntimeDirError(f"{short} is not a private directory of ours (mode 0700); "
                              "set STAMPD_RUNTIME_DIR to a short private directory")
    return short


def _longest_socket(runtime: Path, workers: int) -> int:
    home = runtime / f"{HOME_PREFIX}{max(workers - 1, 0)}-{'x' * 8}"
    return len(os.fsencode(home / LONGEST_SOCKET))


def _make_dirs(path: Path) -> None:
    """``path`` and its missing parents, each made with mode 0700."""
    missing = []
    while not path.exists():
        missing.append(path)
        path = path.parent
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):
            directory.mkdir(mode=0o700)
            os.chmod(directory, 0o700)  # (whatever the umask)


def make_home(runtime: Path, index: int) -> tuple[Path, int]:
    """A fresh private home for worker ``index``, and a descriptor of it holding its lock."""
    for _ in range(10):
        home = Path(tempfile.mkdtemp(prefix=f"{HOME_PREFIX}{index}-", dir=runtime))  # 0700
        fd = os.open(home, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        fcntl.flock(fd, fcntl.LOCK_EX)
        with contextlib.suppress(FileNotFoundError):
            if os.path.samestat(os.fstat(fd), home.lstat()):
                return home, fd
        os.close(fd)  # another supervisor's sweep removed it before we held it
    raise RuntimeDirError(f"cannot keep a home in {runtime}: removed each time")


def remove_home(home: Path) -> None:
    """Kill the agent that serves ``home`` (if it still runs), then remove the home."""
    try:
        agent_pid = int((home / AGENT_PID_FILE).read_text())
    except (OSError, ValueError):
        agent_pid = 0
    if agent_pid > 0 and _is_agent_of(agent_pid, home):
        with contextlib.suppress(ProcessLookupError):
            os.kill(agent_pid, signal.SIGKILL)
    shutil.rmtree(home, ignore_errors=True)


def sweep_stale_homes(runtime: Path) -> list[Path]:
    """Remove the homes in ``runtime`` that no live supervisor holds (see `make_home`); those
    removed. Only our own directories named like homes are looked at."""
    removed = []
    try:
        entries = sorted(runtime.iterdir())
    except FileNotFoundError:
        return []
    for entry in entries:
        if not entry.name.startswith(HOME_PREFIX):
            continue
        try:
            fd = os.open(entry, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:  # not a directory (a link, say), or gone
            continue
        try:
            if os.fstat(fd).st_uid != os.geteuid():
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # in use
            remove_home(entry)
            removed.append(entry)
        finally:
            os.close(fd)
    return removed


def _is_agent_of(pid: int, home: Path) -> bool:
    """Is ``pid`` our gpg-agent or ssh-agent serving ``home``? (Guards against a reused PID.)"""
    proc = Path(f"/proc/{pid}")
    try:
        cmdline = (proc / "cmdline").read_bytes().split(b"\0")
        owner = proc.stat().st_uid
    except OSError:
        return False
    is_agent = bool(cmdline) and cmdline[0].endswith((b"gpg-agent", b"ssh-agent"))
    return is_agent and owner == os.geteuid() and str(home).encode() in b" ".join(cmdline)


def send_config(proc: subprocess.Popen[bytes], config_json: str) -> None:
    """Write a child's configuration to its stdin and close it. (A child that died before
    reading it is reaped and restarted like any other.)"""
    assert proc.stdin is not None
    try:
        with proc.stdin:
            proc.stdin.write(config_json.encode())
    except BrokenPipeError:
        log.warning("process %d exited before reading its configuration", proc.pid)


class _Report:
    """The one line for ``--report-fd``: written once, then the descriptor is closed."""

    def __init__(self, fd: int | None) -> None:
        self.fd = fd

    def __call__(self, line: str) -> bool:
        """Write ``line``; False when there is nowhere to write it."""
        fd, self.fd = self.fd, None
        if fd is None:
            return False
        try:
            os.write(fd, (" ".join(line.split()) + "\n").encode())
        except OSError:
            return False
        finally:
            os.close(fd)
        return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="workers.pool",
                                 description="the signing workers' supervisor; its "
                                 "configuration (JSON) comes on stdin")
    ap.add_argument("--check-keys", action="store_true",
                    help="first make one test signature with every key, checked against its "
                    f"public key; exit {EXIT_KEY_UNUSABLE} when one cannot sign")
    ap.add_argument("--report-fd", type=int, default=None,
                    help="write one line to this descriptor before starting the workers: ok, "
                    "or why they do not start")
    args = ap.parse_args(argv)
    _leave_sigint_to_the_parent()  # (started by ``stampd serve`` alone: `PoolProcess`)
    report = _Report(args.report_fd)
    try:
        config = PoolConfig.from_json(sys.stdin.buffer.read())
    except ConfigError as e:
        if not report(f"bad configuration on stdin: {e}"):
            print(f"workers.pool: bad configuration on stdin: {e}", file=sys.stderr)
        return EXIT_CONFIG
    return run_pool(config, args.check_keys, report)


def forked_pool(config: PoolConfig, env: Mapping[str, str], report_fd: int | None) -> int:
    """In a supervisor forked by ``stampd serve`` (`server.supervisor.PoolProcess`): what
    ``python -m workers.pool [--check-keys --report-fd N]`` would start with (``env``,
    ``/dev/null`` on stdin, the signal handlers of `main`, none of the parent's descriptors
    but stdout, stderr and ``report_fd``: not its listening sockets, journal or data directory
    locks), then `run_pool`, the keys checked where ``report_fd`` is given."""
    start_fresh(env, keep=report_fd)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _leave_sigint_to_the_parent()
    return run_pool(config, report_fd is not None, _Report(report_fd))


def _leave_sigint_to_the_parent() -> None:
    """A terminal's Ctrl-C (SIGINT to its whole foreground process group) is for ``stampd
    serve``, which then stops the supervisor and the supervisor its workers (SIGTERM), not
    for them: the supervisor stopping on it at once was seen by ``stampd serve`` as a
    supervisor that died (an ERROR, and a restart) before it had begun to stop. Its workers,
    forked or started from it, inherit this (and the agents have sessions of their own)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def run_pool(config: PoolConfig, check_keys: bool, report: Callable[[str], bool]) -> int:
    """The supervisor's life once it has its configuration, started as ``python -m
    workers.pool`` (`main`) or forked (`forked_pool`): named `POOL_NAME`, the keys checked
    first with ``check_keys`` (``report`` says ``ok`` or why not), then its workers."""
    set_process_name(POOL_NAME)
    logging.basicConfig(level=config.log_level, force=True,  # (a forked one: its parent's)
                        format="%(asctime)s supervisor %(levelname)s %(message)s")
    pool = WorkerPool(config)
    try:
        pool.prepare(check_keys=check_keys)
    except (KeyUnusable, TsaError, RuntimeDirError, AgentError) as e:
        if not report(e.message):
            print(f"workers.pool: {' '.join(e.message.split())}", file=sys.stderr)
        if isinstance(e, KeyUnusable):
            return EXIT_KEY_UNUSABLE
        return EXIT_CONFIG if isinstance(e, RuntimeDirError | TsaError) else EXIT_AGENT_DIED
    report("ok")
    return pool.run()


if __name__ == "__main__":
    sys.exit(main())
