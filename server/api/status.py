"""The status page: ``GET /`` with ``Accept: text/html``. Server-rendered, no external assets,
served with a Content-Security-Policy that allows nothing else (`PAGE_HEADERS`)."""

from __future__ import annotations

import base64
import hashlib
import html
import time
from dataclasses import dataclass, field

from asn1crypto import pem as asn1_pem
from asn1crypto import x509
from sqlalchemy import func, select

from server.api.services import Services
from server.log.repository import LogRepository
from server.models import CrossStamp, CrossStampState, Peer, Stamp
from server.settings import redact_userinfo
from server.tlog.store import checkpoint_size
from server.tlog.witnesses import WitnessState

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


def snapshot(s: Services) -> Snapshot:
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
    return Snapshot(per_minute, sum(per_minute), log, peers, s.witness_states(),
                    s.published_size())


def _when(t: int | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t)) if t else "never"


def chart(per_minute: list[int]) -> str:
    """An inline SVG bar chart of stamps per minute, oldest minute on the left, with its axes
    labelled: the y axis in stamps per minute (up to the peak), the x axis in minutes ago."""
    width, plot, height = 600, 120, 136  # the bars stand on y = plot; labels below
    peak = max(per_minute) or 1
    bar = width / len(per_minute)
    bars = []
    for i, n in enumerate(per_minute):
        h = round(n / peak * (plot - 20))
        bars.append(f'<rect x="{i * bar:.1f}" y="{plot - h}" width="{bar - 1:.1f}" '
                    f'height="{h}"><title>{len(per_minute) - i} min ago: {n} stamps'
                    f'</title></rect>')
    minutes = len(per_minute)
    return (f'<svg id="throughput" role="img" aria-label="stamps per minute, last hour" '
            f'viewBox="0 0 {width} {height}" width="100%" preserveAspectRatio="none" '
            f'height="{height}">'
            f'<text x="2" y="12" class="axis">stamps per minute (peak {peak})</text>'
            f'{"".join(bars)}'
            f'<line x1="0" y1="{plot}" x2="{width}" y2="{plot}" stroke="#555"/>'
            f'<text x="2" y="{height - 2}" class="axis">{minutes} min ago</text>'
            f'<text x="{width / 2:.0f}" y="{height - 2}" class="axis" text-anchor="middle">'
            f'{minutes // 2} min ago</text>'
            f'<text x="{width - 2}" y="{height - 2}" class="axis" text-anchor="end">now</text>'
            f'</svg>')


CSS = """
body{font-family:system-ui,sans-serif;max-width:52rem;margin:2rem auto;padding:0 1rem;
color:#1d232a;background:#fbfbf8}
h1{font-size:1.6rem;margin-bottom:.2rem}h2{font-size:1.15rem;margin-top:1.8rem}
code,pre{font-family:ui-monospace,monospace;font-size:.9em}
pre{background:#eef0ea;padding:.7rem;overflow-x:auto;border-radius:4px}
table{border-collapse:collapse;width:100%}td,th{text-align:left;padding:.25rem .5rem;
border-bottom:1px solid #ddd;vertical-align:top}
td code{overflow-wrap:anywhere}
@media (max-width:40rem){table{display:block;overflow-x:auto}}
svg rect{fill:#3b7a57}.axis{font-size:10px;fill:#555}.ok{color:#2a6b3f}.bad{color:#a3312a}
"""

# The page needs nothing but its one <style> element (allowed by its hash, so no other style
# applies) and the inline SVG, which is part of the document, not a fetched image: no script,
# image, font, frame or form. Nor may another site frame it.
_STYLE_HASH = base64.b64encode(hashlib.sha256(CSS.encode()).digest()).decode()
CSP = (f"default-src 'none'; style-src 'sha256-{_STYLE_HASH}'; base-uri 'none'; "
       "form-action 'none'; frame-ancestors 'none'")
PAGE_HEADERS = {"Content-Security-Policy": CSP, "X-Frame-Options": "DENY"}


