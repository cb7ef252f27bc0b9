"""formats/mail.py (what a message stamps, whether it may be answered, the reply) and the mail
settings, pure."""

from __future__ import annotations

import email
import hashlib

import pytest
from pydantic import ValidationError

from formats.keys import MAIL, MAIL_KEY, STAMPS, ServedKey, with_purposes
from formats.mail import Digest, Inbound, MalformedMail, Stamped, reply
from server.errors import BadRequest
from server.setting_values import parse_host_port, parse_mail_addresses
from server.settings import Settings
from server.stamping.requests import choose_key


def msg(*headers: str, body: str = "hello\r\n") -> bytes:
    return ("\r\n".join(["From: a@b.example", "To: stamp@s.example", *headers, ""]) + "\r\n"
            + body).encode()


def test_a_plain_message_stamps_its_bytes() -> None:
    data = msg()
    inbound = Inbound.parse(data, 5)
    assert inbound.stamped() == [Digest("sha256", hashlib.sha256(data).hexdigest(), "message")]
    assert inbound.refusal() is None


@pytest.mark.parametrize(("body", "algorithm"), [
    (hashlib.sha256(b"x").hexdigest(), "sha256"),
    ("  " + hashlib.sha512(b"x").hexdigest().upper() + "\r\n\r\n", "sha512"),
])
def test_a_body_that_is_only_a_digest_stamps_it(body: str, algorithm: str) -> None:
    (d,) = Inbound.parse(msg(body=body), 5).stamped()
    assert (d.algorithm, d.digest) == (algorithm, body.strip().lower())


@pytest.mark.parametrize("body", [
    hashlib.sha256(b"x").hexdigest()[:-1],  # 63 digits
    hashlib.sha256(b"x").hexdigest() + " and more",
    "sha1 " + hashlib.sha1(b"x").hexdigest(),
])
def test_a_body_that_is_more_than_a_digest_stamps_the_message(body: str) -> None:
    (d,) = Inbound.parse(msg(body=body), 5).stamped()
    assert d.what == "message"


def test_attachments_are_stamped_decoded_in_order() -> None:
    parts = ("--b\r\nContent-Type: text/plain\r\n\r\ntext\r\n"
             "--b\r\nContent-Disposition: attachment; filename=a.bin\r\n"
             "Content-Transfer-Encoding: base64\r\n\r\nAAEC\r\n"
             "--b\r\nContent-Type: image/png; name=b.png\r\n\r\npng\r\n--b--\r\n")
    inbound = Inbound.parse(msg("MIME-Version: 1.0", "Content-Type: multipart/mixed; boundary=b",
                                body=parts), 5)
    assert inbound.attachments == (hashlib.sha256(b"\x00\x01\x02").hexdigest(),
                                   hashlib.sha256(b"png").hexdigest())
    assert [d.what for d in inbound.stamped()] == ["message", "attachment 1", "attachment 2"]
    with pytest.raises(MalformedMail, match="attachments"):
        Inbound.parse(msg("MIME-Version: 1.0", "Content-Type: multipart/mixed; boundary=b",
                          body=parts), 1)


NESTED = b"From: a@b.example\r\n" + b"".join(
    b"Content-Type: multipart/mixed; boundary=b%d\r\n\r\n--b%d\r\n" % (i, i)
    for i in range(5000)) + b"x\r\n"


@pytest.mark.parametrize("data", [b"", b"no header line\r\n", b"\r\n\r\nbody",
                                  b"".join(b"X-%d: y\r\n" % i for i in range(1001)), NESTED])
def test_malformed(data: bytes) -> None:
    with pytest.raises(MalformedMail):
        Inbound.parse(data, 5)


@pytest.mark.parametrize(("header", "answered"), [
    ("Auto-Submitted: no", True),
    ("Auto-Submitted: auto-replied", False),
    ("Auto-Submitted: auto-generated; owner-email=x@y", False),
    ("Precedence: bulk", False),
    ("Precedence: LIST", False),
    ("Precedence: first-class", True),
    ("List-Id: <a.lists.example>", False),
    ("List-Unsubscribe: <mailto:u@l.example>", False),
    ("X-Auto-Response-Suppress: OOF", False),
    ("Content-Type: multipart/report; report-type=delivery-status; boundary=x", False),
])
def test_rfc3834_refusals(header: str, answered: bool) -> None:
    assert (Inbound.parse(msg(header), 5).refusal() is None) == answered


