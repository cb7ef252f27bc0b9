"""The coordinator's wire (`server.coordinator`): the frames of the job contract
(`formats.jobs`), a 4-byte big-endian length and a JSON object that long, then as many raw
bytes as the object's ``t`` says (none without it: a manifest's digest buckets, or its signed
text in UTF-8, or a job's message and a manifest's lines). One framing for everything that
reaches ``stampd serve``'s socket: a worker's frames, and an HTTP process's. `Call` is what an
HTTP process asks, `Reply` what the coordinator answers or pushes; `Coalesced` joins the frames
of one event-loop turn."""

from __future__ import annotations

import array
import asyncio
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, overload

import msgspec

from formats.frames import HEADER
from server.budgets import ManifestsBusy, RateLimited
from server.stamping.journal import IndexRows

MAX_HEAD = 1 << 24  # a call's JSON (a manifest's 65,536 index keys and sizes: ~0.8 MB)
MAX_CALL = 1 << 30  # a manifest of 10^6 sha512 digests packs into ~64 MB; far below this
LONG_FRAME = 1 << 20  # a tail longer than this is read into a buffer of its own (`read_frame`)
Frame = tuple[dict[str, Any], memoryview]  # a frame's object, and its tail
_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode


def frame(head: dict[str, Any], tail: int = 0) -> bytes:
    """The frame of ``head`` up to its tail, ``tail`` bytes sent after it."""
    if tail:
        head["t"] = tail
    text = _encode(head)
    return HEADER.pack(len(text)) + text


def split(data: bytes | bytearray) -> Frame:
    """A whole frame's object and tail (`read_frame` reads them off a stream); ValueError if
    it is not one."""
    if len(data) < HEADER.size:
        raise ValueError("short frame")
    (n,) = HEADER.unpack(data[:HEADER.size])
    head = _object(data[HEADER.size:HEADER.size + n])
    tail = memoryview(data)[HEADER.size + n:]
    if len(tail) != _tail(head):
        raise ValueError("a frame whose tail is not as long as it says")
    return head, tail


# (`slots`, not frozen: a frozen dataclass sets each field with object.__setattr__, 2-3 us for
# a call or a reply, made for every stamp on the coordinator's loop; none is changed once made)
@dataclass(slots=True)
class Call:
    """What an HTTP process asks of the coordinator: of the journal, ``record`` a stamp row
    (and a manifest's digest buckets), or an outcome, ``signed`` or ``failed``, or
    ``manifest``: a signed manifest's ``text`` (UTF-8) stored with its outcome; of the
    budgets, ``charge`` a client (``b``: the budget, ``c``: the client's key in hex, ``n``),
    ``take`` or ``give`` back ``n`` manifest bytes in flight; of the news, that a checkpoint
    of size ``n`` was ``published`` (told to every HTTP process); ``hello``, answered once
    the connection is one the news go to (its first call); of the processes' view, ``report``
    this process's counters (``r``, `server.runtime.siblings.Siblings.record`), and ``view``
    every process's last report; of the host's dispatcher, ``sign`` a job (``k``: the key's
    id, ``m``: the length of the job's message, which is the start of ``text``, a manifest's
    lines the rest: `formats.jobs.RelayedJob`), or ``drop`` the job of call ``c`` (its
    caller gave up); of both, ``stamp``: record the stamp ``row``, then, once it is
    committed, sign its job (``k``, ``m`` and ``text`` as for ``sign``: a tag's or a branch's,
    which does not name the row's serial) within ``w`` seconds and record it signed with the
    id of the git object ``g`` (its type and format) the signed text is, or record its
    failure (one call for what ``record``, ``sign`` and ``signed`` do; ``drop`` drops it
    too). ``call_id`` 0: no reply wanted (an outcome that rides along with the next commit,
    `Journal.signed`; bytes given back; news)."""

    op: str
    call_id: int
    fields: dict[str, Any]
    buckets: IndexRows | None = None
    text: bytes | memoryview | None = None

    OPS = ("hello", "record", "signed", "failed", "manifest", "charge", "take", "give",
           "published", "report", "view", "sign", "drop", "stamp")
    TEXT_OPS = ("manifest", "sign", "stamp")

    def head(self, tail: int = 0) -> bytes:
        """The frame up to its tail, whose length is ``tail`` (a text sent after it)."""
        head: dict[str, Any] = {"op": self.op, "id": self.call_id, "f": self.fields}
        if self.buckets is not None:
            # Two flat lists: a list of [key, size] pairs took 65 ms to encode and 50 to
            # decode for a manifest's 65,536 rows, each time holding a process's event loop.
            sizes = [len(packed) for _, packed in self.buckets]
            head["bk"] = [key for key, _ in self.buckets]
            head["bn"] = sizes
            tail += sum(sizes)
        return frame(head, tail)

    def encode(self) -> bytes:
        text = bytes(self.text or b"")
        tail = b"".join(packed for _, packed in self.buckets or ())
        return self.head(len(text)) + tail + text

    @classmethod
    def decode(cls, head: dict[str, Any], tail: memoryview) -> Call:
        """A call from a frame (`read_frame`); ValueError if it is not one. A text is a view
        of ``tail`` (not a copy of it)."""
        op, call_id, fields = head.get("op"), head.get("id"), head.get("f")
        if op not in cls.OPS or not isinstance(call_id, int) or not isinstance(fields, dict):
            raise ValueError("not a journal call")
        buckets: IndexRows | None = None
        if "bk" in head:
            buckets = FrameBuckets(head["bk"], head.get("bn"), tail)
        return cls(op, call_id, fields, buckets, tail if op in cls.TEXT_OPS else None)


