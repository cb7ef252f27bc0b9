"""The mail listener's session (`server.mail.listener`), aiosmtpd's protocol on a loopback
port in this process: its bounds never close a session while a message is being answered.
(The whole listener, with a real server, stamps and relay: tests/system/test_mail.py.)"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from server.mail import listener
from server.mail.listener import _Counted


class Sessions:
    """What `_Counted` counts its sessions in (`MailListener.open`)."""

    open = 0


class OutlastsTheDeadline:
    """An aiosmtpd handler that answers a message ``hold`` seconds after it came: later than
    its session's deadline (`SESSION_SECONDS`, made shorter), whose timer therefore fires
    first (the event loop runs due timers in order)."""

    def __init__(self, hold: float) -> None:
        self.hold = hold

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        await asyncio.sleep(self.hold)
        return "250 2.0.0 answered"


def test_a_deadline_passing_while_a_message_is_answered_closes_after_the_answer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The session's whole life (`SESSION_SECONDS`, here 0.1 s) ends while its message is
    being answered: the answer is written, then the session closed. (Closed before it, the
    sender would send the message again: a second stamp and reply.)"""
    monkeypatch.setattr(listener, "SESSION_SECONDS", 0.1)
    handler = OutlastsTheDeadline(hold=0.5)

    async def scenario() -> bytes:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(
            lambda: _Counted(Sessions(), handler,  # type: ignore[arg-type]
                             decode_data=False, hostname="stampd.test", timeout=30),
            "127.0.0.1", 0)
        try:
            port = server.sockets[0].getsockname()[1]
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            # (in one write: no pause of this client's counts)
            writer.write(b"EHLO client.test\r\nMAIL FROM:<a@b.example>\r\n"
                         b"RCPT TO:<stamp@stampd.test>\r\nDATA\r\nSubject: x\r\n\r\nx\r\n.\r\n")
            await writer.drain()
            received = await asyncio.wait_for(reader.read(), 60)  # (until it closes)
            writer.close()
            return received
        finally:
            server.close()

    received = asyncio.run(scenario())
    codes = [int(line[:3]) for line in received.split(b"\r\n") if line and line[3:4] != b"-"]
    assert codes == [220, 250, 250, 250, 354, 250], received
    assert received.endswith(b"250 2.0.0 answered\r\n"), received
