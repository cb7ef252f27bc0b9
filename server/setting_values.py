"""The settings that hold more than one value, parsed and checked: the database URL, the
peers (`PeerConfig`), the email timestampers and our mail account (`MailStamperConfig`,
`MailServer`), the witnesses the log sends its checkpoints to (`WitnessConfig`), the
logs this server witnesses, and the TSA key; and the credentials a configured URL may hold.

`server.settings.Settings` keeps each of them as the string it was given and parses it here
once, when the settings are built (a ValueError here is a settings error there).
"""

from __future__ import annotations

import os
import re
import socket
import urllib.parse
from dataclasses import dataclass, field

from formats.keys import KeySpec, parse_extra_keys
from formats.mailstamps import DIGEST, MODES, QUOTE
from formats.note import Ed25519Verifier, NoteError
from formats.tlog.checkpoint import CosignatureVerifier

# Keys a TSA key may be: what RFC 3161 clients accept (ECDSA P-256/P-384, RSA), held by
# gpg-agent (openpgp:) or ssh-agent (ssh:, ECDSA only; its P-256 signatures are the cheapest).
TSA_KEYS = ("openpgp:nistp256", "openpgp:nistp384", "openpgp:rsa3072", "openpgp:rsa4096",
            "ssh:ecdsa-p256", "ssh:ecdsa-p384")


def parse_tsa_key(spec: str) -> KeySpec:
    """The key of ``STAMPD_TSA_KEY``: one of `TSA_KEYS`."""
    specs = parse_extra_keys(spec)
    key = specs[0] if len(specs) == 1 else None
    if key is None or f"{key.format}:{key.algo}" not in TSA_KEYS:
        raise ValueError("tsa_key must be one of " + ", ".join(TSA_KEYS))
    return key


# The databases stampd runs on, each with the one driver it ships with (`Settings.database_url`).
DATABASES = {"sqlite": "pysqlite", "postgresql": "psycopg"}
DATABASE_URLS = "sqlite:///PATH or postgresql://USER@HOST/NAME"


