"""Cross-timestamping: peer servers stamp the head of our log after every log commit.

For each configured peer, every new head of ``main`` becomes a `CrossStamp` row. A background
task asks the peer for a Zeitgitter branch stamp (``stamp-branch-v1``: the head as ``commit``, its
tree, and the previous stamp on ``<name>-timestamps`` as ``parent``), checks the answer exactly as
the ``git timestamp`` client would (layout, user id, times within ±30 s, one signature, made by the
pinned key), and moves ``<name>-timestamps`` to it. Failures are recorded in the row and retried
with exponential backoff; each peer is handled on its own, so a dead peer delays nothing else. A
newer head supersedes older pending ones: its stamp covers them, since the branch is a merge
chain over our history.

A peer's key is pinned from the configuration (``name=URL#FINGERPRINT``) or on first contact
(trust on first use), recorded in the ``peers`` table and published in the log as
``peers/<name>.asc``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import re
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import Engine, insert, select, update

from keystore.gnupg import GpgError, TempGnupgHome
from keystore.store import describe_public_key
from server.errors import PeerError
from server.gitlog.repository import LogRepository
from server.models import CrossStamp, CrossStampState, Peer
from server.setting_values import PeerConfig, redact_userinfo, url_credentials
from server.settings import Settings

log = logging.getLogger(__name__)

MAX_STAMP = 8000
CLOCK_SKEW = 30
_SIG = re.compile(
    r"gpgsig -----BEGIN PGP SIGNATURE-----\n \n((?: [!-~]+\n)+) -----END PGP SIGNATURE-----\n"
)


@dataclass(frozen=True)
class CheckedStamp:
    text: str
    payload: bytes  # the object without its signature
    signature: str  # armored
    time: int


def check_branch_stamp(text: str, *, tree: str, commit: str, parent: str | None, uid: str,
                       now: int) -> CheckedStamp:
    """Check a stamp-branch-v1 answer as the git-timestamp client does (all but the signature,
    which `PeerKeyring.verify` checks). Raises `PeerError`."""
    if len(text) > MAX_STAMP:
        raise PeerError(f"stamp longer than {MAX_STAMP} characters")
    if not re.fullmatch(r"[ -~\n]*", text):
        raise PeerError("stamp contains characters other than printable ASCII and newline")
    lead = f"tree {tree}\n" + (f"parent {parent}\n" if parent else "") + f"parent {commit}\n"
    if not text.startswith(lead):
        raise PeerError("stamp does not start with the expected tree and parent lines")
    pos = len(lead)
    times = []
    for header in ("author", "committer"):
        m = re.compile(rf"{header} {re.escape(uid)} (\d{{10}}) \+0000\n").match(text, pos)
        if not m:
            raise PeerError(f"stamp's {header} line is not '{header} {uid} <time> +0000'")
        t = int(m.group(1))
        if abs(t - now) >= CLOCK_SKEW:
            raise PeerError(f"stamp's {header} time is {t - now:+d} s off our clock")
        times.append(t)
        pos = m.end()
    m = _SIG.match(text, pos)
    if not m:
        raise PeerError("stamp lacks a well-formed gpgsig header after the committer line")
    if "-----BEGIN PGP SIGNATURE-----" in text[m.end():] or "gpgsig" in text[m.end():]:
        raise PeerError("stamp carries more than one signature")
    if not text[m.end():].startswith("\n"):
        raise PeerError("stamp has extra headers after gpgsig")
    signature = ("-----BEGIN PGP SIGNATURE-----\n\n"
                 + m.group(1).replace("\n ", "\n")[1:] + "-----END PGP SIGNATURE-----\n")
    payload = (text[:pos] + text[m.end():]).encode("ascii")
    return CheckedStamp(text, payload, signature, times[1])


class PeerKeyring:
    """A private GNUPGHOME holding exactly one peer's pinned public key."""

    def __init__(self, armored: str, fingerprint: str) -> None:
        self.fingerprint = fingerprint
        self._home = TempGnupgHome("stampd-p")
        try:
            imported = self._home.import_keys(armored.encode())
        except GpgError as e:
            self.close()
            raise PeerError(e.message) from None
        if not imported.ok:  # (gpg may exit 2 without an agent; see client/hook.py)
            self.close()
            raise PeerError(f"cannot import the pinned key: {imported.stderr[-200:]}")

    def verify(self, payload: bytes, signature: str) -> int:
        """Check the signature is one, good, by the pinned key (not one gpg reports revoked or
        expired: it exits 0 with a VALIDSIG for those, and says so only in its status, as
        `stampd verify` refuses them); return its creation time."""
        try:
            ok, status = self._home.verify_detached(payload, signature)
        except GpgError as e:
            raise PeerError(e.message) from None
        if status.newsig > 1 or len(status.valid_sigs) > 1:
            raise PeerError("the stamp carries more than one signature (only one is allowed)")
        if not ok or len(status.valid_sigs) != 1 or status.errors:
            why = f" ({', '.join(status.errors)})" if status.errors else ""
            raise PeerError(f"the stamp's signature does not verify with the pinned key{why}")
        sig = status.valid_sigs[0]
        if sig.fingerprint != self.fingerprint:
            raise PeerError(f"stamp signed by {sig.fingerprint}, pinned key is {self.fingerprint}")
        return sig.created

    def close(self) -> None:
        self._home.close()


