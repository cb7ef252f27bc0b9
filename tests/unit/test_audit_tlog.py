"""The transparency-log check of `stampd audit` (client.audit.tlog) on logs built here: tiles
written by the server's `TileWriter`, checkpoints signed with Ed25519 keys made here, the git
log given as the stamps its commits list. Split views (a checkpoint an earlier audit saw that
today's tree does not extend) can only be made with the log key, so they are tested here."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from client.audit.report import TLOG_CHECKED, TLOG_NONE, Failure
from client.audit.state import SeenCheckpoints, SeenLog, StateError, default_state_file
from client.audit.tlog import (
    LogCommitStamps,
    NotFound,
    TlogSummary,
    base_url,
    check_tlog,
    server_of,
)
from formats.note import VerifierKey, ed25519_signer, sign_note
from formats.tlog.checkpoint import Checkpoint
from formats.tlog.entry import Entry
from server.tlog.store import TileWriter

ORIGIN = "example.test/tlog"
FPR = "0123456789ABCDEF0123456789ABCDEF01234567"
T0 = 1_760_000_000


def key(seed: int) -> Ed25519PrivateKey:
    return Ed25519PrivateKey.from_private_bytes(bytes([seed]) * 32)


def vkey_of(k: Ed25519PrivateKey, origin: str = ORIGIN) -> str:
    public = k.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return VerifierKey(origin, 1, public).encode()


def sign(cp: Checkpoint, k: Ed25519PrivateKey) -> bytes:
    public = k.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return sign_note(cp.body(), [ed25519_signer(cp.origin, public, k.sign)]).encode()


def digest_entry(n: int, t: int = T0) -> Entry:
    return Entry(n, "digest", t, FPR, algorithm="sha256",
                 digest=hashlib.sha256(b"%d" % n).hexdigest())


def tag_entry(n: int, t: int = T0) -> Entry:
    return Entry(n, "tag", t, FPR, commit=hashlib.sha1(b"%d" % n).hexdigest(),
                 object_id=hashlib.sha1(b"tag %d" % n).hexdigest())


class DirSource:
    """A log's /tlog files from a directory (what a static web server would serve)."""

    def __init__(self, root: Path, vkey: str | None) -> None:
        self.root, self.vkey = root, vkey
        self.name = f"file://{root}/"

    def get(self, path: str, limit: int) -> bytes:
        if path == "vkey":
            if self.vkey is None:
                raise NotFound(path)
            return self.vkey.encode() + b"\n"
        try:
            return (self.root / path).read_bytes()
        except FileNotFoundError:
            raise NotFound(path) from None


class Log:
    """A log in ``root``: entries appended, checkpoints signed with ``k``."""

    def __init__(self, root: Path, k: Ed25519PrivateKey) -> None:
        self.root, self.k = root, k
        self.w = TileWriter(root, sync=False)
        self.w.open()

    def add(self, *entries: Entry) -> bytes:
        self.w.append(self.w.size, [e.encode() for e in entries])
        note = sign(Checkpoint(ORIGIN, self.w.size, self.w.root_hash()), self.k)
        self.w.publish(note)
        return note


def git_log(*commits: tuple[int, list[Entry], bytes | None]) -> list[LogCommitStamps]:
    """Log commits (committer time, the stamps listed, tlog-checkpoint) as the audit reads."""
    out = []
    for n, (t, entries, cp) in enumerate(commits):
        out.append(LogCommitStamps(
            f"{n:040x}", t,
            frozenset(e.commit for e in entries if e.commit),
            frozenset(f"{e.algorithm} {e.digest}" for e in entries if e.digest), cp))
    return out


def run(source: DirSource, stamps: list[LogCommitStamps], state: SeenCheckpoints | None = None,
        ) -> tuple[TlogSummary, list[Failure]]:
    failures: list[Failure] = []

    def fail(rule: str, message: str, commit: str = "", path: str | None = None) -> None:
        failures.append(Failure("tlog", rule, message, commit, path))

    return check_tlog(source, stamps, state, fail, jobs=2), failures


