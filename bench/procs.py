"""Processes: the process table and CPU accounting from /proc, stopping processes by PID (SIGTERM,
wait, SIGKILL) and sweeping up every leftover that mentions a bench directory, running a command
with a timeout, a free local port and a plain HTTP GET; what the bench mains share (wrk and the
other tools, SIGTERM/SIGHUP as KeyboardInterrupt, the bench directory kept or removed); also the
progress lines on stderr (timed from T0) and BenchError (the bench itself could not run: exit
status 2), which every other module of the bench uses. No process is ever looked up by name.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Callable
from dataclasses import dataclass
from http.client import HTTPConnection
from pathlib import Path

# (one free-port rule for tests and benches: below the ephemeral range)
from tests.helpers import free_port as free_port

BIN = Path(sys.executable).parent
CLK_TCK = os.sysconf("SC_CLK_TCK")

T0 = time.monotonic()


def progress(msg: str) -> None:
    print(f"[{time.monotonic() - T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


class BenchError(Exception):
    """The bench itself could not run (exit status 2)."""


# --------------------------------------------------------------------------------------------
# Processes


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""


@dataclass
class ProcInfo:
    pid: int
    ppid: int
    cmdline: bytes
    ticks: int  # utime + stime + cutime + cstime (reaped children count for their parent)
    own: int = 0  # utime + stime: this process alone, what it takes of the core it runs on
    # its name (/proc/PID/comm): forked processes keep their parent's command line but may be
    # named (stampd's HTTP manager stampd-api, its HTTP processes stampd-http-N)
    comm: str = ""

    @property
    def exe(self) -> bytes:
        return os.path.basename(self.cmdline.split(b"\0", 1)[0])


def process_table(marker: bytes | None = None) -> dict[int, ProcInfo]:
    """Every live process; with `marker`, only those whose cmdline or environ contains it."""
    table: dict[int, ProcInfo] = {}
    me = os.getpid()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        stat = _read(f"/proc/{name}/stat")
        if not stat:
            continue
        try:
            rest = stat[stat.rindex(b")") + 2:].split()
        except ValueError:
            continue
        if rest[0] == b"Z":  # zombie: already dead, nothing to stop or count
            continue
        cmdline = _read(f"/proc/{name}/cmdline")
        if marker is not None and marker not in cmdline and marker not in _read(
                f"/proc/{name}/environ"):
            continue
        ticks = sum(int(x) for x in rest[11:15])
        own = sum(int(x) for x in rest[11:13])
        comm = stat[stat.index(b"(") + 1:stat.rindex(b")")].decode("utf-8", "replace")
        table[int(name)] = ProcInfo(int(name), int(rest[1]), cmdline, ticks, own, comm)
    return table


def descendants(pid: int) -> list[int]:
    """``pid`` and every live process below it (`process_table`'s parent links)."""
    parent_of = {p: info.ppid for p, info in process_table().items()}
    tree = {pid}
    grew = True
    while grew:
        below = {p for p, pp in parent_of.items() if pp in tree} - tree
        tree |= below
        grew = bool(below)
    return sorted(tree)


def own_cpu(stat: str) -> float | None:
    """Seconds of CPU (user and system) of the process or thread whose stat file is ``stat``
    (``/proc/PID/stat``, ``/proc/self/task/TID/stat``); None when it is gone."""
    data = _read(stat)
    if not data:
        return None
    rest = data[data.rindex(b")") + 2:].split()
    return (int(rest[11]) + int(rest[12])) / CLK_TCK


def cpu_busy() -> float:
    """Seconds of CPU time the whole machine has spent busy (all cores), from /proc/stat."""
    f = [int(x) for x in _read("/proc/stat").split(b"\n", 1)[0].split()[1:9]]
    return (sum(f) - f[3] - f[4]) / CLK_TCK  # minus idle and iowait


def idle_load(seconds: float = 1.0) -> float:
    """Cores the other processes of the machine keep busy, over `seconds` (said on stderr)."""
    busy0, t0 = cpu_busy(), time.monotonic()
    time.sleep(seconds)
    load = (cpu_busy() - busy0) / (time.monotonic() - t0)
    progress(f"before starting, other processes keep {load:.2f} of {os.cpu_count()} cores busy")
    return load


def kill_pids(pids: list[int], what: str, grace: float = 3.0) -> None:
    """SIGTERM each pid, wait up to `grace` seconds, SIGKILL the survivors."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [p for p in alive if _alive(p)]
    for pid in alive:
        progress(f"{what}: pid {pid} ignored SIGTERM, sending SIGKILL")
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    stat = _read(f"/proc/{pid}/stat")
    if not stat:
        return False
    return stat[stat.rindex(b")") + 2:][:1] != b"Z"


def sweep(marker: Path, what: str) -> None:
    """Stop every process left over that mentions `marker` (a directory of this bench) in its
    command line or environment: gpg-agents, workers whose parent died."""
    m = (str(marker).rstrip("/") + "/").encode()
    for _ in range(3):
        pids = sorted(process_table(m))
        if not pids:
            return
        table = process_table()
        names = ", ".join(f"{pid} ({table[pid].exe.decode(errors='replace')})"
                          if pid in table else str(pid) for pid in pids)
        progress(f"{what}: stopping leftover processes {names}")
        kill_pids(pids, what)


def run(argv: list[str], *, timeout: float, env: dict[str, str] | None = None,
        input: bytes | None = None, check: bool = True) -> subprocess.CompletedProcess[bytes]:
    try:
        p = subprocess.run(argv, input=input, capture_output=True, timeout=timeout, env=env,
                           check=False, stdin=None if input is not None else subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        raise BenchError(f"{argv[0]} took longer than {timeout}s: {argv}") from e
    if check and p.returncode != 0:
        raise BenchError(f"{' '.join(argv)} failed ({p.returncode}): "
                         f"{p.stderr.decode(errors='replace')[-800:]}")
    return p


def http_get(port: int, path: str, timeout: float = 5.0) -> tuple[int, bytes]:
    conn = HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


# --------------------------------------------------------------------------------------------
# What the bench mains share


def ensure_wrk() -> None:
    """wrk, installed with apt-get when missing and we are root (as `make bench` does)."""
    if shutil.which("wrk") is not None:
        return
    if os.geteuid() != 0:
        raise BenchError("wrk is missing: apt-get install -y wrk")
    progress("installing wrk (apt-get install -y wrk)")
    run(["apt-get", "install", "-y", "wrk"], timeout=240,
        env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))


def require_tools(*tools: str) -> None:
    for tool in tools:
        if shutil.which(tool) is None:
            raise BenchError(f"{tool} is missing")


def ensure_tools(*tools: str, programs: tuple[str, ...] = ("stampd",)) -> None:
    """wrk (installed when missing), the system `tools`, and the `programs` of this virtual
    environment (stampd; zeitgitterd comes with the test extra)."""
    ensure_wrk()
    require_tools(*tools)
    for exe in programs:
        if not (BIN / exe).exists():
            raise BenchError(f"{BIN / exe} is missing: pip install -e '.[test,bench]'")


def int_list(text: str) -> tuple[int, ...]:
    """A comma-separated list of integers (an argparse type)."""
    return tuple(int(x) for x in text.split(",") if x.strip())


def add_cell_args(ap: argparse.ArgumentParser, duration: int, budget: float | None) -> None:
    """The options every wrk bench has: --duration, --warmup, --budget (unless None), --json
    and --keep."""
    ap.add_argument("--duration", type=int, default=duration,
                    help=f"seconds per measured cell (default {duration})")
    ap.add_argument("--warmup", type=int, default=1, help="warm-up seconds per cell (1)")
    if budget is not None:
        ap.add_argument("--budget", type=float, default=budget,
                        help="seconds the whole run may take; cells that would not fit are "
                             f"skipped (default {budget:.0f})")
    ap.add_argument("--json", type=Path, help="also write every cell as JSON to this file")
    ap.add_argument("--keep", action="store_true",
                    help="keep the temporary directory (kept anyway when something was wrong)")


def _interrupt(signum: int, frame: types.FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def interrupt_on_signals() -> None:
    """SIGINT (even if started ignoring it), SIGTERM and SIGHUP raise KeyboardInterrupt, so that
    a bench stops its servers on the way out."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGHUP, _interrupt)


def run_then_stop(steps: list[Callable[[], None]], stop: Callable[[], None],
                  failed: Callable[[], int] = lambda: 2) -> int:
    """The `steps` in turn, then `stop` whatever happened; the exit status so far: 0, `failed()`
    when the bench could not run (BenchError), 130 when interrupted."""
    status = 0
    try:
        for step in steps:
            step()
    except BenchError as e:
        progress(f"bench failed: {e}")
        status = failed()
    except KeyboardInterrupt:
        progress("interrupted")
        status = 130
    finally:
        progress("stopping everything")
        stop()
    return status


def start_bench(prefix: str) -> Path:
    """SIGTERM and SIGHUP (and SIGINT) as KeyboardInterrupt, and a fresh bench directory
    /tmp/<prefix>* for this user only, said on stderr."""
    interrupt_on_signals()
    root = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    os.chmod(root, 0o700)
    progress(f"bench directory {root}")
    return root


def keep_or_remove(root: Path, keep: bool, what: str = "logs and samples") -> None:
    """Keep `root` (saying so) when `keep`, else remove it."""
    if keep:
        progress(f"{what} kept in {root}")
    else:
        shutil.rmtree(root, ignore_errors=True)