@functools.cache
def _tls() -> ssl.SSLContext:
    """The TLS context of every request to a peer (httpx's default: the certifi bundle), made
    once: making one reads the bundle, about 45 ms of CPU, and each request made its own."""
    import httpx

    return httpx.create_ssl_context()


def _http(url: str, data: dict[str, str] | None, timeout: float) -> str:
    """The body of a 200 answer to a GET (a form POST with ``data``) of a peer's ``url``: no
    redirect followed (a Zeitgitter server does not redirect), at most ``4 * MAX_STAMP + 1``
    bytes read."""
    import httpx

    limit = MAX_STAMP * 4
    auth = url_credentials(url)  # (sent as a header: no URL a library logs holds them)
    url = redact_userinfo(url)
    try:
        with httpx.stream("POST" if data is not None else "GET", url, data=data,
                          timeout=timeout, follow_redirects=False, verify=_tls(),
                          headers={"User-Agent": "stampd"}, auth=auth) as r:
            if r.status_code != 200:
                raise PeerError(f"HTTP {r.status_code} from {url}")
            body = b""
            for chunk in r.iter_bytes():
                body += chunk
                if len(body) > limit:
                    break
    except httpx.HTTPError as e:
        raise PeerError(redact_userinfo(f"cannot reach {url}: {e}")) from None
    return body[:limit + 1].decode("ascii", "replace")


@dataclass(frozen=True)
class PeerStatus:
    name: str
    last_success: float | None
    failures: int


