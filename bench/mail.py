"""Inbound mail stamped per second (`python -m bench.mail`, part of `make bench`; docs/mail.md).

One ``stampd serve`` (workers as `stampd serve` sizes them on this machine; the mail key's
worker, ``STAMPD_EXTRA_KEY_WORKERS`` (1); SQLite) with its SMTP listener, its replies submitted
to a real SMTP server in this process (aiosmtpd's Controller, counting them). ``--senders``
senders at once, each on its own SMTP connection, send ``--messages`` messages each in turn
(``MAIL``/``RCPT``/``DATA`` per message, the connection kept), every message built before the
clock starts. A message is counted when its ``DATA`` is answered 250, which stampd answers only
once its stamp is committed and signed and its reply was handed to the relay; every reply must
have arrived at the relay by the end. Prints messages/s and the p50/p99 time from ``DATA``'s
end to its 250. ``--attachments N`` adds N small attachments to each message (each one more
receipt, so one more stamp).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from aiosmtpd.controller import Controller

from tests.helpers import free_port, seed_data_dir, start_server

OWN = "stamp@stampd.test"


class Relay:
    def __init__(self) -> None:
        self.received: Counter[str] = Counter()

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        for r in envelope.rcpt_tos:
            self.received[r] += 1
        return "250 OK"


def build(senders: int, messages: int, attachments: int) -> list[list[bytes]]:
    """For each sender, its messages (CRLF, no line starting with '.')."""
    out = []
    for s in range(senders):
        mine = []
        for m in range(messages):
            sender = f"s{s}@b{s}.bench.example"
            head = [f"From: {sender}", f"To: {OWN}", f"Message-ID: <{m}.{sender}>",
                    "Subject: bench"]
            body = f"message {m} of {sender}\r\n"
            if attachments:
                parts = [f"--b\r\nContent-Type: text/plain\r\n\r\n{body}"]
                for a in range(attachments):
                    data = base64.b64encode(f"attachment {a} {m} {sender}".encode()).decode()
                    parts.append(f"--b\r\nContent-Disposition: attachment; filename=a{a}\r\n"
                                 f"Content-Transfer-Encoding: base64\r\n\r\n{data}\r\n")
                head += ["MIME-Version: 1.0", "Content-Type: multipart/mixed; boundary=b"]
                body = "".join(parts) + "--b--\r\n"
            mine.append(("\r\n".join(head) + "\r\n\r\n" + body).encode())
        out.append(mine)
    return out


async def _code(reader: asyncio.StreamReader) -> int:
    while True:
        line = await reader.readline()
        if not line:
            raise ConnectionError("the listener closed the connection")
        if line[3:4] != b"-":
            return int(line[:3])


async def sender_run(port: int, index: int, messages: list[bytes],
                     latencies: list[float]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        assert await _code(reader) == 220
        writer.write(b"EHLO bench.example\r\n")
        assert await _code(reader) == 250
        sender = f"s{index}@b{index}.bench.example"
        for data in messages:
            writer.write(f"MAIL FROM:<{sender}>\r\nRCPT TO:<{OWN}>\r\nDATA\r\n".encode())
            codes = [await _code(reader) for _ in range(3)]
            if codes != [250, 250, 354]:
                raise RuntimeError(f"{sender}: MAIL/RCPT/DATA answered {codes}")
            writer.write(data + b".\r\n")
            t = time.perf_counter()
            code = await _code(reader)
            latencies.append(time.perf_counter() - t)
            if code != 250:
                raise RuntimeError(f"{sender}: DATA answered {code}")
        writer.write(b"QUIT\r\n")
        await _code(reader)
    finally:
        writer.close()


async def drive(port: int, batches: list[list[bytes]]) -> tuple[float, list[float]]:
    latencies: list[float] = []
    t0 = time.perf_counter()
    await asyncio.gather(*(sender_run(port, i, b, latencies) for i, b in enumerate(batches)))
    return time.perf_counter() - t0, latencies


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--senders", type=int, default=16, help="SMTP connections at once (16)")
    ap.add_argument("--messages", type=int, default=50, help="messages each sends (50)")
    ap.add_argument("--attachments", type=int, default=0, help="attachments per message (0)")
    ap.add_argument("--workers", type=int, default=0, help="primary-key workers (0: CPUs)")
    args = ap.parse_args(argv)
    batches = build(args.senders, args.messages + 1, args.attachments)
    relay = Relay()
    relay_port = free_port()
    controller = Controller(relay, hostname="127.0.0.1", port=relay_port)
    controller.start()
    mail_port = free_port()
    work = Path(tempfile.mkdtemp(prefix="bm"))
    server = start_server(seed_data_dir(work / "data"), workers=args.workers, wait=False,
                          extra_env={"STAMPD_MAIL_LISTEN": f"127.0.0.1:{mail_port}",
                                     "STAMPD_MAIL_RELAY": f"127.0.0.1:{relay_port}",
                                     "STAMPD_MAIL_ADDRESSES": OWN,
                                     "STAMPD_MAIL_PER_SENDER_DOMAIN_MINUTE": "0",
                                     "STAMPD_MAIL_PER_MINUTE": "0",
                                     "STAMPD_MAIL_MAX_ATTACHMENTS": str(args.attachments),
                                     "STAMPD_LOG_LEVEL": "WARNING"})
    try:
        server.wait_ready(workers=2)  # (a primary-key worker and the mail key's, at least)
        # warm-up: each sender's first message (not measured)
        asyncio.run(drive(mail_port, [b[:1] for b in batches]))
        seconds, latencies = asyncio.run(drive(mail_port, [b[1:] for b in batches]))
        want = args.messages + 1
        short = {r: n for r, n in relay.received.items() if n != want}
        if len(relay.received) != args.senders or short:
            raise SystemExit(f"bench.mail: replies missing at the relay: {short}")
    finally:
        server.stop()
        controller.stop()
        shutil.rmtree(server.runtime_dir, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    n = len(latencies)
    q = statistics.quantiles(latencies, n=100)
    stamps = n * (1 + args.attachments)
    print(f"mail: {args.senders} senders x {args.messages} messages"
          + (f" with {args.attachments} attachments" if args.attachments else "")
          + f", {n} messages stamped and answered in {seconds:.2f} s: {n / seconds:.0f} "
          f"messages/s ({stamps / seconds:.0f} stamps/s), DATA to 250 p50 "
          f"{q[49] * 1000:.1f} ms, p99 {q[98] * 1000:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