def rules(failures: list[Failure]) -> list[str]:
    return [f.rule for f in failures]


@pytest.fixture
def log(tmp_path: Path) -> Log:
    return Log(tmp_path / "tlog", key(1))


ENTRIES = [digest_entry(1), tag_entry(2), digest_entry(3), tag_entry(4)]


def test_a_good_log_passes_and_is_remembered(log: Log, tmp_path: Path) -> None:
    first = log.add(*ENTRIES[:2])
    log.add(*ENTRIES[2:])
    state = SeenCheckpoints.load(tmp_path / "state.json")
    src = DirSource(log.root, vkey_of(log.k))
    summary, failures = run(src, git_log((T0 + 100, ENTRIES, first)), state)
    assert failures == []
    assert summary.status == TLOG_CHECKED and summary.size == 4
    assert summary.entries == {"digest": 2, "tag": 2}
    assert (summary.git_checkpoints, summary.tiles, summary.not_in_git_log) == (1, 1, 0)
    state.save()
    again = SeenCheckpoints.load(tmp_path / "state.json")
    assert again.logs[ORIGIN].checkpoints == [(log.root / "checkpoint").read_text()]
    log.add(digest_entry(5, T0 + 200))  # newer than the newest log commit: a warning
    summary, failures = run(src, git_log((T0 + 100, ENTRIES, first)), again)
    assert failures == [] and summary.seen == 1 and summary.not_in_git_log == 1


def test_a_seen_checkpoint_the_tree_does_not_extend_fails_with_both(
        log: Log, tmp_path: Path) -> None:
    other = Log(tmp_path / "other", log.k)  # the same key shows another history
    seen = other.add(digest_entry(9), *ENTRIES[1:3])
    log.add(*ENTRIES)
    state = SeenCheckpoints.load(tmp_path / "state.json")
    state.logs[ORIGIN] = SeenLog(
        vkey_of(log.k), [seen.decode()])
    summary, failures = run(DirSource(log.root, vkey_of(log.k)),
                            git_log((T0 + 100, ENTRIES, None)), state)
    assert rules(failures) == ["seen-checkpoint"]
    message = failures[0].message
    assert seen.decode().split("\n")[2] in message  # the old root, signed
    assert (log.root / "checkpoint").read_text().split("\n")[2] in message  # today's
    assert message.count("— example.test/tlog") == 2  # both signature lines
    # the evidence stays, beside today's
    assert state.logs[ORIGIN].checkpoints == [seen.decode(),
                                              (log.root / "checkpoint").read_text()]
    # a larger checkpoint seen before (a host ahead of this one) is kept, not a failure
    state.logs[ORIGIN].checkpoints = [other.add(digest_entry(10), digest_entry(11)).decode()]
    summary, failures = run(DirSource(log.root, vkey_of(log.k)),
                            git_log((T0 + 100, ENTRIES, None)), state)
    assert failures == [] and summary.warnings and len(state.logs[ORIGIN].checkpoints) == 2


def test_a_changed_log_key_fails(log: Log, tmp_path: Path) -> None:
    note = log.add(*ENTRIES)
    state = SeenCheckpoints(tmp_path / "s.json")
    run(DirSource(log.root, vkey_of(log.k)), git_log((T0 + 100, ENTRIES, None)), state)
    other = Log(tmp_path / "other", key(2))
    other.add(*ENTRIES)
    _, failures = run(DirSource(other.root, vkey_of(key(2))),
                      git_log((T0 + 100, ENTRIES, None)), state)
    assert rules(failures) == ["key-changed"]
    assert state.logs[ORIGIN].checkpoints == [note.decode()]  # left as it was