@dataclass(slots=True)
class Reply:
    """The coordinator's answer to a call with an id: the stamp id of a recorded row (None for
    an outcome or a budget's yes), the error that kept it from being committed, or the budget
    that ``refused`` it: ``rate`` (`RateLimited`) or ``busy`` (`ManifestsBusy`), its message,
    and the seconds after which to retry; or the ``view`` asked for: every HTTP process's last
    report, with its age in seconds, and the ``host``'s dispatcher's figures (``queue``,
    ``requeued``, ``disconnects``); or a job ``signed`` (its text, worker and attempts) or
    ``unsigned`` (why: ``queue`` full, ``signing`` failed, ``unavailable``; and the message);
    to a ``stamp``, its stamp id with either, and the seconds its row ``took`` to commit.
    Or, with ``call_id`` 0, news pushed to every HTTP process: the size of a checkpoint
    ``published`` on the host, or the ``workers`` connected to the host's dispatcher (name,
    key, pid), sent on ``hello`` and whenever one comes or goes."""

    call_id: int
    stamp_id: int | None = None
    error: str | None = None
    refused: tuple[str, str, int] | None = None
    published: int | None = None
    view: list[dict[str, Any]] | None = None
    host: dict[str, int] | None = None
    signed: tuple[str, str, int] | None = None
    unsigned: tuple[str, str] | None = None
    workers: list[tuple[str, str, int]] | None = None
    took: float | None = None

    REFUSALS = ("rate", "busy")
    UNSIGNED = ("queue", "signing", "unavailable")

    def encode(self) -> bytes:
        head: dict[str, Any] = {"id": self.call_id, "sid": self.stamp_id, "error": self.error}
        for attr, name in _OPTIONAL:
            value = getattr(self, attr)
            if value is not None:
                head[name] = value
        return frame(head)

    @classmethod
    def decode(cls, head: dict[str, Any]) -> Reply:
        call_id, sid, error = head.get("id"), head.get("sid"), head.get("error")
        no, published, view = head.get("no"), head.get("pub"), head.get("view")
        if (not isinstance(call_id, int) or not (sid is None or isinstance(sid, int))
                or not (error is None or isinstance(error, str))
                or not (published is None or isinstance(published, int))
                or not (view is None or (isinstance(view, list)
                                         and all(isinstance(r, dict) for r in view)))):
            raise ValueError("not a coordinator reply")
        refused = None
        if no is not None:
            if not (isinstance(no, list) and len(no) == 3 and no[0] in cls.REFUSALS
                    and isinstance(no[1], str) and isinstance(no[2], int)):
                raise ValueError("not a coordinator reply")
            refused = (no[0], no[1], no[2])
        host, sig, uns, wk = head.get("host"), head.get("sig"), head.get("uns"), head.get("wk")
        took = head.get("ct")
        if not ((took is None or (isinstance(took, (int, float)) and not isinstance(took, bool)))
                and (host is None or (isinstance(host, dict)
                                  and all(isinstance(v, int) for v in host.values())))
                and (sig is None or (isinstance(sig, list) and len(sig) == 3
                                     and isinstance(sig[0], str) and isinstance(sig[1], str)
                                     and isinstance(sig[2], int)))
                and (uns is None or (isinstance(uns, list) and len(uns) == 2
                                     and uns[0] in cls.UNSIGNED and isinstance(uns[1], str)))
                and (wk is None or (isinstance(wk, list) and all(
                    isinstance(w, list) and len(w) == 3 and isinstance(w[0], str)
                    and isinstance(w[1], str) and isinstance(w[2], int) for w in wk)))):
            raise ValueError("not a coordinator reply")
        return cls(call_id, sid, error, refused, published, view, host,
                   None if sig is None else (sig[0], sig[1], sig[2]),
                   None if uns is None else (uns[0], uns[1]),
                   None if wk is None else [(w[0], w[1], w[2]) for w in wk],
                   None if took is None else float(took))

    def raise_refusal(self) -> None:
        """The refusal as the budget raised it, if this is one."""
        if self.refused is None:
            return
        kind, message, retry = self.refused
        if kind == "rate":
            raise RateLimited(message, retry)
        busy = ManifestsBusy(message)
        busy.retry_after = retry
        raise busy


