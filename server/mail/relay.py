"""Handing a reply to the relay (``STAMPD_MAIL_RELAY``): one SMTP submission per reply, with
the null reverse-path (RFC 3834 section 3.3: an automatic answer must not be answered, nor
bounced to the service), from a thread (smtplib), within a timeout."""

from __future__ import annotations

import asyncio
import logging
import smtplib

from server.errors import MailRefused, RelayFailed

log = logging.getLogger(__name__)


class Relay:
    def __init__(self, address: tuple[str, int], timeout: float, local_hostname: str) -> None:
        self.host, self.port = address
        self.timeout = timeout
        self.local_hostname = local_hostname

    async def send(self, to: str, message: bytes) -> None:
        """Submit ``message`` to ``to``; returns once the relay took it (its 250 to DATA).
        `RelayFailed` when it cannot be handed over now; `MailRefused` when the relay
        refuses the recipient for good (a 5xx: retrying would not help)."""
        await asyncio.to_thread(self._send, to, message)

    def _send(self, to: str, message: bytes) -> None:
        try:
            with smtplib.SMTP(self.host, self.port, timeout=self.timeout,
                              local_hostname=self.local_hostname) as smtp:
                smtp.sendmail("", [to], message)
        except smtplib.SMTPRecipientsRefused as e:
            codes = [code for code, _ in e.recipients.values()]
            if codes and all(500 <= c < 600 for c in codes):
                raise MailRefused("the relay refuses to deliver to the sender's address "
                                  f"({codes[0]})") from None
            raise RelayFailed(f"the relay refused the reply for now ({codes})") from None
        except (smtplib.SMTPException, OSError) as e:
            raise RelayFailed(f"the reply could not be handed to the relay: "
                              f"{type(e).__name__}: {e}") from None
