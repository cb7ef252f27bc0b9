"""stampd's SMTP listener (``STAMPD_MAIL_LISTEN``, docs/mail.md): aiosmtpd's protocol on this
process's event loop, in the first HTTP process only, handing each transaction to the
`MailService` and mapping its errors to SMTP replies here, once.

A message is answered ``250`` only after its stamps are committed and signed and its reply was
handed to the relay; anything that fails after it was taken is answered ``451`` (temporary),
so that the sending MTA, which still holds it, sends it again: its queue is the outbox, and
nothing accepted is lost.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable, Sequence
from typing import Any, cast

from aiosmtpd.smtp import SMTP, Envelope, Session

from formats.keys import ServedKey
from server.budgets import RateLimited
from server.errors import (
    MailRefused,
    MalformedMessage,
    NotOurAddress,
    StampError,
    Unavailable,
)
from server.mail.relay import Relay
from server.mail.service import MailService
from server.settings import Settings
from server.stamping.stamper import Stamper
from server.stats import Stats

log = logging.getLogger(__name__)


def smtp_reply(error: BaseException) -> str:
    """The SMTP reply to a failed command: the one mapping of the service's errors."""
    if isinstance(error, NotOurAddress):
        return f"550 5.7.1 {error.message}"
    if isinstance(error, MalformedMessage):
        return f"554 5.6.0 {error.message}"
    if isinstance(error, MailRefused):
        return f"550 5.7.1 {error.message}"
    if isinstance(error, RateLimited):
        return f"451 4.7.1 {error.message}; try again later"
    if isinstance(error, Unavailable):
        return f"451 4.3.0 {error.message}"
    if isinstance(error, StampError):
        return f"451 4.3.0 {error.message}"
    return "451 4.3.0 internal error; try again later"


def _one_line(reply: str) -> str:
    """One ASCII line (aiosmtpd sends replies as ASCII: a character beyond would fail the
    session), at most 500 characters."""
    return " ".join(reply.split()).encode("ascii", "backslashreplace").decode()[:500]


class Handler:
    """aiosmtpd's hooks: each asks the service, and answers what it says."""

    def __init__(self, service: MailService, stats: Stats) -> None:
        self.service = service
        self.stats = stats

    async def handle_MAIL(self, server: SMTP, session: Session, envelope: Envelope,
                          address: str, mail_options: list[str]) -> str:
        try:
            self.service.sender(address)
        except (StampError, RateLimited) as e:
            return self._refused(e, "MAIL")
        envelope.mail_from = address
        envelope.mail_options.extend(mail_options)
        return "250 2.1.0 OK"

    async def handle_RCPT(self, server: SMTP, session: Session, envelope: Envelope,
                          address: str, rcpt_options: list[str]) -> str:
        if len(envelope.rcpt_tos) >= self.service.max_recipients:
            self.stats.request("mail", 452)
            return "452 4.5.3 too many recipients"
        try:
            self.service.recipient(address)
        except StampError as e:
            return self._refused(e, "RCPT")
        if address.lower() not in (r.lower() for r in envelope.rcpt_tos):
            envelope.rcpt_tos.append(address)
        return "250 2.1.5 OK"

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        data = envelope.original_content
        if not isinstance(data, bytes) or envelope.mail_from is None:
            return "503 5.5.1 bad sequence of commands"
        try:
            answered = await self.service.answer(envelope.mail_from, data)
        except (StampError, RateLimited) as e:
            return self._refused(e, "DATA")
        except Exception:
            log.exception("a mail could not be stamped")
            self.stats.request("mail", 451)
            return smtp_reply(RuntimeError())
        self.stats.request("mail", 250)
        return (f"250 2.0.0 stamped, serial {answered.stamped[0].serial}; reply "
                f"{answered.reply_id}")

    def _refused(self, error: BaseException, command: str) -> str:
        answer = _one_line(smtp_reply(error))
        self.stats.request("mail", int(answer[:3]))
        log.info("mail %s refused: %s", command, answer)
        return answer


