"""The HTTP process's thread pool is started whole before it serves (`server.api.threadpool`):
no thread is started from the event loop later."""

from __future__ import annotations

import threading

from server.api.threadpool import started_pool


def test_every_thread_of_the_pool_runs_before_it_is_used() -> None:
    before = threading.active_count()
    pool = started_pool(4)
    try:
        assert threading.active_count() == before + 4
        names = {t.name for t in threading.enumerate() if t.name.startswith("stampd-io")}
        assert len(names) == 4
        assert [f.result() for f in [pool.submit(lambda i=i: i * i) for i in range(8)]] == [
            i * i for i in range(8)]
        assert threading.active_count() == before + 4  # (none started on demand)
    finally:
        pool.shutdown(wait=True)
    assert threading.active_count() == before
