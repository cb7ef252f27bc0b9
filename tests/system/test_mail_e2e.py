"""Two stampd servers cross-stamping by email, end to end (issue 41, flow 3): A's outbound to
B's inbound, B's reply into A's mailbox, A's log holding B's signed reply, `stampd audit` of A
passing.

Real parts only: the throwaway Postfix and Dovecot of tests/mailservers.py (A's submission and
IMAP; Postfix relays ``b.test`` by SMTP to B's mail listener and takes B's replies on its plain
port), two real `stampd serve`. A pins B's mail key (read from B's /v1/keys) in digest mode:
it mails B only the SHA-256 of its request, B stamps that digest and answers with the receipt.
The committed reply is checked with ``gpg --verify`` and its serial's proof fetched from B."""

from __future__ import annotations

import hashlib
import re
import subprocess
import urllib.request
from pathlib import Path
from urllib.parse import quote

import pytest

from formats.receipts import parse_statement, split_receipt
from formats.tlog.entry import Entry
from formats.tlog.proof import TlogProof
from tests import helpers
from tests.mailservers import MailServers

pytestmark = pytest.mark.slow

B_ADDRESS = "stamp@b.test"  # (the domain the routed_mail_servers fixture routes to B)


def git(repo: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "--git-dir", str(repo), *args], capture_output=True,
                          text=True, timeout=30, check=check)


def test_two_servers_cross_stamp_by_email(
        tmp_path: Path, server_factory: list[helpers.Server],
        routed_mail_servers: tuple[MailServers, int]) -> None:
    servers, b_port = routed_mail_servers

    # B: an email timestamper, its replies handed to Postfix's plain port.
    b = helpers.start_server(helpers.seed_data_dir(tmp_path / "b"), workers=1, extra_env={
        "STAMPD_TLOG": "on",
        "STAMPD_MAIL_LISTEN": f"127.0.0.1:{b_port}",
        "STAMPD_MAIL_RELAY": f"{servers.host}:{servers.plain_port}",
        "STAMPD_MAIL_ADDRESSES": B_ADDRESS,
    })
    server_factory.append(b)
    status, keys = b.get_json("/v1/keys")
    assert status == 200, keys
    [key] = [k for k in keys["keys"] if k["purpose"] == "mail"]  # type: ignore[attr-defined]
    fingerprint = key["fingerprint"]

    # A: B pinned in digest mode, its account at the fixture.
    a_data = helpers.seed_data_dir(tmp_path / "a")
    (a_data / "mail-stampers").mkdir()
    (a_data / "mail-stampers" / "b.asc").write_text(key["public_key"])
    me = servers.users["stampd@mail.test"]
    user, password = quote(me.address, safe=""), quote(me.password, safe="")
    a = helpers.start_server(a_data, workers=1, commit_interval=2, extra_env={
        "STAMPD_TLOG": "on",
        "STAMPD_MAIL_STAMPERS": f"b={B_ADDRESS}#{fingerprint}:digest",
        "STAMPD_MAIL_FROM": me.address,
        "STAMPD_MAIL_SMTP": f"smtp://{user}:{password}@{servers.host}:{servers.smtp_port}",
        "STAMPD_MAIL_IMAP": f"imap://{user}:{password}@{servers.host}:{servers.imap_port}",
        "STAMPD_MAIL_CA_FILE": str(servers.ca.ca_file),
        "STAMPD_MAIL_STAMPER_POLL_INTERVAL": "5",
    })
    server_factory.append(a)

    helpers.stamp_tag(a, "1" * 40)  # (a stamp: A commits its log within its commit interval)
    repo = a_data / "log.git"

    def stamped() -> bool:
        return git(repo, "rev-parse", "--verify", "-q", "refs/heads/b-mailstamps",
                   check=False).returncode == 0

    try:
        helpers.wait_for(stamped, timeout=180, what="B's reply on A's b-mailstamps")
    except AssertionError:
        raise AssertionError(f"{servers.log_tail()}\n== A\n{a.log()[-3000:]}\n"
                             f"== B\n{b.log()[-3000:]}") from None

    # The reply: B's receipt, clear-signed by B's mail key, of the SHA-256 of the request
    # text committed beside it, which names A's log commit that the reply's commit stamps.
    reply = git(repo, "show", "b-mailstamps:mailstamp.asc").stdout
    request = git(repo, "show", "b-mailstamps:request.txt").stdout
    (tmp_path / "b-mail.asc").write_text(key["public_key"])
    home = helpers.keyring(tmp_path / "b-mail.asc", tmp_path / "verify")
    verified = subprocess.run(["gpg", "--homedir", str(home), "--batch", "--status-fd", "1",
                               "--verify"], input=reply, capture_output=True, text=True,
                              timeout=60, check=False)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "VALIDSIG " in verified.stdout and fingerprint in verified.stdout
    statement = parse_statement(split_receipt(reply)[0])
    assert (statement.algorithm, statement.key) == ("sha256", fingerprint)
    assert statement.digest == hashlib.sha256(request.encode()).hexdigest()
    stamped_commit = git(repo, "rev-list", "--parents", "-n1", "b-mailstamps").stdout.split()[-1]
    assert re.search(rf"^git commit: {stamped_commit}$", request, re.MULTILINE), request
    assert git(repo, "merge-base", "--is-ancestor", stamped_commit, "main",
               check=False).returncode == 0

    # B's transparency log holds that receipt's stamp.
    with urllib.request.urlopen(f"{b.url}v1/proofs/{statement.serial}?wait=30",
                                timeout=90) as answer:
        proof = answer.read()
    extra = TlogProof.parse(proof).extra
    assert extra is not None
    entry = Entry.parse(extra)
    assert (entry.serial, entry.kind, entry.digest) == (statement.serial, "digest",
                                                        statement.digest)

    # stampd audit of A checks the reply offline, with the key A's log published.
    audited = helpers.run_stampd(["audit", str(repo), "--no-tlog"], timeout=120)
    assert audited.returncode == 0, audited.stdout + audited.stderr
    m = re.search(r"email timestamper b \(refs/heads/b-mailstamps\): (\d+) of (\d+) replies "
                  "valid", audited.stdout)
    assert m is not None and m.group(1) == m.group(2), audited.stdout
