"""Dispatch: how a signing job reaches a worker holding its key, and how its answer comes back.

Two transports offer the same `Dispatcher` protocol: `server.dispatch.socket` (workers on this
host connect to a Unix socket of ``stampd serve``) and `server.dispatch.database` (several hosts
share one PostgreSQL; workers claim jobs from the ``jobs`` table). With several HTTP processes
on socket dispatch, each hands its jobs to the host's coordinator, which runs the one
`SocketDispatcher` (`server.coordinator.link.HostDispatcher`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from formats.jobs import Job
from formats.keys import PRIMARY
from server.errors import StampError


@dataclass(slots=True)
class Signed:
    """A worker's answer to one job. (Not frozen, as none is changed once made: a frozen
    dataclass sets each field with object.__setattr__, and one is made for every stamp.)"""

    text: str  # the signed git object or receipt
    worker: str  # name of the worker that signed it
    attempts: int = 1  # how many workers were handed the job until one answered


class WorkerView(Protocol):
    """What the service shows of a connected worker."""

    @property
    def name(self) -> str: ...
    @property
    def key(self) -> str: ...
    @property
    def pid(self) -> int: ...


@dataclass(frozen=True)
class Worker:
    """A live worker as a dispatcher knows it from afar: the database's heartbeats
    (`DbDispatcher`), or the coordinator's news (`HostDispatcher`)."""

    name: str
    key: str
    pid: int


class Dispatcher(Protocol):
    """Hands jobs to workers and their answers back (`SocketDispatcher`, `DbDispatcher`,
    `HostDispatcher`)."""

    requeued: int  # jobs handed to another worker after a fault

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def sign(self, job: Job, key: str = PRIMARY, *, internal: bool = False) -> Signed:
        """Have a worker holding ``key`` build and sign ``job``; raises `QueueFull`,
        `SigningFailed` or `Unavailable`. An ``internal`` job is the service's own (a
        transparency log checkpoint, a git log commit): the queue's bound, which refuses
        clients' jobs under overload, never refuses it, so that an overloaded server still
        publishes the proofs of the stamps it has signed."""
        ...

    @property
    def workers(self) -> Mapping[str, WorkerView]:
        """Connected (socket) or live (database) workers by name."""
        ...

    @property
    def queue_depth(self) -> int: ...

    def keys_served(self) -> set[str]:
        """The ids of the keys that some live worker holds."""
        ...


class NotSigned(RuntimeError):
    """The service's own job (`sign_own`) was not signed: no worker serves its key, or none
    signed it in time. Its caller tries again later, and says so in one line."""


async def sign_own(dispatcher: Dispatcher, job: Job, key: str = PRIMARY, *, within: float,
                   what: str) -> Signed:
    """Have ``dispatcher`` sign the service's own ``job`` (``internal``: the queue's bound never
    refuses it) within ``within`` seconds; `NotSigned`, naming ``what``, if it is not."""
    try:
        async with asyncio.timeout(within):
            return await dispatcher.sign(job, key, internal=True)
    except TimeoutError:
        raise NotSigned(f"no worker signed {what} within {within:g} s") from None
    except StampError as e:
        raise NotSigned(f"could not sign {what}: {e.message}") from e
