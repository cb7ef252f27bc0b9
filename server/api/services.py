"""The live parts of a running server that its routes use, built once by `server.api.app`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import Engine

from server.dispatch import Dispatcher
from server.log.committer import LogCommitter
from server.log.peers import CrossStamper
from server.settings import Settings
from server.stamping.journal import Journal
from server.stamping.stamper import Stamper
from server.stats import Stats
from workers.keys.keyset import ServedKey


@dataclass(frozen=True)
class Services:
    settings: Settings
    engine: Engine
    journal: Journal
    dispatcher: Dispatcher
    stamper: Stamper
    committer: LogCommitter
    cross: CrossStamper
    stats: Stats
    keys: list[ServedKey]  # every signing key, the primary first
    clock: Callable[[], float]

    @property
    def key(self) -> ServedKey:
        """The primary OpenPGP key (Zeitgitter's key, and the log's)."""
        return self.keys[0]
