"""The --profile summary: finding the py-spy executable, and turning a raw (collapsed-stack) py-spy
recording into the top functions by self time and by inclusive time; the recording itself is made by
Bench.run_profile (bench.run). Not named profile.py, which would shadow the standard library's
`profile` module for anything run from inside bench/.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from bench.procs import BIN

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
