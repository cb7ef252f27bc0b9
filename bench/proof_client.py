"""The normal client of the proof programs, in a process of its own, so that the load beside it
(thousands of connections, read floods) does not share its event loop and its latencies are the
server's: ``python -m bench.proof_client PORT SECONDS [KIND,...]`` stamps one at a time for
SECONDS (`bench.proof_http.stamp_sequentially`) and prints one JSON object, the latency of
every answered stamp in seconds and the failures. `normal_client` runs it from asyncio.
"""

from __future__ import annotations

import asyncio
import json
import sys

from bench.proof_http import Latencies, stamp_sequentially


async def _run(port: int, seconds: float, kinds: tuple[str, ...]) -> dict[str, list[object]]:
    stop = asyncio.Event()
    lat = Latencies()
    failures: list[str] = []
    task = asyncio.create_task(stamp_sequentially(port, stop, lat, kinds, failures))
    await asyncio.sleep(seconds)
    stop.set()
    await task
    return {"latencies": list(lat.seconds), "failures": list(failures)}


async def normal_client(port: int, seconds: float, kinds: tuple[str, ...] = ("tag", "digest")
                        ) -> tuple[Latencies, list[str]]:
    """Run the normal client in a child process for ``seconds``; (latencies, failures)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.proof_client", str(port), str(seconds), ",".join(kinds),
        stdout=asyncio.subprocess.PIPE)
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), seconds + 60)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    if proc.returncode != 0:
        return Latencies(), [f"the normal client exited with {proc.returncode}"]
    data = json.loads(out)
    return Latencies([float(s) for s in data["latencies"]]), [str(f) for f in data["failures"]]


def main() -> int:
    port, seconds = int(sys.argv[1]), float(sys.argv[2])
    kinds = tuple(sys.argv[3].split(",")) if len(sys.argv) > 3 else ("tag", "digest")
    print(json.dumps(asyncio.run(_run(port, seconds, kinds))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
