"""/readyz in process: ready means every served key, the primary one included, can sign now."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

from formats.keys import PRIMARY, ServedKey
from server import db
from server.api.health import readiness
from server.api.services import Services
from server.gitlog.committer import CommitterConfig, LogCommitter
from server.gitlog.peers import CrossStamper
from server.gitlog.repository import LogRepository
from server.settings import Settings
from server.stamping.journal import Journal
from server.stamping.stamper import Stamper
from server.stats import Stats
from tests.helpers import TEST_FPR, TEST_UID, InProcessDispatcher, migrated_sqlite
from workers.signer import OpenPgpSigner

PRIMARY_KEY = ServedKey(PRIMARY, "openpgp", TEST_FPR, "eddsa (ed25519)", "pub", TEST_UID,
                        primary=True)
EXTRA_KEY = ServedKey("ssh-ed25519", "ssh", "SHA256:" + "A" * 43, "ssh-ed25519", "ssh-ed25519 A",
                      TEST_UID)


def services(tmp_path: Path, dispatcher: InProcessDispatcher) -> Services:
    settings = Settings(data_dir=tmp_path)
    engine = db.make_engine(migrated_sqlite(tmp_path / "stampd.sqlite3"))
    stats = Stats()
    journal = Journal(engine, stats)
    keys = [PRIMARY_KEY, EXTRA_KEY]
    clock = lambda: 1_795_400_000.0  # noqa: E731
    committer = LogCommitter(engine, LogRepository(settings.log_repo), dispatcher,
                             CommitterConfig("pub", 3600, clock=clock))
    return Services(settings, engine, journal, dispatcher,
                    Stamper(journal, dispatcher, keys, public_url="http://x/",
                            request_timeout=5, clock=clock),
                    committer, CrossStamper(engine, settings, clock), stats, keys, clock)


def test_a_key_without_a_live_worker_is_not_ready(tmp_path: Path,
                                                  openpgp_signer: OpenPgpSigner) -> None:
    # Only the extra key's workers are connected: the primary key cannot sign.
    s = services(tmp_path, InProcessDispatcher(openpgp_signer, key=EXTRA_KEY.id))
    ready, body = asyncio.run(readiness(s))
    assert not ready
    assert body["checks"]["key:primary"] == {
        "ok": False, "detail": f"no live worker holds key primary ({TEST_FPR})"}
    assert body["checks"]["key:ssh-ed25519"]["ok"]
    assert body["checks"]["workers"]["ok"]  # some worker is connected, which is not enough


def test_ready_when_every_key_has_a_worker(tmp_path: Path,
                                           openpgp_signer: OpenPgpSigner) -> None:
    class Both(InProcessDispatcher):
        def keys_served(self) -> set[str]:
            return {PRIMARY, EXTRA_KEY.id}

    s = services(tmp_path, Both(openpgp_signer))
    ready, body = asyncio.run(readiness(s))
    assert ready, body
    assert {"database", "workers", "key:primary", "key:ssh-ed25519", "log"} <= set(body["checks"])


def test_an_unsynchronised_clock_reads_as_such(tmp_path: Path,
                                               openpgp_signer: OpenPgpSigner) -> None:
    """The kernel's answer injected: an unsynchronised clock is never shown as plainly fine.
    It fails readiness only where RFC 3161 requests are refused for it."""
    class Both(InProcessDispatcher):
        def keys_served(self) -> set[str]:
            return {PRIMARY, EXTRA_KEY.id}

    s = services(tmp_path, Both(openpgp_signer))
    s = replace(s, settings=s.settings.model_copy(update={"tsa": True}))
    ready, body = asyncio.run(readiness(s, clock=lambda: False))
    assert body["checks"]["clock"]["ok"], body  # not required: tokens are still issued
    assert body["checks"]["clock"] == {
        "ok": True, "detail": "not synchronised (kernel, adjtimex); tokens are still issued: "
        "STAMPD_TSA_REQUIRE_CLOCK_SYNC=false"}
    required = replace(s, settings=s.settings.model_copy(
        update={"tsa_require_clock_sync": True}))
    ready, body = asyncio.run(readiness(required, clock=lambda: False))
    assert not ready
    assert body["checks"]["clock"] == {
        "ok": False, "detail": "not synchronised (kernel, adjtimex): RFC 3161 requests are "
        "refused (STAMPD_TSA_REQUIRE_CLOCK_SYNC=true)"}
    ready, body = asyncio.run(readiness(required, clock=lambda: True))
    assert body["checks"]["clock"] == {"ok": True, "detail": "synchronised (kernel, adjtimex)"}
    off = replace(s, settings=s.settings.model_copy(update={"tsa": False}))
    ready, body = asyncio.run(readiness(off, clock=lambda: False))
    assert ready, body
    assert body["checks"]["clock"]["detail"] == (
        "not synchronised (kernel, adjtimex); RFC 3161 is off, stamps still carry this clock's "
        "time")
