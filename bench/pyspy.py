"""The --profile summary: finding the py-spy executable, and turning a raw (collapsed-stack) py-spy
recording into the top functions by self time and by inclusive time; the recording itself is made by
Bench.run_profile (bench.run). Not named profile.py, which would shadow the standard library's
`profile` module for anything run from inside bench/.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

from bench.procs import BIN, kill_pids

# The leaf frames of a thread waiting for work (an idle executor thread, the event loop in its
# poll): in a profile taken with --idle they are no request's time.
IDLE = re.compile(r"^(_worker \(concurrent/futures/thread\.py|Runner\.run \(asyncio/runners\.py)")


def summarize_profile(raw: Path, top: int = 18, without_idle: bool = False) -> list[str]:
    """Self and inclusive shares of the functions in a py-spy raw (collapsed) profile;
    ``without_idle``: leaving out the samples of threads waiting for work (`IDLE`), which are
    counted apart."""
    self_n: dict[str, int] = {}
    incl_n: dict[str, int] = {}
    total = idle = 0
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        frames = stack.split(";")
        if without_idle and IDLE.match(frames[-1]):
            idle += n
            continue
        total += n
        self_n[frames[-1]] = self_n.get(frames[-1], 0) + n
        for f in set(frames):
            incl_n[f] = incl_n.get(f, 0) + n
    if not total:
        return ["  (no samples)"]
    generic = re.compile(r"^(<module>|main|run|cmd_serve|asyncio_run|Server\.run|Runner\.run|"
                         r"Thread\.|_WorkItem\.run|_worker|thread_run|Loop|run_until|"
                         r"run_forever|Handle__run|task_step|uv_)")
    out = ([f"  {total} samples of work or waiting inside a request ({idle} more of threads "
            "idle for want of work left out); self time (where it is spent):"]
           if without_idle else
           [f"  {total} samples holding the GIL; self time (where the CPU is spent):"])
    for f, n in sorted(self_n.items(), key=lambda kv: -kv[1])[:top]:
        out.append(f"    {100 * n / total:5.1f}%  {f}")
    out.append("  inclusive (time in the function and what it calls):")
    shown = 0
    for f, n in sorted(incl_n.items(), key=lambda kv: -kv[1]):
        if generic.match(f):
            continue
        out.append(f"    {100 * n / total:5.1f}%  {f}")
        shown += 1
        if shown == top:
            break
    return out


def py_spy() -> str | None:
    exe = BIN / "py-spy"
    return str(exe) if exe.exists() else shutil.which("py-spy")


@contextlib.contextmanager
def recording(exe: str, targets: list[tuple[int, Path]], seconds: int, rate: int,
              mode: str) -> Iterator[list[subprocess.Popen[bytes]]]:
    """``py-spy record`` (raw, non-blocking; ``mode`` ``--gil`` or ``--idle``) of each (pid,
    output file) for ``seconds`` while the body runs; afterwards each is waited for, and one
    that hangs is killed by PID."""
    spies = [subprocess.Popen(
        [exe, "record", "--pid", str(pid), "--duration", str(seconds), "--rate", str(rate),
         "--nonblocking", mode, "--format", "raw", "--output", str(out)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for pid, out in targets]
    try:
        yield spies
    finally:
        for spy in spies:
            try:
                spy.wait(timeout=seconds + 30)
            except subprocess.TimeoutExpired:
                kill_pids([spy.pid], "py-spy")
                spy.wait(timeout=10)
