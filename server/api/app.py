"""The composition root of the HTTP process: `create_app(settings)` builds every part of the
service, starts and stops them with the app, and mounts the front ends.

    ZeitgitterPost (POST /, raw ASGI) ─┐
    FastAPI: GET /, /v1/*, /log.git/*, ─┴─> Services: Stamper ─> Journal, Dispatcher
             /healthz, /readyz, /metrics,               LogCommitter, CrossStamper
             /openapi.json, /docs

The secret keys never enter this process: workers hold them.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI

from formats.keys import TLOG_KEY, ServedKey, allowed_signers, tlog_vkey, with_purposes
from server import db
from server.api.health import add_health_routes
from server.api.metrics import add_metrics_route
from server.api.openapi import add_docs_routes
from server.api.publish import add_log_routes
from server.api.rfc3161 import add_timestamp_routes
from server.api.services import Services
from server.api.tlog import add_tlog_routes
from server.api.v1 import add_v1_routes
from server.api.web import add_web_routes
from server.api.witness import add_witness_routes, make_witness
from server.api.zeitgitter import ZeitgitterPost, add_zeitgitter_routes
from server.budgets import Budgets, HostBudgets, LocalBudgets
from server.coordinator import CoordinatorLink, HostDispatcher
from server.dispatch import Dispatcher
from server.dispatch.database import DbDispatcher, psycopg_dsn
from server.dispatch.socket import socket_dispatcher
from server.errors import KeyRegistryError
from server.gitlog.committer import CommitterConfig, LogCommitter
from server.gitlog.mailstampers import MailStamper
from server.gitlog.peers import CrossStamper
from server.gitlog.repository import LogRepository
from server.leadership import AdvisoryLeader, FileLeader
from server.mail.listener import mail_listener
from server.runtime import looplag
from server.runtime.httpproto import on_shutdown, open_connections
from server.runtime.siblings import Siblings
from server.runtime.threadpool import started_pool
from server.settings import Settings
from server.signing_keys import serving_keys
from server.stamping.journal import Journal, JournalApi
from server.stamping.rfc3161 import Tsa, TsaSource
from server.stamping.stamper import Stamper
from server.stats import Stats
from server.tlog.proofs import locate_many
from server.tlog.sequencer import TLOG_LOCK, LogKey, Tlog, TlogConfig
from server.tlog.store import TileReader, checkpoint_file
from server.tlog.waiters import ProofWaiters
from server.tlog.witness_client import Backoff, WitnessSender, state_items


def log_key_files(keys: list[ServedKey], tsa: Tsa | None = None) -> dict[str, str]:
    """Every public key besides pubkey.asc, for the log: keys/<id>.asc|.pub, allowed_signers;
    and the RFC 3161 certificate chain, tsa/chain.pem."""
    files = {f"keys/{k.log_name}": k.public for k in keys[1:]}
    if tsa is not None:
        files["tsa/chain.pem"] = tsa.chain_pem
    signers = allowed_signers(keys)
    if signers:
        files["allowed_signers"] = signers
    return files


def make_dispatcher(settings: Settings, engine: db.Engine, stats: Stats,
                    link: CoordinatorLink | None = None) -> Dispatcher:
    """The database's dispatch, else the host's one `SocketDispatcher`: this process's own
    when it is the only HTTP process, else the coordinator's (over ``link``)."""
    if settings.dispatch == "database":
        return DbDispatcher(engine, max_queue=settings.max_queue,
                            sign_timeout=settings.sign_timeout,
                            max_attempts=settings.max_attempts,
                            heartbeat_timeout=settings.heartbeat_timeout, stats=stats)
    if link is not None:
        return HostDispatcher(link)
    return socket_dispatcher(settings, stats)


