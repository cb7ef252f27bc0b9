"""Our mail account, for the email timestampers (`server.gitlog.mailstampers`): submission by
SMTP (`submit`) and the IMAP mailbox the replies come to (`Mailbox`, with IDLE).

Both require STARTTLS before login unless ``starttls`` is off, and check the server's
certificate (against ``ca_file`` where given, else the system's CAs) and name. Every failure
is a `MailError` whose message names the server without its credentials; no credential is
ever logged. Python 3.11's imaplib has no IDLE: `Mailbox.idle` speaks it (RFC 2177) over
imaplib's connection.
"""

from __future__ import annotations

import contextlib
import email.utils
import imaplib
import re
import select
import smtplib
import socket
import ssl
import threading
import time
from email.message import EmailMessage
from pathlib import Path

from server.errors import StampError
from server.setting_values import MailServer


class MailError(StampError):
    """Our mail account failed: the server is down, refused the login, or answered amiss."""


def tls_context(ca_file: Path | None) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(ca_file) if ca_file else None)


def submit(server: MailServer, sender: str, to: str, subject: str, body: str, *,
           starttls: bool, ca_file: Path | None, timeout: float) -> str:
    """Send one plain-text message; its Message-ID."""
    msg = EmailMessage()
    msg["From"], msg["To"], msg["Subject"] = sender, to, subject
    msg["Date"] = email.utils.formatdate(usegmt=True)
    domain = sender.rpartition("@")[2] or None
    msg["Message-ID"] = message_id = email.utils.make_msgid("stampd", domain=domain)
    msg.set_content(body, cte="7bit" if body.isascii() else "quoted-printable")
    try:
        with smtplib.SMTP(server.host, server.port, timeout=timeout) as s:
            if starttls:
                s.starttls(context=tls_context(ca_file))
            s.login(server.user, server.password)
            s.send_message(msg)
    except smtplib.SMTPAuthenticationError as e:
        raise MailError(f"{server.public} refused our login ({e.smtp_code})") from None
    except smtplib.SMTPNotSupportedError:
        raise MailError(f"{server.public} offers no STARTTLS or no login") from None
    except (smtplib.SMTPException, OSError) as e:
        raise MailError(f"cannot send by {server.public}: {type(e).__name__}: "
                        f"{_no_secrets(str(e), server)}") from None
    return message_id


def _no_secrets(text: str, server: MailServer) -> str:
    for secret in (server.password, server.user):
        if secret:
            text = text.replace(secret, "***")
    return text[:300]


class Mailbox:
    """One IMAP session: STARTTLS, login, the folder selected. Close it with `close` (or
    `abort` from another thread, which ends a wait in `idle` at once)."""

    def __init__(self, server: MailServer, folder: str, *, starttls: bool,
                 ca_file: Path | None, timeout: float) -> None:
        self.server = server
        try:
            self.imap = imaplib.IMAP4(server.host, server.port, timeout=timeout)
        except OSError as e:
            raise MailError(f"cannot reach {server.public}: {e}") from None
        step = "STARTTLS"
        try:
            if starttls:
                self.imap.starttls(ssl_context=tls_context(ca_file))
            step = "login"
            self.imap.login(server.user, server.password)
            step = "SELECT"
            typ, _ = self.imap.select(folder)
            if typ != "OK":
                raise MailError(f"{server.public} has no folder {folder!r}")
        except imaplib.IMAP4.error as e:
            self.abort()
            raise MailError(f"{server.public} refused our {step}: "
                            f"{_no_secrets(str(e), server)}") from None
        except (OSError, ssl.SSLError) as e:
            self.abort()
            raise MailError(f"IMAP with {server.public} failed: {type(e).__name__}: "
                            f"{_no_secrets(str(e), server)}") from None
        self.can_idle = "IDLE" in self._capabilities()

    def _capabilities(self) -> list[str]:
        """The capabilities after login (a server may offer more, or fewer, than before)."""
        try:
            typ, data = self.imap.capability()
        except (imaplib.IMAP4.error, OSError) as e:
            raise MailError(f"IMAP with {self.server.public} failed: {e}") from None
        if typ != "OK" or not data or not isinstance(data[-1], bytes):
            return list(self.imap.capabilities)
        return data[-1].decode("ascii", "replace").upper().split()

    def unseen(self) -> list[tuple[int, bytes]]:
        """(UID, whole message) of every message without the \\Seen flag."""
        try:
            typ, data = self.imap.uid("SEARCH", "UNSEEN")
            if typ != "OK":
                raise MailError(f"{self.server.public}: SEARCH failed")
            uids = [int(u) for u in (data[0] or b"").split()]
            out = []
            for uid in uids:
                typ, parts = self.imap.uid("FETCH", str(uid), "(BODY.PEEK[])")
                raw = next((p[1] for p in parts if isinstance(p, tuple)), None)
                if typ == "OK" and raw is not None:
                    out.append((uid, bytes(raw)))
            return out
        except (imaplib.IMAP4.error, OSError) as e:
            raise MailError(f"IMAP with {self.server.public} failed: {e}") from None

    def mark_seen(self, uid: int) -> None:
        try:
            self.imap.uid("STORE", str(uid), "+FLAGS", "(\\Seen)")
        except (imaplib.IMAP4.error, OSError) as e:
            raise MailError(f"IMAP with {self.server.public} failed: {e}") from None

    def idle(self, timeout: float, stop: threading.Event) -> bool:
        """Wait with IDLE until a message arrives (True), ``timeout`` seconds pass or ``stop``
        is set (False)."""
        imap = self.imap
        tag = imap._new_tag()
        try:
            imap.send(tag + b" IDLE\r\n")
            line = imap.readline()
            if not line.startswith(b"+"):
                raise MailError(f"{self.server.public} refused IDLE: {line[:100]!r}")
            arrived = False
            deadline = time.monotonic() + timeout
            while not (arrived or stop.is_set()) and time.monotonic() < deadline:
                sock = imap.sock
                pending = sock.pending() if isinstance(sock, ssl.SSLSocket) else 0
                if not pending:  # (a short select: `stop` is looked at twice a second)
                    ready, _, _ = select.select([sock], [], [], 0.5)
                    if not ready:
                        continue
                line = imap.readline()
                if not line or line.startswith(b"* BYE"):
                    raise MailError(f"{self.server.public} closed the connection")
                arrived = re.match(rb"\* \d+ EXISTS", line) is not None
            imap.send(b"DONE\r\n")
            while True:  # the tagged end of IDLE (after any untagged lines)
                line = imap.readline()
                if not line:
                    raise MailError(f"{self.server.public} closed the connection")
                if line.startswith(tag):
                    break
            return arrived
        except (OSError, imaplib.IMAP4.error) as e:
            raise MailError(f"IMAP IDLE with {self.server.public} failed: {e}") from None

    def abort(self) -> None:
        with contextlib.suppress(OSError):
            self.imap.sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self.imap.sock.close()

    def close(self) -> None:
        try:
            self.imap.logout()
        except (imaplib.IMAP4.error, OSError):
            self.abort()
