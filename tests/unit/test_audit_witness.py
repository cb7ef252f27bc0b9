"""`stampd audit`'s rule 6: the witnesses the server's policy names are asked for their view of
the log (c2sp tlog-witness monitoring: ``GET <url>/<sha256 hex of origin>/checkpoint``), served
here by a real HTTP server on loopback; a view the log's tree does not extend is a fork (exit
status 4 from the command)."""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from client.audit.report import FORK_RULES, AuditReport
from formats.note import ED25519_COSIGNATURE, Note, Signature, VerifierKey, parse_note
from formats.tlog.checkpoint import cosignature_message
from tests.helpers import RoutesServer
from tests.unit.test_audit_tlog import (
    ENTRIES,
    ORIGIN,
    DirSource,
    Log,
    digest_entry,
    git_log,
    key,
    rules,
    run,
    vkey_of,
)

WITNESS_NAME = "witness.test/w1"


@pytest.fixture
def log(tmp_path: Path) -> Log:
    return Log(tmp_path / "tlog", key(1))


@pytest.fixture
def witness() -> Iterator[RoutesServer]:
    """A witness's monitoring endpoint on loopback: ``routes[VIEW]`` is its view of the log."""
    w = RoutesServer({})
    yield w
    w.close()


WKEY = Ed25519PrivateKey.from_private_bytes(b"\x09" * 32)
WVKEY = VerifierKey(WITNESS_NAME, ED25519_COSIGNATURE,
                    WKEY.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw))


def cosigned(note: bytes, t: int = 1_760_000_500) -> bytes:
    """``note`` with the witness's cosignature, made with `cryptography` on the spec's
    message."""
    parsed = parse_note(note)
    sig = Signature(WVKEY.name, WVKEY.key_id, struct.pack(">Q", t) + WKEY.sign(
        cosignature_message(parsed.text, t)))
    return Note(parsed.text, (*parsed.signatures, sig)).encode()


def with_policy(log: Log, url: str) -> DirSource:
    (log.root / "policy").write_text(f"log {vkey_of(log.k)}\nwitness w1 {WVKEY.encode()} {url}"
                                     "\nquorum w1\n")
    return DirSource(log.root, vkey_of(log.k))


VIEW = f"/{hashlib.sha256(ORIGIN.encode()).hexdigest()}/checkpoint"


def test_a_witness_view_the_tree_extends_is_counted(log: Log, witness: RoutesServer) -> None:
    witness.routes[VIEW] = (200, cosigned(log.add(*ENTRIES[:2])), {})
    log.add(*ENTRIES[2:])
    summary, failures = run(with_policy(log, witness.url), git_log((0, [], None)))
    assert [f for f in failures if f.rule.startswith("witness")] == []
    assert summary.witnesses == 1


def test_a_witness_holding_another_history_is_a_fork(log: Log, witness: RoutesServer,
                                                     tmp_path: Path) -> None:
    other = Log(tmp_path / "other", log.k)  # the same log key, another tree
    forked = cosigned(other.add(digest_entry(9), *ENTRIES[1:3]))
    witness.routes[VIEW] = (200, forked, {})
    log.add(*ENTRIES)
    summary, failures = run(with_policy(log, witness.url), git_log((0, [], None)))
    fork = [f for f in failures if f.rule == "witness-fork"]
    assert len(fork) == 1 and summary.witnesses == 0
    assert forked.decode().split("\n")[2] in fork[0].message  # the witness's root, signed
    assert (log.root / "checkpoint").read_text().split("\n")[2] in fork[0].message
    report = AuditReport(target="t", head="", fingerprint=None)
    report.failures.extend(fork)
    assert report.forked and "witness-fork" in FORK_RULES


def test_an_unreachable_or_ahead_witness_is_a_warning(log: Log, witness: RoutesServer,
                                                      tmp_path: Path) -> None:
    log.add(*ENTRIES[:2])
    summary, failures = run(with_policy(log, witness.url), git_log((0, [], None)))
    assert "witness-fork" not in rules(failures) and summary.witnesses == 0
    assert any("w1" in w and "404" in w for w in summary.warnings), summary.warnings
    bigger = Log(tmp_path / "bigger", log.k)
    witness.routes[VIEW] = (200, cosigned(bigger.add(*ENTRIES)), {})
    summary, failures = run(with_policy(log, witness.url), git_log((0, [], None)))
    assert any("larger" in w for w in summary.warnings), summary.warnings


def test_a_view_not_signed_by_the_log_fails(log: Log, witness: RoutesServer,
                                            tmp_path: Path) -> None:
    stranger = Log(tmp_path / "stranger", key(7))
    witness.routes[VIEW] = (200, cosigned(stranger.add(*ENTRIES[:1])), {})
    log.add(*ENTRIES)
    _, failures = run(with_policy(log, witness.url), git_log((0, [], None)))
    assert "witness-view" in rules(failures)