def extra_keys(s: Services) -> str:
    if len(s.keys) < 2:
        return ""
    e = html.escape
    rows = "".join(f"<tr><td>{e(k.id)}</td><td>{e(k.format)}</td><td><code>{e(k.fingerprint)}"
                   f"</code></td><td>{e(k.algorithm)}</td></tr>" for k in s.keys[1:])
    return ('<p>More keys (ask with <code>key=&lt;fingerprint&gt;</code> or '
            '<code>format=ssh</code>; <a href="/v1/keys">all keys</a>, '
            '<a href="/v1/keys/allowed_signers">allowed signers</a>):</p>'
            f'<table id="extra-keys"><tr><th>id</th><th>format</th><th>fingerprint</th>'
            f'<th>algorithm</th></tr>{rows}</table>')


def witness_table(snap: Snapshot) -> str:
    """The witnesses that cosign the log's checkpoints, each with what it last cosigned, its
    lag and its errors (empty without witnesses)."""
    if not snap.witnesses:
        return ""
    e = html.escape
    rows = []
    for w in snap.witnesses:
        lag = w.lag(snap.published)
        state = (f'<td class="bad">{w.consecutive_errors} failed in a row: '
                 f'{e((w.last_error or "")[:120])}</td>' if w.consecutive_errors
                 else '<td class="ok">ok</td>')
        rows.append(f"<tr><td>{e(w.name)}</td><td><code>{e(w.url)}</code></td>"
                    f"<td>{'none' if w.cosigned_size is None else w.cosigned_size}</td>"
                    f"<td>{'' if lag is None else lag}</td>"
                    f"<td>{_when(None if w.cosigned_at is None else int(w.cosigned_at))}</td>"
                    f"{state}</tr>")
    return ('<p>Witnesses cosign each checkpoint (their cosignatures are on it, and so in '
            'every proof; the policy: <a href="/tlog/policy">/tlog/policy</a>):</p>'
            '<table id="witnesses"><tr><th>witness</th><th>URL</th><th>cosigned size</th>'
            '<th>lag</th><th>last cosignature</th><th>state</th></tr>'
            f'{"".join(rows)}</table>')


def tlog_section(s: Services, snap: Snapshot | None = None) -> str:
    """The transparency log: its verifier key, its size, its witnesses, how to get a proof
    (empty when it is off)."""
    if s.log_key is None or s.tlog_reader is None:
        return ""
    e = html.escape
    note = s.tlog_reader.checkpoint()
    size = "no checkpoint yet" if note is None else f"{checkpoint_size(note)} entries"
    url = s.settings.public_url
    return f"""<h2>Transparency log</h2>
<p>Every stamp is an entry of a Merkle tree published as C2SP tiles under
<a href="/tlog/checkpoint">/tlog</a> ({e(size)}); its checkpoints are signed by the log key,
whose verifier key is:</p>
<pre id="tlog-vkey">{e(s.log_key.vkey)}</pre>
{"" if snap is None else witness_table(snap)}
<p>The proof of a stamp, checkable offline (<code>stampd verify</code> checks it):</p>
<pre>curl -sS --fail '{e(url)}v1/proofs/SERIAL?wait=5' &gt; FILE.receipt.asc.tlog-proof</pre>
"""


def witness_line(s: Services) -> str:
    """This server as a witness of other logs: its cosignature verifier key (empty when it
    is no witness)."""
    from formats.keys import WITNESS_KEY, witness_vkey

    public = next((k.public for k in s.keys if k.id == WITNESS_KEY.id), None)
    if s.witness is None or public is None:
        return ""
    vkey = witness_vkey(s.settings.witness_name, public)
    return (f'<p>This server is a witness (<a href="/tlog/witness-vkey">its verifier key</a>, '
            f'POST /add-checkpoint):</p>\n<pre id="witness-vkey">{html.escape(vkey)}</pre>')


