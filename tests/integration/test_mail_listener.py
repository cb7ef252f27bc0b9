"""The mail listener's session (`server.mail.listener`), aiosmtpd's protocol on a loopback
port in this process: its bounds never close a session while a message is being answered.
(The whole listener, with a real server, stamps and relay: tests/system/test_mail.py.)"""

from __future__ import annotations

import asyncio
import socket
import struct
from typing import Any

import pytest

from server.mail import listener
from server.mail.listener import _Counted


class Sessions:
    """What `_Counted` counts its sessions in (`MailListener.open`)."""

    open = 0


class OutlastsTheDeadline:
    """An aiosmtpd handler that answers a message only once its session's deadline
    (`SESSION_SECONDS`, made short) has passed: its timer has fired by then (the event loop
    runs due timers in order), or after ``bound`` seconds."""

    def __init__(self, bound: float) -> None:
        self.bound = bound

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        loop = asyncio.get_running_loop()
        until = min(server._deadline.when(), loop.time() + self.bound)
        while loop.time() <= until:
            await asyncio.sleep(0.05)
        return "250 2.0.0 answered"


# One message's session, sent in one write: no pause of this client counts against it.
SESSION = (b"EHLO client.test\r\nMAIL FROM:<a@b.example>\r\nRCPT TO:<stamp@stampd.test>\r\n"
           b"DATA\r\nSubject: x\r\n\r\nx\r\n.\r\n")


async def session_with(handler: OutlastsTheDeadline, timeout: float
                       ) -> tuple[asyncio.Server, asyncio.StreamReader, asyncio.StreamWriter]:
    """A listener of `_Counted` sessions over ``handler`` (idle ``timeout``) on a free
    loopback port, and a connection to it that has sent `SESSION`."""
    server = await asyncio.get_running_loop().create_server(
        lambda: _Counted(Sessions(), handler,  # type: ignore[arg-type]
                         decode_data=False, hostname="stampd.test", timeout=timeout),
        "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(SESSION)
    await writer.drain()
    return server, reader, writer


def test_a_deadline_passing_while_a_message_is_answered_closes_after_the_answer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The session's whole life (`SESSION_SECONDS`, here 2 s: the four commands before are
    read from one write well within it) ends while its message is being answered: the answer
    is written, then the session closed. (Closed before it, the sender would send the message
    again: a second stamp and reply.)"""
    monkeypatch.setattr(listener, "SESSION_SECONDS", 2.0)
    handler = OutlastsTheDeadline(bound=30)

    async def scenario() -> bytes:
        server, reader, writer = await session_with(handler, timeout=30)
        try:
            received = await asyncio.wait_for(reader.read(), 60)  # (until it closes)
            writer.close()
            return received
        finally:
            server.close()

    received = asyncio.run(scenario())
    codes = [int(line[:3]) for line in received.split(b"\r\n") if line and line[3:4] != b"-"]
    assert codes == [220, 250, 250, 250, 354, 250], received
    assert received.endswith(b"250 2.0.0 answered\r\n"), received


def test_a_sender_reset_while_its_message_is_answered_leaves_no_timer_behind() -> None:
    """The sender's connection is reset while its message is being answered: the session
    ends without an error (no idle timer started again for a connection that is gone: it
    would fail in the event loop when it fires)."""
    handler = OutlastsTheDeadline(bound=30)  # (SESSION_SECONDS: 600 s)
    errors: list[dict[str, Any]] = []

    async def scenario() -> None:
        asyncio.get_running_loop().set_exception_handler(
            lambda _loop, context: errors.append(context))
        server, reader, writer = await session_with(handler, timeout=2)
        try:
            for _ in range(20):  # (220, the EHLO's lines, 250, 250, then 354)
                line = await reader.readline()
                if not line or line.startswith(b"354"):
                    break
            assert line.startswith(b"354"), line
            # Reset, not closed (a FIN leaves the session open for its answer): the
            # message is being answered, the handler holds it.
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.close()
            # Past the idle timeout of 2 s: a timer started again would have fired.
            await asyncio.sleep(4.0)
        finally:
            server.close()

    asyncio.run(scenario())
    assert not errors, errors