def _transparency_log(
    settings: Settings, engine: db.Engine, dispatcher: Dispatcher, served: Sequence[ServedKey],
    leader: AdvisoryLeader | FileLeader, clock: Callable[[], float], journal: JournalApi,
) -> tuple[LogKey | None, TileReader | None, Tlog | None]:
    """The transparency log's key, reader and writer (None, None, None when it is off). The
    tiles of a host are written by the process holding the log lock when the host's processes
    share one log (socket dispatch), else by the holder of ``run/tlog.lock``; among hosts on
    one PostgreSQL, the holder of the tlog advisory lock sequences."""
    if not settings.tlog:
        return None, None, None
    public = next((k.public for k in served if k.id == TLOG_KEY.id), None)
    if public is None:
        raise KeyRegistryError("the transparency log is on (STAMPD_TLOG) but no host registered "
                               "its key: start `stampd serve` or a `stampd worker` host with it")
    config = TlogConfig.of(settings, LogKey(tlog_vkey(settings.tlog_origin, public)), served,
                           clock)
    host_lock: AdvisoryLeader | FileLeader
    sequencer: Callable[[], bool]
    closers: list[Callable[[], None]] = []
    if settings.dispatch == "socket":
        host_lock, sequencer = leader, (lambda: True)
    else:
        host_lock = FileLeader(settings.run_dir / "tlog.lock")
        advisory = AdvisoryLeader(psycopg_dsn(engine), lock=TLOG_LOCK)
        sequencer = advisory
        closers += [advisory.close, host_lock.close]
    reader = TileReader(config.root)

    def witnesses(tlog: Tlog) -> WitnessSender:
        """The witnesses' sender: idle until the log, sequencing, offers it a checkpoint."""
        return WitnessSender(
            settings.witness_list, reader.node_reader, tlog.add_cosignatures,
            timeout=settings.witness_timeout,
            cosignature_skew=settings.witness_clock_skew,
            backoff=Backoff(settings.witness_retry_base, settings.witness_retry_max),
            clock=clock)

    # On SQLite, the entries go into the group commits of this process's journal, if it has
    # the host's (one HTTP process): not in a transaction that the journal would wait for.
    along = journal.write_along if isinstance(journal, Journal) and \
        engine.dialect.name == "sqlite" else None
    tlog = Tlog(engine, dispatcher, config, host_lock, sequencer, on_stop=closers,
                witnesses=witnesses if settings.witness_list else None, write_along=along)
    return config.key, reader, tlog


def _proof_waiters(settings: Settings, engine: db.Engine, reader: TileReader | None,
                   stats: Stats, tlog: Tlog | None, link: CoordinatorLink | None
                   ) -> ProofWaiters | None:
    """The proof requests that wait (None without a transparency log), woken whenever a
    checkpoint of a new size is published on the host: told by this process's log writer
    when it writes the host's tiles, and with several HTTP processes by the coordinator, to
    which the writer tells it (`server.coordinator`)."""
    if reader is None:
        return None

    def size() -> int | None:
        published = reader.published()
        return None if published is None else published[1]

    waiters = ProofWaiters(size, lambda serials, objects: locate_many(engine, serials, objects),
                           limit=settings.proof_waiters,
                           per_client=settings.proof_waiters_per_client, stats=stats)

    def look(_size: int) -> None:
        waiters.published()

    if link is not None:
        link.on_published = look
    if tlog is not None:
        tlog.on_published = look if link is None else link.published
    waiters.published()  # (the size there is now)
    return waiters


log = logging.getLogger(__name__)


def _server_gone() -> None:
    """The host's coordinator (in ``stampd serve``) closed this HTTP process's link: the server
    stopped or died. The requests whose rows were sent are neither answered nor failed (the
    host may have committed them, and a stamp answered 503 must not be in the log): the
    process ends at once, as ``PR_SET_PDEATHSIG`` would end it a moment later."""
    log.error("the host's coordinator is gone (stampd serve stopped or died): this HTTP "
              "process ends without answering")
    logging.shutdown()
    os._exit(1)