def tsa_section(s: Services) -> str:
    """RFC 3161: the certificate and a recipe to copy (empty when RFC 3161 is off)."""
    tsa = s.tsa
    if tsa is None:
        return ""
    e = html.escape
    url = s.settings.public_url
    _, _, der = asn1_pem.unarmor(tsa.chain_pem.encode())
    cert = x509.Certificate.load(der)
    validity = cert["tbs_certificate"]["validity"]
    return f"""<h2>RFC 3161 time-stamping</h2>
<table id="tsa"><tr><th>certificate</th><td>{e(cert.subject.human_friendly)}</td></tr>
<tr><th>issuer</th><td>{e(cert.issuer.human_friendly)}</td></tr>
<tr><th>valid</th><td>{validity["not_before"].native:%Y-%m-%d} to
{validity["not_after"].native:%Y-%m-%d}</td></tr>
<tr><th>SHA-256</th><td><code>{hashlib.sha256(der).hexdigest()}</code></td></tr>
<tr><th>policy</th><td><code>{e(tsa.policy)}</code></td></tr>
<tr><th>chain</th><td><a href="/tsa.pem">tsa.pem</a></td></tr></table>
<p>Any RFC 3161 client takes <code>{e(url)}</code> as its TSA URL. With openssl and curl:</p>
<pre>openssl ts -query -data FILE -sha256 -cert -out FILE.tsq
curl -sS --fail -H 'Content-Type: application/timestamp-query' --data-binary @FILE.tsq \\
     {e(url)} &gt; FILE.tsr
curl -sS --fail {e(url)}tsa.pem &gt; tsa.pem
openssl ts -verify -data FILE -in FILE.tsr -CAfile tsa.pem</pre>
"""


def render(s: Services, snap: Snapshot) -> str:
    e = html.escape
    url = s.settings.public_url
    key = s.key
    peers = "".join(
        f"<tr><td>{e(p.name)}</td><td><code>{e(p.url)}</code></td>"
        f"<td><code>{e(p.fingerprint or 'not pinned yet')}</code></td>"
        f"<td>{_when(p.last_success)}</td>"
        f"<td class=\"{'bad' if p.pending else 'ok'}\">{p.pending} waiting"
        f"{(': ' + e(p.last_error[:120])) if p.last_error else ''}</td></tr>"
        for p in snap.peers) or '<tr><td colspan="5">no peers configured</td></tr>'
    log = "".join(
        f"<tr><td><code>{cid[:12]}</code></td><td>{_when(t)}</td><td>{e(msg)}</td></tr>"
        for cid, t, msg in snap.log) or '<tr><td colspan="3">no log commit yet</td></tr>'
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>stampd at {e(url)}</title><style>{CSS}</style></head>
<body>
<h1>stampd timestamping server</h1>
<p>{e(url)} — stamps git commits (Zeitgitter protocol v1) and digests. Every stamp is
recorded before it is signed and published in a <a href="/log.git/info/refs">public log</a>.</p>

<h2>Signing key</h2>
<table id="keys"><tr><th>fingerprint</th><td><code>{e(key.fingerprint)}</code></td></tr>
<tr><th>user id</th><td>{e(key.uid)}</td></tr>
<tr><th>algorithm</th><td>{e(key.algorithm)}</td></tr>
<tr><th>public key</th><td><a href="/?request=get-public-key-v1">download</a></td></tr>
</table>
{extra_keys(s)}

<h2>How to use it</h2>
<p>In a browser: <a href="/stamp">stamp files</a> (hashed on your machine, never uploaded) and
<a href="/verify">verify a receipt</a> (checked on your machine, nothing sent).</p>
<p>Timestamp a git commit with the <code>git timestamp</code> client:</p>
<pre>git timestamp --server {e(url.rstrip('/'))} --tag my-stamp
git timestamp --server {e(url.rstrip('/'))} --branch my-timestamps</pre>
<p>Stamp a file's digest with curl, and check the receipt with gpg (once, import the server's
key; compare its fingerprint with the one above):</p>
<pre>sha256sum FILE | cut -d' ' -f1 |
  curl -sS --fail --data-urlencode sha256@- {e(url)}v1/stamps &gt; FILE.receipt.asc
curl -sS --fail '{e(url)}?request=get-public-key-v1' | gpg --import
gpg --verify FILE.receipt.asc</pre>
<p>Stamp every commit of a repository with the git hook:</p>
<pre>stampd hook install --server {e(url.rstrip('/'))}</pre>
<p>Clone and audit the log:</p>
<pre>git clone {e(url)}log.git
stampd audit {e(url)}log.git</pre>
{tlog_section(s, snap)}
{witness_line(s)}
{tsa_section(s)}
<h2>Throughput, last hour</h2>
<p><span id="total">{snap.total_hour}</span> stamps in the last hour.</p>
{chart(snap.per_minute)}

<h2>Recent log commits</h2>
<table id="log"><tr><th>commit</th><th>time</th><th>message</th></tr>{log}</table>

<h2>Peers</h2>
<table id="peers"><tr><th>name</th><th>URL</th><th>pinned key</th><th>last stamp</th>
<th>state</th></tr>{peers}</table>
</body></html>
"""
