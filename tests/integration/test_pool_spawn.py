"""How the supervisor starts a worker (`workers.pool.WorkerPool`): forked while it has one
thread (as under `stampd serve` and `stampd worker`: tests/system/test_worker_homes.py checks
those workers), else started as ``python -m workers.worker`` with its configuration on stdin.
Either way the worker is named `WORKER_NAME`, loads its key and says hello to the dispatcher."""

from __future__ import annotations

import shutil
import socket
import threading
from pathlib import Path

from formats.frames import HEADER, decode_frame, frame_size
from formats.jobs import Hello
from tests.helpers import proc_cmdline, seed_data_dir, short_tmpdir
from workers.config import DispatchConfig, PoolConfig
from workers.pool import WorkerPool
from workers.worker import WORKER_NAME


def read_frame(conn: socket.socket) -> dict[str, object]:
    def exactly(n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = conn.recv(n - len(data))
            assert chunk, "the worker closed the connection"
            data += chunk
        return data

    return decode_frame(exactly(frame_size(exactly(HEADER.size))))


def test_a_supervisor_with_threads_starts_its_worker_as_a_program() -> None:
    base = short_tmpdir("ps")
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)  # (a thread: forking would not be safe)
    other.start()
    dispatcher = socket.socket(socket.AF_UNIX)
    pool = None
    try:
        data = seed_data_dir(base / "data")
        dispatcher.bind(str(base / "d.sock"))
        dispatcher.listen()
        dispatcher.settimeout(60)
        pool = WorkerPool(PoolConfig(1, data / "keys", base / "run",
                                     DispatchConfig("socket", socket=base / "d.sock")))
        pool.prepare()
        slot = pool.slots[0]
        pool._spawn(slot)
        assert slot.proc is not None and slot.home is not None
        conn, _ = dispatcher.accept()
        with conn:
            hello = Hello.from_dict(read_frame(conn))
        assert hello.pid == slot.proc.pid and hello.key == slot.key_id
        argv = proc_cmdline(hello.pid).split(b"\0")
        assert argv[1:3] == [b"-m", b"workers.worker"], argv
        assert argv[argv.index(b"--home") + 1] == bytes(slot.home)
        assert Path(f"/proc/{hello.pid}/comm").read_text().strip() == WORKER_NAME
        home = slot.home
    finally:
        if pool is not None:
            pool.stop()
        dispatcher.close()
        stop.set()
        other.join()
        shutil.rmtree(base, ignore_errors=True)
    assert slot.proc is None and not home.exists()
