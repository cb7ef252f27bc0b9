"""The transparency-log check of `stampd audit` (docs/transparency.md, docs/log.md "stampd
audit"): the server's signed checkpoint, the tree rebuilt from its entry bundles, its hash
tiles, the two logs listing the same stamps, the checkpoints the git log pins, and the
checkpoints earlier audits saw.

`check_tlog` is given a `TlogSource` (what ``GET <server>/tlog/<path>`` answers: `HttpSource`;
tests give a directory of tiles) and the stamps of the audited git log (`LogCommitStamps`, one
per log commit, oldest first). It returns a `TlogSummary` and records each failure with the
callable ``fail`` (check ``tlog``):

1. ``/tlog/vkey`` is an Ed25519 note verifier key (404: the server keeps no transparency log,
   not a failure); ``/tlog/checkpoint`` opens with it, and its origin is the key's name;
2. the entry bundle of every level 0 tile of the checkpoint's size parses at its width; the
   tree of their leaf hashes has the checkpoint's root; every hash tile the server serves at
   that size is the rebuilt tree's (all of them: a tile is one request, like a bundle);
3. every entry parses (`formats.tlog.entry.Entry`). A tag or branch entry's ``commit`` is in
   some log commit's ``hashes.log``, a digest or tsa entry's ``<algorithm> <digest>`` in some
   ``digests.log``, unless the entry is newer than the newest log commit's time less the
   pending slack (its stamp may still be waiting for its log commit: a warning). Conversely
   every ``hashes.log`` id has a tag or branch entry, every ``digests.log`` line a digest or
   tsa entry, unless a manifest entry's time falls in that log commit's period (the git log
   lists a manifest's file digests, the entry only the signed manifest's hash: such lines are
   not checkable), or the log commit is younger than `SEQUENCE_GRACE` when the checkpoint was
   fetched (a warning). Manifest entries themselves cannot be matched with the git log;
4. each log commit's ``tlog-checkpoint`` opens with the key, has the origin, and is a prefix
   of today's tree (its root is the rebuilt tree's root at its size);
5. each checkpoint kept from earlier audits (`client.audit.state`) is a prefix of today's tree;
   one that is not fails with both signed checkpoints as the evidence. Today's is then kept;
6. each witness the server's policy (``/tlog/policy``, c2sp tlog-policy) names with a URL is
   asked for its view of the log (``GET <witness URL>/<SHA-256 hex of the origin>/checkpoint``,
   c2sp.org/tlog-witness); a view that opens with the log key and is not a prefix of today's
   tree fails with both checkpoints (a witness that cannot be reached, or is ahead of the
   checkpoint fetched, is a warning).

The failures of rules 4 to 6 that show two histories of one log (``FORK_RULES``) make
`stampd audit` exit with a status of its own (4).
"""

from __future__ import annotations

import base64
import hashlib
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from client.audit.report import (
    TLOG_CHECKED,
    TLOG_FAILED,
    TLOG_NO_CHECKPOINT,
    TLOG_NONE,
    TlogSummary,
)
from client.audit.state import SeenCheckpoints, SeenLog
from client.fetch import FetchError, http_request
from formats.note import Ed25519Verifier, NoteError, open_note
from formats.tlog.checkpoint import Checkpoint
from formats.tlog.entry import GIT_KINDS, Entry
from formats.tlog.errors import TlogError
from formats.tlog.merkle import leaf_hash, tree_levels, tree_root
from formats.tlog.policy import Policy, PolicyError
from formats.tlog.tiles import (
    MAX_ENTRY_SIZE,
    TILE_WIDTH,
    Tile,
    parse_entry_bundle,
    tile_data,
    tiles_for_size,
)

# A stamp goes into the git log's next commit once signed, or once pending for longer than the
# server's STAMPD_REQUEST_TIMEOUT (at most 25 s) + 10 s (docs/log.md "What goes into the
# log"): an entry at most this much older than the newest log commit may not be in it yet.
PENDING_SLACK = 35
# The sequencer makes the entries of signed stamps within a second or so; a stamp of a log
# commit younger than this (server time vs the auditor's clock when the checkpoint was
# fetched) may not have its entry yet.
SEQUENCE_GRACE = 30
HTTP_TIMEOUT = 30.0
MAX_VKEY = 1024
MAX_NOTE = 64 * 1024
MAX_BUNDLE = TILE_WIDTH * (2 + MAX_ENTRY_SIZE)
MAX_TILE = TILE_WIDTH * 32
DIGEST_KINDS = ("digest", "tsa")

