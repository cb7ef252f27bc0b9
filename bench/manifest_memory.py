"""What checking one manifest costs the HTTP process: ``python -m bench.manifest_memory``.

For each size (91 MiB of 1.2 M lines, 127 MiB of 1.6 M lines by default), a body of
``<64 hex>  <name>`` lines (random digests, names padded to the size) is built, then handed
to `server.api.manifests.manifest_request` as the handler does (the caller still holds the
body): the body parsed, its lines checked, its digest buckets built. Each size runs in two
fresh processes: one timed, with the growth of the resident set (VmHWM after the call, reset
through /proc/self/clear_refs before it, less VmRSS before the body was made; and VmRSS after
it, the request still held), one under tracemalloc (the peak of Python's allocations during
the call, and what is still allocated after it, both counted from before the body was made).
So every figure includes the body. Printed as one line per size.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

MIB = 1 << 20


def status_kib(field: str) -> int:
    m = re.search(rf"^{field}:\s+(\d+) kB$", Path("/proc/self/status").read_text(), re.M)
    return int(m[1]) if m else 0


def make_body(lines: int, size: int) -> bytearray:
    """``lines`` sha256sum lines of about ``size`` bytes in all."""
    rnd = random.Random(lines)
    name = max(1, size // lines - 67)
    hexes = rnd.randbytes(32 * lines).hex()
    body = bytearray()
    for i in range(lines):
        body += f"{hexes[64 * i:64 * i + 64]}  {i:0{name}d}\n".encode()
    return body


def measure(lines: int, mib: int, traced: bool, as_bytes: bool) -> dict[str, float]:
    """One size in this process: the figures count the body too (from before it was made)."""
    from server.api.manifests import manifest_request

    if traced:
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
    before = status_kib("VmRSS")
    body: bytes | bytearray = make_body(lines, mib * MIB)
    out: dict[str, float] = {"lines": lines, "body_mib": len(body) / MIB}
    if as_bytes:  # what read_manifest returned before it handed over its buffer
        body = bytes(body)
    if traced:
        tracemalloc.reset_peak()
        req = manifest_request(body)  # type: ignore[arg-type]
        now, peak = tracemalloc.get_traced_memory()
        out["tracemalloc_peak_mib"] = (peak - base) / MIB
        out["tracemalloc_kept_mib"] = (now - base) / MIB
    else:
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
        t = time.perf_counter()
        req = manifest_request(body)  # type: ignore[arg-type]
        out["seconds"] = time.perf_counter() - t
        out["rss_peak_growth_mib"] = (status_kib("VmHWM") - before) / 1024
        out["rss_kept_growth_mib"] = (status_kib("VmRSS") - before) / 1024
    out["rows"] = len(req.digest_buckets())
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="1200000:91,1600000:127",
                    help="LINES:MIB,... (default %(default)s)")
    ap.add_argument("--bytes", action="store_true",
                    help="hand manifest_request the body as bytes, not a bytearray")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # LINES:MIB:traced, in a child
    args = ap.parse_args()
    if args.one:
        lines, mib, traced = args.one.split(":")
        print(json.dumps(measure(int(lines), int(mib), traced == "1", args.bytes)))
        return 0
    for size in args.sizes.split(","):
        row: dict[str, float] = {}
        for traced in ("0", "1"):
            done = subprocess.run([sys.executable, "-m", "bench.manifest_memory",
                                   "--one", f"{size}:{traced}"]
                                  + (["--bytes"] if args.bytes else []),
                                  check=True, capture_output=True, text=True)
            row.update(json.loads(done.stdout))
        print(f"{row['lines']:.0f} lines, {row['body_mib']:.1f} MiB: "
              f"{row['seconds']:.2f} s; tracemalloc peak {row['tracemalloc_peak_mib']:.0f} MiB "
              f"({row['tracemalloc_peak_mib'] / row['body_mib']:.2f}x), kept "
              f"{row['tracemalloc_kept_mib']:.0f} MiB; RSS growth peak "
              f"{row['rss_peak_growth_mib']:.0f} MiB "
              f"({row['rss_peak_growth_mib'] / row['body_mib']:.2f}x), kept "
              f"{row['rss_kept_growth_mib']:.0f} MiB; {row['rows']:.0f} rows", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
