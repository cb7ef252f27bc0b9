"""Worker homes hold an imported copy of the secret key: they live in a private directory of
the data directory (by default), and they go with their workers, even when the supervisor is
killed with SIGKILL (its workers and agents die with it; the next supervisor removes the homes
they left).

These servers run without the ``STAMPD_RUNTIME_DIR`` override that `start_server` always sets,
so they are started here. Their data directories have short paths: the agents' sockets live in
the homes, and a socket path is limited to 107 bytes."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import (
    ROOT,
    Server,
    free_port,
    kill_pids,
    proc_cmdline,
    seed_data_dir,
    short_tmpdir,
    stamp_tag,
    start_stampd,
    wait_for,
)
from workers.config import DispatchConfig, WorkerConfig
from workers.pool import POOL_NAME
from workers.worker import WORKER_NAME

WORKERS = 2


@pytest.fixture
def default_server() -> Iterator[Server]:
    """A server with the test key, 2 workers and the default runtime directory."""
    base = short_tmpdir("wh")
    data = seed_data_dir(base / "data")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "STAMPD_RUNTIME_DIR"}
    env.update({"STAMPD_LOG_LEVEL": "INFO", "PYTHONUNBUFFERED": "1"})
    log_path = base / "server.log"
    proc = start_stampd(["serve", "--port", str(port), "--data-dir", str(data), "--workers",
                         str(WORKERS)], env, log_path)
    # runtime_dir: where the homes are expected (Server.agent_pids() looks for it).
    server = Server(proc, port, data, data / "run" / "workers", log_path, WORKERS, env)
    try:
        server.wait_ready()
        yield server
    finally:
        tree = descendants(proc.pid)
        server.stop()
        # Anything of this server's left behind (the test has failed then).
        kill_pids([pid for pid in tree if alive(pid)] + pids_with(str(base)))
        shutil.rmtree(base, ignore_errors=True)


# -- the process tree, from /proc ------------------------------------------------------------

def parent_of(pid: int) -> int | None:
    try:
        stat_line = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat_line.rpartition(")")[2].split()
    return None if fields[0] in ("Z", "X") else int(fields[1])  # a zombie is gone


def alive(pid: int) -> bool:
    return parent_of(pid) is not None


def children(pid: int) -> list[int]:
    return [int(e.name) for e in Path("/proc").iterdir()
            if e.name.isdigit() and parent_of(int(e.name)) == pid]


def descendants(pid: int) -> list[int]:
    found = children(pid)
    for child in list(found):
        found += descendants(child)
    return found


def pids_with(needle: str) -> list[int]:
    """Live processes whose command line mentions ``needle`` (a zombie's is empty)."""
    return [int(e.name) for e in Path("/proc").iterdir()
            if e.name.isdigit() and int(e.name) != os.getpid()
            and needle.encode() in proc_cmdline(int(e.name)).replace(b"\0", b" ")]


def supervisor(server: Server) -> int | None:
    pools = [p for p in children(server.proc.pid) if name_of(p) == POOL_NAME]
    assert len(pools) <= 1, pools
    return pools[0] if pools else None


def name_of(pid: int) -> str:
    """/proc/PID/comm: the supervisor and its workers are forked, told apart by name."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def is_worker(pid: int) -> bool:
    return name_of(pid) == WORKER_NAME


def worker_homes(supervisor_pid: int) -> dict[int, Path]:
    """The supervisor's workers (forked: named `WORKER_NAME`) that run an agent, and their
    homes (on the agent's command line: gpg-agent's ``--homedir``)."""
    homes = {}
    for pid in children(supervisor_pid):
        if not is_worker(pid):
            continue
        for agent in agents_of([pid]):
            argv = proc_cmdline(agent).split(b"\0")
            if b"--homedir" in argv:
                homes[pid] = Path(os.fsdecode(argv[argv.index(b"--homedir") + 1]))
    return homes


def agents_of(worker_pids: list[int]) -> list[int]:
    return [p for w in worker_pids for p in children(w)
            if proc_cmdline(p).split(b"\0")[0].endswith((b"gpg-agent", b"ssh-agent"))]


def holds_key(home: Path) -> bool:
    keys = home / "private-keys-v1.d"
    return keys.is_dir() and any(keys.iterdir())


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


# -- the tests --------------------------------------------------------------------------------

def test_homes_are_private_in_the_data_dir_and_go_on_shutdown(default_server: Server) -> None:
    server = default_server
    base = server.runtime_dir
    pool = supervisor(server)
    assert pool is not None
    homes = worker_homes(pool)
    assert len(homes) == WORKERS, homes
    assert base.is_dir() and mode(base) == 0o700
    for home in homes.values():
        assert home.parent == base, f"{home} is not in {base}"
        assert mode(home) == 0o700
        assert holds_key(home)
    assert len(agents_of(list(homes))) == WORKERS
    # Forked by the supervisor, each holds none of its descriptors but stdout and stderr:
    # not the homes' locks (a worker's own either: the lock is the supervisor's), not its
    # configuration pipe (stdin is /dev/null).
    for worker in homes:
        fds = {int(fd.name): os.readlink(fd) for fd in Path(f"/proc/{worker}/fd").iterdir()}
        assert fds[0] == os.devnull, fds
        assert not {str(h) for h in homes.values()} & set(fds.values()), fds
        assert proc_cmdline(worker) == proc_cmdline(pool)  # (forked, not started anew)
    # The supervisor, forked by stampd serve, holds none of its descriptors either (its data
    # directory's locks, the journal): only the homes' locks are its own.
    held = [os.readlink(fd) for fd in Path(f"/proc/{pool}/fd").iterdir()]
    assert [t for t in held if t.startswith(str(server.data_dir))
            and not t.startswith(str(base))] == [], held
    assert proc_cmdline(pool) == proc_cmdline(server.proc.pid)
    stamp_tag(server, "a" * 40)

    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(timeout=30) == 0
    assert [p for p in [pool, *homes] if alive(p)] == []
    assert pids_with(str(base)) == []
    assert list(base.iterdir()) == []


def test_killed_supervisor_takes_workers_agents_and_homes_along(default_server: Server
                                                                ) -> None:
    server = default_server
    old_pool = supervisor(server)
    assert old_pool is not None
    homes = worker_homes(old_pool)
    agents = agents_of(list(homes))
    assert len(homes) == WORKERS and len(agents) == WORKERS, (homes, agents)
    assert all(holds_key(home) for home in homes.values())

    os.kill(old_pool, signal.SIGKILL)

    # The orphans do not linger: every old worker and agent is gone (a PID still alive is
    # checked against its home, so a reused PID does not count).
    def orphans() -> list[int]:
        return [p for p in homes if is_worker(p)] + [
            p for home in homes.values() for p in pids_with(str(home))]

    wait_for(lambda: orphans() == [], timeout=10, what="the old workers and agents to die")

    # The HTTP process starts another supervisor; that one removes the old homes (nobody
    # else can: their workers were killed) and starts new workers in new homes.
    wait_for(lambda: supervisor(server) not in (None, old_pool), timeout=30,
             what="a new supervisor")
    wait_for(lambda: not any(home.exists() for home in homes.values()), timeout=30,
             what="the old homes to be removed")
    log = server.log_path.read_text()
    assert all(f"removed the stale worker home {home}" in log for home in homes.values()), log
    new_pool = supervisor(server)
    assert new_pool is not None
    wait_for(lambda: len(worker_homes(new_pool)) == WORKERS, timeout=30,
             what="the new workers")
    server.wait_ready()
    new_homes = set(worker_homes(new_pool).values())
    assert not new_homes & set(homes.values())
    base = server.data_dir / "run" / "workers"
    assert set(base.iterdir()) == new_homes, "a home of no live worker is left"
    assert all(mode(home) == 0o700 for home in new_homes)
    stamp_tag(server, "b" * 40)

    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(timeout=30) == 0
    assert list(base.iterdir()) == []


def test_an_orphaned_worker_removes_its_home() -> None:
    """Where its supervisor dies without taking it along (no PR_SET_PDEATHSIG: here its
    parent exits and never set it), a worker stops and removes its home itself."""
    base = short_tmpdir("wo")
    try:
        data = seed_data_dir(base / "data")
        home = base / "h"
        home.mkdir(mode=0o700)
        dispatcher = socket.socket(socket.AF_UNIX)
        dispatcher.bind(str(base / "d.sock"))
        dispatcher.listen()
        dispatcher.settimeout(60)
        config = WorkerConfig("orphan:1:0", home, data / "keys",
                              DispatchConfig("socket", socket=base / "d.sock"))
        # A parent that starts the worker, tells it its PID, and exits.
        parent = (
            "import os, subprocess, sys\n"
            "from dataclasses import replace\n"
            "from workers.config import WorkerConfig\n"
            "config = replace(WorkerConfig.from_json(sys.argv[1]), supervisor=os.getpid())\n"
            "p = subprocess.Popen([sys.executable, '-m', 'workers.worker'], "
            "stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=open(sys.argv[2], 'w'))\n"
            "p.stdin.write(config.to_json().encode())\n"
            "p.stdin.close()\n"
            "print(p.pid)\n"
        )
        r = subprocess.run([sys.executable, "-c", parent, config.to_json(),
                            str(base / "worker.log")],
                           capture_output=True, text=True, timeout=60, cwd=ROOT, check=True)
        worker = int(r.stdout)
        conn, _ = dispatcher.accept()  # it says hello: it has started, with its key
        wait_for(lambda: not alive(worker), timeout=20, what="the orphaned worker to exit")
        assert not home.exists(), (base / "worker.log").read_text()
        assert "supervisor is gone; removing home" in (base / "worker.log").read_text()
        conn.close()
        dispatcher.close()
    finally:
        kill_pids(pids_with(str(base)))
        shutil.rmtree(base, ignore_errors=True)


def test_a_data_dir_too_long_for_agent_sockets_falls_back(tmp_path: Path,
                                                          caplog: pytest.LogCaptureFixture
                                                          ) -> None:
    """When the agents' socket paths would not fit, the homes go to a short private
    directory instead, and the log says so."""
    from workers.pool import prepare_runtime_dir

    wanted = tmp_path / ("d" * 100) / "run" / "workers"
    with caplog.at_level(logging.WARNING, logger="workers.pool"):
        chosen = prepare_runtime_dir(wanted, workers=3)
    try:
        assert chosen != wanted and not wanted.exists()
        assert len(os.fsencode(chosen / "stampd-w2-xxxxxxxx" / "S.gpg-agent")) <= 107
        assert chosen.is_dir() and mode(chosen) == 0o700
        assert chosen.lstat().st_uid == os.geteuid()
        assert str(wanted) in caplog.text and str(chosen) in caplog.text
        assert prepare_runtime_dir(wanted, workers=3) == chosen  # the same one next time
    finally:
        shutil.rmtree(chosen, ignore_errors=True)
    short = tmp_path / "r"
    assert prepare_runtime_dir(short, workers=3) == short
    assert mode(short) == 0o700
