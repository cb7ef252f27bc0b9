"""Mail to stamp (docs/mail.md), pure: what a message received by stampd's SMTP listener
asks to have stamped, whether it may be answered at all, and the reply's bytes.

- `Inbound.parse` reads a message as received (the DATA bytes): its SHA-256, the SHA-256 of
  each attachment (the decoded bytes of each part that is an attachment, what the user holds
  as a file), or the digest it carries when its body is only a SHA-256 or SHA-512 in hex.
- `Inbound.refusal` says why it must not be answered (RFC 3834: auto-replies, list mail and
  reports never get an automatic answer), or None.
- `Inbound.authenticated` says whether the MTA in front marked it as passing its checks
  (an RFC 8601 ``Authentication-Results`` header of a given authserv-id).
- `reply` builds the answer: a plain ASCII message whose text holds one receipt per digest
  stamped (formats.receipts: each an OpenPGP cleartext-signed statement) and nothing the
  sender chose (no subject, no file name, no text of theirs; only the Message-ID it answers,
  in the headers mail readers do not show, and only a short plain one), so that an answer to
  a forged sender carries nothing anyone could use to spam.
"""

from __future__ import annotations

import email.parser
import email.policy
import email.utils
import hashlib
import re
from dataclasses import dataclass
from email.message import Message

from formats.receipts import ALGORITHMS

# Headers whose presence marks a message that must get no automatic answer (RFC 3834 section 2,
# RFC 2369 and 2919 list headers; the de-facto auto-reply markers).
LIST_HEADERS = ("list-id", "list-unsubscribe", "list-post", "list-help", "list-subscribe",
                "list-owner", "list-archive")
AUTO_HEADERS = ("x-autoreply", "x-autorespond", "x-auto-response-suppress")
BULK_PRECEDENCE = ("bulk", "list", "junk")
MAX_HEADERS = 1000  # headers of a message that is parsed at all
_HEX = re.compile(r"[0-9a-fA-F]+")
# A msg-id as the reply repeats it (In-Reply-To, References): short, dot-atoms around one '@'
# (RFC 5322's id-left "@" id-right without quoting or a domain literal); others are left out.
_MSG_ID = re.compile(r"<[A-Za-z0-9!#$%&'*+/=?^_`{|}~.-]{1,64}@[A-Za-z0-9.-]{1,64}>")
_RESULT = re.compile(r"\b(spf|dkim|dmarc)\s*=\s*([a-z]+)\b([^;]*)", re.IGNORECASE)
_PROP = re.compile(r"\b(smtp\.mailfrom|header\.d|header\.from|header\.i)\s*=\s*"
                   r"\"?([^\s;\"]+)", re.IGNORECASE)


class MalformedMail(ValueError):
    """Bytes that cannot be read as a message (none of its headers parse)."""


@dataclass(frozen=True)
class Digest:
    """One thing stamped: ``algorithm`` (sha256 or sha512) and its lowercase hex ``digest``;
    ``what`` names it in the reply (``message``, ``digest in the body``, ``attachment 2``)."""

    algorithm: str
    digest: str
    what: str


