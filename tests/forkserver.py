"""A fork server for the tests' ``stampd serve`` processes (tests.helpers.start_server).

A server start spends most of its CPU importing: fastapi, pydantic, sqlalchemy, uvicorn,
pygit2 and stampd's modules, about 0.9 s of the 1.3 s its process costs before it is ready, and
the suite starts about 150 servers on two cores. This process imports all of that once, then
forks a child for each server, which runs ``python -m stampd ARGS`` as a fresh interpreter
would (``runpy``, ``sys.argv``, its own environment, working directory and log file,
``/dev/null`` on stdin) and exits through the interpreter as one does: SystemExit's code, a
traceback and 1 for an uncaught exception, atexit handlers run. Only the serve process is
forked: its HTTP processes, worker supervisor, workers and agents are started by stampd
itself, as in production.

    python -m tests.forkserver FD
    python -m tests.forkserver --listen FD

FD is a Unix stream socket to one test process, or (``--listen``) a listening one, to which
every test process of a ``pytest -n`` run connects (tests/conftest.py: one fork server for the
run, not one for each test process, each of which cost 1.7 s of CPU preloading). One JSON
object a line each way, one answer for each request. ``{"start": {"args": [...], "env":
{...}, "cwd": ..., "log": ...}}`` forks ``python -m stampd ARGS`` and answers ``{"pid": N}``
(``"stdout"``, ``"stderr"`` and ``"stdin"``, files, may replace the log and ``/dev/null``:
`tests.helpers.run_stampd`); ``{"poll": N}`` answers ``{"status": S}``, S null while it runs,
else its exit status as `subprocess.Popen.returncode` gives it (negative: the signal);
``{"env": 1}`` answers ``{"env": {...}}``, the variables of its environment that Python reads
when it starts (a child has these, whatever its own say). The fork server reaps only its
children that it was asked about (an unpolled one stays a zombie, as with Popen), is
single-threaded when it forks (it refuses to start otherwise) and exits when the test process
closes the socket (one that listens: when it is stopped).
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import runpy
import selectors
import socket
import sys
import threading
import time
from typing import Any

from procs.forked import Forked

# What `stampd serve` imports before it serves (one HTTP process, SQLite or PostgreSQL).
PRELOAD = (
    "stampd.cli", "server.commands", "server.supervisor", "server.api.app",
    "server.http_processes", "server.runtime.httpproto", "workers.pool",
    "uvicorn", "uvicorn.protocols.http.httptools_impl", "uvicorn.lifespan.on", "uvloop",
    "sqlalchemy.dialects.sqlite", "sqlalchemy.dialects.postgresql", "pydantic.v1",
    "websockets.server", "uvicorn.protocols.websockets.websockets_sansio_impl",
    "fastapi.telemetry._runtime",
    # and what some servers import later: alembic (a journal not at the newest revision), httpx
    # (peers, witnesses), psycopg (PostgreSQL): 0.1-0.2 s of CPU each, in a forked server
    "alembic.command", "alembic.config", "alembic.autogenerate", "alembic.runtime.migration",
    "mako.template", "httpx", "httpcore", "h11", "certifi", "psycopg",
)


def serve(ctl: socket.socket, listening: bool = False) -> dict[str, Any] | None:
    """Answer requests until the test process closes the socket (None); with ``listening``,
    ``ctl`` is a listening socket and every test process that connects to it is answered,
    until this process is stopped. In a forked child, return what it is to run."""
    children: dict[int, Forked] = {}
    ready = selectors.DefaultSelector()
    ready.register(ctl, selectors.EVENT_READ)
    received: dict[socket.socket, bytes] = {} if listening else {ctl: b""}
    while True:
        for key, _ in ready.select():
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            if listening and sock is ctl:
                conn, _ = ctl.accept()
                ready.register(conn, selectors.EVENT_READ)
                received[conn] = b""
                continue
            data = sock.recv(1 << 16)
            if not data:
                ready.unregister(sock)
                sock.close()
                del received[sock]
                if not listening:
                    return None
                continue
            received[sock] += data
            while b"\n" in received[sock]:
                line, _, received[sock] = received[sock].partition(b"\n")
                request = json.loads(line)
                if "start" in request:
                    if threading.active_count() != 1:  # (never: checked before the first)
                        raise RuntimeError("the fork server has threads: it cannot fork safely")
                    pid = os.fork()
                    if pid == 0:
                        ready.close()
                        for other in (*received, ctl):
                            other.close()
                        return dict(request["start"])
                    children[pid] = Forked(pid)
                    answer: dict[str, Any] = {"pid": pid}
                elif "env" in request:  # (what the children's interpreter started with)
                    answer = {"env": {k: v for k, v in os.environ.items() if startup_variable(k)}}
                else:
                    child = children.get(int(request["poll"]))
                    answer = {"status": None if child is None else child.poll()}
                sock.sendall(json.dumps(answer).encode() + b"\n")


def startup_variable(name: str) -> bool:
    """Whether the environment variable ``name`` is read when Python starts (so that a forked
    child has the fork server's, whatever its own environment says)."""
    return name.startswith(("PYTHON", "LC_")) or name in ("LANG", "LANGUAGE")


def become(job: dict[str, Any]) -> None:
    """In the forked child: the environment, directory, descriptors and arguments of a fresh
    ``python -m stampd`` started as tests.helpers.start_server starts it."""
    os.chdir(job["cwd"])
    os.environ.clear()
    os.environ.update(job["env"])
    time.tzset()
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
    os.dup2(os.open(job.get("stdin") or os.devnull, os.O_RDONLY), 0)
    os.dup2(os.open(job.get("stdout") or job["log"], flags, 0o644), 1)
    os.dup2(os.open(job.get("stderr") or job["log"], flags, 0o644), 2)
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))  # (what a subprocess.Popen child keeps)
    sys.argv = ["-m", *(str(a) for a in job["args"])]  # ([0]: run_module sets the path)


def main() -> None:
    listening = sys.argv[1] == "--listen"
    ctl = socket.socket(fileno=int(sys.argv[-1]))
    for name in PRELOAD:
        importlib.import_module(name)
    # The command line's parsers (with the server's commands, and with their names only, for
    # a client command), built once here for every `stampd` run forked from this process.
    cli = importlib.import_module("stampd.cli")
    cli.parser(importlib.import_module("server.commands"))
    cli.parser(None)
    if threading.active_count() != 1:
        print("tests.forkserver: an import started a thread; not forking", file=sys.stderr)
        sys.exit(1)
    gc.collect()
    gc.freeze()  # (the children's collections leave the preloaded objects' pages shared)
    sys.stdout.flush()
    sys.stderr.flush()
    job = serve(ctl, listening)
    if job is None:
        return
    become(job)
    runpy.run_module("stampd", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