def create_app(
    settings: Settings, *, clock: Callable[[], float] = time.time,
    before_shutdown: Callable[[], None] | None = None,
    keys: Sequence[ServedKey] | None = None, process: int = 0,
) -> ZeitgitterPost:
    """``keys`` are the served keys if the caller has them already (`stampd serve` read them
    at start-up); otherwise they are read when the app starts. ``before_shutdown`` runs (in a
    thread) when the server stops, after the last request and before the dispatcher closes:
    `stampd serve` stops its worker pool there, so that workers are stopped rather than cut
    off and respawned. ``process`` is the number of this HTTP process among those of
    `stampd serve` (`server.http_processes`)."""
    cell: list[Services] = []  # filled when the app starts

    def services() -> Services:
        return cell[0]

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        asyncio.get_running_loop().set_default_executor(started_pool())
        engine = db.make_engine(settings.db_url)
        served = with_purposes(keys if keys is not None else serving_keys(
            settings.keys_dir, settings.extra_key_specs, settings.dispatch, engine),
            None if settings.tsa_spec is None else settings.tsa_spec.id)
        stats = Stats()
        journal: JournalApi
        budgets: Budgets
        link = None
        if settings.api_process_count > 1:  # `stampd serve` is the host's coordinator
            link = CoordinatorLink(settings.serve_socket, stats,
                                   on_host_lost=_server_gone)
            await link.connect()
            budgets = link
        else:
            budgets = LocalBudgets(HostBudgets(settings, clock))
        # (on SQLite, the coordinator keeps the host's one journal)
        journal = link if link is not None and settings.shared_journal else Journal(engine,
                                                                                    stats)
        dispatcher = make_dispatcher(settings, engine, stats, link)
        # One log writer and one cross-stamper: the HTTP process holding the log lock.
        leader: AdvisoryLeader | FileLeader
        if settings.dispatch == "database":
            leader = AdvisoryLeader(psycopg_dsn(engine))
        else:
            leader = FileLeader(settings.run_dir / "log.lock")
        cross = CrossStamper(engine, settings, clock, leader=leader)
        mail_stampers = MailStamper(engine, settings, clock, leader=leader)
        loop = asyncio.get_running_loop()

        def on_commit(head: str) -> None:
            try:
                cross.head_committed(head)
                loop.call_soon_threadsafe(cross.wake)
            finally:  # (each on its own: a failure of one schedules the other all the same)
                mail_stampers.head_committed(head)
                loop.call_soon_threadsafe(mail_stampers.wake)

        tsa_source = None if settings.tsa_spec is None else TsaSource(
            served, settings.tsa_spec.id, settings.keys_dir, engine,
            policy=settings.tsa_policy, accuracy=settings.tsa_accuracy,
            allow_sha1=settings.tsa_allow_sha1,
            require_clock_sync=settings.tsa_require_clock_sync)
        tsa = None if tsa_source is None else tsa_source.get()
        log_key, tlog_reader, tlog = _transparency_log(settings, engine, dispatcher, served,
                                                       leader, clock, journal)
        committer = LogCommitter(
            engine, LogRepository(settings.log_repo), dispatcher,
            CommitterConfig.of(settings, served[0].public, log_key_files(served, tsa), clock),
            leader=leader, on_commit=on_commit, peer_keys=cross.pinned_keys,
            extra_files=lambda: {**checkpoint_file(tlog_reader), **mail_stampers.published_keys()})
        # (the coordinator keeps both: a tag or branch stamp is one call to it)
        at_once = link if journal is link and isinstance(dispatcher, HostDispatcher) else None
        stamper = Stamper(journal, dispatcher, served, public_url=settings.public_url,
                          request_timeout=settings.request_timeout, clock=clock,
                          at_once=at_once)
        count = settings.api_process_count

        def witness_states() -> list[dict[str, Any]] | None:
            """The witnesses' states, where this process sends the checkpoints to them."""
            sender = None if tlog is None else tlog.witnesses
            return state_items(sender.states()) if sender is not None and sender.sending \
                else None

        siblings = None if link is None else Siblings(link, process, count, stats, dispatcher,
                                                      witness_states)
        if siblings is not None and tlog is not None and tlog.witnesses is not None:
            tlog.witnesses.on_change = siblings.report
        await dispatcher.start()
        journal.start()
        committer.start()
        if tlog is not None:
            tlog.start()
        cross.start()
        mail_stampers.start()
        if siblings is not None:
            siblings.start()
        # The SMTP listener (STAMPD_MAIL_LISTEN) runs in the first HTTP process only: its
        # rates have one owner, and a process restarting only delays mail, which the sending
        # MTAs retry (docs/mail.md).
        mail = mail_listener(settings, stamper, served, stats, clock) if process == 0 else None
        if mail is not None:
            await mail.start()
        lag = asyncio.create_task(looplag.watch(stats, busy=lambda: open_connections() > 0))
        waiters = _proof_waiters(settings, engine, tlog_reader, stats, tlog, link)
        unhook = on_shutdown(waiters.close) if waiters is not None else None
        cell.append(Services(settings, engine, journal, dispatcher, stamper, committer, cross,
                             stats, served, clock, tsa_source, siblings, log_key, tlog_reader,
                             tlog, witness=make_witness(settings, engine, dispatcher, served,
                                                        clock), process=process,
                             proof_waiters=waiters, budgets=budgets,
                             mail_stampers=mail_stampers))
        app.state.services = cell[0]
        try:
            yield
        finally:
            lag.cancel()
            if mail is not None:
                await mail.stop()
            if unhook is not None:
                unhook()
            if before_shutdown is not None:
                await asyncio.to_thread(before_shutdown)
            if siblings is not None:
                await siblings.stop()
            await cross.stop()
            await mail_stampers.stop()
            if tlog is not None:
                await tlog.stop()
            await committer.stop()
            await dispatcher.stop()
            await journal.stop()
            if link is not None and link is not journal:
                await link.stop()
            leader.close()
            engine.dispose()
            cell.clear()

    app = FastAPI(title="stampd", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)
    add_v1_routes(app, services)  # first: a digest stamp is routed without trying / first
    add_zeitgitter_routes(app)
    add_log_routes(app, settings.log_repo)
    add_health_routes(app)
    add_metrics_route(app, services)
    add_docs_routes(app)
    add_timestamp_routes(app)
    add_tlog_routes(app)
    add_witness_routes(app)
    add_web_routes(app, services)
    return ZeitgitterPost(app, services)