def supported_database_url(url: str) -> str:
    """``url`` when it names a database and driver stampd supports (SQLite, PostgreSQL with
    psycopg 3), else ValueError saying which it supports, with a "did you mean" for a near
    miss (``postgress://``). Checked before anything is made: an unknown scheme fails here,
    not after keys were generated, and never as an import error of a driver we lack."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    scheme, sep, _ = url.partition("://")
    if not sep or not re.fullmatch(r"[A-Za-z0-9_+.-]+", scheme):
        raise ValueError(f"not a database URL: use {DATABASE_URLS}")
    backend, _, driver = scheme.lower().partition("+")
    backend = {"postgres": "postgresql"}.get(backend, backend)
    if backend not in DATABASES:
        import difflib

        near = difflib.get_close_matches(backend, [*DATABASES, "postgres"], n=1, cutoff=0.6)
        hint = f"; did you mean {'postgresql' if near[0] == 'postgres' else near[0]}://?" \
            if near else ""
        raise ValueError(f"unsupported database {backend!r}: stampd runs on SQLite or "
                         f"PostgreSQL ({DATABASE_URLS}){hint}")
    if driver and driver != DATABASES[backend]:
        raise ValueError(f"unsupported driver {driver!r}: stampd uses "
                         f"{backend}+{DATABASES[backend]}:// (or just {backend}://)")
    try:
        make_url(url)
    except (ArgumentError, ValueError) as e:  # (a port that is not a number: ValueError)
        raise ValueError(f"not a database URL ({e}): use {DATABASE_URLS}") from None
    return url


PEER_NAME = re.compile(r"[a-z0-9][a-z0-9_.-]{0,39}")


@dataclass(frozen=True)
class PeerConfig:
    name: str
    url: str
    fingerprint: str | None = None  # pinned in configuration; else trust on first use


def parse_peers(spec: str) -> list[PeerConfig]:
    """``name=URL[#FINGERPRINT]`` items separated by commas."""
    peers: list[PeerConfig] = []
    for item in filter(None, (i.strip() for i in spec.split(","))):
        name, sep, rest = item.partition("=")
        url, _, fpr = rest.partition("#")
        if not sep or not PEER_NAME.fullmatch(name):
            raise ValueError(f"peer {item!r}: use name=URL[#FINGERPRINT], name in [a-z0-9_.-]")
        if not re.fullmatch(r"https?://[!-~]+", url):
            raise ValueError(f"peer {name}: URL must start with http:// or https://")
        if fpr and not re.fullmatch(r"[0-9A-F]{40}", fpr.upper()):
            raise ValueError(f"peer {name}: fingerprint must be 40 hex digits")
        if any(p.name == name for p in peers):
            raise ValueError(f"peer {name} listed twice")
        peers.append(PeerConfig(name, url, fpr.upper() or None))
    return peers


# An email timestamper's address: a plain addr-spec, no display name, no white space.
MAIL_ADDRESS = re.compile(r"[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]+@[A-Za-z0-9.-]+")


@dataclass(frozen=True)
class MailStamperConfig:
    """An email timestamper (docs/mail.md): its name (the log's ``<name>-mailstamps``), the
    address requests go to, and the pinned key: its id (16 hex digits, the long key id) or
    fingerprint (40), the key itself read from ``<data_dir>/mail-stampers/<name>.asc``; and
    ``mode``, how it answers: ``quote`` (a clear-signed copy of the request) or ``digest`` (it
    is mailed only the request's SHA-256 and answers with a stampd receipt of it)."""

    name: str
    address: str
    key_id: str  # upper-case hex, 16 or 40 digits
    mode: str = QUOTE

    def pins(self, fingerprint: str) -> bool:
        """Whether a key of this ``fingerprint`` is the pinned one."""
        return fingerprint.upper().endswith(self.key_id)


def parse_mail_stampers(spec: str) -> list[MailStamperConfig]:
    """``name=ADDRESS#KEYID[:MODE]`` items separated by commas; MODE ``quote`` (the default)
    or ``digest``."""
    stampers: list[MailStamperConfig] = []
    for item in filter(None, (i.strip() for i in spec.split(","))):
        name, sep, rest = item.partition("=")
        address, _, pin = rest.partition("#")
        key_id, colon, mode = pin.partition(":")
        if colon and mode not in MODES:
            raise ValueError(f"mail stamper {name}: unknown mode {mode[:20]!r} after the key "
                             f"id; use :{QUOTE} (the default) or :{DIGEST}")
        if not sep or not PEER_NAME.fullmatch(name):
            raise ValueError(f"mail stamper {item!r}: use name=ADDRESS#KEYID, name in "
                             "[a-z0-9_.-]")
        if not MAIL_ADDRESS.fullmatch(address):
            raise ValueError(f"mail stamper {name}: {address!r} is no plain email address")
        if not re.fullmatch(r"[0-9A-Fa-f]{16}|[0-9A-Fa-f]{40}", key_id):
            raise ValueError(f"mail stamper {name}: pin its key with #KEYID, the key id (16 "
                             "hex digits) or fingerprint (40) of its OpenPGP key")
        if any(s.name == name for s in stampers):
            raise ValueError(f"mail stamper {name} listed twice")
        stampers.append(MailStamperConfig(name, address, key_id.upper(), mode or QUOTE))
    return stampers


@dataclass(frozen=True)
class MailServer:
    """Our SMTP submission server or IMAP server: ``smtp://USER:PASSWORD@HOST[:PORT]`` or
    ``imap://...`` (user and password percent-encoded; an ``@`` in the user name as ``%40``).
    Its `public` form, without the credentials, is what is logged and shown."""

    scheme: str
    host: str
    port: int
    user: str = field(repr=False)
    password: str = field(repr=False)

    @property
    def public(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}"


MAIL_PORTS = {"smtp": 587, "imap": 143}


def parse_mail_server(url: str, scheme: str) -> MailServer | None:
    """``url`` of ``scheme`` (smtp or imap) with its credentials; None when empty."""
    if not url:
        return None
    shown = redact_userinfo(url)
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port or MAIL_PORTS[scheme]
    except ValueError:
        raise ValueError(f"mail {scheme} server {shown!r}: not a URL") from None
    if parts.scheme != scheme or not parts.hostname or parts.path not in ("", "/"):
        raise ValueError(f"mail {scheme} server {shown!r}: use {scheme}://USER:PASSWORD@HOST"
                         f"[:PORT] (default port {MAIL_PORTS[scheme]})")
    creds = url_credentials(url)
    if creds is None or not creds[0]:
        raise ValueError(f"mail {scheme} server {shown}: give the user and password "
                         f"({scheme}://USER:PASSWORD@HOST)")
    return MailServer(scheme, parts.hostname, port, creds[0], creds[1])


# The user information of a URL (``user:password@``), up to the authority's last ``@``.
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/?#\s]*@")


def redact_userinfo(text: str) -> str:
    """``text`` with the user name and password of every URL in it removed
    (``https://ops:TOKEN@host/`` becomes ``https://host/``): a URL, or a message naming one,
    as it may be published or logged. The configured URL keeps them, to send with."""
    return _USERINFO.sub(r"\1", text)


def url_credentials(url: str) -> tuple[str, str] | None:
    """The user name and password of ``url`` (percent-decoded), for HTTP basic
    authentication; None when it holds none."""
    parts = urllib.parse.urlsplit(url)
    if parts.username is None and parts.password is None:
        return None
    return (urllib.parse.unquote(parts.username or ""),
            urllib.parse.unquote(parts.password or ""))


@dataclass(frozen=True)
class WitnessConfig:
    """A witness the log sends its checkpoints to: its submission prefix (requests go to
    ``<url>/add-checkpoint``, with the credentials it may hold) and its cosignature verifier
    key (type 0x04)."""

    url: str
    vkey: str

    @property
    def public_url(self) -> str:
        """The URL without its credentials: what is published (the policy, /readyz, the
        status page), logged, and requested (the credentials go in a header of their own,
        `credentials`, so that no URL a library logs holds them)."""
        return redact_userinfo(self.url)

    @property
    def credentials(self) -> tuple[str, str] | None:
        """The user name and password of the URL, for HTTP basic authentication."""
        return url_credentials(self.url)

    @property
    def verifier(self) -> CosignatureVerifier:
        return CosignatureVerifier.from_vkey(self.vkey)

    @property
    def name(self) -> str:
        """The witness's key name: how the log names it (metrics, status, the policy)."""
        return self.verifier.name


# Names of the published policy (c2sp tlog-policy) that a witness may not take.
_POLICY_NAMES = ("none", "witnesses")


def parse_witnessed(spec: str) -> dict[str, list[Ed25519Verifier]]:
    """The logs of ``STAMPD_WITNESS_FOR``: comma-separated checkpoint vkeys (type 0x01, named
    for the log's origin), grouped by origin; ValueError naming a bad one."""
    logs: dict[str, list[Ed25519Verifier]] = {}
    for item in filter(None, (i.strip() for i in spec.split(","))):
        try:
            verifier = Ed25519Verifier.from_vkey(item)
        except NoteError as e:
            raise ValueError(f"witness_for: {item!r} is no log's Ed25519 vkey "
                             f"(origin+keyid+key): {e}") from None
        keys = logs.setdefault(verifier.name, [])
        if any(k.key == verifier.key for k in keys):
            raise ValueError(f"witness_for: {item} listed twice")
        keys.append(verifier)
    return logs


def parse_witnesses(spec: str) -> list[WitnessConfig]:
    """``URL=VKEY`` items separated by commas (the URL holds no ``=``)."""
    witnesses: list[WitnessConfig] = []
    for item in filter(None, (i.strip() for i in spec.split(","))):
        url, sep, vkey = item.partition("=")
        shown = redact_userinfo(url)  # (an error names the URL without its credentials)
        if not sep or not vkey:
            raise ValueError(f"witness {redact_userinfo(item)[:80]!r}: use URL=VKEY")
        if not re.fullmatch(r"https?://[!-~]+", url):
            raise ValueError(f"witness {shown[:80]!r}: URL must start with http:// or https://")
        try:
            name = CosignatureVerifier.from_vkey(vkey).name
        except NoteError as e:
            raise ValueError(f"witness {shown}: not a cosignature verifier key (type 0x04, "
                             f"name+id+base64): {e}") from None
        if name in _POLICY_NAMES:
            raise ValueError(f"witness {shown}: its key name {name!r} is reserved in the "
                             "published policy")
        w = WitnessConfig(url.rstrip("/"), vkey)
        for other in witnesses:
            if other.name == name or other.verifier.key.public_key == w.verifier.key.public_key:
                raise ValueError(f"witness {name} listed twice")
        witnesses.append(w)
    return witnesses



def parse_host_port(spec: str, what: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` for an IPv6 address): the address of an SMTP listener or
    relay (``STAMPD_MAIL_LISTEN``, ``STAMPD_MAIL_RELAY``); ValueError naming ``what``."""
    host, sep, port = spec.strip().rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isascii() or not port.isdigit() \
            or not 0 < int(port) < 65536 or any(c.isspace() for c in host):
        raise ValueError(f"{what} must be host:port (an IPv6 address in brackets), not {spec!r}")
    return host, int(port)


_ADDRESS = re.compile(r"[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]{1,64}@[A-Za-z0-9.-]{1,253}")


def parse_mail_addresses(spec: str) -> tuple[str, ...]:
    """The service's own mail addresses (``STAMPD_MAIL_ADDRESSES``), comma-separated, each a
    plain ``local@domain``; compared without regard to case. ValueError for one that is not."""
    out: list[str] = []
    for item in filter(None, (i.strip() for i in spec.split(","))):
        if not _ADDRESS.fullmatch(item):
            raise ValueError(f"mail address {item!r} is not a plain local@domain address")
        if item.lower() not in out:
            out.append(item.lower())
    return tuple(out)


@dataclass(frozen=True)
class MailInbound:
    """stampd as an email timestamper: its SMTP listener's and its relay's (host, port), and
    the service's own addresses (lower case, the replies' From first)."""

    listen: tuple[str, int]
    relay: tuple[str, int]
    addresses: tuple[str, ...]


def parse_mail_inbound(listen: str, relay: str, addresses: str, key_uid: str
                        ) -> MailInbound | None:
    """``STAMPD_MAIL_LISTEN``, ``STAMPD_MAIL_RELAY`` and ``STAMPD_MAIL_ADDRESSES`` (by default
    the address of ``key_uid``); None when the listener is off. ValueError when they do not
    go together."""
    if not listen.strip():
        if relay.strip():
            raise ValueError("STAMPD_MAIL_RELAY is set but not STAMPD_MAIL_LISTEN")
        return None
    where = parse_host_port(listen, "STAMPD_MAIL_LISTEN")
    if not relay.strip():
        raise ValueError("STAMPD_MAIL_LISTEN needs STAMPD_MAIL_RELAY: where the replies go")
    own = parse_mail_addresses(addresses or key_uid.rsplit("<", 1)[-1].rstrip(">"))
    if not own:
        raise ValueError("STAMPD_MAIL_ADDRESSES names no address")
    return MailInbound(where, parse_host_port(relay, "STAMPD_MAIL_RELAY"), own)


DEFAULT_UID = "stampd Timestamping Service <stampd@{host}>"
# A host name that may stand after the @ of the default user id (git compares a tag's tagger
# with it, so it must stay a plain 'Name <email>'); anything else falls back to localhost.
_UID_HOST = re.compile(r"(?!-)[a-z0-9-]{1,63}(?<!-)(\.(?!-)[a-z0-9-]{1,63}(?<!-))*")


def default_uid(own_url: str | None) -> str:
    """The user id of a generated key: its e-mail's host is the host of ``own_url`` where set,
    else this machine's host name, so that keys of different servers differ; localhost where
    that host is not a plain DNS name (an IPv6 address, odd characters)."""
    host = (urllib.parse.urlsplit(own_url).hostname if own_url else socket.gethostname()) or ""
    host = host.lower().rstrip(".")
    return DEFAULT_UID.format(host=host if _UID_HOST.fullmatch(host) else "localhost")


def usable_cpus() -> int:
    """The CPUs this process may run on (``taskset``, cgroup cpusets), not all the machine's."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # (no affinity where the platform has none)
        return os.cpu_count() or 1
