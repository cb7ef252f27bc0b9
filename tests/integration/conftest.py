"""Fixtures of the integration tests: an in-process transport for signing jobs.

`InProcessDispatcher` offers the `server.dispatch.Dispatcher` protocol without a socket or a
worker process: it builds and signs each job with the real `OpenPgpSigner` over a real
`GpgAgent` holding the fixed test key. It is not a mock: the signed object is exactly what a
worker would answer, only the transport is left out.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import pytest

from server.dispatch import Signed
from server.errors import Unavailable
from tests.helpers import TEST_FPR, TEST_SECRET_KEY, TEST_UID, pid_gone, short_tmpdir
from workers.agents.gpg import GpgAgent
from workers.formats.jobs import Job
from workers.keys.keyset import PRIMARY
from workers.worker import OpenPgpSigner

WORKER = "inproc"


@dataclass(frozen=True)
class InProcessWorker:
    """What `Dispatcher.workers` shows of the one in-process "worker"."""

    name: str
    key: str
    pid: int


class InProcessDispatcher:
    """`Dispatcher` over a real signer in this process; the blocking signature runs in a
    thread, as it would in a worker. ``jobs`` records every job signed, in order."""

    requeued: int = 0

    def __init__(self, signer: OpenPgpSigner, key: str = PRIMARY) -> None:
        self.signer = signer
        self.key = key
        self.jobs: list[Job] = []

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def sign(self, job: Job, key: str = PRIMARY) -> Signed:
        if key != self.key:
            raise Unavailable(f"no worker holds key {key}")
        text = await asyncio.to_thread(self.signer.build, job)
        self.jobs.append(job)
        return Signed(text, WORKER, 1)

    @property
    def workers(self) -> Mapping[str, InProcessWorker]:
        return {WORKER: InProcessWorker(WORKER, self.key, os.getpid())}

    @property
    def queue_depth(self) -> int:
        return 0

    def keys_served(self) -> set[str]:
        return {self.key}


@pytest.fixture(scope="module")
def openpgp_signer() -> Iterator[OpenPgpSigner]:
    """The real signer with the test key, over a gpg-agent in a short private home; the agent
    is stopped by PID when the module is done."""
    home = short_tmpdir("ip")
    os.chmod(home, 0o700)
    agent = GpgAgent(home)
    pid: int | None = None
    try:
        agent.start()
        pid = agent.pid
        key = agent.import_secret_key(TEST_SECRET_KEY)
        assert key.fingerprint == TEST_FPR and key.uid == TEST_UID
        yield OpenPgpSigner(key, agent.connect())
    finally:
        agent.stop()
        shutil.rmtree(home, ignore_errors=True)
    assert pid is not None and pid_gone(pid)


@pytest.fixture
def inproc_dispatcher(openpgp_signer: OpenPgpSigner) -> InProcessDispatcher:
    """A fresh in-process transport (its own job record) over the module's signer."""
    return InProcessDispatcher(openpgp_signer)
