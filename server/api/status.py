"""The status page: ``GET /`` with ``Accept: text/html``. Server-rendered, no external assets,
served with a Content-Security-Policy that allows nothing else (`PAGE_HEADERS`)."""

from __future__ import annotations

import base64
import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import NamedTuple

from asn1crypto import pem as asn1_pem
from asn1crypto import x509
from markupsafe import Markup
from sqlalchemy import func, select

from formats.keys import WITNESS_KEY, witness_vkey
from server.api import templates
from server.api.services import Services
from server.api.templates import TEMPLATE_DIR
from server.gitlog.mailstampers import MailStamperStatus
from server.gitlog.repository import LogRepository
from server.models import CrossStamp, CrossStampState, Peer, Stamp
from server.runtime.siblings import Sibling
from server.setting_values import redact_userinfo
from server.tlog.store import checkpoint_size
from server.tlog.witness_client import WitnessState

MINUTES = 60


@dataclass
class PeerRow:
    name: str
    url: str
    fingerprint: str | None
    last_success: int | None
    pending: int
    last_error: str | None


@dataclass
class Snapshot:
    per_minute: list[int]  # stamps in each of the last 60 minutes, oldest first
    total_hour: int
    log: list[tuple[str, int, str]]  # (commit id, time, first line) newest first
    peers: list[PeerRow]
    witnesses: list[WitnessState] = field(default_factory=list)  # (the transparency log's)
    published: int | None = None  # the size of the published checkpoint
    mail_stampers: list[MailStamperStatus] = field(default_factory=list)


def snapshot(s: Services, others: Sequence[Sibling] = ()) -> Snapshot:
    """What the status page shows (``others``: the other HTTP processes' reports)."""
    now = int(s.clock())
    start = now - MINUTES * 60
    per_minute = [0] * MINUTES
    with s.engine.connect() as conn:
        minute = ((Stamp.stamped_at - start) / 60).cast(type_=Stamp.id.type)
        rows = conn.execute(select(minute, func.count()).where(Stamp.stamped_at >= start)
                            .group_by(minute))
        for m, n in rows:
            if 0 <= int(m) < MINUTES:
                per_minute[int(m)] += int(n)
        peers = []
        for p in conn.execute(select(Peer.name, Peer.url, Peer.fingerprint)).all():
            if p.name not in s.cross.peers:
                continue
            last = conn.execute(select(func.max(CrossStamp.updated_at)).where(
                CrossStamp.peer == p.name, CrossStamp.state == CrossStampState.DONE)).scalar()
            pending = conn.execute(select(func.count()).select_from(CrossStamp).where(
                CrossStamp.peer == p.name,
                CrossStamp.state == CrossStampState.PENDING)).scalar() or 0
            err = conn.execute(select(CrossStamp.last_error).where(
                CrossStamp.peer == p.name, CrossStamp.state == CrossStampState.PENDING,
                CrossStamp.last_error.is_not(None)).order_by(CrossStamp.id.desc())
                .limit(1)).scalar()
            peers.append(PeerRow(p.name, redact_userinfo(p.url), p.fingerprint, last,
                                 int(pending), err))
    log = LogRepository(s.settings.log_repo).recent(10)  # a handle of this thread's own
    return Snapshot(per_minute, sum(per_minute), log, peers, s.witness_states(others),
                    s.published_size(),
                    s.mail_stampers.statuses() if s.mail_stampers is not None else [])


def _when(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t)) if t else "never"


class Bar(NamedTuple):
    """One minute's bar of the chart: numbers only (the template writes them unescaped)."""

    x: str  # (formatted: one decimal)
    y: int
    height: int
    ago: int  # minutes
    stamps: int


@dataclass(frozen=True)
class Chart:
    """An SVG bar chart of stamps per minute, oldest minute on the left, with its axes
    labelled: the y axis in stamps per minute (up to the peak), the x axis in minutes ago."""

    bars: list[Bar]
    bar_width: str
    total: int
    peak: int
    minutes: int
    width: int = 600
    plot: int = 120  # the bars stand on y = plot; labels below
    height: int = 136


def chart(per_minute: list[int]) -> Chart:
    width, plot, minutes = Chart.width, Chart.plot, len(per_minute)
    peak = max(per_minute) or 1
    bar = width / minutes
    bars = []
    for i, n in enumerate(per_minute):
        h = round(n / peak * (plot - 20))
        bars.append(Bar(f"{i * bar:.1f}", plot - h, h, minutes - i, n))
    return Chart(bars, f"{bar - 1:.1f}", sum(per_minute), peak, minutes)


CSS = (TEMPLATE_DIR / "status.css").read_text()

# The page needs nothing but its one <style> element (allowed by its hash, so no other style
# applies) and the inline SVG, which is part of the document, not a fetched image: no script,
# image, font, frame or form. Nor may another site frame it.
_STYLE_HASH = base64.b64encode(hashlib.sha256(CSS.encode()).digest()).decode()
CSP = (f"default-src 'none'; style-src 'sha256-{_STYLE_HASH}'; base-uri 'none'; "
       "form-action 'none'; frame-ancestors 'none'")
PAGE_HEADERS = {"Content-Security-Policy": CSP, "X-Frame-Options": "DENY"}


@dataclass(frozen=True)
class TsaView:
    """The RFC 3161 authority's certificate as the page shows it."""

    subject: str
    issuer: str
    not_before: str
    not_after: str
    sha256: str
    policy: str


@lru_cache(maxsize=4)
def tsa_view(chain_pem: str, policy: str) -> TsaView:
    """(Parsed once per chain: a chain changes only when the TSA's certificate is renewed.)"""
    _, _, der = asn1_pem.unarmor(chain_pem.encode())
    cert = x509.Certificate.load(der)
    validity = cert["tbs_certificate"]["validity"]
    return TsaView(cert.subject.human_friendly, cert.issuer.human_friendly,
                   f"{validity['not_before'].native:%Y-%m-%d}",
                   f"{validity['not_after'].native:%Y-%m-%d}", hashlib.sha256(der).hexdigest(),
                   policy)


def own_witness_vkey(s: Services) -> str | None:
    """This server's cosignature verifier key as a witness of other logs (None: no witness)."""
    public = next((k.public for k in s.keys if k.id == WITNESS_KEY.id), None)
    if s.witness is None or public is None:
        return None
    return witness_vkey(s.settings.witness_name, public)


def render(s: Services, snap: Snapshot) -> str:
    """The page (templates/status.html): every value HTML-escaped but the chart's numbers."""
    tlog, tsa = None, s.tsa
    if s.log_key is not None and s.tlog_reader is not None:
        note = s.tlog_reader.checkpoint()
        size = "no checkpoint yet" if note is None else f"{checkpoint_size(note)} entries"
        tlog = {"size": size, "vkey": s.log_key.vkey}
    return templates.render(
        "status.html", url=s.settings.public_url, css=Markup(CSS), key=s.key,
        extra_keys=s.keys[1:], tlog=tlog,
        witnesses=[(w, w.lag(snap.published)) for w in snap.witnesses],
        witness_vkey=own_witness_vkey(s),
        tsa=None if tsa is None else tsa_view(tsa.chain_pem, tsa.policy),
        chart=chart(snap.per_minute), log=snap.log, peers=snap.peers, when=_when,
        mail_stampers=snap.mail_stampers)
