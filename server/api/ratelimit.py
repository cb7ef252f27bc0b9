"""Budgets per client and per host over fixed windows of time, shared by every HTTP process of
a host: the hourly manifest bytes of ``POST /v1/manifests`` (`server.api.manifests`) and the
``POST /add-checkpoint`` requests a minute of the witness (`server.api.witness`).

A client is what `client_key` makes of its address (an IPv6 site's /64 is one client). The
counters live in one small file per budget under the data directory's run/, read and written
under an exclusive ``flock`` (`locked`), so that every HTTP process of the host counts the same.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import ipaddress
import os
import secrets
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

SLOTS = 1 << 16  # client counters of a budget's file (a keyed hash of the address picks one)
_HEAD = struct.Struct("<QQ32s")  # window start, host count in it, the hash key
_SLOT = struct.Struct("<Q")


class RateLimited(Exception):
    """A request over a budget of this window; the client may come back in ``retry_after``
    seconds (when the window ends). Answered 429 with ``Retry-After``."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after


def client_key(host: str | None) -> bytes:
    """What a per-client budget counts by: the IPv4 address, or the IPv6 /64 (one site's
    addresses; a client holding a /64 must not get 2**64 budgets)."""
    if host is None:
        return b"?"
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        return host.encode("utf-8", "replace")  # a Unix socket's name, a proxy's token
    if isinstance(addr, ipaddress.IPv6Address):
        if addr.ipv4_mapped is not None:
            return addr.ipv4_mapped.packed
        return ipaddress.IPv6Network((addr, 64), strict=False).network_address.packed
    return addr.packed


@contextlib.contextmanager
def locked(path: Path) -> Iterator[int]:
    """``path`` (made if missing, mode 0600) open and under an exclusive ``flock``, which the
    host's HTTP processes take in turn: a budget's shared counters."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield fd
    finally:
        os.close(fd)  # (releases the lock)


@dataclass
class WindowBudget:
    """At most ``per_client`` ``unit`` per client and ``per_host`` from all clients in each
    window of ``window`` seconds, shared by every HTTP process of the host: the counters live
    in one small file (``path``, under the data directory's run/). Fixed windows, aligned to
    multiples of ``window`` (``clock() // window``: the hour, the minute): a window's counters
    start at 0. A client's counter is one of `SLOTS`, picked by a hash of its address keyed
    with a secret the file holds (two clients may share one by chance, never by choice).
    0 = no limit. ``period`` names the window in messages ("this hour")."""

    path: Path
    per_client: int
    per_host: int
    clock: Callable[[], float]
    window: int = 3600
    unit: str = "bytes"
    period: str = "this hour"

    def charge(self, client: bytes, n: int) -> None:
        """Count ``n`` of ``client``; `RateLimited` (and nothing counted) if that would
        exceed a budget of this window."""
        if not (self.per_client or self.per_host) or n <= 0:
            return
        now = self.clock()
        window = int(now // self.window)
        retry = max(1, int((window + 1) * self.window - now + 0.999))
        with locked(self.path) as fd:
            head = os.pread(fd, _HEAD.size, 0)
            if len(head) == _HEAD.size:
                start, host, key = _HEAD.unpack(head)
            else:
                start, host, key = window, 0, secrets.token_bytes(32)
                os.ftruncate(fd, 0)
            if start != window:  # a new window: every counter from 0
                os.ftruncate(fd, 0)
                host = 0
            slot = _HEAD.size + _SLOT.size * (
                int.from_bytes(hashlib.blake2b(client, key=key, digest_size=8).digest())
                % SLOTS)
            raw = os.pread(fd, _SLOT.size, slot)
            used = _SLOT.unpack(raw)[0] if len(raw) == _SLOT.size else 0
            if self.per_client and used + n > self.per_client:
                raise RateLimited(
                    f"this client sent {used} of its {self.per_client} {self.unit} "
                    f"{self.period}; {n} more would exceed them", retry)
            if self.per_host and host + n > self.per_host:
                raise RateLimited(
                    f"this server took {host} of its {self.per_host} {self.unit} "
                    f"{self.period}; {n} more would exceed them", retry)
            os.pwrite(fd, _SLOT.pack(used + n), slot)
            os.pwrite(fd, _HEAD.pack(window, host + n, key), 0)
