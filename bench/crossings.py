"""Which of stampd's own source files one request crosses, in order, and in which processes
(issue 39: a tag stamp at most 12 files, a digest stamp to its proof at most 20).

Run from the repository root::

    python -m bench.crossings                    # two HTTP processes (so the coordinator too)
    python -m bench.crossings --api-processes 1  # stampd serve alone answers

It starts one ``stampd serve`` (this tree's code, ``PYTHONPATH``; an ed25519 key, one worker
of it, the transparency log on, so one worker of the log key too) with
``bench/crossings_site`` first on its ``PYTHONPATH``: its ``sitecustomize.py`` gives every
Python process of the server a profile function that, between SIGUSR1 and SIGUSR2, notes each
file of the project (its root packages, pyproject.toml) that a thread enters, the first time,
with the time, thread, function and the outermost project file on the stack. After warm-up
requests of each kind it opens one window per measured request, in every process of the
server at once (it waits until each said the window is open), sends the request, waits
``--settle`` seconds for what follows the answer (an outcome journalled), and closes it:

- ``tag``: one Zeitgitter tag stamp (``POST /``, ``request=stamp-tag-v1``);
- ``digest+proof``: one digest stamp (``POST /v1/stamps``) and its proof
  (``GET /v1/proofs/<serial>?wait=30``, which waits for the transparency log's next checkpoint:
  the sequencer's step, its note signed by the log key's worker, are part of it);
- ``idle``: nothing, as long as the longest of the two: what the server enters on its own
  meanwhile (timers, reports to the coordinator, the sequencer's steps, the workers' loops).

For each request it prints the files in order of first entry over all processes, each with its
process and thread, the function it was entered by, the outermost project file on that
thread's stack ("via": which request or background task), and ``bg`` where that process entered
that file in the idle window too: such a file may be the background's rather than the
request's (the sequencer serves a proof and runs idle alike). The counts: distinct files, and
distinct files without the ``bg`` ones; the processes; the process boundaries crossed (changes
of process between consecutive entries of the list, ``bg`` ones left out). Time order across
processes is the wall clock's; within a window the background's entries interleave with the
request's, so the order is the order of first entry, not a call graph.

The traced server is slower (a profile function on every call): this measures which files, not
how long. Exit status: 0 when it measured (whatever the counts), 2 when the bench could not
run, 130 when interrupted.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import secrets
import signal
import sys
import time
import tomllib
from dataclasses import dataclass
from http.client import HTTPConnection
from pathlib import Path
from typing import Any

from bench.cells import stop_servers
from bench.checks import make_home
from bench.procs import BenchError, http_get, keep_or_remove, progress, start_bench
from bench.servers import Stampd

REPO = Path(__file__).resolve().parent.parent
SITE = Path(__file__).resolve().parent / "crossings_site"
TARGETS = {"tag": 12, "digest+proof": 20}
ACK_TIMEOUT = 10.0  # seconds every process gets to say its window is open, or to write it


def project_packages() -> list[str]:
    """The project's top-level packages: the import-linter's root packages."""
    data = tomllib.loads((REPO / "pyproject.toml").read_text())
    return list(data["tool"]["importlinter"]["root_packages"])


@dataclass(frozen=True)
class Entry:
    time: float
    pid: int
    process: str
    file: str
    thread: str
    function: str
    via: str
    background: bool = False


# -- the server and its processes ----------------------------------------------------------------

class Traced:
    """A `Stampd` whose Python processes trace (bench/crossings_site), and its windows."""

    def __init__(self, root: Path, api_processes: int) -> None:
        self.dir = make_home(root / "trace")
        self.server = Stampd("traced", make_home(root / "server"), root / "data", "ed25519", 1)
        self.server.tlog = True
        self.server.serve_args = ["--api-processes", str(api_processes)]
        self.server.env.update(
            PYTHONPATH=os.pathsep.join([str(SITE), str(REPO)]),
            STAMPD_CROSSINGS_DIR=str(self.dir), STAMPD_CROSSINGS_ROOT=str(REPO),
            STAMPD_CROSSINGS_PACKAGES=",".join(project_packages()))

    def traced_pids(self) -> dict[int, str]:
        """The server's live processes that have the tracer's handlers: pid -> name."""
        tree = self.server.processes()
        out: dict[int, str] = {}
        for f in self.dir.glob("pid-*"):
            pid = int(f.name[4:])
            try:
                exe = os.path.basename(os.readlink(f"/proc/{pid}/exe"))
            except OSError:
                continue
            # (a program exec'd from a forked child wrote one too: only Python has handlers)
            if pid in tree and exe.startswith("python"):
                out[pid] = tree[pid][1].comm
        return out

    def window(self, label: str, action: Any, settle: float) -> tuple[dict[int, Any], Any]:
        """Open a window in every traced process, run ``action()``, wait ``settle`` seconds,
        close it; each process's record by pid, and what ``action`` returned."""
        (self.dir / "label").write_text(label)
        for f in self.dir.glob("on-*"):
            f.unlink()
        pids = self.traced_pids()
        for pid in pids:
            os.kill(pid, signal.SIGUSR1)
        self._wait([self.dir / f"on-{pid}" for pid in pids], f"{label}: open")
        try:
            result = action()
            time.sleep(settle)
        finally:
            for pid in pids:
                os.kill(pid, signal.SIGUSR2)
        files = [self.dir / f"{label}-{pid}.json" for pid in pids]
        self._wait(files, f"{label}: close")
        return {pid: json.loads(f.read_text()) for pid, f in zip(pids, files, strict=True)}, result

    @staticmethod
    def _wait(files: list[Path], what: str) -> None:
        deadline = time.monotonic() + ACK_TIMEOUT
        while not all(f.exists() for f in files):
            if time.monotonic() > deadline:
                missing = [f.name for f in files if not f.exists()]
                raise BenchError(f"{what}: no answer from {', '.join(missing)}")
            time.sleep(0.01)


