"""The **mailstamps** check of `stampd audit`: each ``<name>-mailstamps`` branch, the replies of
an email timestamper (docs/mail.md, "In the log"; `formats.mailstamps`).

Every commit of the branch has one or two parents: the stamped ``main`` commit last, and the
previous commit of the branch first when there are two. Its tree's ``mailstamp.asc`` is exactly
one clear-signed message, which gpg verifies with the key the log published for the timestamper
(``mailstampers/<name>.asc`` of the first main commit at or after the stamped one that has it,
else of the newest one before it; one key per timestamper) and nothing else; the signed text
quotes the request stampd sends for the stamped commit (rebuilt from that commit: its number and
its ``tlog-checkpoint``); the signature is not older than the stamped commit (30 s of skew).

A reply of a timestamper in digest mode (another stampd's mail listener, sent only the
request's SHA-256) has the request text beside it, ``request.txt``: its signed text must be a
stampd receipt of the SHA-256 of that text, and the text the request for the stamped commit.

A valid reply covers the stamped commit and every earlier one from its signature's time on: it
is a stamp for the coverage report, named ``<name> (mail)``.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable, Sequence

import pygit2

from client.audit.errors import KeyFileError
from client.audit.report import MAIL_CHECK, PeerStamp, PeerSummary
from client.audit.repository import read_blob, ref_commit, ref_target
from client.audit.signatures import Keyring, Keyrings, verify_cleartext
from formats.mailstamps import (
    KEYS_DIR,
    REPLY_FILE,
    REQUEST_FILE,
    MailStampError,
    clearsigned_block,
    quotes,
    receipt_of,
    request_digest,
    request_text,
)

NAME = re.compile(r"[a-z0-9][a-z0-9_.-]{0,39}")
LOG_NUMBER = re.compile(r"stampd log commit (\d+)\n")
CLOCK_SKEW = 30

Fail = Callable[..., None]  # (check, rule, message, commit, path=None, ref=None)


def request_of(repo: pygit2.Repository, main: pygit2.Commit) -> str:
    """The request stampd mails for ``main``: its number and its checkpoint."""
    m = LOG_NUMBER.match(main.message)
    checkpoint = read_blob(repo, main.tree, "tlog-checkpoint")
    return request_text(str(main.id), int(m.group(1)) if m else None,
                        checkpoint.decode("utf-8", "replace") if checkpoint else None)


def check_mail_branch(repo: pygit2.Repository, keyrings: Keyrings, fail: Fail, name: str,
                      ref: str, chain: Sequence[pygit2.Commit], main_index: dict[str, int]
                      ) -> tuple[PeerSummary, list[PeerStamp]]:
    """Check one ``<name>-mailstamps`` branch; (its summary, its valid replies)."""
    summary = PeerSummary(name, ref)
    head = ref_commit(repo, ref)
    tip = head or ref_target(repo, ref)
    if not NAME.fullmatch(name):
        fail(MAIL_CHECK, "name", f"unsupported email timestamper name {name!r}", tip, ref=ref)
        return summary, []
    if head is None:
        fail(MAIL_CHECK, "ref", "does not point to a commit", tip, ref=ref)
        return summary, []

    path = f"{KEYS_DIR}/{name}.asc"
    published: list[tuple[int, str, Keyring]] = []
    for i, main in enumerate(chain):
        data = read_blob(repo, main.tree, path)
        if data is None:
            continue
        try:
            keyring = keyrings.get(data)
        except KeyFileError as e:
            fail(MAIL_CHECK, "key-invalid", e.message, str(main.id), path, ref)
            continue
        if published and published[-1][2].fingerprint != keyring.fingerprint:
            fail(MAIL_CHECK, "key-changed", f"the log's key for email timestamper {name} "
                 f"changed: {keyring.fingerprint} here, {published[-1][2].fingerprint} in "
                 f"{published[-1][1]}", str(main.id), path, ref)
        published.append((i, str(main.id), keyring))
    if published:
        summary.fingerprint = published[-1][2].fingerprint
        summary.key_source = f"{path} in {published[-1][1]}"
    indexes = [i for i, _, _ in published]

    valid: list[PeerStamp] = []
    c: pygit2.Commit | None = _commit(repo, head)
    while c is not None:
        oid = str(c.id)
        summary.commits += 1
        parents = [str(p) for p in c.parent_ids]
        if len(parents) not in (1, 2):
            fail(MAIL_CHECK, "parents", f"has {len(parents)} parents; a reply has the stamped "
                 "main commit as last parent, after the previous reply", oid, ref=ref)
            break
        previous = parents[0] if len(parents) == 2 else None
        stamped = parents[-1]
        if previous is not None and previous in main_index:
            fail(MAIL_CHECK, "chain", f"first parent {previous} is a main commit, not the "
                 "previous reply of the branch", oid, ref=ref)
            previous = None
        if stamped not in main_index:
            fail(MAIL_CHECK, "not-main", f"stamps {stamped}, which is not a commit of the main "
                 "branch", oid, ref=ref)
        else:
            stamp = _check_reply(repo, fail, name, ref, c, chain[main_index[stamped]],
                                 _key(published, indexes, main_index[stamped]))
            if stamp is not None:
                valid.append(stamp)
        c = _parent(repo, fail, oid, previous, ref) if previous else None
    summary.valid = len(valid)
    return summary, valid


def _key(published: list[tuple[int, str, Keyring]], indexes: list[int], i: int
         ) -> Keyring | None:
    if not published:
        return None
    at = bisect.bisect_left(indexes, i)
    return published[min(at, len(published) - 1)][2]


def _check_reply(repo: pygit2.Repository, fail: Fail, name: str, ref: str, c: pygit2.Commit,
                 main: pygit2.Commit, keyring: Keyring | None) -> PeerStamp | None:
    oid = str(c.id)
    data = read_blob(repo, c.tree, REPLY_FILE)
    if data is None:
        fail(MAIL_CHECK, "reply-missing", f"has no {REPLY_FILE}", oid, ref=ref)
        return None
    text = data.decode("utf-8", "replace")
    try:
        if clearsigned_block(text) != text.replace("\r\n", "\n"):
            raise MailStampError("holds more than the clear-signed message")
    except MailStampError as e:
        fail(MAIL_CHECK, "reply-format", str(e), oid, REPLY_FILE, ref)
        return None
    if keyring is None:
        fail(MAIL_CHECK, "key-missing", f"no {KEYS_DIR}/{name}.asc in any main commit: the "
             "reply cannot be verified", oid, ref=ref)
        return None
    check = verify_cleartext(data, keyring)
    if not check.valid:
        fail(MAIL_CHECK, "bad-signature", f"the reply does not verify with email timestamper "
             f"{name}'s key {keyring.fingerprint}: {check.problem}", oid, REPLY_FILE, ref)
        return None
    if check.fingerprint != keyring.fingerprint:
        fail(MAIL_CHECK, "signer", f"signed by {check.fingerprint}, not by {name}'s key "
             f"{keyring.fingerprint}", oid, REPLY_FILE, ref)
        return None
    request = request_of(repo, main)
    committed = read_blob(repo, c.tree, REQUEST_FILE)
    if committed is not None:
        if not _check_digest(fail, ref, oid, main, check.text, request, committed):
            return None
    elif not quotes(check.text, request):
        fail(MAIL_CHECK, "quote", f"the signed text does not quote the request for {main.id}",
             oid, REPLY_FILE, ref)
        return None
    assert check.created is not None
    if check.created < main.commit_time - CLOCK_SKEW:
        fail(MAIL_CHECK, "signature-time", f"signed at {check.created}, before the stamped "
             f"log commit was made ({main.commit_time})", oid, REPLY_FILE, ref)
        return None
    return PeerStamp(f"{name} (mail)", oid, str(main.id), check.created)


def _check_digest(fail: Fail, ref: str, oid: str, main: pygit2.Commit, signed: str,
                  request: str, committed: bytes) -> bool:
    """A digest-mode reply: the committed request text is the request for ``main``, and the
    signed text a stampd receipt of its SHA-256."""
    text = committed.decode("utf-8", "replace")
    if text != request:
        fail(MAIL_CHECK, "request", f"{REQUEST_FILE} is not the request for {main.id}", oid,
             REQUEST_FILE, ref)
        return False
    try:
        statement = receipt_of(signed)
    except MailStampError as e:
        fail(MAIL_CHECK, "receipt", str(e), oid, REPLY_FILE, ref)
        return False
    if statement.digest != request_digest(text):
        fail(MAIL_CHECK, "digest", f"the receipt names {statement.digest}, not the SHA-256 of "
             f"{REQUEST_FILE} ({request_digest(text)})", oid, REPLY_FILE, ref)
        return False
    return True


def _commit(repo: pygit2.Repository, oid: str) -> pygit2.Commit:
    obj = repo[oid]
    assert isinstance(obj, pygit2.Commit)
    return obj


def _parent(repo: pygit2.Repository, fail: Fail, child: str, oid: str, ref: str
            ) -> pygit2.Commit | None:
    try:
        obj = repo[oid]
    except (KeyError, ValueError):
        obj = None
    if isinstance(obj, pygit2.Commit):
        return obj
    fail(MAIL_CHECK, "missing-parent", f"parent {oid} is missing or not a commit (incomplete "
         "or shallow clone?)", child, ref=ref)
    return None
