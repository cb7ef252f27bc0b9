"""`make fuzz`, the SMTP listener's section (docs/mail.md): malformed and hostile SMTP sessions
against a real stampd with its mail listener, replies received by a real SMTP server (aiosmtpd's
Controller, in this process), and the promises that must hold whatever arrives.

    .venv/bin/python -m bench.fuzz_mail [--sessions N] [--seed S] [--concurrency C] [--keep]

Every session has a sender of its own (its case number in the local part and the domain), so
that each reply at the relay names the session it answers. Sessions are of two sorts:

- **must not be answered**: bounces (``MAIL FROM:<>``), RFC 3834 automatic, list and report
  mail in many spellings, relay attempts, senders that are no plain address, messages with no
  header or too many attachments, oversize messages, and command noise (garbage, NUL bytes,
  lines over 1000 bytes, commands out of order, pipelined junk, connections cut mid-DATA);
- **may be answered**: well-formed messages mutated (nested and broken MIME, parts nested
  hundreds deep, bad base64, 8-bit bytes, folded and repeated headers, a digest body, more
  recipients than allowed).

The promises: 0 crashes (the server answers /healthz at the end, no traceback, no ERROR line
and no worker restart in its log, no ``451 ... internal error``), no session left hanging
past ``--bound`` seconds, 0 replies to what must not be answered (nor a 250 to its DATA),
and for the rest exactly one reply per ``250`` and none otherwise (nothing accepted is lost,
nothing refused is answered). It prints a summary and exits 1 if a promise broke (2 if it
could not run). `tests/system/test_fuzz_mail_sample.py` runs a sample through the same code.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiosmtpd.controller import Controller

from bench.fuzz_server import LogScan, UnderTest
from tests.helpers import free_port

OWN = "stamp@stampd.test"
MAX_SIZE = 32 * 1024
MAX_ATTACHMENTS = 3
HANG_BOUND = 30.0  # seconds a session may take (stamping included)


@dataclass
class Step:
    """One thing a session sends: a command line (``data`` None), or DATA and its content."""

    line: bytes
    data: bytes | None = None
    cut: bool = False  # hang up in the middle of the content


@dataclass
class Session:
    case: int
    kind: str
    answerable: bool  # False: must get no reply and no 250 to DATA
    sender: str
    steps: list[Step]
    raw: bytes | None = None  # bytes sent as they are instead of steps (noise)


@dataclass
class Outcome:
    codes: list[int] = field(default_factory=list)
    data_code: int | None = None  # the answer to the end of DATA
    internal: bool = False  # a "451 ... internal error": an exception escaped the service
    hung: bool = False
    closed: bool = False


class RelayStore:
    """A real SMTP server (aiosmtpd) counting the replies per recipient."""

    def __init__(self) -> None:
        self.to: Counter[str] = Counter()
        self.port = free_port()
        self.controller = Controller(self, hostname="127.0.0.1", port=self.port)

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        for r in envelope.rcpt_tos:
            self.to[r.lower()] += 1
        return "250 OK"


# -- the sessions ------------------------------------------------------------------------------

def _message(sender: str, headers: list[str], body: bytes) -> bytes:
    head = [f"From: {sender}", f"To: {OWN}", f"Message-ID: <{sender}>", "Subject: fuzz",
            *headers]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def _mime(rng: random.Random, depth: int = 0) -> tuple[list[str], bytes]:
    """Headers and body of a random, possibly broken, MIME entity."""
    kind = rng.choice(["text", "b64", "bad-b64", "multi", "qp", "8bit"] if depth < 3
                      else ["text", "b64"])
    if kind == "multi":
        boundary = f"b{rng.randrange(10**6)}"
        inner = [_mime(rng, depth + 1) for _ in range(rng.randint(0, 3))]
        parts = [b"--" + boundary.encode() + b"\r\n" + ("\r\n".join(h) + "\r\n\r\n").encode()
                 + b + b"\r\n" for h, b in inner]
        end = b"--" + boundary.encode() + b"--\r\n" if rng.random() < 0.8 else b""
        return [f"Content-Type: multipart/{rng.choice(['mixed', 'alternative', 'related'])}; "
                f"boundary={boundary}"], b"".join(parts) + end
    disposition = ([f"Content-Disposition: attachment; filename=\"f{rng.randrange(99)}.bin\""]
                   if rng.random() < 0.5 else [])
    payload = rng.randbytes(rng.randint(0, 400))
    if kind == "b64":
        return (["Content-Type: application/octet-stream", "Content-Transfer-Encoding: base64",
                 *disposition], base64.encodebytes(payload).replace(b"\n", b"\r\n"))
    if kind == "bad-b64":
        return (["Content-Type: application/octet-stream", "Content-Transfer-Encoding: base64",
                 *disposition], b"!!not*base64==\r\n" + payload.hex().encode() + b"\r\n")
    if kind == "qp":
        return (["Content-Type: text/plain; charset=utf-8",
                 "Content-Transfer-Encoding: quoted-printable", *disposition],
                b"caf=C3=A9 =\r\nsoft break=ZZ\r\n")
    if kind == "8bit":
        return (["Content-Type: text/plain; charset=latin-1", *disposition],
                bytes(b for b in payload if b not in b"\r\n") + b"\r\n")
    return ["Content-Type: text/plain"], b"some text\r\n"


def _plain(sender: str, message: bytes, rcpts: list[str] | None = None) -> list[Step]:
    return [Step(b"EHLO fuzz.example"), Step(f"MAIL FROM:<{sender}>".encode()),
            *(Step(f"RCPT TO:<{r}>".encode()) for r in (rcpts or [OWN])),  # (UTF-8)
            Step(b"DATA", message)]


REFUSED_HEADERS = [
    "Auto-Submitted: auto-replied", "Auto-Submitted: AUTO-GENERATED", "auto-submitted: "
    "auto-notified; owner-email=a@b.example", "Precedence: bulk", "Precedence: LIST",
    "precedence: junk", "List-Id: <x.lists.example>", "List-Unsubscribe: <mailto:u@x.example>",
    "List-Post: NO", "List-Help: <mailto:h@x.example>", "List-Owner: <mailto:o@x.example>",
    "X-Autoreply: yes", "X-Autorespond: yes", "X-Auto-Response-Suppress: All",
    "Content-Type: multipart/report; report-type=delivery-status; boundary=r",
    "Content-Type: message/delivery-status", "Content-Type: message/disposition-notification",
]
# (Not here: "@route:a@b.example" and "\"q\"@c.example", which RFC 5321 reads as the plain
# a@b.example and q@c.example, and which are answered as those.)
BAD_SENDERS = ["", "a@b", "a@[127.0.0.1]", "a b@c.example", "a@-c.example", "a@c-.example",
               "a@c..example", "a" * 70 + "@c.example", "a@c.example>extra", "<a@c.example",
               "a@c.example\x00", "a\u00e4@c.example"]


def make_session(rng: random.Random, case: int) -> Session:
    sender = f"f{case}@c{case}.fuzz.example"
    kind = rng.choice(["plain", "mime", "deep", "digest", "rcpts", "refused-header", "bounce",
                       "bad-sender", "relay", "no-header", "attachments", "oversize",
                       "noise", "cut", "order"])
    if kind == "plain":
        return Session(case, kind, True, sender, _plain(sender, _message(
            sender, [], b"hello " + str(case).encode() + b"\r\n")))
    if kind == "mime":
        headers, body = _mime(rng)
        dup = [f"X-Dup: {i}" for i in range(rng.randint(0, 30))]
        folded = ["X-Folded: a\r\n\tb\r\n c"] if rng.random() < 0.5 else []
        data = _message(sender, ["MIME-Version: 1.0", *headers, *dup, *folded], body)
        # (more attachments than stamped, or not, as the parser finds them: either answer is
        # right, so long as a reply comes exactly with a 250; the "attachments" kind is sure)
        return Session(case, kind, True, sender, _plain(sender, data))
    if kind == "deep":  # MIME parts nested hundreds deep (the parser recurses): either answer
        depth = rng.randint(100, 600)
        data = b"".join(b"Content-Type: multipart/mixed; boundary=d%d\r\n\r\n--d%d\r\n" % (i, i)
                        for i in range(depth)) + b"deep\r\n"
        return Session(case, kind, True, sender, _plain(sender, _message(sender, [], b"")[:-2]
                                                        + data))
    if kind == "digest":
        digest = hashlib.new(rng.choice(["sha256", "sha512"]), rng.randbytes(8)).hexdigest()
        return Session(case, kind, True, sender, _plain(sender, _message(
            sender, [], f"  {digest.upper() if rng.random() < 0.5 else digest}\r\n".encode())))
    if kind == "rcpts":
        rcpts = [OWN] * rng.randint(2, 6) + [f"x{case}@elsewhere.example"]
        rng.shuffle(rcpts)
        return Session(case, kind, True, sender, _plain(sender, _message(sender, [], b"r\r\n"),
                                                        rcpts))
    if kind == "refused-header":
        header = rng.choice(REFUSED_HEADERS)
        return Session(case, kind, False, sender, _plain(sender, _message(
            sender, [header] if rng.random() < 0.5 else ["X-A: b", header], b"auto\r\n")))
    if kind == "bounce":
        steps = _plain(sender, _message(sender, [], b"bounce\r\n"))
        steps[1] = Step(b"MAIL FROM:<>")
        return Session(case, kind, False, sender, steps)
    if kind == "bad-sender":
        bad = rng.choice(BAD_SENDERS)
        steps = _plain(sender, _message(sender, [], b"x\r\n"))
        steps[1] = Step(f"MAIL FROM:<{bad}>".encode())
        # (the reply would go to the bad address, or to none: it must go nowhere)
        return Session(case, kind, False, bad or sender, steps)
    if kind == "relay":
        victim = rng.choice([f"v{case}@victim.example", f"{OWN}.victim.example",
                             f"stamp%victim.example@{OWN.split('@')[1]}",
                             f"{OWN.split('@')[0]}@victim.example",
                             f"st\u00e4mp@{OWN.split('@')[1]}", f"v{case}@vict\u00efm.example"])
        return Session(case, kind, False, sender, _plain(
            sender, _message(sender, [], b"relay me\r\n"), [victim]))
    if kind == "no-header":
        garbage = rng.choice([b"just words\r\n", b"\r\n", rng.randbytes(200).replace(b"\n", b"")
                              + b"\r\n", b":\r\n\r\n"])
        return Session(case, kind, False, sender, _plain(sender, garbage))
    if kind == "attachments":
        parts = b"".join(b"--b\r\nContent-Disposition: attachment; filename=a%d\r\n\r\nz\r\n" % i
                         for i in range(MAX_ATTACHMENTS + 1 + rng.randrange(5)))
        return Session(case, kind, False, sender, _plain(sender, _message(
            sender, ["MIME-Version: 1.0", "Content-Type: multipart/mixed; boundary=b"],
            parts + b"--b--\r\n")))
    if kind == "oversize":
        return Session(case, kind, False, sender, _plain(sender, _message(
            sender, [], (b"y" * 98 + b"\r\n") * (MAX_SIZE // 100 + 5))))
    if kind == "noise":
        junk = rng.choice([rng.randbytes(rng.randint(1, 3000)),
                           b"EHLO x\r\n" + b"A" * 5000 + b"\r\n",
                           b"HELO x\r\nMAIL FROM:<" + sender.encode() + b">\r\nRCPT TO:<"
                           + OWN.encode() + b">\r\nDATA\r\n" + b"\x00" * 100 + b"\r\n.\r\n",
                           b"\r\n" * 50, b"AUTH PLAIN AGFhAGI=\r\nSTARTTLS\r\nVRFY root\r\n"
                           b"EXPN all\r\nNOOP\r\nHELP\r\nXYZZY\r\n"])
        return Session(case, kind, False, sender, [], raw=junk)
    if kind == "cut":
        steps = _plain(sender, _message(sender, [], b"cut\r\n" * 50))
        steps[-1].cut = True
        return Session(case, kind, False, sender, steps)
    # "order": DATA before RCPT, RCPT before MAIL, MAIL twice
    return Session(case, kind, False, sender, [
        Step(b"EHLO o.example"), Step(b"DATA"), Step(f"RCPT TO:<{OWN}>".encode()),
        Step(f"MAIL FROM:<{sender}>".encode()), Step(f"MAIL FROM:<{sender}>".encode()),
        Step(b"RSET"), Step(b"DATA")])


# -- one session, raw ---------------------------------------------------------------------------

async def _reply(reader: asyncio.StreamReader, out: Outcome) -> int:
    """The code of one (possibly multi-line) reply; 0 when the server closed."""
    while True:
        line = await reader.readline()
        if not line:
            out.closed = True
            return 0
        if b"internal error" in line:
            out.internal = True
        if len(line) < 4 or line[3:4] != b"-":
            code = int(line[:3]) if line[:3].isdigit() else 0
            out.codes.append(code)
            return code


def _stuffed(data: bytes) -> bytes:
    if not data.endswith(b"\r\n"):
        data += b"\r\n"
    lines = data.split(b"\r\n")
    return b"\r\n".join(b"." + ln if ln.startswith(b".") else ln for ln in lines) + b".\r\n"


async def run_session(host: str, port: int, s: Session, bound: float) -> Outcome:
    out = Outcome()

    async def talk() -> None:
        reader, writer = await asyncio.open_connection(host, port, limit=1 << 20)
        try:
            if await _reply(reader, out) != 220:
                return
            if s.raw is not None:
                writer.write(s.raw + b"\r\nQUIT\r\n")
                await writer.drain()
                while not out.closed:
                    await _reply(reader, out)
                return
            for step in s.steps:
                writer.write(step.line + b"\r\n")
                await writer.drain()
                code = await _reply(reader, out)
                if out.closed:
                    return
                if step.data is not None and code == 354:
                    content = _stuffed(step.data)
                    if step.cut:
                        writer.write(content[:len(content) // 2])
                        await writer.drain()
                        return
                    writer.write(content)
                    await writer.drain()
                    out.data_code = await _reply(reader, out)
            writer.write(b"QUIT\r\n")
            await writer.drain()
            await _reply(reader, out)
        finally:
            writer.close()

    try:
        await asyncio.wait_for(talk(), bound)
    except TimeoutError:
        out.hung = True
    except (ConnectionError, OSError):
        out.closed = True
    return out


# -- the run -----------------------------------------------------------------------------------

@dataclass
class Result:
    sessions: int = 0
    kinds: Counter[str] = field(default_factory=Counter)
    data_codes: Counter[str] = field(default_factory=Counter)
    answered: int = 0
    problems: list[str] = field(default_factory=list)
    scan: LogScan = field(default_factory=LogScan)
    seconds: float = 0.0
    workdir: Path | None = None

    @property
    def ok(self) -> bool:
        return not self.problems


def judge(sessions: list[Session], outcomes: list[Outcome], relay: RelayStore,
          result: Result) -> None:
    p: list[str] = []
    for s, o in zip(sessions, outcomes, strict=True):
        result.kinds[s.kind] += 1
        result.data_codes[str(o.data_code)] += 1
        replies = relay.to[s.sender.lower()] if s.sender else 0
        name = f"case {s.case} ({s.kind})"
        if o.hung:
            p.append(f"{name}: no answer within the bound")
        if o.internal:
            p.append(f"{name}: an internal error was answered")
        if not s.answerable and (replies or o.data_code == 250):
            p.append(f"{name}: must not be answered, got DATA {o.data_code} and {replies} "
                     "reply(ies)")
        if s.answerable and replies != (1 if o.data_code == 250 else 0):
            p.append(f"{name}: DATA answered {o.data_code}, {replies} reply(ies) at the relay")
        if o.data_code == 250:
            result.answered += 1
    result.problems += p[:20] + ([f"... {len(p) - 20} more"] if len(p) > 20 else [])


def fuzz_mail(sessions: int = 2000, seed: int = 1, concurrency: int = 16,
              bound: float = HANG_BOUND, keep: bool = False,
              report: Any = None) -> Result:
    say = report or (lambda _m: None)
    result = Result()
    workdir = Path(tempfile.mkdtemp(prefix="fm", dir="/tmp"))
    result.workdir = workdir
    t0 = time.monotonic()
    relay = RelayStore()
    relay.controller.start()
    under: UnderTest | None = None
    mail_port = free_port()
    try:
        under = UnderTest("sqlite", workdir, None, 2, ssh_key=False, tlog=False, extra_env={
            "STAMPD_MAIL_LISTEN": f"127.0.0.1:{mail_port}",
            "STAMPD_MAIL_RELAY": f"127.0.0.1:{relay.port}",
            "STAMPD_MAIL_ADDRESSES": OWN, "STAMPD_MAIL_MAX_SIZE": str(MAX_SIZE),
            "STAMPD_MAIL_MAX_RECIPIENTS": "3",
            "STAMPD_MAIL_MAX_ATTACHMENTS": str(MAX_ATTACHMENTS),
            "STAMPD_MAIL_PER_MINUTE": "0", "STAMPD_MAIL_SESSIONS": str(concurrency + 4),
            "STAMPD_MAIL_TIMEOUT": "5"}, extra_workers=1)
        rng = random.Random(seed)
        cases = [make_session(rng, i) for i in range(sessions)]
        say(f"{len(cases)} sessions against 127.0.0.1:{mail_port}")

        async def run_all() -> list[Outcome]:
            gate = asyncio.Semaphore(concurrency)

            async def one(s: Session) -> Outcome:
                async with gate:
                    return await run_session("127.0.0.1", mail_port, s, bound)

            return list(await asyncio.gather(*(one(s) for s in cases)))

        outcomes = asyncio.run(run_all())
        if not under.alive():
            result.problems.append("the server no longer answers /healthz")
        result.sessions = len(cases)
        judge(cases, outcomes, relay, result)
    except RuntimeError as e:  # the server did not start
        result.problems.append(f"could not run: {e}")
    finally:
        if under is not None:
            under.stop()
            result.scan = under.scan_log()
        relay.controller.stop()
        result.seconds = time.monotonic() - t0
    if result.scan.tracebacks:
        result.problems.append(f"{result.scan.tracebacks} traceback(s) in the server log")
    if result.scan.errors:
        result.problems.append(f"{result.scan.errors} ERROR line(s) in the server log")
    if result.scan.restarts:
        result.problems.append(f"{result.scan.restarts} worker restart(s) in the server log")
    if result.ok and not keep:
        shutil.rmtree(workdir, ignore_errors=True)
        result.workdir = None
    return result


def summary(r: Result, seed: int) -> str:
    out = [f"== stampd mail fuzz: {r.sessions} SMTP sessions, seed {seed}, {r.seconds:.0f} s ==",
           "sessions per kind: " + "  ".join(f"{k} {n}" for k, n in sorted(r.kinds.items())),
           "answer to DATA: " + "  ".join(f"{k}: {n}" for k, n in sorted(r.data_codes.items())),
           f"stamped and answered (250): {r.answered}",
           f"server log: {r.scan.tracebacks} tracebacks, {r.scan.errors} ERROR lines"]
    out += ["  " + e for e in r.scan.examples]
    out.append("result: " + ("PASS" if r.ok else "FAIL: " + "; ".join(r.problems)))
    if r.workdir is not None:
        out.append(f"kept {r.workdir}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.fuzz_mail",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--sessions", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--bound", type=float, default=HANG_BOUND)
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args(argv)

    def progress(msg: str) -> None:
        print(f"[fuzz-mail {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    r = fuzz_mail(args.sessions, args.seed, args.concurrency, args.bound, args.keep, progress)
    print(summary(r, args.seed), flush=True)
    if any(p.startswith("could not run") for p in r.problems):
        return 2
    return 0 if r.ok else 1


if __name__ == "__main__":
    sys.exit(main())
