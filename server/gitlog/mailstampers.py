"""Email timestampers stamp the head of our log after every log commit (docs/mail.md,
"Outbound: email timestampers"), a second assurance beside the peers' cross-stamps
(`server.gitlog.peers`).

For each configured timestamper, every new head of ``main`` becomes a `MailStamp` row. A
background task mails it the request (`formats.mailstamps.request_text`) through our SMTP
submission server (failures recorded in the row, retried with exponential backoff); a thread
watches our IMAP mailbox (IDLE, else polling) for replies. A reply from a timestamper's address
is good when its one clear-signed block verifies with the timestamper's pinned key and its
signed text answers a request we sent (`server.gitlog.mailreplies`: quotes it, or, for a
timestamper in digest mode, which is sent only the request's SHA-256, is a stampd receipt of
it); it is then
committed to ``<name>-mailstamps`` and the rows of older heads are superseded. A bad reply
is refused: logged, counted, recorded as the row's last error, marked seen, nothing
committed. A timestamper that never answers makes its
head overdue after ``mail_stamper_overdue_after`` (shown in /readyz, /metrics and the status
page, never a readiness failure) and changes nothing else.

The pinned key is read from ``<data_dir>/mail-stampers/<name>.asc`` and must be the key the
setting's key id names; the log publishes it as ``mailstampers/<name>.asc``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import pygit2
from pygit2.enums import FileMode
from sqlalchemy import Engine, insert, select, update

from formats.mailstamps import (
    BRANCH_SUFFIX,
    DIGEST,
    KEYS_DIR,
    REPLY_FILE,
    REQUEST_FILE,
    MailStampError,
    clearsigned_block,
    request_body,
    request_text,
    stamp_commit,
)
from keystore.gnupg import GpgError, TempGnupgHome
from server.errors import PeerError, StampError
from server.gitlog.mailreplies import Waiting, match_request, reply_body
from server.gitlog.mailtransport import Mailbox, MailError, submit
from server.gitlog.repository import LogRepository
from server.models import MailStamp, MailStampState
from server.setting_values import MailStamperConfig
from server.settings import Settings

log = logging.getLogger(__name__)


class StamperKeyring:
    """A private GNUPGHOME holding exactly one email timestamper's pinned public key."""

    def __init__(self, stamper: MailStamperConfig, armored: str) -> None:
        self.stamper = stamper
        self.armored = armored
        self._home = TempGnupgHome("stampd-m")
        try:
            imported = self._home.import_keys(armored.encode())
        except GpgError as e:
            self.close()
            raise PeerError(e.message) from None
        pinned = [f for f in imported.fingerprints if stamper.pins(f)]
        if not imported.ok or not pinned:
            self.close()
            raise PeerError(f"the key file of {stamper.name} holds no key {stamper.key_id}")
        self.fingerprint = pinned[0]

    def verify(self, block: str) -> tuple[str, int]:
        """(signed text, signature time) of a clear-signed ``block`` with one good signature
        by the pinned key; `MailStampError` otherwise."""
        try:
            ok, status, text = self._home.verify_cleartext(block.encode("utf-8"))
        except GpgError as e:
            raise MailStampError(e.message) from None
        if status.newsig > 1 or len(status.valid_sigs) > 1:
            raise MailStampError("the reply carries more than one signature")
        if not ok or len(status.valid_sigs) != 1 or status.errors:
            why = f" ({', '.join(status.errors)})" if status.errors else ""
            raise MailStampError(f"the reply's signature does not verify with the pinned key "
                                 f"{self.stamper.key_id}{why}")
        sig = status.valid_sigs[0]
        if not (self.stamper.pins(sig.primary) or self.stamper.pins(sig.fingerprint)):
            raise MailStampError(f"the reply is signed by {sig.fingerprint}, not by the "
                                 f"pinned key {self.stamper.key_id}")
        return text.decode("utf-8", "replace"), sig.created

    def close(self) -> None:
        self._home.close()


@dataclass(frozen=True)
class MailStamperStatus:
    """One timestamper as /readyz, /metrics and the status page show it."""

    name: str
    address: str
    last_sent: int | None
    last_reply: int | None
    overdue_since: int | None  # created_at of the oldest head waiting too long; None: none
    failures: int  # failed sends since start
    refused: int  # replies refused since start
    error: str | None  # the last error: sending, the mailbox, a refused reply or the key


