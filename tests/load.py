"""A small threaded load generator for fault tests (benchmarks use wrk, see bench/)."""

from __future__ import annotations

import http.client
import secrets
import threading
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field


@dataclass
class Result:
    commit: str
    status: int  # 0 = connection failed
    text: str


@dataclass
class Load:
    port: int
    clients: int
    per_client: int
    kind: str = "tag"
    results: list[Result] = field(default_factory=list)
    done: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(0))
    stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _client(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        for _ in range(self.per_client):
            if self.stop.is_set():
                return
            commit = secrets.token_hex(20)
            fields = {"request": "stamp-tag-v1", "commit": commit, "tagname": "load"}
            if self.kind == "branch":
                fields = {"request": "stamp-branch-v1", "commit": commit,
                          "tree": secrets.token_hex(20)}
            try:
                conn.request("POST", "/", body=urllib.parse.urlencode(fields),
                             headers={"Content-Type": "application/x-www-form-urlencoded"})
                r = conn.getresponse()
                res = Result(commit, r.status, r.read().decode())
            except (OSError, http.client.HTTPException) as e:
                res = Result(commit, 0, repr(e))
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
            with self._lock:
                self.results.append(res)
            self.done.release()
        conn.close()

    def run(self) -> ThreadPoolExecutor:
        pool = ThreadPoolExecutor(self.clients)
        for _ in range(self.clients):
            pool.submit(self._client)
        return pool

    def wait_done(self, n: int, timeout: float = 120) -> None:
        for _ in range(n):
            if not self.done.acquire(timeout=timeout):
                raise TimeoutError(f"load made no progress in {timeout}s")
