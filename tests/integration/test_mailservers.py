"""The throwaway mail servers of the tests (tests/mailservers.py) are real and behave as a
provider's submission and IMAP servers do: mail submitted by one user, after STARTTLS and
login, is read back by another over IMAP, after STARTTLS and login; what a provider refuses,
they refuse."""

from __future__ import annotations

import imaplib
import smtplib
import ssl
from email.message import EmailMessage

import pytest

from tests.mailservers import MailServers


def _message(sender: str, to: str, body: str) -> EmailMessage:
    msg = EmailMessage()
    msg["From"], msg["To"], msg["Subject"] = sender, to, "fixture"
    msg.set_content(body)
    return msg


def test_submitted_mail_is_read_back_over_imap(mail_servers: MailServers) -> None:
    stampd, stamper = mail_servers.users["stampd@mail.test"], mail_servers.users[
        "stamper@mail.test"]
    with smtplib.SMTP(mail_servers.host, mail_servers.smtp_port, timeout=30) as s:
        s.starttls(context=mail_servers.ca.client_context())
        s.login(stampd.address, stampd.password)
        s.send_message(_message(stampd.address, stamper.address, "the first line\n"))

    got = mail_servers.wait_for_messages(stamper, 1)
    assert len(got) == 1
    assert b"the first line" in got[0]
    assert f"From: {stampd.address}".encode() in got[0]

    m = imaplib.IMAP4(mail_servers.host, mail_servers.imap_port, timeout=30)
    try:
        m.starttls(ssl_context=mail_servers.ca.client_context())
        m.login(stamper.address, stamper.password)
        assert "IDLE" in m.capabilities
        m.select("INBOX")
        _typ, data = m.search(None, "ALL")
        assert len(data[0].split()) == 1
    finally:
        m.logout()
    # The sender's own mailbox is untouched.
    assert mail_servers.wait_for_messages(stampd, 0) == []


def test_no_login_without_starttls(mail_servers: MailServers) -> None:
    user = mail_servers.users["stampd@mail.test"]
    with smtplib.SMTP(mail_servers.host, mail_servers.smtp_port, timeout=30) as s:
        s.ehlo()
        assert not s.has_extn("auth")
        with pytest.raises(smtplib.SMTPException):
            s.login(user.address, user.password)
        code, text = s.mail(user.address)
        assert code == 530, text  # 5.7.0 Must issue a STARTTLS command first
    m = imaplib.IMAP4(mail_servers.host, mail_servers.imap_port, timeout=30)
    try:
        assert "LOGINDISABLED" in m.capabilities
        with pytest.raises(imaplib.IMAP4.error):
            m.login(user.address, user.password)
    finally:
        m.shutdown()
    assert "secured" not in mail_servers.log_tail()  # (Dovecot's word for a local client)


def test_wrong_credentials_and_unknown_ca_are_refused(mail_servers: MailServers) -> None:
    user = mail_servers.users["stampd@mail.test"]
    with pytest.raises(smtplib.SMTPAuthenticationError), smtplib.SMTP(
            mail_servers.host, mail_servers.smtp_port, timeout=30) as s:
        s.starttls(context=mail_servers.ca.client_context())
        s.login(user.address, "not the password")
    m = imaplib.IMAP4(mail_servers.host, mail_servers.imap_port, timeout=30)
    try:
        m.starttls(ssl_context=mail_servers.ca.client_context())
        with pytest.raises(imaplib.IMAP4.error):
            m.login(user.address, "not the password")
    finally:
        m.shutdown()
    # Only the test CA vouches for the servers' certificate.
    with pytest.raises(ssl.SSLCertVerificationError), smtplib.SMTP(
            mail_servers.host, mail_servers.smtp_port, timeout=30) as s:
        s.starttls(context=ssl.create_default_context())


def test_mail_for_other_domains_is_refused(mail_servers: MailServers) -> None:
    user = mail_servers.users["stampd@mail.test"]
    with mail_servers.smtp(user) as s, pytest.raises(smtplib.SMTPRecipientsRefused):
        s.send_message(_message(user.address, "nobody@mail.test", "x"))


def test_stopped_and_started_again(mail_servers: MailServers) -> None:
    user = mail_servers.users["stampd@mail.test"]
    mail_servers.stop_postfix()
    with pytest.raises(OSError):
        mail_servers.smtp(user)
    mail_servers.start_postfix()
    with mail_servers.smtp(user) as s:
        s.send_message(_message(user.address, user.address, "again"))
    assert len(mail_servers.wait_for_messages(user, 1)) == 1