Fail = Callable[..., None]  # fail(rule, message, commit="", path=None)


class NotFound(Exception):
    """The source has no such file (HTTP 404)."""


class SourceError(Exception):
    """The source could not answer (anything but 200 or 404)."""


class TlogSource(Protocol):
    """Where the ``/tlog`` files come from; ``name`` says it in messages."""

    @property
    def name(self) -> str: ...

    def get(self, path: str, limit: int) -> bytes:
        """The bytes of ``tlog/<path>``; `NotFound` or `SourceError` otherwise."""
        ...


@dataclass(frozen=True)
class HttpSource:
    """``GET <base>tlog/<path>`` with the client's HTTP (no redirects, a timeout, a limit)."""

    base: str  # the server's base URL, ending in "/"

    @property
    def name(self) -> str:
        return self.base

    def get(self, path: str, limit: int) -> bytes:
        url = f"{self.base}tlog/{path}"
        try:
            data = http_request(url, timeout=HTTP_TIMEOUT, limit=limit)
        except FetchError as e:
            if e.status == 404:
                raise NotFound(url) from None
            what = f"HTTP {e.status}" if e.status is not None else e.reason
            raise SourceError(f"GET {url}: {what}") from None
        if len(data) > limit:
            raise SourceError(f"GET {url}: more than {limit} bytes")
        return data


def server_of(url: str) -> str | None:
    """The server's base URL of a log URL ``.../log.git`` (with a final "/"); None if the
    URL does not end so."""
    stripped = url.rstrip("/")
    if not stripped.lower().startswith(("http://", "https://")) or \
            not stripped.endswith("/log.git"):
        return None
    return stripped[: -len("log.git")]


def base_url(server: str) -> str:
    """``--server URL`` as a base URL ending in "/" (a URL of its ``log.git`` works too)."""
    server = server_of(server) or server
    return server if server.endswith("/") else server + "/"


@dataclass(frozen=True)
class TlogOptions:
    """How `audit` checks the transparency log: the server (None: the target's URL, or the
    audited remote's, less ``log.git``), the state file of seen checkpoints (None: none kept),
    and the pending slack (seconds)."""

    server: str | None = None
    state: Path | None = None
    slack: int = PENDING_SLACK


@dataclass(frozen=True)
class LogCommitStamps:
    """What one log commit lists, as the tlog check needs it."""

    commit: str
    time: int  # committer time
    hashes: frozenset[str]  # the lines of hashes.log
    digests: frozenset[str]  # the lines of digests.log, "<algorithm> <hex>"
    checkpoint: bytes | None  # its tlog-checkpoint file


def _b64(h: bytes) -> str:
    return base64.b64encode(h).decode("ascii")


def _indent(note: str) -> str:
    return "\n".join("  " + line for line in note.rstrip("\n").split("\n"))