@dataclass(frozen=True)
class Inbound:
    """A received message, read: the message itself, its digest, its attachments' digests."""

    message: Message
    sha256: str  # of the bytes as received
    attachments: tuple[str, ...]  # SHA-256 of each attachment's decoded bytes, in order
    body_digest: Digest | None  # the digest a message whose body is only a digest carries

    @classmethod
    def parse(cls, data: bytes, max_attachments: int) -> Inbound:
        """Read ``data`` (the message as received); `MalformedMail` when it holds no header
        or too many, or more than ``max_attachments`` attachments."""
        try:
            msg = email.parser.BytesParser(policy=email.policy.compat32).parsebytes(data)
            if not msg.keys():
                raise MalformedMail("the message has no header")
            if len(msg.keys()) > MAX_HEADERS:
                raise MalformedMail(f"the message has more than {MAX_HEADERS} headers")
            attachments = tuple(hashlib.sha256(part).hexdigest() for part in _attachments(msg))
            body_digest = _body_digest(msg)
        except (ValueError, TypeError, LookupError, RecursionError) as e:
            # (MalformedMail is a ValueError: raised again as it is)
            if isinstance(e, MalformedMail):
                raise
            # RecursionError: MIME parts nested thousands deep
            raise MalformedMail(f"the message cannot be parsed: {type(e).__name__}") from None
        if len(attachments) > max_attachments:
            raise MalformedMail(f"the message has {len(attachments)} attachments; at most "
                                f"{max_attachments} are stamped")
        return cls(msg, hashlib.sha256(data).hexdigest(), attachments, body_digest)

    def header(self, name: str) -> str:
        """The first ``name`` header, unfolded, or ``""``."""
        value = self.message.get(name)
        return " ".join(str(value).split()) if value is not None else ""

    def headers(self, name: str) -> list[str]:
        return [" ".join(str(v).split()) for v in self.message.get_all(name) or []]

    def refusal(self) -> str | None:
        """Why this message must get no automatic answer (RFC 3834), or None."""
        auto = self.header("auto-submitted").lower()
        if auto and auto.split(";")[0].strip() != "no":
            return f"it is automatic (Auto-Submitted: {auto.split(';')[0].strip()[:40]})"
        precedence = self.header("precedence").lower()
        if precedence in BULK_PRECEDENCE:
            return f"it is list or bulk mail (Precedence: {precedence})"
        for name in LIST_HEADERS:
            if name in self.message:
                return f"it is list mail ({name.title()})"
        for name in AUTO_HEADERS:
            if name in self.message:
                return f"it asks for no automatic answer ({name.title()})"
        ctype = self.message.get_content_type()
        if ctype in ("multipart/report", "message/delivery-status",
                     "message/disposition-notification"):
            return f"it is a delivery or disposition report ({ctype})"
        return None

    def authenticated(self, authserv_id: str, sender_domain: str) -> bool:
        """Whether an ``Authentication-Results`` header of ``authserv_id`` (the MTA in front,
        which removes such headers from what it receives) says that the envelope sender's
        domain, ``sender_domain``, sent the message: ``spf=pass`` for that very domain
        (``smtp.mailfrom``), or ``dkim=pass`` or ``dmarc=pass`` for it or a domain it lies
        under (``header.d``, ``header.i``, ``header.from``: DMARC's relaxed alignment). A
        ``dmarc=pass`` alone proves nothing here: DMARC vouches for the ``From:`` header's
        domain, and the reply goes to the envelope sender."""
        domain = sender_domain.lower().rstrip(".")
        for value in self.headers("authentication-results"):
            server, _, results = value.partition(";")
            if server.strip().split(" ")[0].lower() != authserv_id.lower():
                continue
            for method, result, props in _RESULT.findall(results):
                if result.lower() != "pass":
                    continue
                for name, prop in _PROP.findall(props):
                    d = prop.rsplit("@", 1)[-1].lower().rstrip(".")
                    if method.lower() == "spf":
                        if name.lower() == "smtp.mailfrom" and d == domain:
                            return True
                    elif name.lower() != "smtp.mailfrom" and "." in d and (
                            d == domain or domain.endswith("." + d)):
                        return True
        return False

    def stamped(self) -> list[Digest]:
        """What is stamped: the digest of the body, when the body is only a digest; else the
        message, then each attachment."""
        if self.body_digest is not None:
            return [self.body_digest]
        return [Digest("sha256", self.sha256, "message"),
                *(Digest("sha256", d, f"attachment {i}")
                  for i, d in enumerate(self.attachments, 1))]

    @property
    def message_id(self) -> str | None:
        """The message's Message-ID, where it is a plain ``<...>`` we may repeat."""
        value = self.header("message-id")
        return value if _MSG_ID.fullmatch(value) else None


def _attachments(msg: Message) -> list[bytes]:
    """The decoded bytes of each part that is an attachment (``Content-Disposition:
    attachment``, or a part with a file name), in order."""
    out: list[bytes] = []
    for part in msg.walk():
        if part.is_multipart():
            continue
        disposition = (part.get("content-disposition") or "").split(";")[0].strip().lower()
        if disposition != "attachment" and part.get_filename() is None:
            continue
        payload = part.get_payload(decode=True)
        out.append(payload if isinstance(payload, bytes) else b"")
    return out