def test_tampered_files_fail(log: Log) -> None:
    note = log.add(*ENTRIES)
    src = DirSource(log.root, vkey_of(log.k))
    stamps = git_log((T0 + 100, ENTRIES, None))
    tile = log.root / "tile/0/000.p/4"
    good = tile.read_bytes()
    tile.write_bytes(good[:32] + bytes(32) + good[64:])
    assert rules(run(src, stamps)[1]) == ["tile"]
    tile.write_bytes(good)
    bundle = log.root / "tile/entries/000.p/4"
    good = bundle.read_bytes()
    bundle.write_bytes(good.replace(b"kind tag", b"kind tsa", 1))
    assert "root" in rules(run(src, stamps)[1])
    bundle.write_bytes(good[:-3])
    assert rules(run(src, stamps)[1]) == ["bundle"]
    bundle.write_bytes(good)
    cp = Checkpoint.parse(note.decode().split("\n\n")[0] + "\n")
    (log.root / "checkpoint").write_bytes(sign(cp, key(2)))  # another key
    assert rules(run(src, stamps)[1]) == ["checkpoint"]
    (log.root / "checkpoint").write_bytes(sign(Checkpoint(ORIGIN, 4, bytes(32)), log.k))
    assert rules(run(src, stamps)[1]) == ["root"]
    (log.root / "checkpoint").write_bytes(note)
    # a git log checkpoint of another history
    other = sign(Checkpoint(ORIGIN, 2, hashlib.sha256(b"x").digest()), log.k)
    assert rules(run(src, git_log((T0 + 100, ENTRIES, other)))[1]) == ["git-checkpoint"]


def test_both_logs_list_the_same_stamps(log: Log) -> None:
    log.add(*ENTRIES)
    src = DirSource(log.root, vkey_of(log.k))
    # an entry the git log does not list, older than its newest commit: a failure
    _, failures = run(src, git_log((T0 + 100, ENTRIES[1:], None)))
    assert rules(failures) == ["not-in-git-log"] and "entry 0" in failures[0].message
    # ... not when it may still wait for its log commit
    summary, failures = run(src, git_log((T0 + 10, ENTRIES[1:], None)))
    assert failures == [] and summary.not_in_git_log == 1
    # a stamp of the git log without an entry (an old log commit): a failure
    lost = tag_entry(7)
    stamps = git_log((T0 + 100, [*ENTRIES, lost], None))
    _, failures = run(src, stamps)
    assert rules(failures) == ["not-in-tlog"] and failures[0].path == "hashes.log"
    assert lost.commit is not None and lost.commit in failures[0].message
    # a digests.log line without an entry is not checkable where a manifest was stamped
    _, failures = run(src, git_log((T0 + 100, [*ENTRIES, digest_entry(8)], None)))
    assert rules(failures) == ["not-in-tlog"] and failures[0].path == "digests.log"
    manifest = Entry(5, "manifest", T0 + 50, FPR, signed=hashlib.sha256(b"m").hexdigest())
    log.add(manifest)
    summary, failures = run(src, git_log((T0 + 100, [*ENTRIES, digest_entry(8)], None)))
    assert failures == [] and summary.manifests == 1


def test_a_server_without_a_log(log: Log) -> None:
    summary, failures = run(DirSource(log.root, None), git_log((T0, ENTRIES, None)))
    assert summary.status == TLOG_NONE and failures == []


def test_urls_and_state_location(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert server_of("https://stamps.example/log.git") == "https://stamps.example/"
    assert server_of("http://h:8080/x/log.git/") == "http://h:8080/x/"
    assert server_of("/srv/stampd/log.git") is None
    assert base_url("https://h/log.git") == base_url("https://h") == "https://h/"
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    assert default_state_file() == tmp_path / "stampd" / "tlog-checkpoints.json"
    monkeypatch.delenv("XDG_STATE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_state_file() == tmp_path / ".local/state/stampd/tlog-checkpoints.json"
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(StateError):
        SeenCheckpoints.load(bad)


def test_root_is_base64_of_the_checkpoint(log: Log) -> None:
    note = log.add(*ENTRIES)
    summary, _ = run(DirSource(log.root, vkey_of(log.k)), git_log((T0 + 100, ENTRIES, None)))
    assert summary.root == note.decode().split("\n")[2]
    assert base64.b64decode(summary.root)
