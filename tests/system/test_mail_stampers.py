"""A whole server with an email timestamper (issue 41, outbound): `stampd serve` mails each log
head through the real Postfix of tests/mailservers.py, the `Responder` answers with a clear-signed
reply, the server reads it over IMAP (IDLE) and commits it to ``pgp-mailstamps``; /readyz,
/metrics and the status page show the timestamper; the password is in no log line, no page and
no object of the log. The in-process checks (refusals, backoff, overdue) are
tests/integration/test_mail_stampers.py."""

from __future__ import annotations

import shutil
import subprocess
import urllib.request
from pathlib import Path
from urllib.parse import quote

import pytest

from tests.helpers import (
    Server,
    run_stampd,
    seed_data_dir,
    stamp_tag,
    start_server,
    wait_for,
)
from tests.mailservers import STAMPER_KEY, MailServers, Responder, key_fpr

pytestmark = pytest.mark.slow


def _get(server: Server, path: str, accept: str = "*/*") -> str:
    req = urllib.request.Request(server.url + path.lstrip("/"), headers={"Accept": accept})
    with urllib.request.urlopen(req, timeout=10) as r:
        return str(r.read().decode())


def test_server_mails_its_log_heads_and_commits_the_replies(
        tmp_path: Path, server_factory: list[Server], mail_servers: MailServers) -> None:
    me = mail_servers.users["stampd@mail.test"]
    data = seed_data_dir(tmp_path / "data")
    keys = data / "mail-stampers"
    keys.mkdir()
    shutil.copy(STAMPER_KEY.with_suffix(".pub.asc"), keys / "pgp.asc")
    user, password = quote(me.address, safe=""), quote(me.password, safe="")
    server = start_server(data, workers=1, commit_interval=2, extra_env={
        "STAMPD_TLOG": "on",
        "STAMPD_MAIL_STAMPERS": f"pgp=stamper@mail.test#{key_fpr(STAMPER_KEY)}",
        "STAMPD_MAIL_FROM": me.address,
        "STAMPD_MAIL_SMTP": f"smtp://{user}:{password}@{mail_servers.host}:"
                            f"{mail_servers.smtp_port}",
        "STAMPD_MAIL_IMAP": f"imap://{user}:{password}@{mail_servers.host}:"
                            f"{mail_servers.imap_port}",
        "STAMPD_MAIL_CA_FILE": str(mail_servers.ca.ca_file),
    })
    server_factory.append(server)
    responder = Responder(mail_servers, mail_servers.users["stamper@mail.test"])
    try:
        stamp_tag(server, "1" * 40)
        [request] = responder.requests(1)
        body = request.get_body().get_content()  # type: ignore[union-attr]
        assert "git commit: " in body and "tlog checkpoint:" in body
        responder.answer(request)

        repo = data / "log.git"

        def stamped() -> bool:
            r = subprocess.run(["git", "--git-dir", str(repo), "rev-parse", "--verify", "-q",
                                "refs/heads/pgp-mailstamps"], capture_output=True, timeout=30,
                               check=False)
            return r.returncode == 0

        wait_for(stamped, timeout=60, what="the reply on pgp-mailstamps")
        reply = subprocess.run(["git", "--git-dir", str(repo), "show",
                                "pgp-mailstamps:mailstamp.asc"], capture_output=True,
                               text=True, timeout=30, check=True).stdout
        home = tmp_path / "verify"
        home.mkdir(mode=0o700)
        subprocess.run(["gpg", "--homedir", str(home), "--batch", "--import",
                        str(STAMPER_KEY.with_suffix(".pub.asc"))], capture_output=True,
                       timeout=60, check=True)
        ok = subprocess.run(["gpg", "--homedir", str(home), "--batch", "--verify"],
                            input=reply, capture_output=True, text=True, timeout=60,
                            check=False)
        assert ok.returncode == 0, ok.stderr

        def replied() -> bool:
            _status, ready = server.get_json("/readyz")
            mail = ready.get("mail_stampers")
            return isinstance(mail, dict) and mail["pgp"]["last_reply"] is not None

        wait_for(replied, timeout=30, what="the reply in /readyz")
        _status, ready = server.get_json("/readyz")
        pgp = ready["mail_stampers"]["pgp"]  # type: ignore[index]
        assert pgp["overdue"] is False and pgp["address"] == "stamper@mail.test"
        metrics = _get(server, "/metrics")
        assert 'stampd_mail_stamper_overdue{stamper="pgp"} 0.0' in metrics
        assert 'stampd_mail_stamper_last_reply_age_seconds{stamper="pgp"}' in metrics
        page = _get(server, "/", accept="text/html")
        assert "Email timestampers" in page and "stamper@mail.test" in page

        audited = run_stampd(["audit", str(repo), "--no-tlog"], timeout=120)
        assert audited.returncode == 0, audited.stdout + audited.stderr
        assert "email timestamper pgp (refs/heads/pgp-mailstamps): 1 of 1 replies valid" \
            in audited.stdout

        for text in (server.log(), page, metrics, str(ready)):
            assert me.password not in text
        objects = subprocess.run(["git", "--git-dir", str(repo), "cat-file",
                                  "--batch-all-objects", "--batch"], capture_output=True,
                                 timeout=60, check=True).stdout
        assert me.password.encode() not in objects
    finally:
        responder.close()
