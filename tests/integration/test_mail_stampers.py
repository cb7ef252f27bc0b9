"""Email timestampers (issue 41, outbound), in-process against real mail servers.

Our log is written by the real `LogCommitter` (signed over a real gpg-agent through
`InProcessDispatcher`), whose ``on_commit`` is the mail stamper's ``head_committed``. Requests go
through a real Postfix (submission: STARTTLS, login) into a real Dovecot; the replies come back
the same way and are read over IMAP (STARTTLS, login, IDLE) — the ``mail_servers`` fixture,
tests/mailservers.py. The timestamper on the other side is `Responder`: it reads the stamper's
mailbox over IMAP and answers each request with a ``gpg --clearsign`` reply (real gpg, a
committed test key) quoting it. The stored replies are checked with ``gpg --verify``.

The mail stamper's steps (``send_due``, ``collect_once``) are called directly; one test runs its
loops (IDLE). Backoff and the overdue state follow an injected clock: nothing sleeps to wait
for a time. Waiting for a message to be delivered is waiting for a condition.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
from sqlalchemy import select

from client.audit import audit
from server import db
from server.gitlog.committer import CommitterConfig, LogCommitter
from server.gitlog.mailstampers import MailStamper
from server.gitlog.mailtransport import MailError
from server.gitlog.repository import LogRepository
from server.models import MailStamp, MailStampState
from server.settings import Settings
from server.stamping.journal import Journal
from server.stamping.requests import TagRequest
from tests.helpers import TEST_PUBLIC_KEY, InProcessDispatcher, migrated_sqlite
from tests.mailservers import IMPOSTOR_KEY, STAMPER_KEY, MailServers, Responder, key_fpr

PUBKEY = TEST_PUBLIC_KEY.read_text()


class Clock:
    def __init__(self, t: float) -> None:
        self.t = float(t)

    def __call__(self) -> float:
        return self.t


class Node:
    """Our side: settings, database, a log committer and the mail stamper under test."""

    def __init__(self, data_dir: Path, servers: MailServers, clock: Clock,
                 dispatcher: InProcessDispatcher, *, imap_password: str | None = None,
                 mode: str = "", **extra: object) -> None:
        me = servers.users["stampd@mail.test"]
        keys_dir = data_dir / "mail-stampers"
        keys_dir.mkdir(parents=True)
        shutil.copy(STAMPER_KEY.with_suffix(".pub.asc"), keys_dir / "pgp.asc")
        user = quote(me.address, safe="")
        self.password = me.password
        self.settings = Settings(
            data_dir=data_dir, mail_from=me.address,
            mail_stampers=f"pgp=stamper@mail.test#{key_fpr(STAMPER_KEY)[-16:]}"
                          + (f":{mode}" if mode else ""),
            mail_smtp=f"smtp://{user}:{quote(me.password, safe='')}@{servers.host}:"
                      f"{servers.smtp_port}",
            mail_imap=f"imap://{user}:{quote(imap_password or me.password, safe='')}@"
                      f"{servers.host}:{servers.imap_port}",
            mail_ca_file=servers.ca.ca_file,
            mail_stamper_timeout=20, mail_stamper_retry_base=60, mail_stamper_retry_max=3600,
            mail_stamper_overdue_after=6 * 3600,
            **{"mail_stamper_poll_interval": 5, **extra})
        self.engine = db.make_engine(migrated_sqlite(self.settings.data_dir / "stampd.sqlite3"))
        self.clock = clock
        self.mail = MailStamper(self.engine, self.settings, clock)
        self.mail.load_keys()  # (what start() does before it starts its loops)
        self.repo = LogRepository(self.settings.log_repo)
        self.committer = LogCommitter(self.engine, self.repo, dispatcher,
                                      CommitterConfig(PUBKEY, 3600, clock=clock),
                                      on_commit=self.mail.head_committed,
                                      extra_files=self.mail.published_keys)
        self._stamps = 0

    async def new_head(self) -> str:
        self._stamps += 1
        journal = Journal(self.engine)
        journal.start()
        try:
            sid = await journal.record(TagRequest(f"{self._stamps:040x}", "t"),
                                       int(self.clock()))
            journal.signed(sid, "w1", 1, None)
        finally:
            await journal.stop()
        head = await self.committer.commit_now()
        assert head is not None
        return head

    def rows(self) -> list[tuple[str, str, int, int, str | None, int]]:
        """(log commit, state, attempts, refused, last error, next attempt) by id."""
        with self.engine.connect() as conn:
            return [tuple(r) for r in conn.execute(select(  # type: ignore[misc]
                MailStamp.log_commit, MailStamp.state, MailStamp.attempts, MailStamp.refused,
                MailStamp.last_error, MailStamp.next_attempt_at).order_by(MailStamp.id))]

    def collect_until(self, accepted: int = 1, looked: int = 1, timeout: float = 30) -> int:
        """Look through the mailbox until ``looked`` replies were handled (delivery takes a
        moment: a condition, not a timing); replies accepted."""
        deadline = time.monotonic() + timeout
        got = 0
        while True:
            got += self.mail.collect_once()
            handled = got + sum(self.mail.refused.values())
            if handled >= looked or time.monotonic() > deadline:
                return got
            time.sleep(0.2)

    def close(self) -> None:
        asyncio.run(self.mail.stop())
        self.engine.dispose()


@contextlib.contextmanager
def node_and_responder(data_dir: Path, servers: MailServers,
                       dispatcher: InProcessDispatcher, mode: str = ""
                       ) -> Iterator[tuple[Node, Responder, Clock]]:
    clock = Clock(time.time())
    node = Node(data_dir, servers, clock, dispatcher, mode=mode)
    responder = Responder(servers, servers.users["stamper@mail.test"])
    try:
        yield node, responder, clock
    finally:
        responder.close()
        node.close()


@pytest.fixture
def setup(tmp_path: Path, mail_servers: MailServers, inproc_dispatcher: InProcessDispatcher
          ) -> Iterator[tuple[Node, Responder, Clock]]:
    with node_and_responder(tmp_path / "data", mail_servers, inproc_dispatcher) as parts:
        yield parts


def gpg_verify(text: str, pubkey: Path, home: Path) -> subprocess.CompletedProcess[str]:
    """The stock tool: ``gpg --verify`` with only ``pubkey`` known."""
    home.mkdir(mode=0o700, parents=True)
    subprocess.run(["gpg", "--homedir", str(home), "--batch", "--import", str(pubkey)],
                   capture_output=True, timeout=60, check=True)
    return subprocess.run(["gpg", "--homedir", str(home), "--batch", "--status-fd", "1",
                           "--verify"], input=text, capture_output=True, text=True,
                          timeout=60, check=False)


def rebuilt_elsewhere(node: Node, path: Path, clock: Clock) -> LogRepository:
    """Another host that becomes the log writer: its log repository at ``path`` synced from
    the database, the mail stamper's branch rebuilt there from the rows."""
    other = LogRepository(path)
    LogCommitter(node.engine, other, node.committer.dispatcher,
                 CommitterConfig(PUBKEY, 3600, clock=clock)).sync_from_db()
    node.mail.repo = other
    try:
        node.mail._sync_branch("pgp")
    finally:
        node.mail.repo = node.repo
    return other