@pytest.mark.parametrize(("results", "sender_domain", "ok"), [
    ("mx.s.example; spf=pass smtp.mailfrom=a@b.example", "b.example", True),
    ("mx.s.example; spf=pass smtp.mailfrom=b.example", "b.example", True),
    # SPF of a subdomain proves nothing of its parent, nor the other way round
    ("mx.s.example; spf=pass smtp.mailfrom=a@mail.b.example", "b.example", False),
    ("mx.s.example; spf=pass smtp.mailfrom=a@b.example", "mail.b.example", False),
    ("mx.s.example; dkim=pass header.d=b.example header.s=k", "b.example", True),
    ("mx.s.example; dkim=pass header.d=b.example", "mail.b.example", True),  # relaxed
    ("mx.s.example; dkim=pass header.d=notb.example", "b.example", False),
    ("mx.s.example; dkim=pass header.d=example", "b.example", False),  # a bare TLD
    ("mx.s.example; dmarc=pass header.from=b.example", "b.example", True),
    # DMARC vouches for the From: header's domain; the reply goes to the envelope sender
    ("mx.s.example; dmarc=pass header.from=evil.example", "b.example", False),
    ("mx.s.example; dmarc=pass", "b.example", False),
    ("mx.s.example; spf=pass smtp.mailfrom=a@evil.example", "b.example", False),
    ("mx.s.example; spf=fail smtp.mailfrom=a@b.example; dmarc=fail", "b.example", False),
    ("other.example; spf=pass smtp.mailfrom=a@b.example", "b.example", False),
    ("mx.s.example 1; spf=pass smtp.mailfrom=a@b.example", "b.example", True),  # a version
])
def test_authenticated_only_by_the_trusted_mta(results: str, sender_domain: str,
                                               ok: bool) -> None:
    inbound = Inbound.parse(msg(f"Authentication-Results: {results}"), 5)
    assert inbound.authenticated("mx.s.example", sender_domain) == ok


def test_the_reply_holds_nothing_the_sender_chose() -> None:
    inbound = Inbound.parse(msg("Subject: BUY CHEAP PILLS", "Message-ID: <id@b.example>"), 5)
    stamped = [Stamped(Digest("sha256", inbound.sha256, "message"), 7,
                       "-----BEGIN PGP SIGNED MESSAGE-----\nHash: SHA256\n\nstampd receipt v1\n"
                       "-----BEGIN PGP SIGNATURE-----\n\nx\n-----END PGP SIGNATURE-----\n")]
    out = reply(sender="stamp@s.example", to="a@b.example", stamped=stamped,
                server="http://s.example/", key="AB" * 20, in_reply_to=inbound.message_id,
                message_id="<stampd-7@s.example>", date=0)
    assert b"PILLS" not in out
    assert b"\n" not in out.replace(b"\r\n", b"")  # every line CRLF
    parsed = email.message_from_bytes(out)
    assert parsed["Auto-Submitted"] == "auto-replied"
    assert parsed["In-Reply-To"] == "<id@b.example>"
    assert parsed.get_content_type() == "text/plain"
    assert parsed.get_payload().rstrip().endswith("-----END PGP SIGNATURE-----")


@pytest.mark.parametrize(("value", "repeated"), [
    ("<id@b.example>", True), ("<a.b+c@d-e.example>", True),
    ("<BUY CHEAP PILLS@b.example>", False), ('<"q"@b.example>', False), ("<a@[1.2.3.4]>", False),
    ("<" + "x" * 65 + "@b.example>", False), ("id@b.example", False), ("<a@b><c@d>", False),
])
def test_only_a_short_plain_message_id_is_repeated(value: str, repeated: bool) -> None:
    assert (Inbound.parse(msg(f"Message-ID: {value}"), 5).message_id == value) == repeated


def test_a_reply_with_attachments_attaches_their_receipts() -> None:
    stamped = [Stamped(Digest("sha256", "0" * 64, w), n, f"receipt {n}\n")
               for n, w in ((1, "message"), (2, "attachment 1"))]
    out = reply(sender="s@s.example", to="a@b.example", stamped=stamped, server="http://s/",
                key="AB" * 20, in_reply_to=None, message_id="<stampd-1@s.example>", date=0)
    parsed = email.message_from_bytes(out)
    assert parsed.get_content_type() == "multipart/mixed" and "In-Reply-To" not in parsed
    first, second = parsed.get_payload()
    assert "receipt 1" in first.get_payload() and second.get_filename() == "receipt-2.asc"


def test_settings() -> None:
    s = Settings(mail_listen="127.0.0.1:2525", mail_relay="[::1]:25",
                 key_uid="x <Stamp@S.example>")
    assert s.mail_inbound is not None
    assert (s.mail_inbound.listen, s.mail_inbound.relay) == (("127.0.0.1", 2525), ("::1", 25))
    assert s.mail_inbound.addresses == ("stamp@s.example",)
    assert Settings().mail_inbound is None
    assert MAIL_KEY in s.extra_key_specs and s.mail_spec == MAIL_KEY
    assert MAIL_KEY not in Settings().extra_key_specs
    for bad in ({"mail_listen": "127.0.0.1:2525"}, {"mail_relay": "127.0.0.1:25"},
                {"mail_listen": "2525", "mail_relay": "h:25"},
                {"mail_listen": "h:1", "mail_relay": "h:25", "mail_addresses": "no-at"}):
        with pytest.raises(ValidationError):
            Settings(**bad)
    with pytest.raises(ValueError):
        parse_host_port("h:99999", "X")
    assert parse_mail_addresses("A@b.example, a@B.example,c@d.example") == ("a@b.example",
                                                                           "c@d.example")


def test_the_mail_key_signs_mail_only() -> None:
    primary = ServedKey("primary", "openpgp", "A" * 40, "ed25519", "", "u", primary=True)
    mail = ServedKey(MAIL_KEY.id, "openpgp", "B" * 40, "ed25519", "", "u")
    keys = with_purposes([primary, mail], None)
    assert [k.purpose for k in keys] == [STAMPS, MAIL]
    with pytest.raises(BadRequest, match="mail key"):
        choose_key(keys, None, "B" * 40)
    assert choose_key(keys, "openpgp", None) is keys[0]
