"""The HTML pages (Jinja2 templates, server/web/templates) escape every value a peer, a witness,
a log commit, a key or the operator's settings put in them: hostile values show as text, once
escaped, and never as markup."""

from __future__ import annotations

import base64
import datetime
import hashlib
import json
import re
from html.parser import HTMLParser
from types import SimpleNamespace
from typing import cast

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from cryptography.x509.oid import NameOID

from formats import note
from formats.keys import WITNESS, WITNESS_KEY, ServedKey
from server.api import status, web
from server.api.services import Services
from server.tlog.sequencer import LogKey
from server.tlog.witness_client import WitnessState

EVIL = "<script>alert('x')</script>\"&"
SSH = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHbr9GGRjdkSvfQZFgYAGLqCmoJAGjOmh6e5aTkIDmqd\n"
PRIVATE = ed25519.Ed25519PrivateKey.from_private_bytes(bytes(32))
PUBLIC = PRIVATE.public_key().public_bytes(serialization.Encoding.Raw,
                                           serialization.PublicFormat.Raw)


def tsa_chain(common_name: str) -> str:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    start = datetime.datetime(2024, 1, 2, tzinfo=datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(PRIVATE.public_key()).serial_number(7).not_valid_before(start)
            .not_valid_after(start + datetime.timedelta(days=400)).sign(PRIVATE, None))
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def services(url: str = f"https://stamp.example.org/{EVIL}") -> Services:
    """What the pages read of a server (a stand-in for `Services`): every string one that
    HTML must not take as markup."""
    keys = [ServedKey("primary", "openpgp", "A" * 40, "ed25519", "PUBLIC",
                      f"stampd <t@x> {EVIL}", primary=True),
            ServedKey(f"ssh{EVIL}", "ssh", f"SHA256:{EVIL}", f"ed25519{EVIL}", SSH, "u"),
            ServedKey(WITNESS_KEY.id, "ssh", "SHA256:w", "ed25519", SSH, "u", purpose=WITNESS)]
    checkpoint = note.sign_note(f"example.org/log\n42\n{'A' * 43}=\n",
                                [note.ed25519_signer("example.org/log", PUBLIC, PRIVATE.sign)])
    return cast(Services, SimpleNamespace(
        settings=SimpleNamespace(public_url=url, witness_name="witness.example.org/w",
                                 witness_list=[], quorum=0),
        keys=keys, key=keys[0],
        log_key=LogKey(note.VerifierKey("example.org/log", note.ED25519, PUBLIC).encode()),
        tlog_reader=SimpleNamespace(checkpoint=checkpoint.encode),
        witness=object(),
        tsa=SimpleNamespace(chain_pem=tsa_chain(f"TSA {EVIL}"), policy=f"1.2.3{EVIL}")))


def snapshot() -> status.Snapshot:
    peers = [status.PeerRow(f"peer{EVIL}", f"http://peer.example/{EVIL}", f"fpr{EVIL}",
                            1_700_000_000, 3, f"refused {EVIL}"),
             status.PeerRow("calm", "http://calm.example/", None, None, 0, None)]
    log = [("c" * 40, 1_700_000_100, f"stampd log commit 2 {EVIL}")]
    witnesses = [WitnessState(f"w{EVIL}", f"https://w.example/{EVIL}", 40, None, 1.7e9),
                 WitnessState("w2", "https://w2.example/", None, consecutive_errors=2,
                              last_error=f"timeout {EVIL}")]
    return status.Snapshot([i % 7 for i in range(60)], 180, log, peers, witnesses, 42)


class Text(HTMLParser):
    """A page's elements and its text as a browser reads it (entities decoded)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def parsed(page: str) -> Text:
    text = Text()
    text.feed(page)
    text.close()
    return text


def test_the_status_page_shows_hostile_values_as_text() -> None:
    s = services()
    page = status.render(s, snapshot())
    assert "<script" not in page and "<title>" in page
    read = parsed(page)
    assert "script" not in read.tags
    text = "".join(read.text)
    # Each value once escaped, so read back as it was (not "&amp;lt;", not markup).
    for value in (f"peer{EVIL}", f"http://peer.example/{EVIL}", f"fpr{EVIL}", f"refused {EVIL}",
                  f"w{EVIL}", f"https://w.example/{EVIL}", f"timeout {EVIL}",
                  f"stampd log commit 2 {EVIL}", f"stampd <t@x> {EVIL}", f"ssh{EVIL}",
                  f"SHA256:{EVIL}", f"ed25519{EVIL}", f"TSA {EVIL}", f"1.2.3{EVIL}",
                  f"git clone https://stamp.example.org/{EVIL}log.git"):
        assert value in text, value
    assert "&amp;lt;" not in page
    assert page.count("<rect ") == 60 and ">42 entries<" not in page and "(42 entries)" in page
    assert "1 min ago: 3 stamps" in text and "stamps per minute (peak 6)" in text


def test_the_status_page_style_is_the_one_its_policy_allows() -> None:
    page = status.render(services("https://stamp.example.org/"), snapshot())
    styles = re.findall(r"<style>(.*?)</style>", page, re.S)
    assert len(styles) == 1 and styles[0] == status.CSS
    digest = base64.b64encode(hashlib.sha256(styles[0].encode()).digest()).decode()
    assert f"style-src 'sha256-{digest}';" in status.CSP


def test_the_web_pages_config_cannot_end_its_script_element() -> None:
    """A user id holding "</script><!--" stays inside the JSON data block, and the page's
    scripts read the configuration as it was."""
    s = services("https://stamp.example.org/")
    for page in web.PAGES:
        html = web.render(page, s)
        block = html.split('id="stampd-config">', 1)[1].split("</script>", 1)[0]
        assert not set("<>&'") & set(block)
        assert json.loads(block) == json.loads(json.dumps(web.page_config(s)))
        assert parsed(html).tags.count("script") == 2