# -- the requests ----------------------------------------------------------------------------------

def post(port: int, path: str, body: str, accept: str = "*/*") -> tuple[int, bytes]:
    conn = HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("POST", path, body=body.encode(), headers={
            "Content-Type": "application/x-www-form-urlencoded", "Accept": accept})
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def tag_stamp(port: int) -> float:
    """One Zeitgitter tag stamp; its seconds."""
    t0 = time.monotonic()
    status, body = post(port, "/", f"request=stamp-tag-v1&commit={secrets.token_hex(20)}"
                                   f"&tagname=crossings-{secrets.token_hex(4)}")
    if status != 200 or not body.startswith(b"object "):
        raise BenchError(f"tag stamp: {status} {body[:200]!r}")
    return time.monotonic() - t0


def digest_and_proof(port: int) -> float:
    """One digest stamp and its proof (waiting for the checkpoint that covers it); seconds."""
    t0 = time.monotonic()
    status, body = post(port, "/v1/stamps", f"sha256={secrets.token_hex(32)}",
                        accept="application/json")
    if status != 200:
        raise BenchError(f"digest stamp: {status} {body[:200]!r}")
    serial = json.loads(body)["serial"]
    status, body = http_get(port, f"/v1/proofs/{serial}?wait=30", timeout=60)
    if status != 200:
        raise BenchError(f"proof of {serial}: {status} {body[:200]!r}")
    return time.monotonic() - t0


# -- what the windows say --------------------------------------------------------------------------

def names(records: dict[int, Any]) -> dict[int, str]:
    """Each process's name, its pid added where two share one (the workers)."""
    comms = [r["comm"] for r in records.values()]
    return {pid: r["comm"] if comms.count(r["comm"]) == 1 else f"{r['comm']}:{pid}"
            for pid, r in records.items()}


def entries(records: dict[int, Any], idle: dict[int, Any]) -> list[Entry]:
    """Every first entry of a file by a thread (or task) of a window, in time order;
    ``background`` where the same process entered the same file by the same ``via`` in the
    idle window."""
    named = names(records)
    out = []
    for pid, r in records.items():
        quiet = {(e[1], e[4]) for e in idle.get(pid, {}).get("files", [])}
        for t, f, thread, function, via in r["files"]:
            out.append(Entry(t, pid, named[pid], f, thread, function, via, (f, via) in quiet))
    return sorted(out, key=lambda e: e.time)


def first_of_each_file(listed: list[Entry]) -> list[Entry]:
    seen: set[str] = set()
    out = []
    for e in listed:
        if e.file not in seen:
            seen.add(e.file)
            out.append(e)
    return out