def _body_digest(msg: Message) -> Digest | None:
    """The digest a single text body holds and nothing else (surrounding white space aside):
    64 hex digits (sha256) or 128 (sha512), any case."""
    if msg.is_multipart() or msg.get_content_type() != "text/plain":
        return None
    payload = msg.get_payload(decode=True)
    if not isinstance(payload, bytes) or len(payload) > 1024:
        return None
    text = payload.strip(b" \t\r\n").decode("ascii", "replace")
    for algorithm, width in ALGORITHMS.items():
        if len(text) == width and _HEX.fullmatch(text):
            return Digest(algorithm, text.lower(), "digest in the body")
    return None


@dataclass(frozen=True)
class Stamped:
    """One receipt of a reply: what it stamps, its serial and the receipt."""

    digest: Digest
    serial: int
    receipt: str


def reply(*, sender: str, to: str, stamped: list[Stamped], server: str, key: str,
          in_reply_to: str | None, message_id: str, date: float) -> bytes:
    """The reply to a message stamped: From ``sender`` (the service) to ``to`` (the envelope
    sender), marked ``Auto-Submitted: auto-replied`` (RFC 3834), every line ASCII, CRLF. Its
    text says what was stamped and ends with the first receipt, so that ``gpg --verify`` takes
    the text as it is (gpg checks one signed message at a time); each further receipt (one per
    attachment) follows as an attachment of its own, ``receipt-<serial>.asc``."""
    first = stamped[0]
    head = [
        f"From: {sender}",
        f"To: {to}",
        f"Subject: Timestamp receipt {first.serial}",
        f"Date: {email.utils.formatdate(date, usegmt=True)}",
        f"Message-ID: {message_id}",
        *([f"In-Reply-To: {in_reply_to}", f"References: {in_reply_to}"] if in_reply_to else []),
        "Auto-Submitted: auto-replied",
        "MIME-Version: 1.0",
    ]
    text = "\n".join([
        f"{server} received your message and stamped it:",
        "",
        *(f"  {s.digest.what}: {s.digest.algorithm} {s.digest.digest}, serial {s.serial}"
          for s in stamped),
        "",
        "Each receipt is an OpenPGP cleartext-signed statement of one digest, the time and",
        f"the serial, signed by this service's mail key {key}",
        f"(in {server}v1/keys, the key whose purpose is mail): check it with",
        "gpg --verify, or with stampd verify RECEIPT --file FILE. Its place in the",
        f"transparency log: {server}v1/proofs/<serial>."
        + (" The receipts of the attachments are attached." if len(stamped) > 1 else ""),
        "",
        first.receipt.rstrip("\n"),
        "",
    ])
    plain = ["Content-Type: text/plain; charset=us-ascii", "Content-Transfer-Encoding: 7bit"]
    if len(stamped) == 1:
        body = "\n".join([*head, *plain, "", text])
    else:
        boundary = f"=_stampd_{first.serial}"
        parts = [f"--{boundary}", *plain, "", text]
        for s in stamped[1:]:
            parts += [f"--{boundary}", *plain,
                      f'Content-Disposition: attachment; filename="receipt-{s.serial}.asc"',
                      "", s.receipt.rstrip("\n"), ""]
        body = "\n".join([*head, f'Content-Type: multipart/mixed; boundary="{boundary}"', "",
                          "This is a message in MIME format.", "", *parts,
                          f"--{boundary}--", ""])
    return body.replace("\r\n", "\n").replace("\n", "\r\n").encode("ascii")


def reply_id(serial: int, domain: str) -> str:
    """The reply's Message-ID: one per first serial, so a reply is named by its stamp."""
    return f"<stampd-{serial}@{domain}>"


def address_domain(address: str) -> str:
    """The domain of ``local@domain`` (lower case; ``""`` when none)."""
    return address.rpartition("@")[2].strip().lower().rstrip(".")
