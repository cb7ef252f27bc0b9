"""One gpg-agent's raw signing rate, the ceiling a stampd worker can reach on this machine: the
server's secret key in two throw-away GnuPG homes, each agent driven over one Assuan connection with
SIGKEY / SETHASH / PKSIGN (no HTTP, no OpenPGP packet), first one agent alone and then two at once,
with the cores other processes took meanwhile; the scaling block and the rsa4096 targets are judged
against it.
"""

from __future__ import annotations

import hashlib
import os
import resource
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from bench.checks import gpg_env, make_home
from bench.procs import CLK_TCK, BenchError, cpu_busy, process_table, run


class Assuan:
    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.settimeout(30)
        self.sock.connect(path)
        self.f = self.sock.makefile("rb")
        self._answer()

    def _answer(self) -> None:
        while True:
            line = self.f.readline()
            if not line:
                raise ConnectionError("gpg-agent closed the connection")
            if line.startswith(b"OK"):
                return
            if line.startswith((b"ERR", b"INQUIRE")):
                raise BenchError(f"gpg-agent: {line.decode(errors='replace').strip()}")

    def command(self, line: str) -> None:
        self.sock.sendall(line.encode() + b"\n")
        self._answer()

    def close(self) -> None:
        self.f.close()
        self.sock.close()


@dataclass
class AgentRates:
    one: float  # signatures/s from one agent
    two: float  # from two agents at once
    background: tuple[float, float]  # cores used by other processes meanwhile


def agent_rates(secret_key: Path, root: Path, seconds: float) -> AgentRates:
    """Signatures per second from one gpg-agent, then from two agents at once, each driven
    over one Assuan connection with SIGKEY/SETHASH/PKSIGN (no HTTP, no OpenPGP packet)."""
    socks: list[tuple[str, str]] = []
    for i in range(2):
        home = make_home(root / f"a{i}")
        env = gpg_env(home)
        run(["gpg", "--homedir", str(home), "--batch", "--import", str(secret_key)],
            timeout=60, env=env)
        out = run(["gpg", "--homedir", str(home), "--batch", "--with-colons", "--with-keygrip",
                   "--list-secret-keys"], timeout=30, env=env).stdout.decode()
        grip = next(ln.split(":")[9] for ln in out.splitlines() if ln.startswith("grp:"))
        run(["gpg-connect-agent", "--homedir", str(home), "/bye"], timeout=30, env=env)
        path = run(["gpgconf", "--homedir", str(home), "--list-dirs", "agent-socket"],
                   timeout=30, env=env).stdout.decode().strip()
        socks.append((path, grip))

    def drive(path: str, grip: str, until: float, counts: list[int]) -> None:
        a = Assuan(path)
        try:
            n = 0
            while time.monotonic() < until:
                digest = hashlib.sha256(os.urandom(16)).hexdigest()
                a.command(f"SIGKEY {grip}")
                a.command(f"SETHASH --hash=sha256 {digest}")
                a.command("PKSIGN")
                n += 1
            counts.append(n)
        finally:
            a.close()

    marker = (str(root) + "/").encode()

    def used() -> float:  # CPU of the agents and of this process (the Assuan clients)
        me = resource.getrusage(resource.RUSAGE_SELF)
        agents = sum(p.ticks for p in process_table(marker).values()) / CLK_TCK
        return agents + me.ru_utime + me.ru_stime

    rates: list[float] = []
    background: list[float] = []
    for n_agents in (1, 2):
        counts: list[int] = []
        used0, busy0 = used(), cpu_busy()
        start = time.monotonic()
        threads = [threading.Thread(target=drive, args=(*socks[i], start + seconds, counts))
                   for i in range(n_agents)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(seconds + 60)
        elapsed = time.monotonic() - start
        if len(counts) != n_agents:
            raise BenchError("an agent-rate thread failed")
        rates.append(sum(counts) / elapsed)
        background.append(max(0.0, cpu_busy() - busy0 - (used() - used0)) / elapsed)
    return AgentRates(rates[0], rates[1], (background[0], background[1]))