class CrossStamper:
    def __init__(self, engine: Engine, settings: Settings,
                 clock: Callable[[], float] = time.time,
                 leader: Callable[[], bool] | None = None) -> None:
        self.engine = engine
        self.settings = settings
        self.peers = {p.name: p for p in settings.peer_list}
        self.repo = LogRepository(settings.log_repo)  # its own handle, used from threads
        self.clock = clock
        self.leader = leader  # several API hosts: only the log writer talks to peers
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._inflight: dict[str, asyncio.Task[None]] = {}
        self._keyrings: dict[str, PeerKeyring] = {}
        self.attempts = 0
        self.failures: dict[str, int] = dict.fromkeys(self.peers, 0)
        self.last_success: dict[str, float] = {}

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        if not self.peers:
            return
        self._sync_peer_rows()
        self._task = asyncio.create_task(self._run(), name="cross-stamper")

    async def stop(self) -> None:
        tasks = [t for t in [self._task, *self._inflight.values()] if t is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for kr in self._keyrings.values():
            kr.close()

    def _sync_peer_rows(self) -> None:
        with self.engine.begin() as conn:
            known = {r.name: r for r in conn.execute(
                select(Peer.name, Peer.url, Peer.fingerprint)).all()}
            for p in self.peers.values():
                row = known.get(p.name)
                if row is None:
                    conn.execute(insert(Peer).values(name=p.name, url=p.url))
                elif row.url != p.url:
                    conn.execute(update(Peer).where(Peer.name == p.name).values(url=p.url))
                if (row is not None and p.fingerprint and row.fingerprint
                        and row.fingerprint != p.fingerprint):
                    # The operator pinned another key: re-pin on next contact.
                    conn.execute(update(Peer).where(Peer.name == p.name).values(
                        fingerprint=None, pubkey=None, uid=None, pinned_at=None))

    # -- the API for the log committer ----------------------------------------------------------
    def head_committed(self, head: str) -> None:
        """Called (from a thread) after each log commit: every peer should stamp ``head``."""
        if not self.peers:
            return
        now = int(self.clock())
        with self.engine.begin() as conn:
            for name in self.peers:
                exists = conn.execute(select(CrossStamp.id).where(
                    CrossStamp.peer == name, CrossStamp.log_commit == head)).first()
                if exists is None:
                    conn.execute(insert(CrossStamp).values(
                        peer=name, log_commit=head, state=CrossStampState.PENDING, attempts=0,
                        next_attempt_at=0, created_at=now, updated_at=now))

    def wake(self) -> None:
        self._wake.set()

    def peer_status(self) -> list[PeerStatus]:
        return [PeerStatus(n, self.last_success.get(n), self.failures.get(n, 0))
                for n in self.peers]

    def stale_peers(self, bound: float) -> dict[str, str]:
        """Peers with a head waiting for their stamp for longer than ``bound`` seconds."""
        if not self.peers:
            return {}
        cutoff = int(self.clock() - bound)
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(CrossStamp.peer, CrossStamp.created_at, CrossStamp.last_error)
                .where(CrossStamp.state == CrossStampState.PENDING,
                       CrossStamp.created_at < cutoff))
            return {peer: f"waiting since {created}: {err or 'no attempt yet'}"
                    for peer, created, err in rows if peer in self.peers}

    def pinned_keys(self) -> dict[str, str]:
        with self.engine.connect() as conn:
            rows = conn.execute(select(Peer.name, Peer.pubkey).where(Peer.pubkey.is_not(None)))
            return {name: key for name, key in rows if name in self.peers and key}

    # -- the loop ------------------------------------------------------------------------------
    async def _run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):
                    await self._wake.wait()
            self._wake.clear()
            try:
                if self.leader is not None and not await asyncio.to_thread(self.leader):
                    continue
                due = await asyncio.to_thread(self._due)
            except Exception:
                log.exception("cannot read cross-stamp rows")
                continue
            for name, (row_id, head) in due.items():
                if name not in self._inflight:
                    self._inflight[name] = asyncio.create_task(self._attempt(name, row_id, head))

    def _due(self) -> dict[str, tuple[int, str]]:
        """The newest pending head per peer whose retry time has come; older pending rows of
        the same peer are superseded."""
        now = int(self.clock())
        due: dict[str, tuple[int, str]] = {}
        with self.engine.begin() as conn:
            rows = conn.execute(
                select(CrossStamp.id, CrossStamp.peer, CrossStamp.log_commit,
                       CrossStamp.next_attempt_at)
                .where(CrossStamp.state == CrossStampState.PENDING)
                .order_by(CrossStamp.id.desc())
            ).all()
            newest: dict[str, int] = {}
            for row_id, peer, head, next_at in rows:
                if peer not in newest:
                    newest[peer] = row_id
                    if next_at <= now:
                        due[peer] = (row_id, head)
                elif peer not in self._inflight:
                    conn.execute(update(CrossStamp).where(CrossStamp.id == row_id).values(
                        state=CrossStampState.SUPERSEDED, updated_at=now))
        return due

    async def _attempt(self, name: str, row_id: int, head: str) -> None:
        try:
            stamp = await asyncio.to_thread(self._stamp, name, head)
        except PeerError as e:
            self.failures[name] += 1
            await asyncio.to_thread(self._failed, row_id, e.message)
        except Exception as e:  # a bug or an I/O error: recorded, retried, never fatal
            log.exception("cross-stamp by %s failed unexpectedly", name)
            self.failures[name] += 1
            await asyncio.to_thread(self._failed, row_id, f"{type(e).__name__}: {e}")
        else:
            self.last_success[name] = self.clock()
            await asyncio.to_thread(self._done, row_id, stamp)
            log.info("peer %s stamped log head %s: %s", name, head, stamp[0])
        finally:
            self._inflight.pop(name, None)
            self.attempts += 1

    def _failed(self, row_id: int, error: str) -> None:
        now = int(self.clock())
        with self.engine.begin() as conn:
            attempts = conn.execute(select(CrossStamp.attempts).where(
                CrossStamp.id == row_id)).scalar_one() + 1
            delay = min(self.settings.peer_retry_base * 2 ** (attempts - 1),
                        self.settings.peer_retry_max)
            conn.execute(update(CrossStamp).where(CrossStamp.id == row_id).values(
                attempts=attempts, last_error=error[:2000], updated_at=now,
                next_attempt_at=now + int(delay)))
        log.warning("cross-stamp row %d failed (attempt %d, retry in %ds): %s",
                    row_id, attempts, int(delay), error)

    def _done(self, row_id: int, stamp: tuple[str, str]) -> None:
        now = int(self.clock())
        with self.engine.begin() as conn:
            conn.execute(update(CrossStamp).where(CrossStamp.id == row_id).values(
                state=CrossStampState.DONE, stamp_commit=stamp[0], stamp_text=stamp[1],
                updated_at=now,
                attempts=CrossStamp.attempts + 1, last_error=None))

    # -- one attempt (in a thread) -------------------------------------------------------------
    def _peer_key(self, peer: PeerConfig) -> tuple[str, str, PeerKeyring]:
        """(fingerprint, uid, keyring) of the pinned key, pinning it on first contact."""
        with self.engine.connect() as conn:
            row = conn.execute(select(Peer.pubkey, Peer.fingerprint, Peer.uid)
                               .where(Peer.name == peer.name)).one()
        if row.pubkey and row.fingerprint and row.uid:
            if peer.name not in self._keyrings:
                self._keyrings[peer.name] = PeerKeyring(row.pubkey, row.fingerprint)
            return row.fingerprint, row.uid, self._keyrings[peer.name]
        armored = _http(peer.url.rstrip("/") + "/?request=get-public-key-v1", None,
                        self.settings.peer_timeout)
        try:
            key = describe_public_key(armored)
        except Exception as e:
            raise PeerError(f"peer {peer.name} sent no usable public key: {e}") from None
        if peer.fingerprint and key.fingerprint != peer.fingerprint:
            raise PeerError(f"peer {peer.name} serves key {key.fingerprint}, "
                            f"configured pin is {peer.fingerprint}")
        with self.engine.begin() as conn:
            conn.execute(update(Peer).where(Peer.name == peer.name).values(
                fingerprint=key.fingerprint, uid=key.uid, pubkey=armored,
                pinned_at=int(self.clock()), pinned_by="config" if peer.fingerprint else "tofu"))
        log.info("pinned key %s (%s) for peer %s", key.fingerprint, key.uid, peer.name)
        self._keyrings[peer.name] = PeerKeyring(armored, key.fingerprint)
        return key.fingerprint, key.uid, self._keyrings[peer.name]

    def _sync_branch(self, name: str, branch: str) -> None:
        """Stamps recorded by another host (the log writer moved): put them on the branch."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(CrossStamp.stamp_commit, CrossStamp.stamp_text)
                .where(CrossStamp.peer == name, CrossStamp.state == CrossStampState.DONE,
                       CrossStamp.stamp_commit.is_not(None), CrossStamp.stamp_text.is_not(None))
                .order_by(CrossStamp.id)).all()
        if not rows:
            return
        for oid, stamp_text in rows:
            assert oid is not None and stamp_text is not None
            if not self.repo.has(oid) and self.repo.write_raw_commit(
                    stamp_text.encode("ascii")) != oid:
                raise PeerError(f"recorded stamp {oid} of {name} does not rebuild")
        last = rows[-1][0]
        if last is not None and self.repo.branch_head(branch) != last:
            self.repo.repo.references.create(f"refs/heads/{branch}", last, force=True)

    def _stamp(self, name: str, head: str) -> tuple[str, str]:
        peer = self.peers[name]
        _fpr, uid, keyring = self._peer_key(peer)
        branch = f"{name}-timestamps"
        if self.leader is not None:
            self._sync_branch(name, branch)
        parent = self.repo.branch_head(branch)
        tree = self.repo.commit_tree(head)
        fields = {"request": "stamp-branch-v1", "commit": head, "tree": tree}
        if parent:
            fields["parent"] = parent
        text = _http(peer.url, fields, self.settings.peer_timeout)
        now = int(self.clock())
        checked = check_branch_stamp(text, tree=tree, commit=head, parent=parent, uid=uid,
                                     now=now)
        created = keyring.verify(checked.payload, checked.signature)
        if abs(created - now) >= CLOCK_SKEW:
            raise PeerError(f"signature time is {created - now:+d} s off our clock")
        return self.repo.store_on_branch(text.encode("ascii"), branch, parent), text
