"""The transparency log survives kill -9 (the `make crash` sample for it): while clients stamp,
the HTTP process that sequences the log, then the log key's worker and its agent are killed.
Afterwards the tree extends every checkpoint the server ever published (checked with pymerkle,
an RFC 6962 library that is not ours, over the served entry bundles) and every answered stamp
has an entry whose proof verifies."""

from __future__ import annotations

import os
import re
import signal
import threading
from pathlib import Path

from pymerkle import InmemoryTree

from bench.procs import http_get
from formats.note import Ed25519Verifier, VerifierKey, open_note
from formats.tlog.checkpoint import Checkpoint
from formats.tlog.entry import Entry
from formats.tlog.proof import TlogProof, verify_proof
from formats.tlog.tiles import parse_entry_bundle, tiles_for_size
from tests.helpers import Load, Server, proc_cmdline, start_server, wait_for


def get(server: Server, path: str, timeout: float = 30) -> tuple[int, bytes]:
    return http_get(server.port, path, timeout=timeout)


class Checkpoints(threading.Thread):
    """Every distinct checkpoint `/tlog/checkpoint` answers, each verified with the log key,
    until stopped (a bounded loop: at most `limit` looks)."""

    def __init__(self, server: Server, vkey: str, limit: int = 3000) -> None:
        super().__init__(daemon=True)
        self.server, self.limit = server, limit
        self.verifier = Ed25519Verifier.from_vkey(vkey)
        self.seen: dict[bytes, Checkpoint] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        for _ in range(self.limit):
            if self.stop.wait(0.05):
                return
            try:
                status, note = get(self.server, "/tlog/checkpoint", timeout=5)
            except OSError:
                continue  # (a killed process's connection)
            if status == 200 and note not in self.seen:
                self.seen[note] = Checkpoint.parse(open_note(note, [self.verifier]).text)


def test_kill_the_sequencer_and_the_log_keys_worker_and_agent(
        seeded_dir: Path, server_factory: list[Server]) -> None:
    server = start_server(seeded_dir, workers=2, api_processes=2, commit_interval=3600,
                          extra_env={"STAMPD_TLOG": "on", "STAMPD_REQUEST_TIMEOUT": "2"})
    server_factory.append(server)
    writer_line = re.compile(r"this process \(pid (\d+)\) is now the log writer")
    wait_for(lambda: writer_line.search(server.log()), timeout=10, what="a log writer")
    found = writer_line.search(server.log())
    assert found is not None
    sequencer = int(found.group(1))
    vkey = get(server, "/tlog/vkey")[1].decode().strip()
    origin = VerifierKey.parse(vkey).name
    recorder = Checkpoints(server, vkey)
    recorder.start()

    load = Load(server.port, clients=20, per_client=30)
    pool = load.run()
    load.wait_done(200)
    os.kill(sequencer, signal.SIGKILL)  # the HTTP process that sequences and signs
    load.wait_done(150)  # (350 answered: each call waits for as many more)
    tlog_worker = server.key_workers("tlog-ed25519")
    assert len(tlog_worker) == 1, server.worker_pids()
    os.kill(tlog_worker[0], signal.SIGKILL)  # the log key's worker
    server.wait_ready(workers=3)
    load.wait_done(100)  # (450)
    ssh_agents = [p for p in server.agent_pids() if b"ssh-agent" in proc_cmdline(p)]
    assert len(ssh_agents) == 1, server.agent_pids()
    os.kill(ssh_agents[0], signal.SIGKILL)  # and its agent
    pool.shutdown(wait=True)
    server.wait_ready(workers=3)
    received = [r for r in load.results if r.status == 200]
    assert len(received) >= 450

    # Every answered stamp gets its entry (a killed process's pending ones once no live
    # request can be behind them: the request timeout plus a grace), and its proof verifies.
    log_keys = [Ed25519Verifier.from_vkey(vkey)]
    for r in received:
        status, proof = get(server, f"/v1/proofs/git/{r.commit}?wait=40", timeout=60)
        assert status == 200, (r.commit, proof)
        extra = TlogProof.parse(proof).extra
        assert extra is not None
        verify_proof(proof, extra, origin=origin, log_keys=log_keys)
        assert Entry.parse(extra).commit == r.commit
    wait_for(lambda: len(recorder.seen) >= 2, timeout=10, what="checkpoints recorded")
    recorder.stop.set()
    recorder.join(10)

    # The final tree, from the served entries, extends every checkpoint ever seen.
    status, note = get(server, "/tlog/checkpoint")
    final = Checkpoint.parse(open_note(note, log_keys).text)
    theirs = InmemoryTree(algorithm="sha256")
    for tile in tiles_for_size(final.size):
        if tile.level == 0:
            for entry in parse_entry_bundle(get(server, "/tlog/" + tile.entries_path())[1],
                                            tile.width):
                theirs.append_entry(entry)
    assert theirs.get_root(final.size) == final.root
    for cp in recorder.seen.values():
        assert cp.size <= final.size
        assert cp.size == 0 or theirs.get_root(cp.size) == cp.root, cp.size
    assert len(writer_line.findall(server.log())) >= 2  # another process took the log over
