"""uvicorn's httptools protocol, hardened against idle and slow clients.

uvicorn arms its keep-alive timer only after a response. A connection that never sends a
request, or sends its headers a byte at a time, would stay open forever. Here a connection must
deliver complete request headers within ``timeout_keep_alive`` seconds of connecting or of the
previous response; the body has its own timeout in `server.api.body.read_body`.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class StampdHttpProtocol(HttpToolsProtocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._headers_deadline: float | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(_CoalescingTransport(transport, self.loop))  # type: ignore[arg-type]
        self._arm_headers_timer()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._waiting_for_headers():
            self._arm_headers_timer()
        else:
            self._headers_deadline = None

    def on_response_complete(self) -> None:
        self._headers_deadline = None
        super().on_response_complete()

    def _waiting_for_headers(self) -> bool:
        if self.transport.is_closing():
            return False
        return self.cycle is None or self.cycle.response_complete

    def _arm_headers_timer(self) -> None:
        now = self.loop.time()
        if self._headers_deadline is None:
            self._headers_deadline = now + self.timeout_keep_alive
        self._unset_keepalive_if_required()
        self.timeout_keep_alive_task = self.loop.call_later(
            max(0.0, self._headers_deadline - now), self.timeout_keep_alive_handler
        )


class _CoalescingTransport:
    """Joins the writes of one event-loop turn into one ``send``: uvicorn writes a response's
    headers and body separately, which costs a system call and a TCP segment each."""

    __slots__ = ("_buffer", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._buffer: list[bytes] = []

    def write(self, data: bytes) -> None:
        if not self._buffer:
            self._loop.call_soon(self._flush)
        self._buffer.append(bytes(data))

    def _flush(self) -> None:
        if self._buffer:
            data = b"".join(self._buffer)
            self._buffer.clear()
            if not self._transport.is_closing():
                self._transport.write(data)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)