class MailStamper:
    def __init__(self, engine: Engine, settings: Settings,
                 clock: Callable[[], float] = time.time,
                 leader: Callable[[], bool] | None = None) -> None:
        self.engine = engine
        self.settings = settings
        self.stampers = {s.name: s for s in settings.mail_stamper_list}
        self.repo = LogRepository(settings.log_repo)  # its own handle, used from threads
        self.clock = clock
        self.leader = leader
        self.keyrings: dict[str, StamperKeyring] = {}
        self.failures: dict[str, int] = dict.fromkeys(self.stampers, 0)
        self.refused: dict[str, int] = dict.fromkeys(self.stampers, 0)
        self.errors: dict[str, str] = {}
        self.mailbox_error: str | None = None
        self._seen: set[int] = set()  # UIDs of messages looked at in this process
        self._wake = asyncio.Event()
        self._stop = threading.Event()
        self._task: asyncio.Task[None] | None = None
        self._receiver: threading.Thread | None = None
        self._mailbox: Mailbox | None = None

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        if not self.stampers:
            return
        self.load_keys()
        self._task = asyncio.create_task(self._run(), name="mail-stamper")
        self._receiver = threading.Thread(target=self._receive_loop, name="mail-replies",
                                          daemon=True)
        self._receiver.start()

    async def stop(self) -> None:
        self._stop.set()
        mailbox = self._mailbox
        if mailbox is not None:
            mailbox.abort()  # (ends a wait in IDLE at once)
        task, receiver, self._task, self._receiver = self._task, self._receiver, None, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if receiver is not None:
            await asyncio.to_thread(receiver.join, self.settings.mail_stamper_timeout + 5)
        for kr in self.keyrings.values():
            kr.close()
        self.keyrings.clear()

    def load_keys(self) -> None:
        """Each timestamper's pinned key from its file; a missing or wrong one is that
        timestamper's error (shown, retried at each send), never the server's."""
        for name, stamper in self.stampers.items():
            if name in self.keyrings:
                continue
            path = self.settings.mail_stamper_keys / f"{name}.asc"
            try:
                self.keyrings[name] = StamperKeyring(stamper, path.read_text())
                self.errors.pop(name, None)
            except OSError as e:
                self.errors[name] = f"cannot read its key {path}: {e.strerror}"
            except PeerError as e:
                self.errors[name] = e.message

    def published_keys(self) -> dict[str, str]:
        """``mailstampers/<name>.asc`` of each pinned key, for the next log commit."""
        return {f"{KEYS_DIR}/{n}.asc": kr.armored for n, kr in self.keyrings.items()}

    # -- the API for the log committer ----------------------------------------------------------
    def head_committed(self, head: str) -> None:
        """Called (from a thread) after each log commit: every timestamper should stamp it."""
        if not self.stampers:
            return
        now = int(self.clock())
        with self.engine.begin() as conn:
            for name in self.stampers:
                exists = conn.execute(select(MailStamp.id).where(
                    MailStamp.stamper == name, MailStamp.log_commit == head)).first()
                if exists is None:
                    conn.execute(insert(MailStamp).values(
                        stamper=name, log_commit=head, state=MailStampState.PENDING,
                        attempts=0, refused=0, next_attempt_at=0, created_at=now,
                        updated_at=now))

    def wake(self) -> None:
        self._wake.set()

    # -- sending -------------------------------------------------------------------------------
    async def _run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):
                    await self._wake.wait()
            self._wake.clear()
            try:
                if self.leader is not None and not await asyncio.to_thread(self.leader):
                    continue
                await asyncio.to_thread(self.send_due)
            except Exception:
                log.exception("cannot send the email timestamp requests")

    def due(self) -> dict[str, tuple[int, str]]:
        """The newest pending head per timestamper whose time has come; older pending (not
        yet sent) rows of the same timestamper are superseded."""
        now = int(self.clock())
        due: dict[str, tuple[int, str]] = {}
        with self.engine.begin() as conn:
            rows = conn.execute(
                select(MailStamp.id, MailStamp.stamper, MailStamp.log_commit,
                       MailStamp.next_attempt_at)
                .where(MailStamp.state == MailStampState.PENDING)
                .order_by(MailStamp.id.desc())).all()
            newest: set[str] = set()
            for row_id, name, head, next_at in rows:
                if name not in self.stampers:
                    continue
                if name not in newest:
                    newest.add(name)
                    if next_at <= now:
                        due[name] = (row_id, head)
                else:
                    conn.execute(update(MailStamp).where(MailStamp.id == row_id).values(
                        state=MailStampState.SUPERSEDED, updated_at=now))
        return due

    def send_due(self) -> dict[str, tuple[int, str]]:
        """Send every due request (in this thread); what was due."""
        due = self.due()
        for name, (row_id, head) in due.items():
            try:
                self._send(name, row_id, head)
            except StampError as e:
                self._failed(name, row_id, e.message)
            except Exception as e:  # a bug or an I/O error: recorded, retried, never fatal
                log.exception("email timestamp request to %s failed unexpectedly", name)
                self._failed(name, row_id, f"{type(e).__name__}: {e}")
        return due

    def _send(self, name: str, row_id: int, head: str) -> None:
        stamper = self.stampers[name]
        self.load_keys()  # (a key file put in place since)
        if name not in self.keyrings:
            raise MailError(self.errors.get(name, "no pinned key"))
        number, checkpoint = self._commit_facts(head)
        text = request_text(head, number, checkpoint)
        smtp = self.settings.mail_smtp_server
        assert smtp is not None  # (the settings require it with timestampers)
        message_id = submit(smtp, self.settings.mail_from, stamper.address,
                            f"stampd log commit {number or ''}".rstrip(),
                            request_body(text, stamper.mode),
                            starttls=self.settings.mail_starttls,
                            ca_file=self.settings.mail_ca_file,
                            timeout=self.settings.mail_stamper_timeout)
        now = int(self.clock())
        with self.engine.begin() as conn:
            conn.execute(update(MailStamp).where(MailStamp.id == row_id).values(
                state=MailStampState.SENT, sent_at=now, sent_text=text, message_id=message_id,
                attempts=MailStamp.attempts + 1, updated_at=now, last_error=None))
        self.errors.pop(name, None)
        log.info("sent log head %s to email timestamper %s (%s)", head, name, message_id)

    def _commit_facts(self, head: str) -> tuple[int | None, str | None]:
        """The log commit number of ``head`` and its transparency log checkpoint, if any."""
        message = self.repo.message(head)
        first = message.split("\n", 1)[0]
        number = int(first.rsplit(" ", 1)[1]) if first.startswith("stampd log commit ") \
            and first.rsplit(" ", 1)[1].isdigit() else None
        commit = self.repo.repo[head]
        assert isinstance(commit, pygit2.Commit)
        checkpoint = None
        with contextlib.suppress(KeyError):
            blob = commit.tree["tlog-checkpoint"]
            if isinstance(blob, pygit2.Blob):
                checkpoint = blob.data.decode("utf-8", "replace")
        return number, checkpoint

    def _failed(self, name: str, row_id: int, error: str) -> None:
        now = int(self.clock())
        self.failures[name] = self.failures.get(name, 0) + 1
        self.errors[name] = error
        with self.engine.begin() as conn:
            attempts = conn.execute(select(MailStamp.attempts).where(
                MailStamp.id == row_id)).scalar_one() + 1
            delay = min(self.settings.mail_stamper_retry_base * 2 ** (attempts - 1),
                        self.settings.mail_stamper_retry_max)
            conn.execute(update(MailStamp).where(MailStamp.id == row_id).values(
                attempts=attempts, last_error=error[:2000], updated_at=now,
                next_attempt_at=now + int(delay)))
        log.warning("email timestamp request %d to %s failed (attempt %d, retry in %ds): %s",
                    row_id, name, attempts, int(delay), error)

    # -- receiving -----------------------------------------------------------------------------
    def _open_mailbox(self) -> Mailbox:
        imap = self.settings.mail_imap_server
        assert imap is not None
        return Mailbox(imap, self.settings.mail_folder, starttls=self.settings.mail_starttls,
                       ca_file=self.settings.mail_ca_file,
                       timeout=self.settings.mail_stamper_timeout)

    def _receive_loop(self) -> None:
        """The replies' thread: a session kept open, looked through, then IDLE (or a pause)
        until new mail; a failure is recorded and the session opened again after a backoff."""
        failures = 0
        while not self._stop.is_set():
            try:
                if self.leader is not None and not self.leader():
                    self._stop.wait(self.settings.mail_stamper_poll_interval)
                    continue
                self._mailbox = mailbox = self._open_mailbox()
                try:
                    while not self._stop.is_set():
                        if self.leader is not None and not self.leader():
                            break  # (another process writes the log now)
                        self.collect(mailbox)
                        failures = 0
                        if mailbox.can_idle:
                            mailbox.idle(self.settings.mail_stamper_poll_interval, self._stop)
                        else:
                            self._stop.wait(self.settings.mail_stamper_poll_interval)
                finally:
                    self._mailbox = None
                    mailbox.close()
            except MailError as e:
                if self._stop.is_set():
                    break
                failures += 1
                self.mailbox_error = e.message
                log.warning("the mailbox of the email timestamps' replies: %s", e.message)
                self._stop.wait(min(self.settings.mail_stamper_retry_base * 2 ** (failures - 1),
                                    self.settings.mail_stamper_retry_max))
            except Exception:
                log.exception("the mailbox of the email timestamps' replies failed")
                self._stop.wait(self.settings.mail_stamper_retry_max)

    def collect_once(self) -> int:
        """Open the mailbox, look through it once, close it; replies accepted. (Tests, and a
        step the loop repeats.)"""
        mailbox = self._open_mailbox()
        try:
            return self.collect(mailbox)
        finally:
            mailbox.close()

    def collect(self, mailbox: Mailbox) -> int:
        """Check every new message from a timestamper's address; replies accepted."""
        self.mailbox_error = None
        accepted = 0
        by_address = {s.address.lower(): s for s in self.stampers.values()}
        for uid, raw in mailbox.unseen():
            if uid in self._seen:
                continue
            sender, body = reply_body(raw)
            stamper = by_address.get(sender)
            if stamper is None:  # (not a reply of ours: left unseen)
                self._seen.add(uid)
                continue
            try:
                self._check_and_commit(stamper, body)
                accepted += 1
            except MailStampError as e:
                self._refuse(stamper.name, str(e))
            mailbox.mark_seen(uid)
            self._seen.add(uid)
        return accepted

    def _refuse(self, name: str, why: str) -> None:
        self.refused[name] = self.refused.get(name, 0) + 1
        self.errors[name] = f"reply refused: {why}"
        log.warning("refused a reply of email timestamper %s: %s", name, why)
        now = int(self.clock())
        with self.engine.begin() as conn:
            row = conn.execute(select(MailStamp.id).where(
                MailStamp.stamper == name, MailStamp.state == MailStampState.SENT)
                .order_by(MailStamp.id.desc())).first()
            if row is not None:
                conn.execute(update(MailStamp).where(MailStamp.id == row[0]).values(
                    refused=MailStamp.refused + 1, last_error=f"reply refused: {why}"[:2000],
                    updated_at=now))

    def _check_and_commit(self, stamper: MailStamperConfig, body: str) -> None:
        keyring = self.keyrings.get(stamper.name)
        if keyring is None:
            raise MailStampError(self.errors.get(stamper.name, "no pinned key"))
        block = clearsigned_block(body)
        signed, created = keyring.verify(block)
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(MailStamp.id, MailStamp.log_commit, MailStamp.sent_text,
                       MailStamp.sent_at)
                .where(MailStamp.stamper == stamper.name,
                       MailStamp.state == MailStampState.SENT)
                .order_by(MailStamp.id.desc())).all()
        match = match_request(signed, created, stamper.mode, [Waiting(*r) for r in rows])
        request = match.sent_text if stamper.mode == DIGEST else None
        now = int(self.clock())
        if self.leader is not None:
            self._sync_branch(stamper.name)
        oid, raw = self._commit(stamper.name, match.log_commit, block, now, request)
        with self.engine.begin() as conn:
            conn.execute(update(MailStamp).where(MailStamp.id == match.id).values(
                state=MailStampState.DONE, replied_at=now, reply_text=block,
                stamp_commit=oid, stamp_text=raw.decode("utf-8"), updated_at=now,
                last_error=None))
            conn.execute(update(MailStamp).where(
                MailStamp.stamper == stamper.name, MailStamp.id < match.id,
                MailStamp.state.in_([MailStampState.SENT, MailStampState.PENDING])).values(
                state=MailStampState.SUPERSEDED, updated_at=now))
        self.errors.pop(stamper.name, None)
        log.info("email timestamper %s stamped log head %s: %s", stamper.name,
                 match.log_commit, oid)

    def _reply_tree(self, block: str, request: str | None = None) -> str:
        """The tree of a reply: ``mailstamp.asc``, and in digest mode ``request.txt``."""
        repo = self.repo.repo
        builder = repo.TreeBuilder()
        builder.insert(REPLY_FILE, repo.create_blob(block.encode("utf-8")), FileMode.BLOB)
        if request is not None:
            builder.insert(REQUEST_FILE, repo.create_blob(request.encode("utf-8")),
                           FileMode.BLOB)
        return str(builder.write())

    def _commit(self, name: str, head: str, block: str, when: int,
                request: str | None = None) -> tuple[str, bytes]:
        """Put the reply on ``<name>-mailstamps``: a commit over the previous one and
        ``head`` (``request``: the request text a digest-mode reply stamps); (its id, the raw
        commit)."""
        branch = f"{name}{BRANCH_SUFFIX}"
        previous = self.repo.branch_head(branch)
        raw = stamp_commit(self._reply_tree(block, request),
                           [p for p in (previous, head) if p],
                           f"stampd <{self.settings.mail_from}>", when, name, head)
        return self.repo.store_on_branch(raw, branch, previous), raw

    def _sync_branch(self, name: str) -> None:
        """Replies recorded by another host (the log writer moved here): put them on the
        branch first, each rebuilt from its row and checked to have the recorded id."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(MailStamp.stamp_commit, MailStamp.stamp_text, MailStamp.reply_text,
                       MailStamp.sent_text)
                .where(MailStamp.stamper == name, MailStamp.state == MailStampState.DONE,
                       MailStamp.stamp_commit.is_not(None), MailStamp.stamp_text.is_not(None),
                       MailStamp.reply_text.is_not(None))
                .order_by(MailStamp.id)).all()
        digest = name in self.stampers and self.stampers[name].mode == DIGEST
        for oid, raw, reply, sent in rows:
            assert oid is not None and raw is not None and reply is not None
            if not self.repo.has(oid):
                self._reply_tree(reply, sent if digest else None)
                if self.repo.write_raw_commit(raw.encode("utf-8")) != oid:
                    raise MailStampError(f"recorded reply {oid} of {name} does not rebuild")
        last = rows[-1][0] if rows else None
        branch = f"{name}{BRANCH_SUFFIX}"
        if last is not None and self.repo.branch_head(branch) != last:
            self.repo.repo.references.create(f"refs/heads/{branch}", last, force=True)

    # -- state ---------------------------------------------------------------------------------
    def statuses(self) -> list[MailStamperStatus]:
        if not self.stampers:
            return []
        cutoff = int(self.clock() - self.settings.mail_stamper_overdue_after)
        out = []
        with self.engine.connect() as conn:
            for name, s in self.stampers.items():
                sent = conn.execute(select(MailStamp.sent_at).where(
                    MailStamp.stamper == name, MailStamp.sent_at.is_not(None))
                    .order_by(MailStamp.sent_at.desc())).scalar()
                replied = conn.execute(select(MailStamp.replied_at).where(
                    MailStamp.stamper == name, MailStamp.replied_at.is_not(None))
                    .order_by(MailStamp.replied_at.desc())).scalar()
                waiting = conn.execute(select(MailStamp.created_at).where(
                    MailStamp.stamper == name,
                    MailStamp.state.in_([MailStampState.PENDING, MailStampState.SENT]),
                    MailStamp.created_at < cutoff).order_by(MailStamp.created_at)).scalar()
                error = self.errors.get(name) or self.mailbox_error
                out.append(MailStamperStatus(name, s.address, sent, replied, waiting,
                                             self.failures.get(name, 0),
                                             self.refused.get(name, 0), error))
        return out
