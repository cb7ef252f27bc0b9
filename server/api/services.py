"""The live parts of a running server that its routes use, built once by `server.api.app`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sqlalchemy import Engine

from formats.keys import ServedKey
from server.budgets import Budgets
from server.dispatch import Dispatcher
from server.gitlog.committer import LogCommitter
from server.gitlog.mailstampers import MailStamper
from server.gitlog.peers import CrossStamper
from server.runtime.siblings import Overview, Sibling, Siblings, overview
from server.settings import Settings
from server.stamping.journal import JournalApi
from server.stamping.rfc3161 import Tsa, TsaSource
from server.stamping.stamper import Stamper
from server.stats import Stats
from server.tlog.sequencer import LogKey, Tlog
from server.tlog.store import TileReader
from server.tlog.waiters import ProofWaiters
from server.tlog.witness_client import WitnessState, states_of
from server.witness.service import Witness


@dataclass(frozen=True)
class Services:
    settings: Settings
    engine: Engine
    journal: JournalApi
    dispatcher: Dispatcher
    stamper: Stamper
    committer: LogCommitter
    cross: CrossStamper
    stats: Stats
    keys: list[ServedKey]  # every signing key, the primary first
    clock: Callable[[], float]
    tsa_source: TsaSource | None = None  # RFC 3161; None when off
    siblings: Siblings | None = None  # the other HTTP processes of `stampd serve`, if any
    # The transparency log (None when STAMPD_TLOG=off): its public key, the tiles every
    # process reads, and its writer (running in one process of the host at a time).
    log_key: LogKey | None = None
    tlog_reader: TileReader | None = None
    tlog: Tlog | None = None
    witness: Witness | None = None  # this server as a witness of other logs; None: none
    proof_waiters: ProofWaiters | None = None  # GET /v1/proofs ?wait= (None: no log)
    process: int = 0  # this HTTP process's number among those of `stampd serve`
    # The host's budgets (manifest bytes, witness requests): this process's own when it is
    # the only one, else the coordinator's.
    budgets: Budgets | None = None
    mail_stampers: MailStamper | None = None  # the email timestampers (none configured: idle)

    async def overview(self) -> Overview:
        """The counters and queues of every HTTP process of this server."""
        return await overview(self.stats, self.dispatcher, self.siblings)

    def witness_states(self, others: Sequence[Sibling] = ()) -> list[WitnessState]:
        """Each configured witness's state: this process's own where it sends the checkpoints,
        else as the host's sending process last reported it (among ``others``, the other
        HTTP processes' reports: `Overview.others`)."""
        witnesses = self.settings.witness_list
        if not witnesses:
            return []
        sender = None if self.tlog is None else self.tlog.witnesses
        if sender is not None and sender.sending:
            return [WitnessState(**vars(s)) for s in sender.states()]  # (a copy)
        reported = next((o.record["witnesses"] for o in others
                         if o.record is not None and "witnesses" in o.record), None)
        return states_of(reported, witnesses)

    def published_size(self) -> int | None:
        """The tree size of the checkpoint this host publishes (None: none yet, or no log)."""
        published = None if self.tlog_reader is None else self.tlog_reader.published()
        return None if published is None else published[1]

    @property
    def tsa(self) -> Tsa | None:
        """The RFC 3161 authority; None when off or while its key has no certificate chain."""
        return None if self.tsa_source is None else self.tsa_source.get()

    @property
    def key(self) -> ServedKey:
        """The primary OpenPGP key (Zeitgitter's key, and the log's)."""
        return self.keys[0]