# A reply's optional fields, and their names on the wire (left out when None).
_OPTIONAL = (("refused", "no"), ("published", "pub"), ("view", "view"), ("host", "host"),
             ("signed", "sig"), ("unsigned", "uns"), ("workers", "wk"), ("took", "ct"))


class FrameBuckets(Sequence[tuple[int, bytes]]):
    """A manifest's index rows as a journal call carried them: their keys, and their packed
    digests one after another in ``data`` (a view of the frame), ``sizes`` bytes each. A row
    is made when it is asked for, as the journal writes it a slice per commit: making all
    65,536 rows of a manifest at once held the host's event loop (and every stamp's reply)
    for 45 ms."""

    def __init__(self, keys: Any, sizes: Any, data: memoryview) -> None:
        # (checked with what runs in C: the rows' keys are checked as each is written)
        try:
            if (not isinstance(keys, list) or not isinstance(sizes, list)
                    or len(keys) != len(sizes) or (sizes and min(sizes) <= 0)):
                raise ValueError("malformed buckets")
            self.ends = array.array("q", itertools.accumulate(sizes))
        except (TypeError, OverflowError):
            raise ValueError("malformed buckets") from None
        if (self.ends[-1] if self.ends else 0) != len(data):
            raise ValueError("the buckets do not add up")
        self.keys: list[int] = keys
        self.data = data

    def __len__(self) -> int:
        return len(self.keys)

    @overload
    def __getitem__(self, i: int) -> tuple[int, bytes]: ...
    @overload
    def __getitem__(self, i: slice) -> list[tuple[int, bytes]]: ...

    def __getitem__(self, i: int | slice) -> tuple[int, bytes] | list[tuple[int, bytes]]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        start = self.ends[i - 1] if i > 0 else 0
        return self.keys[i], bytes(self.data[start:self.ends[i]])


def _object(text: bytes | bytearray | memoryview) -> dict[str, Any]:
    try:
        head = _decode(text)
    except msgspec.DecodeError as e:
        raise ValueError(f"not JSON: {e}") from None
    if not isinstance(head, dict):
        raise ValueError("not a JSON object")
    return head


def _tail(head: dict[str, Any]) -> int:
    size = head.get("t", 0)
    if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= MAX_CALL:
        raise ValueError(f"a tail of {size!r} bytes")
    return size


async def read_frame(reader: asyncio.StreamReader) -> Frame | None:
    """The next frame; None at the end of the stream (ConnectionError inside a frame). A long
    tail (a manifest's text, its buckets,
    its lines) is read into one buffer of its size as it arrives: ``readexactly`` gathers it in
    the stream's own buffer and then copies that, and the host held three copies of a 105 MiB
    text at once (+275 MiB; one copy now)."""
    try:
        header = await reader.readexactly(HEADER.size)
    except asyncio.IncompleteReadError as e:
        if e.partial:
            raise ConnectionError("the connection closed inside a frame") from None
        return None
    (length,) = HEADER.unpack(header)
    if length > MAX_HEAD:
        raise ValueError(f"a frame of {length} bytes")
    try:
        head = _object(await reader.readexactly(length))
        size = _tail(head)
        if size <= LONG_FRAME:
            return head, memoryview(await reader.readexactly(size) if size else b"")
    except asyncio.IncompleteReadError:
        raise ConnectionError("the connection closed inside a frame") from None
    body = bytearray(size)
    view, at = memoryview(body), 0
    while at < size:
        chunk = await reader.read(size - at)
        if not chunk:
            raise ConnectionError("the connection closed inside a frame")
        view[at:at + len(chunk)] = chunk
        at += len(chunk)
    return head, view


class Coalesced:
    """Frames for one stream, written together once per turn of the event loop: one send for
    every reply a commit releases, or every call a process makes meanwhile."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self.frames: list[bytes] = []
        self.held = False  # a long frame is being written a piece at a time (`CoordinatorLink`)

    def put(self, frame: bytes) -> None:
        if not self.frames:
            asyncio.get_running_loop().call_soon(self.flush)
        self.frames.append(frame)

    def flush(self) -> None:
        if self.held:
            return  # (written when the long frame ends)
        if self.frames and not self.writer.is_closing():
            self.writer.write(b"".join(self.frames))
        self.frames.clear()


