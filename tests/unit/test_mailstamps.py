"""The pure parts of email timestamps (formats.mailstamps) and the timestampers' setting: the
request in quote and digest mode, and what answers it."""

from __future__ import annotations

import hashlib

import pytest

from formats.mailstamps import (
    DIGEST,
    QUOTE,
    MailStampError,
    answers,
    receipt_of,
    request_body,
    request_digest,
    request_text,
)
from formats.receipts import Statement
from server.setting_values import MailStamperConfig, parse_mail_stampers

HEAD = "a" * 40
TEXT = request_text(HEAD, 7, "example.org/log\n3\nAAAA=\n\n\u2014 example.org/log sig\n")
FPR = "0123456789ABCDEF0123456789ABCDEF01234567"


def receipt(digest: str, algorithm: str = "sha256") -> str:
    return Statement(algorithm, digest, 1_700_000_000, "http://b.test/", 5, FPR).text()


def test_request_text_and_its_digest() -> None:
    assert (f"stampd log commit 7\ngit commit: {HEAD}\ntlog checkpoint:\n"
                    "example.org/log\n3\nAAAA=\n") == TEXT
    digest = hashlib.sha256(TEXT.encode()).hexdigest()
    assert request_digest(TEXT) == digest
    assert request_body(TEXT, QUOTE) == TEXT
    assert request_body(TEXT, DIGEST) == digest + "\n"


def test_a_receipt_of_the_digest_answers_in_digest_mode() -> None:
    good = receipt(request_digest(TEXT))
    assert answers(good, TEXT, DIGEST)
    assert answers(good.rstrip("\n"), TEXT, DIGEST)  # (gpg's text may lack the last LF)
    assert answers(good.replace("\n", "\r\n"), TEXT, DIGEST)
    assert receipt_of(good).serial == 5
    assert not answers(receipt("0" * 64), TEXT, DIGEST)  # another digest
    assert not answers(good, TEXT.replace("7", "8"), DIGEST)  # another request
    # A quoting reply is no answer in digest mode, nor a receipt in quote mode.
    with pytest.raises(MailStampError, match="no stampd receipt"):
        answers(f"received:\n{TEXT}", TEXT, DIGEST)
    assert not answers(good, TEXT, QUOTE)
    assert answers(f"received:\n> {TEXT.replace(chr(10), chr(10) + '> ')}", TEXT, QUOTE)


def test_a_receipt_must_be_of_sha256() -> None:
    with pytest.raises(MailStampError, match="sha512"):
        receipt_of(receipt("0" * 128, "sha512"))
    with pytest.raises(MailStampError, match="no stampd receipt"):
        receipt_of(receipt(request_digest(TEXT)) + "more\n")


def test_mail_stampers_setting_modes() -> None:
    key = "0123456789abcdef"
    assert parse_mail_stampers(f"pgp=a@b.example#{key},b=stamp@b.test#{FPR}:digest,"
                               f"c=c@c.example#{key}:quote") == [
        MailStamperConfig("pgp", "a@b.example", key.upper(), QUOTE),
        MailStamperConfig("b", "stamp@b.test", FPR, DIGEST),
        MailStamperConfig("c", "c@c.example", key.upper(), QUOTE)]
    for bad in (f"b=stamp@b.test#{FPR}:digests", f"b=stamp@b.test#{FPR}:",
                f"b=s@b.test#{FPR}:Digest"):
        with pytest.raises(ValueError, match="unknown mode") as e:
            parse_mail_stampers(bad)
        assert "\n" not in str(e.value) and ":quote" in str(e.value)
    with pytest.raises(ValueError, match="key id"):
        parse_mail_stampers("b=stamp@b.test#:digest")


def test_unknown_mode_is_a_settings_error() -> None:
    from server.settings import Settings

    with pytest.raises(ValueError, match="unknown mode 'x'"):
        Settings(mail_stampers=f"b=stamp@b.test#{FPR}:x", mail_from="me@x.example",
                 mail_smtp="smtp://me:secret@mx.x.example",
                 mail_imap="imap://me:secret@mx.x.example")
