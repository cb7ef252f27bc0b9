"""Reading an email timestamper's reply (docs/mail.md, "The replies"): its sender and text
(`reply_body`), and which request we sent and are waiting for its signed text answers
(`match_request`): it quotes it, or, for a timestamper in digest mode, it is a stampd receipt
of its SHA-256 (`formats.mailstamps.answers`). The signature itself is checked by gpg with the
pinned key (`server.gitlog.mailstampers.StamperKeyring`) before; refusals are
`MailStampError`, which `server.gitlog.mailstampers` records.
"""

from __future__ import annotations

import contextlib
import email
import email.policy
import email.utils
from collections.abc import Sequence
from dataclasses import dataclass
from email.message import EmailMessage

from formats.mailstamps import DIGEST, MailStampError, answers

CLOCK_SKEW = 30  # a reply's signature may not be older than its request by more than this


def reply_body(raw: bytes) -> tuple[str, str]:
    """(sender address, text of the plain-text parts) of a message."""
    msg = email.message_from_bytes(raw, policy=email.policy.default)
    sender = email.utils.parseaddr(str(msg.get("From", "")))[1].lower()
    texts = []
    assert isinstance(msg, EmailMessage)
    for part in msg.walk():
        if part.get_content_type() == "text/plain" and not part.is_attachment():
            with contextlib.suppress(LookupError, ValueError):
                texts.append(str(part.get_content()))
    return sender, "\n".join(texts)


@dataclass(frozen=True)
class Waiting:
    """A request sent and waiting for its reply (a `MailStamp` row in state sent)."""

    id: int
    log_commit: str
    sent_text: str | None
    sent_at: int | None


def match_request(signed: str, created: int, mode: str, waiting: Sequence[Waiting]
                  ) -> Waiting:
    """The first of ``waiting`` (newest first) that a reply answers whose verified signature
    (made at ``created``) covers ``signed``, for a timestamper of ``mode``; `MailStampError`
    saying why it answers none."""
    match = next((w for w in waiting if w.sent_text and answers(signed, w.sent_text, mode)),
                 None)
    if match is None:
        raise MailStampError("the receipt names the digest of no request we are waiting for"
                             if mode == DIGEST else
                             "the signed text quotes no request we are waiting for")
    if match.sent_at is not None and created < match.sent_at - CLOCK_SKEW:
        raise MailStampError(f"the signature ({created}) is older than the request "
                             f"({match.sent_at})")
    return match
