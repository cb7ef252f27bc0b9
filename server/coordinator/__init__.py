"""The host's coordinator: ``stampd serve``, when it runs several HTTP processes, owns what they
share, and each of them asks it over one Unix socket connection (`CoordinatorLink`):

- **the journal** (SQLite): one writer for every HTTP process of the host. Each HTTP process
  committing its own groups made the processes take turns at SQLite's one write lock, one
  fsync each: with four processes on 12 cores, 43% of the time spent inside a request went to
  waiting for the others' commits (bench/RESULTS.md, "Many cores"). Here the rows of every
  process that arrive while one commit runs go into the next, one fsync for all. (On
  PostgreSQL each process commits its own groups; the database takes them together.)
- **the budgets** (`server.budgets.HostBudgets`): the hourly manifest bytes, the manifest bytes
  in flight, the witness's requests a minute. A process's bytes in flight are given back when
  its connection closes.
- **the processes' view**: each HTTP process reports its counters and its view of the workers
  four times a second; ``GET /metrics`` and ``GET /readyz``, in whichever process answers,
  add up or check every process's last report (`server.runtime.siblings`);
- **the news** of each transparency log checkpoint published on the host: the HTTP process
  that writes the tiles tells it, and it tells every HTTP process (their proof waiters, which
  cost nothing until then, look again: `server.tlog.waiters`).

The coordinator runs in a thread of its own of the ``stampd serve`` process, which serves no
request itself (`Coordinator`). Nothing changes in what is promised: a request is answered (and
signed) only after the host has committed its row and replied with its id. An HTTP process
killed loses only its connection: the rows it sent are committed, or were never acknowledged.
The coordinator dies only with ``stampd serve``, whose HTTP processes die with it; if its thread
fails, it stops the server (SIGTERM to its own process) rather than leave the HTTP processes
answering 503.

The wire (`Call`, `Reply`): frames of a 4-byte big-endian length, then a 4-byte length of a
JSON object, the object, and the bytes it names (a manifest's digest buckets, or its signed
text in UTF-8).
"""

from server.coordinator.host import Coordinator
from server.coordinator.link import CoordinatorLink, HostDispatcher
from server.coordinator.wire import Call, FrameBuckets, Reply

__all__ = ["Call", "Coordinator", "CoordinatorLink", "FrameBuckets", "HostDispatcher", "Reply"]