class _Busy(asyncio.Protocol):
    """A session over the limit: told so at once, and closed."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # (uvloop's transports are no asyncio.WriteTransport instances, but write alike)
        cast(asyncio.WriteTransport, transport).write(
            b"421 4.3.2 too many sessions; try again later\r\n")
        transport.close()


# How long one session may last however busy it keeps itself (a sender dripping a byte just
# inside the idle timeout would hold a session for ever), and how often it may give each
# command (a sender looping on NOOP likewise): beyond either the session is closed (aiosmtpd
# answers 421 past a command's limit). Many messages on one connection stay possible.
SESSION_SECONDS = 600.0
COMMAND_LIMITS = {"*": 1000, "NOOP": 20, "HELO": 5, "EHLO": 5, "HELP": 5, "VRFY": 5,
                  "EXPN": 5, "AUTH": 5, "STARTTLS": 5}


class _Counted(SMTP):
    """aiosmtpd's session, counted in its listener's open sessions, closed after
    `SESSION_SECONDS`.

    Neither its idle timeout nor its deadline closes it while a message is being answered
    (stamped, its reply handed to the relay): the stamps and the reply would be made and the
    sender, seeing the connection close without a ``250``, would send the message again (a
    second stamp, a second reply). The idle time is the sender's: it starts again when the
    answer has been given; a deadline that passed meanwhile closes the session once the
    answer has been written."""

    def __init__(self, listener: MailListener, handler: Handler, **options: Any) -> None:
        super().__init__(handler, command_call_limit=COMMAND_LIMITS, **options)
        self.listener = listener
        self._deadline: asyncio.TimerHandle | None = None
        self._answering = False
        self._expired = False

    def connection_made(self, transport: Any) -> None:
        self.listener.open += 1
        self._deadline = asyncio.get_running_loop().call_later(SESSION_SECONDS, self._expire)
        super().connection_made(transport)

    def _expire(self) -> None:
        self._expired = True
        if not self._answering and self.transport is not None:
            self.transport.close()

    async def _call_handler_hook(self, command: str, *args: Any) -> Any:
        if command != "DATA":
            return await super()._call_handler_hook(command, *args)
        if self._timeout_handle is not None:  # (aiosmtpd's idle timer, 1.4)
            self._timeout_handle.cancel()
        self._answering = True
        try:
            return await super()._call_handler_hook(command, *args)
        finally:
            self._answering = False
            if self.transport is None:
                pass  # (the sender went away meanwhile: nothing to time, nothing to close)
            elif self._expired:
                # (after the answer: it is written before the transport closes)
                asyncio.get_running_loop().call_soon(self.transport.close)
            else:
                self._reset_timeout()

    def connection_lost(self, exc: Exception | None) -> None:
        self.listener.open -= 1
        if self._deadline is not None:
            self._deadline.cancel()
        super().connection_lost(exc)


class MailListener:
    """The listener on ``address``: at most ``sessions`` SMTP sessions at once (beyond them
    ``421``), each idle at most ``timeout`` seconds, messages of at most ``max_size`` bytes."""

    def __init__(self, service: MailService, stats: Stats, address: tuple[str, int], *,
                 sessions: int, max_size: int, timeout: float, hostname: str) -> None:
        self.handler = Handler(service, stats)
        self.address = address
        self.sessions = sessions
        self.max_size = max_size
        self.timeout = timeout
        self.hostname = hostname
        self.open = 0
        self._server: asyncio.AbstractServer | None = None

    def _protocol(self) -> asyncio.Protocol:
        if self.open >= self.sessions:
            return _Busy()
        # No AUTH (nothing is submitted here: mail comes to the service's own addresses).
        return _Counted(self, self.handler, data_size_limit=self.max_size,
                        enable_SMTPUTF8=False, decode_data=False, hostname=self.hostname,
                        ident="stampd", timeout=self.timeout,
                        auth_exclude_mechanism=["LOGIN", "PLAIN"])

    async def start(self) -> None:
        # aiosmtpd logs every command of every session at INFO ("mail.log"), the senders'
        # addresses among them: its warnings only; stampd logs each refusal and answer.
        logging.getLogger("mail.log").setLevel(logging.WARNING)
        host, port = self.address
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            sock.listen(128)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self._protocol, sock=sock)
        log.info("mail listener on %s:%d", host, port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None


def mail_listener(settings: Settings, stamper: Stamper, keys: Sequence[ServedKey],
                  stats: Stats, clock: Callable[[], float]) -> MailListener | None:
    """The listener the settings ask for (None when mail is off)."""
    inbound = settings.mail_inbound
    if inbound is None:
        return None
    hostname = inbound.addresses[0].rpartition("@")[2]
    service = MailService(settings, stamper, keys,
                          Relay(inbound.relay, settings.mail_relay_timeout, hostname), clock)
    return MailListener(service, stats, inbound.listen, sessions=settings.mail_sessions,
                        max_size=settings.mail_max_size, timeout=settings.mail_timeout,
                        hostname=hostname)