def branch_file(node: Node, oid: str, name: str) -> str | None:
    import pygit2

    commit = node.repo.repo[oid]
    assert isinstance(commit, pygit2.Commit)
    try:
        blob = commit.tree[name]
    except KeyError:
        return None
    assert isinstance(blob, pygit2.Blob)
    return blob.data.decode()


def branch_commit(node: Node, oid: str) -> tuple[list[str], str]:
    import pygit2

    commit = node.repo.repo[oid]
    assert isinstance(commit, pygit2.Commit)
    blob = commit.tree["mailstamp.asc"]
    assert isinstance(blob, pygit2.Blob)
    return [str(p) for p in commit.parent_ids], blob.data.decode()


# ---------------------------------------------------------------------------------------------


def test_reply_is_verified_and_committed(setup: tuple[Node, Responder, Clock], tmp_path: Path,
                                         caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    node, responder, _clock = setup
    first = asyncio.run(node.new_head())
    assert node.rows() == [(first, MailStampState.PENDING, 0, 0, None, 0)]

    assert node.mail.send_due() == {"pgp": (1, first)}
    assert [r[:3] for r in node.rows()] == [(first, MailStampState.SENT, 1)]
    [request] = responder.requests(1)
    body = request.get_body().get_content().replace("\r\n", "\n")  # type: ignore[union-attr]
    assert f"git commit: {first}\n" in body and body.startswith("stampd log commit 1\n")
    assert request["From"] == "stampd@mail.test"

    responder.answer(request)
    assert node.collect_until() == 1
    [(head, state, _, refused, error, _)] = node.rows()
    assert (head, state, refused, error) == (first, MailStampState.DONE, 0, None)
    stamp = node.repo.branch_head("pgp-mailstamps")
    assert stamp is not None
    parents, reply = branch_commit(node, stamp)
    assert parents == [first]
    ok = gpg_verify(reply, STAMPER_KEY.with_suffix(".pub.asc"), tmp_path / "v1")
    assert ok.returncode == 0 and f"VALIDSIG {key_fpr(STAMPER_KEY)}" in ok.stdout, ok.stderr
    assert f"git commit: {first}" in reply

    # The next log commit publishes the pinned key; its request chains on the branch.
    second = asyncio.run(node.new_head())
    tree = node.repo.repo[second].tree  # type: ignore[attr-defined]
    assert tree["mailstampers/pgp.asc"].data.decode() == STAMPER_KEY.with_suffix(
        ".pub.asc").read_text()
    assert node.mail.send_due() == {"pgp": (2, second)}
    requests = responder.requests(2)
    responder.answer(requests[-1])
    assert node.collect_until() == 1
    newer = node.repo.branch_head("pgp-mailstamps")
    assert newer is not None and branch_commit(node, newer)[0] == [stamp, second]
    [status] = node.mail.statuses()
    assert status.last_reply is not None and status.overdue_since is None
    assert status.error is None

    # stampd audit checks the replies with the key the log publishes, and counts them as stamps.
    report = audit(node.settings.log_repo)
    assert report.ok, [str(f) for f in report.failures]
    [mail] = report.mail
    assert (mail.name, mail.commits, mail.valid) == ("pgp", 2, 2)
    assert mail.fingerprint == key_fpr(STAMPER_KEY)
    assert [e.stamp.peer if e.stamp else None for e in report.log] == ["pgp (mail)"] * 2

    # A reply moved onto another main commit quotes the wrong request: the audit fails it.
    first_reply = branch_commit(node, stamp)[1]
    forged, _raw = node.mail._commit("pgp", second, first_reply, int(_clock()))
    report = audit(node.settings.log_repo)
    assert [(f.check, f.rule, f.commit) for f in report.failures] == [
        ("mailstamps", "quote", forged)]

    # Another host that becomes the log writer rebuilds the branch from the database.
    other = rebuilt_elsewhere(node, tmp_path / "other.git", _clock)
    assert other.branch_head("pgp-mailstamps") == newer
    assert branch_commit(node, newer)[1] == other.repo[newer].tree[  # type: ignore[attr-defined]
        "mailstamp.asc"].data.decode()

    # The credentials are in no log line and in no object of the log.
    assert node.password not in caplog.text
    objects = node.repo.repo.odb
    assert not any(node.password.encode() in objects.read(oid)[1] for oid in objects)


def assert_refused(node: Node, n: int, why: str, caplog: pytest.LogCaptureFixture) -> None:
    """The ``n``-th reply, just sent, is refused for ``why``: counted, recorded in the row,
    logged, nothing committed."""
    assert node.collect_until(looked=n) == 0
    assert node.mail.refused == {"pgp": n}
    [(_, state, _, refused, error, _)] = node.rows()
    assert (state, refused) == (MailStampState.SENT, n)
    assert error is not None and why in error, error
    assert why in caplog.text
    assert node.repo.branch_head("pgp-mailstamps") is None


def test_bad_replies_are_refused_and_nothing_is_committed(
        setup: tuple[Node, Responder, Clock], caplog: pytest.LogCaptureFixture) -> None:
    node, responder, _clock = setup
    head = asyncio.run(node.new_head())
    node.mail.send_due()
    [request] = responder.requests(1)
    quoted = request.get_body().get_content()  # type: ignore[union-attr]

    cases = [
        ({"key": IMPOSTOR_KEY}, "NO_PUBKEY"),  # the right text, another key
        ({"tamper": True}, "BADSIG"),  # signed text altered
        ({"body": quoted.replace(head, "0" * 40)}, "quotes no request"),  # another head
    ]
    for n, (how, why) in enumerate(cases, start=1):
        responder.answer(request, **how)  # type: ignore[arg-type]
        assert_refused(node, n, why, caplog)

    # Refused replies are marked seen, not looked at again; a good one is then accepted.
    responder.answer(request)
    assert node.collect_until() == 1
    assert node.rows()[0][1] == MailStampState.DONE
    assert node.mail.refused == {"pgp": 3}


@pytest.fixture
def digest_setup(tmp_path: Path, mail_servers: MailServers,
                 inproc_dispatcher: InProcessDispatcher
                 ) -> Iterator[tuple[Node, Responder, Clock]]:
    """A timestamper in digest mode (another stampd's mail listener, played by `Responder`)."""
    with node_and_responder(tmp_path / "data", mail_servers, inproc_dispatcher,
                            "digest") as parts:
        yield parts


def sent_text(node: Node, head: str) -> str:
    with node.engine.connect() as conn:
        text = conn.execute(select(MailStamp.sent_text).where(
            MailStamp.log_commit == head)).scalar_one()
    assert text is not None
    return text


def test_digest_mode_receipt_is_verified_and_committed(
        digest_setup: tuple[Node, Responder, Clock], tmp_path: Path) -> None:
    """Digest mode: the request mailed is only the SHA-256 of the request text; the reply, a
    stampd receipt of it, is committed with the request text, and the audit checks both."""
    node, responder, clock = digest_setup
    first = asyncio.run(node.new_head())
    assert node.mail.send_due() == {"pgp": (1, first)}
    [request] = responder.requests(1)
    text = sent_text(node, first)
    assert text.startswith("stampd log commit 1\n") and f"git commit: {first}\n" in text
    digest = hashlib.sha256(text.encode()).hexdigest()
    body = request.get_body().get_content()  # type: ignore[union-attr]
    assert body.strip() == digest and first not in body

    responder.answer_receipt(request)
    assert node.collect_until() == 1
    assert node.rows()[0][:2] == (first, MailStampState.DONE)
    stamp = node.repo.branch_head("pgp-mailstamps")
    assert stamp is not None
    parents, reply = branch_commit(node, stamp)
    assert parents == [first]
    assert branch_file(node, stamp, "request.txt") == text
    ok = gpg_verify(reply, STAMPER_KEY.with_suffix(".pub.asc"), tmp_path / "v1")
    assert ok.returncode == 0 and f"VALIDSIG {key_fpr(STAMPER_KEY)}" in ok.stdout, ok.stderr
    assert f"digest: {digest}\n" in reply

    second = asyncio.run(node.new_head())
    node.mail.send_due()
    responder.answer_receipt(responder.requests(2)[-1])
    assert node.collect_until() == 1
    newer = node.repo.branch_head("pgp-mailstamps")
    assert newer is not None and branch_commit(node, newer)[0] == [stamp, second]

    report = audit(node.settings.log_repo)
    assert report.ok, [str(f) for f in report.failures]
    [mail] = report.mail
    assert (mail.name, mail.commits, mail.valid) == ("pgp", 2, 2)

    # Forged onto another main commit: the first reply with its request (not the request
    # of the stamped commit), or with the stamped commit's request (not the digest stamped).
    forged, _ = node.mail._commit("pgp", second, reply, int(clock()), text)
    wrong, _ = node.mail._commit("pgp", second, reply, int(clock()), sent_text(node, second))
    report = audit(node.settings.log_repo)
    assert sorted((f.check, f.rule, f.commit) for f in report.failures) == sorted([
        ("mailstamps", "request", forged), ("mailstamps", "digest", wrong)])

    # Another log writer rebuilds the branch, request.txt and all.
    other = rebuilt_elsewhere(node, tmp_path / "other.git", clock)
    assert other.branch_head("pgp-mailstamps") == newer
    assert "request.txt" in other.repo[newer].tree  # type: ignore[attr-defined]


def test_digest_mode_bad_receipts_are_refused(
        digest_setup: tuple[Node, Responder, Clock], caplog: pytest.LogCaptureFixture) -> None:
    node, responder, _clock = digest_setup
    asyncio.run(node.new_head())
    node.mail.send_due()
    [request] = responder.requests(1)
    digest = request.get_body().get_content().strip()  # type: ignore[union-attr]

    cases = [
        (lambda: responder.answer_receipt(request, digest="0" * 64),
         "names the digest of no request"),  # a receipt of another digest
        (lambda: responder.answer_receipt(request, key=IMPOSTOR_KEY),
         "NO_PUBKEY"),  # the right receipt, signed by another key
        (lambda: responder.answer(request), "no stampd receipt"),  # a quoting reply
    ]
    for n, (answer, why) in enumerate(cases, start=1):
        answer()
        assert_refused(node, n, why, caplog)

    responder.answer_receipt(request, digest=digest.upper())  # (not how a receipt writes it)
    assert node.collect_until(looked=4) == 0
    responder.answer_receipt(request)
    assert node.collect_until() == 1
    assert node.rows()[0][1] == MailStampState.DONE


def test_submission_server_down_backs_off(setup: tuple[Node, Responder, Clock],
                                          mail_servers: MailServers) -> None:
    node, responder, clock = setup
    t0 = int(clock())
    head = asyncio.run(node.new_head())
    mail_servers.stop_postfix()
    assert node.mail.send_due() == {"pgp": (1, head)}
    [(_, state, attempts, _, error, next_at)] = node.rows()
    assert (state, attempts, next_at) == (MailStampState.PENDING, 1, t0 + 60)
    assert error is not None and "cannot send by smtp://" in error
    assert node.password not in error and "%40" not in error
    clock.t = t0 + 59
    assert node.mail.send_due() == {}
    clock.t = t0 + 60
    node.mail.send_due()
    assert node.rows()[0][2:6:3] == (2, t0 + 60 + 120)

    mail_servers.start_postfix()
    clock.t = t0 + 180
    assert node.mail.send_due() == {"pgp": (1, head)}
    assert node.rows()[0][1:3] == (MailStampState.SENT, 3)
    assert len(responder.requests(1)) == 1


def test_wrong_imap_credentials(tmp_path: Path, mail_servers: MailServers,
                                inproc_dispatcher: InProcessDispatcher) -> None:
    node = Node(tmp_path / "data", mail_servers, Clock(time.time()), inproc_dispatcher,
                imap_password="not-the-password")
    try:
        with pytest.raises(MailError) as refused:
            node.mail.collect_once()
        assert "refused our login" in refused.value.message
        assert "not-the-password" not in refused.value.message
        assert str(mail_servers.imap_port) in refused.value.message
    finally:
        node.close()


def test_mailbox_down_is_shown_and_changes_nothing_else(
        setup: tuple[Node, Responder, Clock], mail_servers: MailServers) -> None:
    """Dovecot down (IMAP, and with it the submission's login, which it checks): the replies'
    thread records the error (shown with the timestamper), backs off, and stops at once when
    told; the log goes on, the request waits for its retry."""
    node, _responder, _clock = setup
    mail_servers.stop_dovecot()
    with pytest.raises(MailError, match="cannot reach imap://"):
        node.mail.collect_once()
    thread = threading.Thread(target=node.mail._receive_loop)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while node.mail.mailbox_error is None:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert "cannot reach imap://" in (node.mail.statuses()[0].error or "")
        head = asyncio.run(node.new_head())
        assert node.mail.send_due() == {"pgp": (1, head)}
        assert node.rows()[0][1:3] == (MailStampState.PENDING, 1)
    finally:
        node.mail._stop.set()
        thread.join(timeout=30)
    assert not thread.is_alive()  # (woken from its backoff by the stop)


def test_silent_stamper_is_overdue_and_changes_nothing_else(
        setup: tuple[Node, Responder, Clock]) -> None:
    node, responder, clock = setup
    t0 = int(clock())
    first = asyncio.run(node.new_head())
    node.mail.send_due()
    responder.requests(1)  # (delivered; never answered)
    assert node.mail.collect_once() == 0
    [status] = node.mail.statuses()
    assert status.overdue_since is None and status.last_sent == t0

    clock.t = t0 + 6 * 3600
    assert node.mail.statuses()[0].overdue_since is None
    clock.t = t0 + 6 * 3600 + 1
    assert node.mail.statuses()[0].overdue_since == t0
    # The log goes on: the next commit is made and requested as ever.
    second = asyncio.run(node.new_head())
    assert second != first
    assert node.mail.send_due() == {"pgp": (2, second)}
    assert [r[1] for r in node.rows()] == [MailStampState.SENT, MailStampState.SENT]


def test_loops_send_and_collect_with_idle(setup: tuple[Node, Responder, Clock]) -> None:
    """The running stamper: its task sends when woken, its thread waits in IMAP IDLE and
    commits the reply once it arrives; stop ends the IDLE at once."""
    node, responder, _clock = setup

    async def run() -> None:
        node.mail.start()
        head = await node.new_head()
        node.mail.wake()
        [request] = await asyncio.to_thread(responder.requests, 1)
        await asyncio.to_thread(responder.answer, request)
        deadline = time.monotonic() + 60
        while node.repo.branch_head("pgp-mailstamps") is None:
            assert time.monotonic() < deadline, node.mail.statuses()
            await asyncio.sleep(0.1)
        assert node.rows()[0][:2] == (head, MailStampState.DONE)
        receiver = node.mail._receiver
        await node.mail.stop()
        assert receiver is not None and not receiver.is_alive()

    asyncio.run(run())


def test_polling_where_the_server_offers_no_idle(
        tmp_path: Path, inproc_dispatcher: InProcessDispatcher) -> None:
    """A mailbox without IDLE is looked at every STAMPD_MAIL_STAMPER_POLL_INTERVAL seconds."""
    servers = MailServers(["stampd", "stamper"], idle=False)
    servers.start()
    clock = Clock(time.time())
    node = Node(tmp_path / "data", servers, clock, inproc_dispatcher,
                mail_stamper_poll_interval=0.2)
    responder = Responder(servers, servers.users["stamper@mail.test"])
    try:
        mailbox = node.mail._open_mailbox()
        assert not mailbox.can_idle
        mailbox.close()

        async def run() -> None:
            node.mail.start()
            await node.new_head()
            node.mail.wake()
            [request] = await asyncio.to_thread(responder.requests, 1)
            await asyncio.to_thread(responder.answer, request)
            deadline = time.monotonic() + 60
            while node.repo.branch_head("pgp-mailstamps") is None:
                assert time.monotonic() < deadline, node.mail.statuses()
                await asyncio.sleep(0.1)
            await node.mail.stop()

        asyncio.run(run())
    finally:
        responder.close()
        node.close()
        servers.stop()


def test_settings_need_the_account() -> None:
    with pytest.raises(ValueError, match="STAMPD_MAIL_FROM"):
        Settings(mail_stampers="pgp=a@b.example#0123456789ABCDEF")
    with pytest.raises(ValueError, match="key id"):
        Settings(mail_stampers="pgp=a@b.example")
    with pytest.raises(ValueError, match="unknown mode 'quoted'"):
        Settings(mail_stampers="pgp=a@b.example#0123456789ABCDEF:quoted")
    s = Settings(mail_stampers="pgp=a@b.example#0123456789abcdef", mail_from="me@x.example",
                 mail_smtp="smtp://me%40x.example:secret@mx.x.example",
                 mail_imap="imap://me%40x.example:secret@mx.x.example")
    smtp = s.mail_smtp_server
    assert smtp is not None and (smtp.port, smtp.user, smtp.password) == (
        587, "me@x.example", "secret")
    assert "secret" not in repr(s) and "secret" not in repr(smtp)
    assert s.mail_imap_server is not None and s.mail_imap_server.public == \
        "imap://mx.x.example:143"