class _Check:
    def __init__(self, source: TlogSource, stamps: Sequence[LogCommitStamps],
                 state: SeenCheckpoints | None, fail: Fail, jobs: int,
                 slack: int, summary: TlogSummary) -> None:
        self.source = source
        self.stamps = stamps
        self.state = state
        self.fail = fail
        self.jobs = jobs
        self.slack = slack
        self.s = summary

    def get(self, path: str, limit: int) -> bytes | None:
        """The file, or None after recording a failure (``fetch``)."""
        try:
            return self.source.get(path, limit)
        except NotFound:
            self.fail("fetch", f"{self.source.name}tlog/{path}: not found (404)",
                      path=f"/tlog/{path}")
        except SourceError as e:
            self.fail("fetch", str(e), path=f"/tlog/{path}")
        return None

    def run(self) -> None:
        s = self.s
        try:
            vkey_bytes = self.source.get("vkey", MAX_VKEY)
        except NotFound:
            s.status = TLOG_NONE
            carried = sum(1 for c in self.stamps if c.checkpoint is not None)
            if carried:
                s.warnings.append(f"the git log carries {carried} tlog-checkpoint file(s): "
                                  "the server kept a transparency log before")
            return
        except SourceError as e:
            s.status = TLOG_FAILED
            self.fail("fetch", str(e), path="/tlog/vkey")
            return
        try:
            verifier = Ed25519Verifier.from_vkey(vkey_bytes.decode("utf-8").strip())
        except (NoteError, ValueError) as e:
            s.status = TLOG_FAILED
            self.fail("vkey", f"not an Ed25519 note verifier key: {e}", path="/tlog/vkey")
            return
        s.vkey, s.origin = verifier.key.encode(), verifier.name

        try:
            note = self.source.get("checkpoint", MAX_NOTE)
        except NotFound:
            s.status = TLOG_NO_CHECKPOINT
            if self.state is not None and self.state.logs.get(verifier.name):
                self.fail("checkpoint", "the server has no checkpoint, but an earlier audit "
                          f"saw one (state {self.state.path})", path="/tlog/checkpoint")
            return
        except SourceError as e:
            s.status = TLOG_FAILED
            self.fail("fetch", str(e), path="/tlog/checkpoint")
            return
        fetched_at = time.time()
        cp = self.open_checkpoint(note, verifier, "/tlog/checkpoint", "the server's checkpoint")
        if cp is None:
            s.status = TLOG_FAILED
            return
        s.size, s.root = cp.size, _b64(cp.root)

        entries = self.fetch_entries(cp.size)
        if entries is None:
            s.status = TLOG_FAILED
            return
        levels = tree_levels([leaf_hash(e) for e in entries])

        def node(level: int, index: int) -> bytes:
            return levels[level][index]

        if tree_root(cp.size, node) != cp.root:
            self.fail("root", f"the {cp.size} entries served hash to "
                      f"{_b64(tree_root(cp.size, node))}, not to the checkpoint's root "
                      f"{_b64(cp.root)}", path="/tlog/checkpoint")
        self.check_tiles(cp.size, node)
        s.status = TLOG_CHECKED
        parsed = self.parse_entries(entries)
        self.match_git_log(parsed, fetched_at)
        self.check_git_checkpoints(verifier, cp, node)
        self.check_seen(verifier, note, cp, node)
        self.check_witnesses(verifier, note, cp, node)

    def open_checkpoint(self, note: bytes, verifier: Ed25519Verifier, path: str, what: str,
                        commit: str = "", rule: str = "checkpoint") -> Checkpoint | None:
        try:
            opened = open_note(note, [verifier])
            cp = Checkpoint.parse(opened.text)
        except (NoteError, TlogError, ValueError) as e:
            self.fail(rule, f"{what} is not a checkpoint signed by the log key "
                      f"{verifier.key.encode()}: {e}", commit, path)
            return None
        if cp.origin != verifier.name:
            self.fail(rule, f"{what} has origin {cp.origin!r}, not the log key's name "
                      f"{verifier.name!r}", commit, path)
            return None
        return cp

    def fetch_entries(self, size: int) -> list[bytes] | None:
        """The entries of the tree of ``size``, from its entry bundles; None if any bundle
        is missing or malformed (each a failure)."""

        def bad(tile: Tile, e: TlogError) -> None:
            self.fail("bundle", str(e), path=f"/tlog/{tile.entries_path()}")

        return read_entries(size, lambda path: self.get(path, MAX_BUNDLE), bad, self.jobs)

    def check_tiles(self, size: int, node: Callable[[int, int], bytes]) -> None:
        tiles = tiles_for_size(size)
        with ThreadPoolExecutor(max_workers=self.jobs) as pool:
            served = list(pool.map(lambda t: self.get(t.path(), MAX_TILE), tiles))
        for tile, data in zip(tiles, served, strict=True):
            if data is None:
                continue
            if data != tile_data(tile, node):
                self.fail("tile", f"hash tile of {len(data)} bytes differs from the tree "
                          "rebuilt from the entries", path=f"/tlog/{tile.path()}")
            else:
                self.s.tiles += 1

    def parse_entries(self, entries: Sequence[bytes]) -> list[tuple[int, Entry]]:
        parsed = []
        for i, data in enumerate(entries):
            try:
                e = Entry.parse(data)
            except TlogError as err:
                self.fail("entry", f"entry {i} is not a stampd log entry: {err}",
                          path=f"entry {i}")
                continue
            parsed.append((i, e))
            self.s.entries[e.kind] = self.s.entries.get(e.kind, 0) + 1
        return parsed

    def match_git_log(self, parsed: Sequence[tuple[int, Entry]], fetched_at: float) -> None:
        """Rule 3: every stamp in both logs (see the module docstring)."""
        hashes: set[str] = set()
        digests: set[str] = set()
        for c in self.stamps:
            hashes |= c.hashes
            digests |= c.digests
        newest = self.stamps[-1].time if self.stamps else None
        git_ids: set[str] = set()
        digest_lines: set[str] = set()
        manifest_times: list[int] = []
        for i, e in parsed:
            if e.kind == "manifest":
                self.s.manifests += 1
                manifest_times.append(e.time)
                continue
            if e.kind in GIT_KINDS:
                assert e.commit is not None
                git_ids.add(e.commit)
                listed, what = e.commit in hashes, f"commit {e.commit} (hashes.log)"
            else:
                line = f"{e.algorithm} {e.digest}"
                digest_lines.add(line)
                listed, what = line in digests, f"{line} (digests.log)"
            if listed:
                continue
            if newest is None or e.time > newest - self.slack:
                self.s.not_in_git_log += 1
                continue
            self.fail("not-in-git-log", f"entry {i} ({e.kind} stamp of {what}, time {e.time}) "
                      f"is in no log commit, though the newest log commit ({newest}) is more "
                      f"than {self.slack} s younger", path=f"entry {i}")
        previous: int | None = None
        for c in self.stamps:
            young = fetched_at - c.time < SEQUENCE_GRACE
            missing = sorted(c.hashes - git_ids)
            extra = sorted(c.digests - digest_lines)
            if extra and any((previous is None or t > previous - self.slack)
                             and t <= c.time + self.slack for t in manifest_times):
                extra = []  # possibly a manifest's file digests: not checkable
            for what, lines in (("hashes.log", missing), ("digests.log", extra)):
                if not lines:
                    continue
                if young:
                    self.s.not_in_tlog += len(lines)
                    continue
                shown = ", ".join(lines[:3]) + (f" and {len(lines) - 3} more"
                                                if len(lines) > 3 else "")
                self.fail("not-in-tlog", f"{len(lines)} stamp(s) of this log commit have no "
                          f"entry in the transparency log: {shown}", c.commit, what)
            previous = c.time

    def check_git_checkpoints(self, verifier: Ed25519Verifier, cp: Checkpoint,
                              node: Callable[[int, int], bytes]) -> None:
        """Rule 4: the git log's tlog-checkpoint files are prefixes of today's tree."""
        for c in self.stamps:
            if c.checkpoint is None:
                continue
            old = self.open_checkpoint(c.checkpoint, verifier, "tlog-checkpoint",
                                       "its tlog-checkpoint", c.commit, "git-checkpoint")
            if old is None:
                continue
            if old.size > cp.size:
                self.s.warnings.append(f"log commit {c.commit[:12]} pins a checkpoint of size "
                                       f"{old.size}, larger than the server's ({cp.size}): "
                                       "not checked")
            elif tree_root(old.size, node) != old.root:
                self.fail("git-checkpoint", f"its tlog-checkpoint (size {old.size}, root "
                          f"{_b64(old.root)}) is not a prefix of the server's tree: that tree "
                          f"has root {_b64(tree_root(old.size, node))} at size {old.size}",
                          c.commit, "tlog-checkpoint")
            else:
                self.s.git_checkpoints += 1

    def check_seen(self, verifier: Ed25519Verifier, note: bytes, cp: Checkpoint,
                   node: Callable[[int, int], bytes]) -> None:
        """Rule 5: the checkpoints of earlier audits are prefixes of today's tree; keep
        today's, and those that are not shown to be prefixes."""
        if self.state is None:
            return
        self.s.state = str(self.state.path)
        origin = verifier.name
        today = note.decode("utf-8")
        seen = self.state.logs.get(origin)
        keep: list[str] = []
        if seen is not None and seen.vkey != verifier.key.encode():
            # the state is left as it is: the old key and its checkpoints are the evidence
            self.fail("key-changed", f"the server's log key for {origin} is "
                      f"{verifier.key.encode()}, but an earlier audit saw {seen.vkey} "
                      f"(state {self.state.path})", path="/tlog/vkey")
            return
        try:
            old_verifier = Ed25519Verifier.from_vkey(seen.vkey) if seen is not None else None
        except (NoteError, ValueError):
            old_verifier = None  # (equal to today's vkey, which parsed: cannot happen)
        for old_note in (seen.checkpoints if seen is not None else []):
            assert old_verifier is not None
            try:
                old = Checkpoint.parse(open_note(old_note.encode("utf-8"),
                                                 [old_verifier]).text)
            except (NoteError, TlogError, ValueError) as e:
                self.s.warnings.append(f"a checkpoint in the state {self.state.path} does not "
                                       f"open with the log key ({e}): dropped")
                continue
            if old.size > cp.size:
                self.s.warnings.append(f"an earlier audit saw size {old.size}, larger than "
                                       f"today's {cp.size}: not checked, kept")
                keep.append(old_note)
            elif tree_root(old.size, node) != old.root:
                self.fail("seen-checkpoint", "a checkpoint seen by an earlier audit is not a "
                          f"prefix of today's tree (size {old.size}: root {_b64(old.root)} "
                          f"then, {_b64(tree_root(old.size, node))} in today's tree): two "
                          f"histories of one log. Seen before:\n{_indent(old_note)}\n"
                          f"Today:\n{_indent(today)}", path="/tlog/checkpoint")
                keep.append(old_note)
            else:
                self.s.seen += 1
        if today not in keep:
            keep.append(today)
        self.state.logs[origin] = SeenLog(verifier.key.encode(), keep)


    def check_witnesses(self, verifier: Ed25519Verifier, note: bytes, cp: Checkpoint,
                        node: Callable[[int, int], bytes]) -> None:
        """Rule 6: the witnesses' views of the log are prefixes of today's tree."""
        try:
            policy = Policy.parse(self.source.get("policy", MAX_NOTE))
        except NotFound:
            return
        except (SourceError, PolicyError) as e:
            self.s.warnings.append(f"the server's witness policy was not read: {e}")
            return
        origin_hash = hashlib.sha256(verifier.name.encode()).hexdigest()
        today = note.decode("utf-8")
        for w in policy.witnesses:
            if w.url is None:
                continue
            url = f"{w.url.rstrip('/')}/{origin_hash}/checkpoint"
            try:
                view = http_request(url, timeout=HTTP_TIMEOUT, limit=MAX_NOTE)
                opened = open_note(view, [verifier, w.key])
                if not any((x.name, x.key_id) == (verifier.name, verifier.key_id)
                           for x in opened.verified):
                    raise NoteError("no signature by the log key")
                seen = Checkpoint.parse(opened.text)
            except FetchError as e:
                what = f"HTTP {e.status}" if e.status is not None else e.reason
                self.s.warnings.append(f"witness {w.name}: GET {url}: {what}")
                continue
            except (NoteError, TlogError, ValueError) as e:
                self.fail("witness-view", f"witness {w.name}'s checkpoint ({url}) does not "
                          f"open with the log key and its own: {e}", path=url)
                continue
            if seen.origin != cp.origin:
                self.fail("witness-view", f"witness {w.name} answered a checkpoint of "
                          f"{seen.origin!r}, not {cp.origin!r}", path=url)
            elif seen.size > cp.size:
                self.s.warnings.append(f"witness {w.name} has seen size {seen.size}, larger "
                                       f"than the checkpoint fetched ({cp.size}): not checked")
            elif tree_root(seen.size, node) != seen.root:
                self.fail("witness-fork", f"witness {w.name} holds a checkpoint that is not a "
                          f"prefix of the server's tree (size {seen.size}: root "
                          f"{_b64(seen.root)} there, {_b64(tree_root(seen.size, node))} in the "
                          f"server's tree): two histories of one log. The witness's:\n"
                          f"{_indent(view.decode('utf-8', 'replace'))}\nThe server's:\n"
                          f"{_indent(today)}", path=url)
            else:
                self.s.witnesses += 1


