"""The mail timestamper's domain (docs/mail.md): which senders and recipients are taken, what a
message received stamps, and its reply handed to the relay. Each digest is stamped on the one
`Stamper` path every stamp takes (journal, a worker holding the mail key, journal again), so
each is in the journal and the transparency log like any digest stamp; only the key differs.

Errors are the service's (`server.errors`, `server.budgets.RateLimited`); the SMTP front end
(`server.mail.listener`) maps them to replies, once.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from formats.keys import MAIL, ServedKey
from formats.mail import Inbound, MalformedMail, Stamped, address_domain, reply, reply_id
from server.budgets import WindowBudget
from server.errors import (
    KeyRegistryError,
    MailRefused,
    MalformedMessage,
    NotOurAddress,
    StampError,
)
from server.mail.relay import Relay
from server.settings import Settings
from server.stamping.requests import DigestRequest
from server.stamping.stamper import Stamper

log = logging.getLogger(__name__)

# An envelope sender we answer: a plain ASCII local@domain, the domain a host name of two
# labels or more, none starting or ending with '-' (the reply goes to it, and it is written
# into the reply's To: header).
_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
SENDER = re.compile(rf"[A-Za-z0-9.!#$%&'*+/=?^_`{{|}}~-]{{1,64}}@{_LABEL}(\.{_LABEL})+")


@dataclass(frozen=True)
class Answered:
    """A message stamped and answered: what it stamped, and the reply's Message-ID."""

    stamped: list[Stamped]
    reply_id: str


class MailService:
    def __init__(self, settings: Settings, stamper: Stamper, keys: Sequence[ServedKey],
                 relay: Relay, clock: Callable[[], float]) -> None:
        key = next((k for k in keys if k.purpose == MAIL), None)
        if key is None:
            raise KeyRegistryError("the mail listener is on (STAMPD_MAIL_LISTEN) but no host "
                                   "registered the mail key: start `stampd serve` with it")
        self.key = key
        self.stamper = stamper
        self.relay = relay
        self.clock = clock
        self.own = settings.mail_inbound.addresses if settings.mail_inbound else ()
        self.server = settings.public_url
        self.max_recipients = settings.mail_max_recipients
        self.max_attachments = settings.mail_max_attachments
        self.authserv_id = settings.mail_authserv_id
        # Messages a minute per sender domain and in all, counted where the listener runs
        # (the first HTTP process only: one owner, no other process takes mail).
        self.rates = WindowBudget(settings.mail_per_sender_domain_minute,
                                  settings.mail_per_minute, clock, window=60,
                                  unit="messages", period="this minute")

    def sender(self, address: str) -> None:
        """Take a transaction from ``address`` (MAIL FROM), counted against the rates:
        `MailRefused` for a bounce (the null reverse-path) or an address the reply cannot go
        to; `RateLimited` past a rate."""
        if address in ("", "<>"):
            raise MailRefused("a bounce (null reverse-path) gets no answer")
        if not SENDER.fullmatch(address):
            raise MailRefused("the sender's address is not a plain local@domain address")
        self.rates.charge(address_domain(address).encode("ascii"), 1)

    def recipient(self, address: str) -> None:
        """Take ``address`` as a recipient (RCPT TO): only the service's own (no relaying)."""
        if address.lower() not in self.own:
            raise NotOurAddress(f"{address[:100]!a} is not this service's address: "
                                "relaying denied")

    async def answer(self, sender: str, data: bytes) -> Answered:
        """Stamp the message ``data`` (as received) from ``sender`` and hand its reply to the
        relay; returns once both are done. Refusals (`MailRefused`) record nothing; a
        failure after the stamps were recorded (a worker, the relay) leaves them in the
        journal and the log, unanswered: the sender's MTA sends the message again."""
        try:  # (in a thread: a large or deeply nested message takes the CPU for a while)
            inbound = await asyncio.to_thread(Inbound.parse, data, self.max_attachments)
        except MalformedMail as e:
            raise MalformedMessage(str(e)) from None
        why = inbound.refusal()
        if why is not None:
            raise MailRefused(f"no automatic answer: {why}")
        if self.authserv_id and not inbound.authenticated(self.authserv_id,
                                                          address_domain(sender)):
            raise MailRefused(f"no answer: {self.authserv_id} did not mark the message as "
                              "passing its checks for the sender's domain")
        digests = inbound.stamped()
        results = await asyncio.gather(
            *(self.stamper.stamp(DigestRequest(d.algorithm, d.digest), self.key)
              for d in digests), return_exceptions=True)
        stamped: list[Stamped] = []
        for d, result in zip(digests, results, strict=True):
            if isinstance(result, BaseException):
                if not isinstance(result, StampError):
                    log.error("stamping a mail failed", exc_info=result)
                raise result
            statement, receipt = result
            stamped.append(Stamped(d, statement.serial, receipt))
        domain = address_domain(self.own[0])
        message_id = reply_id(stamped[0].serial, domain)
        body = reply(sender=self.own[0], to=sender, stamped=stamped, server=self.server,
                     key=self.key.fingerprint, in_reply_to=inbound.message_id,
                     message_id=message_id, date=self.clock())
        await self.relay.send(sender, body)
        log.info("mail from %s stamped (serials %s) and answered", address_domain(sender),
                 ",".join(str(s.serial) for s in stamped),
                 extra={"stamp_id": stamped[0].serial})
        return Answered(stamped, message_id)
