"""GnuPG's status lines: what ``gpg --status-fd`` (and ``git verify-tag|verify-commit --raw``)
reports of the signatures it checked, tallied. Pure: the workers (verifying peers' stamps and
test signatures) and the client (verifying receipts, stamps, logs) read the same lines the same
way.

A line is ``[GNUPG:] KEYWORD ARGS...``. What counts here: ``NEWSIG`` (a signature begins),
``GOODSIG``, ``VALIDSIG <fpr> <date> <time> <expires> <version> <reserved> <pk-algo>
<hash-algo> <class> [<primary fpr>]`` and the keywords of a signature that did not verify
(`FAILED`). A caller refuses a block holding several signatures (the multiple-signature attack)
by `SignatureTally.newsig` and `SignatureTally.valid_sigs`.
"""

from __future__ import annotations

import calendar
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

PREFIX = "[GNUPG:] "
# Keywords of a signature that did not verify (or of input that held none).
FAILED = frozenset({"BADSIG", "ERRSIG", "EXPSIG", "EXPKEYSIG", "REVKEYSIG", "NO_PUBKEY",
                    "NODATA", "BADARMOR"})
# Of those, gpg's complaints that the signing key has ended (expired, revoked) by now: they say
# nothing of when it signed, which the key's listing decides (`formats.gpgkeys`).
KEY_ENDED = frozenset({"EXPKEYSIG", "REVKEYSIG"})


def status_time(value: str) -> int | None:
    """A status-line time: seconds since the epoch, or ISO 8601 ``YYYYMMDDThhmmss`` (UTC)."""
    if value.isdigit():
        return int(value)
    try:
        return calendar.timegm(time.strptime(value, "%Y%m%dT%H%M%S"))
    except ValueError:
        return None


@dataclass(frozen=True)
class ValidSig:
    """One good signature: a well-formed ``VALIDSIG`` line (or, in the client, an SSH
    signature, class "ssh")."""

    fingerprint: str  # the signing (sub)key, upper-case hex
    created: int  # signature time, seconds since the epoch
    sig_class: str  # "00" binary, "01" text...
    primary: str  # the primary key of the signing key (the signing key if gpg omits it)


@dataclass
class SignatureTally:
    """The signatures one gpg run reported: how many began (``NEWSIG``), were good
    (``GOODSIG``, ``VALIDSIG``), each well-formed ``VALIDSIG`` (`valid_sigs`), and the keywords
    of the failed ones (`errors`). Every status line, keyword first, in `records`."""

    records: list[tuple[str, ...]] = field(default_factory=list)
    newsig: int = 0
    goodsig: int = 0
    validsig: int = 0  # VALIDSIG lines, well-formed or not
    valid_sigs: list[ValidSig] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # FAILED keywords, in order

    @property
    def only_key_ended(self) -> bool:
        """Whether gpg's only complaints are that the key has ended by now (`KEY_ENDED`)."""
        return bool(self.errors) and set(self.errors) <= KEY_ENDED

    def add(self, keyword: str, args: Sequence[str]) -> None:
        """One status line: its keyword and the words after it."""
        self.records.append((keyword, *args))
        if keyword == "NEWSIG":
            self.newsig += 1
        elif keyword == "GOODSIG":
            self.goodsig += 1
        elif keyword == "VALIDSIG":
            self.validsig += 1
            created = status_time(args[2]) if len(args) > 8 else None
            if created is not None:
                signer = args[0].upper()
                primary = args[9] if len(args) > 9 and args[9] else signer
                self.valid_sigs.append(ValidSig(signer, created, args[8], primary.upper()))
        elif keyword in FAILED:
            self.errors.append(keyword)

    def add_lines(self, text: str) -> None:
        """Every ``[GNUPG:]`` line of ``text``; other lines are passed over."""
        for line in text.splitlines():
            if line.startswith(PREFIX):
                words = line[len(PREFIX):].split()
                if words:
                    self.add(words[0], words[1:])