def read_entries(size: int, get: Callable[[str], bytes | None],
                 bad: Callable[[Tile, TlogError], None], jobs: int = 4) -> list[bytes] | None:
    """The entries of the tree of ``size`` from its entry bundles, ``get(path)`` each (None:
    missing), ``jobs`` at a time; None if any bundle is missing or malformed (``bad`` is told
    of each malformed one)."""
    tiles = [t for t in tiles_for_size(size) if t.level == 0]
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        bundles = list(pool.map(lambda t: get(t.entries_path()), tiles))
    entries: list[bytes] = []
    ok = True
    for tile, data in zip(tiles, bundles, strict=True):
        if data is None:
            ok = False
            continue
        try:
            entries += parse_entry_bundle(data, tile.width)
        except TlogError as e:
            bad(tile, e)
            ok = False
    return entries if ok else None


def check_tlog(source: TlogSource, stamps: Sequence[LogCommitStamps],
               state: SeenCheckpoints | None, fail: Fail, *, jobs: int = 4,
               slack: int = PENDING_SLACK) -> TlogSummary:
    """Run the transparency-log checks (see the module docstring) and return what was found;
    each failure goes to ``fail(rule, message, commit="", path=None)``. ``state``, when
    given, is read and updated (not saved: the caller saves it)."""
    summary = TlogSummary(server=source.name)
    _Check(source, stamps, state, fail, jobs, slack, summary).run()
    return summary
