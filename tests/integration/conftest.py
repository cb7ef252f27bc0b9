"""Fixtures of the integration tests: a real signer holding the fixed test key, and the
in-process transport over it (`tests.helpers.InProcessDispatcher`)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest

from tests.helpers import (
    TEST_FPR,
    TEST_SECRET_KEY,
    TEST_UID,
    InProcessDispatcher,
    pid_gone,
    short_tmpdir,
)
from workers.agents.gpg import GpgAgent
from workers.signer import OpenPgpSigner


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