def crossings(listed: list[Entry]) -> int:
    """Changes of process between consecutive entries."""
    return sum(1 for a, b in itertools.pairwise(listed) if a.pid != b.pid)


def report(label: str, seconds: float, listed: list[Entry]) -> dict[str, Any]:
    everything = first_of_each_file(listed)
    request = [e for e in listed if not e.background]
    own = first_of_each_file(request)
    processes = sorted({e.process for e in request})
    target = TARGETS[label]
    t0 = listed[0].time if listed else 0.0
    print(f"\n== {label}: answered in {seconds * 1000:.0f} ms. {len(own)} files entered but "
          f"not as in the idle window (target <= {target}: "
          f"{'met' if len(own) <= target else 'NOT met'}); {len(everything)} files entered in "
          f"all; {len(processes)} processes ({', '.join(processes)}); "
          f"{crossings(request)} changes of process")
    print("in order of first entry:")
    for i, e in enumerate(own, 1):
        print(f"{i:>3}. {e.file:<36} {e.process}")
    print("every entry (file, by thread or task):")
    print(f"{'ms':>7}  {'process':<20} {'thread':<20} {'file':<36} {'function':<22} via")
    for e in listed:
        print(f"{(e.time - t0) * 1000:7.1f}  {e.process:<20} {e.thread[:20]:<20} "
              f"{e.file:<36} {e.function[:22]:<22} {e.via}{'  (bg)' if e.background else ''}")
    return {"label": label, "seconds": seconds, "target": target, "files": [e.file for e in own],
            "all_files": [e.file for e in everything], "processes": processes,
            "crossings": crossings(request), "entries": [e.__dict__ for e in listed]}


def measure(args: argparse.Namespace, root: Path) -> list[dict[str, Any]]:
    traced = Traced(root, args.api_processes)
    s = traced.server
    try:
        s.start()
        s.wait_ready(600)
        progress(f"server up (port {s.port}); warming up")
        for _ in range(args.warmup):
            tag_stamp(s.port)
            digest_and_proof(s.port)
        pids = traced.traced_pids()
        progress(f"traced processes: {', '.join(f'{n} ({p})' for p, n in sorted(pids.items()))}")
        windows = {}
        for label, action in (("tag", tag_stamp), ("digest+proof", digest_and_proof)):
            windows[label] = traced.window(label, lambda a=action: a(s.port), args.settle)
        longest = max(seconds for _, seconds in windows.values())
        idle, _ = traced.window("idle", lambda: time.sleep(longest), args.settle)
        print(f"stampd serve --api-processes {args.api_processes}, 1 ed25519 worker, the "
              f"transparency log on; {args.warmup} warm-up rounds; each window closed "
              f"{args.settle:.2f} s after the answer; idle window {longest + args.settle:.2f} s")
        print("via: the task that entered the file (its coroutine), or else the outermost "
              "project frame of the thread's innermost run of them; (bg): that process "
              "entered that file by that via in the idle window too (background work, or "
              "work the request shares with it: left out of the count)")
        quiet = sorted({f"{r['comm']} {e[1]} ({e[4]})" for r in idle.values()
                        for e in r["files"]})
        print(f"idle window: {len(quiet)} entries:")
        for q in quiet:
            print(f"  {q}")
        return [report(label, seconds, entries(records, idle))
                for label, (records, seconds) in windows.items()]
    finally:
        stop_servers([s], root)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.crossings", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--api-processes", type=int, default=2,
                    help="HTTP processes (2: the coordinator takes part; 1: none)")
    ap.add_argument("--warmup", type=int, default=3, help="warm-up rounds of each request (3)")
    ap.add_argument("--settle", type=float, default=0.3,
                    help="seconds a window stays open after the answer (0.3)")
    ap.add_argument("--json", type=Path, help="also write the lists as JSON to this file")
    ap.add_argument("--keep", action="store_true", help="keep the bench directory")
    args = ap.parse_args(argv)
    try:
        root = start_bench("stampd-crossings-")
        try:
            results = measure(args, root)
        finally:
            keep_or_remove(root, args.keep, "the server's log and the traces")
    except BenchError as e:
        progress(f"bench failed: {e}")
        return 2
    except KeyboardInterrupt:
        return 130
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
