"""Email timestamps of the log (docs/mail.md, "Outbound: email timestampers"), pure.

After each log commit, stampd mails each email timestamper (the PGP Digital Timestamping
Service and the like) a request, `request_text`: the new head of ``main`` and the transparency
log's checkpoint of that commit. The timestamper answers with a clear-signed message that
quotes it. A reply is good when it holds exactly one clear-signed block (`clearsigned_block`),
its signature verifies with the timestamper's pinned key (checked by gpg, elsewhere), and the
signed text quotes every line of the request, in order and together (`quotes`).

A timestamper in **digest mode** (another stampd, whose mail listener stamps a body that is only
a digest and quotes nothing) is sent `request_body`: the SHA-256 (hex) of the request text, and
nothing else. Its reply is good when the signed text is a stampd receipt (`formats.receipts`)
of exactly that digest (`answers`).

A good reply is committed to the branch ``<name>-mailstamps`` (`stamp_commit`): each commit
has the previous one (if any) and then the stamped ``main`` commit as parents, and a tree of
``mailstamp.asc``, the clear-signed block as received, and in digest mode ``request.txt``, the
request text whose digest the receipt names (the digest is recomputed from it, and it names the
stamped commit). `stampd audit` checks them with the key the log publishes as
``mailstampers/<name>.asc``.
"""

from __future__ import annotations

import hashlib
import re

from formats.receipts import MalformedReceipt, Statement, parse_statement

BEGIN_SIGNED = "-----BEGIN PGP SIGNED MESSAGE-----"
END_SIGNATURE = "-----END PGP SIGNATURE-----"
REPLY_FILE = "mailstamp.asc"
REQUEST_FILE = "request.txt"  # digest mode: the request text whose digest was stamped
QUOTE, DIGEST = "quote", "digest"  # how a timestamper answers (MODES: the setting's values)
MODES = (QUOTE, DIGEST)
KEYS_DIR = "mailstampers"
BRANCH_SUFFIX = "-mailstamps"
MAX_REPLY = 64 * 1024  # characters of a clear-signed block we keep
# Lines a timestamper may put before a quoted line: mail quoting ("> ") and nothing else.
_QUOTE = re.compile(r"^(?:> ?)*")


class MailStampError(ValueError):
    """A reply that is no good email timestamp (the message says why)."""


def request_text(head: str, number: int | None, checkpoint: str | None) -> str:
    """The body of the request for log head ``head`` (``number``: its log commit number);
    ``checkpoint``: the transparency log's checkpoint in that commit (``tlog-checkpoint``),
    of which the body (origin, size, root hash) is sent; its signature lines are not (they
    begin with an em dash, which not every timestamper passes through)."""
    lines = [f"stampd log commit {number}" if number is not None else "stampd log commit",
             f"git commit: {head}"]
    if checkpoint:
        body = checkpoint.split("\n\n", 1)[0]
        lines += ["tlog checkpoint:", *body.splitlines()]
    return "".join(f"{line}\n" for line in lines)


def request_digest(text: str) -> str:
    """The SHA-256 (lowercase hex) of a request text, as a digest-mode request carries it."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def request_body(text: str, mode: str) -> str:
    """What is mailed for the request ``text``: the text itself (``quote``), or only its
    SHA-256 in hex (``digest``), which a stampd mail listener stamps as it is."""
    if mode == DIGEST:
        return request_digest(text) + "\n"
    return text


def receipt_of(signed_text: str) -> Statement:
    """The stampd receipt statement a digest-mode reply's signed text is (as gpg gives it,
    its line ends and final newline aside); `MailStampError` when it is none, or not of a
    SHA-256 digest."""
    text = signed_text.replace("\r\n", "\n").rstrip("\n") + "\n"
    try:
        statement = parse_statement(text)
    except MalformedReceipt as e:
        raise MailStampError(f"the signed text is no stampd receipt: {e}") from None
    if statement.algorithm != "sha256":
        raise MailStampError(f"the receipt is of a {statement.algorithm} digest, not sha256")
    return statement


def answers(signed_text: str, sent: str, mode: str) -> bool:
    """Whether a reply whose signature covers ``signed_text`` answers the request ``sent``:
    it quotes it (`quotes`), or, in digest mode, it is a receipt of its SHA-256
    (`MailStampError` when it is no receipt at all)."""
    if mode == DIGEST:
        return receipt_of(signed_text).digest == request_digest(sent)
    return quotes(signed_text, sent)


def clearsigned_block(body: str) -> str:
    """The one clear-signed block in a reply's text (from its BEGIN line through its END
    line, with LF line ends); `MailStampError` when there is none or more than one."""
    lines = body.replace("\r\n", "\n").split("\n")
    starts = [i for i, line in enumerate(lines) if line.rstrip() == BEGIN_SIGNED]
    if not starts:
        raise MailStampError("the reply holds no clear-signed message")
    if len(starts) > 1:
        raise MailStampError("the reply holds more than one clear-signed message")
    start = starts[0]
    end = next((i for i in range(start, len(lines)) if lines[i].rstrip() == END_SIGNATURE),
               None)
    if end is None:
        raise MailStampError("the reply's clear-signed message has no end")
    block = "\n".join(line.rstrip("\r") for line in lines[start:end + 1]) + "\n"
    if len(block) > MAX_REPLY:
        raise MailStampError(f"the reply's clear-signed message is longer than {MAX_REPLY}")
    return block


def quotes(signed_text: str, sent: str) -> bool:
    """Whether ``signed_text`` (what the signature covers, as gpg reads it) holds every line of
    ``sent``, in order and together, each perhaps quoted with ``>`` (the same way for all);
    trailing white space is ignored, as the signature ignores it."""
    want = [line.rstrip() for line in sent.strip("\n").split("\n")]
    have = [line.rstrip() for line in signed_text.replace("\r\n", "\n").split("\n")]
    for i in range(len(have) - len(want) + 1):
        prefix = _QUOTE.match(have[i])
        assert prefix is not None
        p = prefix.group(0)
        if all(have[i + j] == (p + w).rstrip() for j, w in enumerate(want)):
            return True
    return False


def stamp_commit(tree: str, parents: list[str], ident: str, when: int, stamper: str,
                 head: str) -> bytes:
    """The raw commit of a reply on ``<stamper>-mailstamps``: ``parents`` the previous such
    commit (if any) and the stamped ``main`` commit ``head``, last."""
    lines = [f"tree {tree}", *(f"parent {p}" for p in parents),
             f"author {ident} {when} +0000", f"committer {ident} {when} +0000", "",
             f"email timestamp of {head} by {stamper}", ""]
    return "\n".join(lines).encode("utf-8")
