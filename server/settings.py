"""Runtime configuration: one `Settings` object, built at the entry point and passed down.

Every field can be set from the environment with the `STAMPD_` prefix (``STAMPD_DATA_DIR``,
``STAMPD_WORKERS``...) and most from the command line (see ``server.commands``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import Field, PrivateAttr, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from formats.keys import MAIL_KEY, TLOG_KEY, WITNESS_KEY, KeySpec, parse_extra_keys
from formats.note import Ed25519Verifier, valid_key_name
from server.setting_values import (
    DEFAULT_UID,
    MailInbound,
    MailServer,
    MailStamperConfig,
    PeerConfig,
    WitnessConfig,
    default_uid,
    parse_mail_inbound,
    parse_mail_server,
    parse_mail_stampers,
    parse_peers,
    parse_tsa_key,
    parse_witnessed,
    parse_witnesses,
    supported_database_url,
    usable_cpus,
)

# The default policy of RFC 3161 tokens: an OID under 2.25 (ITU-T X.667, a UUID as an
# integer), minted for stampd's policy as docs/tsa.md describes it.
TSA_POLICY = "2.25.178387009458913539541377305212843591845"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="STAMPD_", extra="ignore")

    host: str = Field(default="127.0.0.1", description="listen address")
    port: int = Field(default=8080, ge=0, le=65535, description="listen port")
    data_dir: Path = Field(default=Path("var"), description="database, keys, log repository")
    database_url: str | None = Field(
        default=None,
        description="SQLAlchemy URL; default sqlite:///<data_dir>/stampd.sqlite3",
    )
    workers: int = Field(default=0, ge=0,
                         description="signing processes; 0 = one per CPU it may run on")
    api_processes: int = Field(
        default=0, ge=0, le=64,
        description="HTTP processes sharing the port; 0 = one per three CPUs, at least one",
    )
    own_url: str | None = Field(
        default=None, description="public URL of this server, written into stamps"
    )

    # Signing key generated on first start.
    key_uid: str = Field(
        default=DEFAULT_UID.format(host="localhost"),
        description="user id of a generated key; default 'stampd Timestamping Service "
        "<stampd@HOST>', HOST the host of own_url, else this machine's host name")
    key_algo: str = Field(default="ed25519", description="gpg --quick-gen-key algorithm")
    extra_keys: str = Field(
        default="", description="more signing keys: openpgp:<algo>,ssh:<type>,..."
    )
    extra_key_workers: int = Field(default=1, ge=1, description="workers for each extra key")
    passphrase_file: Path | None = Field(default=None, description="file with the key's passphrase")
    passphrase: str | None = Field(default=None, repr=False, description="the key's passphrase")

    # RFC 3161 time-stamping (docs/tsa.md).
    tsa: bool = Field(default=True, description="answer RFC 3161 requests on POST / and /tsr")
    tsa_key: str = Field(
        default="openpgp:nistp256",
        description="the key that signs RFC 3161 tokens: openpgp:nistp256|nistp384|rsa3072|"
        "rsa4096 (gpg-agent) or ssh:ecdsa-p256|ecdsa-p384 (ssh-agent); ssh:ecdsa-p256 signs "
        "fastest (docs/tsa.md); the default keeps existing deployments' certificate",
    )
    tsa_policy: str = Field(default=TSA_POLICY, description="policy OID of every token")
    tsa_accuracy: int = Field(
        default=1, ge=0, description="accuracy in tokens, seconds (0: not stated)"
    )
    tsa_allow_sha1: bool = Field(default=False, description="accept SHA-1 message imprints")
    tsa_subject: str | None = Field(
        default=None, description="common name of the generated TSA certificate; "
        "default 'stampd TSA at <public URL>'"
    )
    tsa_cert_days: int = Field(
        default=3650, gt=0, description="validity of the generated TSA certificate, days"
    )
    tsa_require_clock_sync: bool = Field(
        default=False,
        description="refuse RFC 3161 requests while the kernel reports the clock unsynchronised",
    )

    # The C2SP transparency log (docs/transparency-formats.md) and its own signing key.
    tlog: bool = Field(
        default=True,
        description="keep a C2SP transparency log; its Ed25519 key (keys/tlog-ed25519/, "
        "generated on first start) signs its checkpoints and nothing else: on or off",
    )
    tlog_origin: str = Field(
        default="",
        description="the log's origin: the first line of its checkpoints and the name of its "
        "verifier key (no white space, no '+'); default the public URL without its scheme, "
        "then /tlog",
    )

    # Public log.
    commit_interval: float = Field(default=3600.0, gt=0, description="seconds between log commits")

    # How jobs reach workers: "socket" (workers on this host, over data_dir/run/serve.sock)
    # or "database" (several hosts sharing one PostgreSQL; jobs claimed FOR UPDATE SKIP LOCKED).
    dispatch: Literal["socket", "database"] = Field(
        default="socket", description="socket (one host) or database (hosts share PostgreSQL)"
    )
    heartbeat_timeout: float = Field(
        default=10.0, gt=0, description="seconds without a heartbeat before a worker is dead"
    )

    # Peers that cross-stamp our log: "name=URL[#FINGERPRINT],name2=URL2".
    peers: str = Field(default="", description="peer servers that stamp our log")
    peer_timeout: float = Field(default=30.0, gt=0, description="seconds per peer request")
    peer_retry_base: float = Field(default=10.0, gt=0, description="first retry delay, seconds")
    peer_retry_max: float = Field(default=600.0, gt=0, description="longest retry delay")
    peer_stale_after: float = Field(
        default=7200.0, gt=0, description="seconds a head may wait for a peer before /readyz fails"
    )

    # Email timestampers that stamp our log (docs/mail.md, "Outbound: email timestampers").
    mail_stampers: str = Field(
        default="", description="email timestampers that stamp our log: "
        "name=ADDRESS#KEYID[:MODE],... (KEYID the long key id or fingerprint of its OpenPGP "
        "key, the key itself in <data_dir>/mail-stampers/<name>.asc; MODE quote, the default: "
        "it is mailed the request and answers with a clear-signed copy quoting it, or digest: "
        "it is mailed only the request's SHA-256 and answers with a stampd receipt of it)")
    mail_from: str = Field(default="", description="our address, the sender of the requests")
    mail_smtp: str = Field(
        default="", repr=False, description="our SMTP submission server: smtp://USER:PASSWORD"
        "@HOST[:PORT] (port 587 by default; an @ in USER as %40); logged and shown nowhere "
        "with its credentials")
    mail_imap: str = Field(
        default="", repr=False, description="the IMAP mailbox the replies come to: imap://USER:"
        "PASSWORD@HOST[:PORT] (port 143 by default)")
    mail_starttls: bool = Field(
        default=True, description="require STARTTLS on both servers (off: plain text, for a "
        "server on this host only)")
    mail_ca_file: Path | None = Field(
        default=None, description="CA certificates the mail servers' certificates must chain "
        "to; default the system's")
    mail_folder: str = Field(default="INBOX", description="the IMAP folder the replies come to")
    mail_stamper_timeout: float = Field(
        default=60.0, gt=0, description="seconds per SMTP or IMAP step of our mail account")
    mail_stamper_retry_base: float = Field(
        default=60.0, gt=0, description="first retry delay, seconds")
    mail_stamper_retry_max: float = Field(default=3600.0, gt=0, description="longest retry delay")
    mail_stamper_poll_interval: float = Field(
        default=60.0, gt=0, description="seconds between looks at the mailbox where it offers "
        "no IMAP IDLE (and the longest IDLE before it is renewed)")
    mail_stamper_overdue_after: float = Field(
        default=21600.0, gt=0, description="seconds a log head may wait for an email "
        "timestamper's reply before it is shown overdue (never a readiness failure)")

    # Witnesses that cosign the transparency log's checkpoints (docs/witness-log.md).
    witnesses: str = Field(
        default="", description="witnesses the log sends its checkpoints to: URL=VKEY,... "
        "(URL the witness's submission prefix, VKEY its cosignature verifier key); a URL's "
        "user:password@ goes as HTTP basic authentication, published and logged nowhere")
    witness_quorum: int = Field(
        default=0, ge=0, description="cosignatures the published policy (/tlog/policy) asks "
        "for; 0 = a majority of the witnesses")
    witness_timeout: float = Field(default=5.0, gt=0, description="seconds per witness request")
    witness_clock_skew: float = Field(
        default=60.0, gt=0, description="seconds a witness's cosignature time may lie before or "
        "after this server's clock when it comes in; a cosignature dated outside is refused "
        "(its time is an upper bound verifiers rely on)")

    # This server as a witness of other logs (docs/witness.md): its own key, the logs it
    # cosigns for.
    witness: bool = Field(
        default=False, description="be a witness (c2sp.org/tlog-witness): serve POST "
        "/add-checkpoint with a witness key of its own (keys/witness-ed25519/); on whenever "
        "STAMPD_WITNESS_FOR lists a log")
    witness_for: str | None = Field(
        default=None, description="the logs this witness cosigns for: their checkpoint "
        "verifier keys (vkeys, origin+keyid+key), comma-separated; set but naming no log "
        "(empty) is an error")
    witness_name: str = Field(
        default="", description="the witness's name, the name of its cosignature verifier key "
        "(no white space, no '+'); default the public URL without its scheme, then /witness")
    witness_requests_per_client_minute: int = Field(
        default=600, ge=0, description="POST /add-checkpoint requests one client address "
        "(IPv6: its /64) may send this witness per clock minute, all HTTP processes together; "
        "beyond them 429; 0 = no limit")
    witness_retry_base: float = Field(
        default=1.0, gt=0, description="first retry delay after a witness failed, seconds")
    witness_retry_max: float = Field(
        default=30.0, gt=0, description="longest retry delay for a failing witness, seconds")

    # stampd as an email timestamper (docs/mail.md): an SMTP listener of its own, in the
    # first HTTP process, answering each message through a relay with its receipt.
    mail_listen: str = Field(
        default="", description="host:port of stampd's own SMTP listener (inbound mail to "
        "stamp); empty: off. On, the mail key (keys/mail-ed25519/, OpenPGP) signs the replies")
    mail_relay: str = Field(
        default="", description="host:port where the replies are submitted (an MTA that "
        "relays for this host, no authentication); needed with STAMPD_MAIL_LISTEN")
    mail_addresses: str = Field(
        default="", description="the service's own addresses, comma-separated: the only "
        "recipients accepted (no relaying); the first is the replies' From; default the "
        "e-mail of the key's user id")
    mail_max_size: int = Field(
        default=10 << 20, gt=0, description="largest message accepted, bytes (SIZE)")
    mail_max_recipients: int = Field(
        default=3, ge=1, description="recipients of one message (all the service's own)")
    mail_max_attachments: int = Field(
        default=20, ge=0, description="attachments stamped with one message (each one more "
        "receipt); a message with more is refused")
    mail_per_sender_domain_minute: int = Field(
        default=10, ge=0, description="messages answered per clock minute to the addresses "
        "of one sender domain; beyond them 451 (the sender's MTA retries); 0 = no limit")
    mail_per_minute: int = Field(
        default=120, ge=0, description="messages answered per clock minute in all; beyond "
        "them 451; 0 = no limit")
    mail_sessions: int = Field(
        default=50, gt=0, description="SMTP sessions at once; beyond them 421")
    mail_timeout: float = Field(
        default=60.0, gt=0, description="seconds an SMTP session may stay idle (the sender's "
        "time: not while a message is being answered)")
    mail_relay_timeout: float = Field(
        default=30.0, gt=0, description="seconds to hand a reply to the relay")
    mail_authserv_id: str = Field(
        default="", description="answer only messages that the MTA in front marked as "
        "passing: an Authentication-Results header of this authserv-id with spf=pass for the "
        "envelope sender's domain, or dkim=pass or dmarc=pass for it or a domain it lies "
        "under; empty: answer any (docs/mail.md)")

    # Limits and timeouts.
    max_body: int = Field(default=1000, gt=0, description="largest accepted request body, bytes")
    body_timeout: float = Field(default=10.0, gt=0, description="seconds to receive a body")
    # POST /v1/manifests (docs/manifests.md): its body has its own limits. At most 256 MiB,
    # the most a manifest job may carry (formats.frames.MAX_MANIFEST_TEXT).
    max_manifest_bytes: int = Field(
        default=128 << 20, gt=0, le=256 << 20,
        description="largest manifest body (POST /v1/manifests), bytes",
    )
    max_manifest_lines: int = Field(
        default=1_000_000, gt=0, description="most lines in one manifest"
    )
    # Budgets of POST /v1/manifests (docs/manifests.md, "Budgets"); 0 = no limit.
    manifest_bytes_per_client_hour: int = Field(
        default=1 << 30, ge=0,
        description="manifest bytes one client address (IPv6: its /64) may send per clock "
        "hour, all HTTP processes together; beyond them 429; 0 = no limit",
    )
    manifest_bytes_per_hour: int = Field(
        default=8 << 30, ge=0,
        description="manifest bytes this host takes per clock hour from all clients; beyond "
        "them 429; 0 = no limit",
    )
    manifest_bytes_in_flight: int = Field(
        default=256 << 20, ge=0,
        description="manifest bytes being read, signed and answered at once on this host "
        "(all its HTTP processes together; one manifest whatever its size when none is in "
        "flight); beyond them 503; 0 = no limit. "
        "The whole server holds about 4.5 times them above its idle size at its peak: the "
        "default, two maximal manifests, about 0.9 GiB (a 2-core host's within 1.5 GiB)",
    )
    keepalive_timeout: float = Field(
        default=15.0, gt=0, description="seconds an idle connection may stay open"
    )
    # GET /v1/proofs/...?wait= (docs/transparency.md, "Waiting for a proof").
    proof_waiters: int = Field(
        default=2000, gt=0,
        description="proof requests that may wait (?wait=) at once in each HTTP process; "
        "beyond them 503 with Retry-After",
    )
    proof_waiters_per_client: int = Field(
        default=32, gt=0,
        description="proof requests one client address (IPv6: its /64) may have waiting at "
        "once in each HTTP process; beyond them 503 with Retry-After",
    )
    max_queue: int = Field(default=5000, gt=0,
                           description="stamps waiting before 503 (socket dispatch: on the host)")
    sign_timeout: float = Field(default=10.0, gt=0, description="seconds per signing attempt")
    request_timeout: float = Field(
        default=20.0, gt=0, le=25, description="seconds before 503 (stamps must stay fresh)"
    )
    max_attempts: int = Field(default=3, ge=1, description="signing attempts per stamp")
    runtime_dir: Path | None = Field(
        default=None,
        description="where worker homes (key copies) and agent sockets live; "
        "default <data_dir>/run/workers",
    )

    @field_validator("database_url")
    @classmethod
    def _supported_database(cls, v: str | None) -> str | None:
        """A URL of a database stampd supports (`supported_database_url`); ``postgres://``
        and ``postgresql://`` (what libpq and most hosts print) mean the psycopg 3 driver
        stampd ships with."""
        if v is None:
            return v
        v = supported_database_url(v)
        for scheme in ("postgres://", "postgresql://"):
            if v.startswith(scheme):
                return "postgresql+psycopg://" + v[len(scheme):]
        return v

    @field_validator("key_uid")
    @classmethod
    def _uid_is_printable(cls, v: str) -> str:
        if not v or any(not (" " <= c <= "~") for c in v) or "<" not in v or not v.endswith(">"):
            raise ValueError("key_uid must be printable ASCII of the form 'Name <email>'")
        return v

    # The list settings, parsed once (from the strings above) when the settings are built.
    _extra_key_specs: list[KeySpec] = PrivateAttr(default_factory=list)
    _peer_list: list[PeerConfig] = PrivateAttr(default_factory=list)
    _witness_list: list[WitnessConfig] = PrivateAttr(default_factory=list)
    _mail_stamper_list: list[MailStamperConfig] = PrivateAttr(default_factory=list)
    _mail_smtp: MailServer | None = PrivateAttr(default=None)
    _mail_imap: MailServer | None = PrivateAttr(default=None)
    _tsa_spec: KeySpec | None = PrivateAttr(default=None)
    _witnessed: dict[str, list[Ed25519Verifier]] = PrivateAttr(default_factory=dict)
    _mail: MailInbound | None = PrivateAttr(default=None)

    @field_validator("tsa_policy")
    @classmethod
    def _policy_is_an_oid(cls, v: str) -> str:
        if not re.fullmatch(r"[0-2](\.(0|[1-9][0-9]*))+", v):
            raise ValueError("tsa_policy must be a dotted object identifier such as 1.2.3.4")
        return v

    @model_validator(mode="after")
    def _uid_names_this_host(self) -> Settings:
        if "key_uid" not in self.model_fields_set:
            self.key_uid = default_uid(self.own_url)
        return self

    @field_validator("tlog_origin", "witness_name")
    @classmethod
    def _note_key_name(cls, v: str, info: ValidationInfo) -> str:
        if v and not valid_key_name(v):
            raise ValueError(f"{info.field_name} must be a note key name: no white space, no "
                             "'+', no control character")
        return v

    @model_validator(mode="after")
    def _default_tlog_origin(self) -> Settings:
        """The origin of the public URL, where none is set: ``127.0.0.1:8080/tlog`` for
        ``http://127.0.0.1:8080/``."""
        if not self.tlog_origin:
            if "tlog_origin" in self.model_fields_set:
                raise ValueError("STAMPD_TLOG_ORIGIN must not be empty")
            origin = self.public_url.split("://", 1)[-1].rstrip("/") + "/tlog"
            # (Of the listen address, it is checked when listening: a host with white space
            # fails there first, with the message of a bad listen address.)
            if self.tlog and self.own_url and not valid_key_name(origin):
                raise ValueError(f"the log origin of the public URL, {origin!r}, is no note "
                                 "key name (white space or '+'): set STAMPD_TLOG_ORIGIN")
            self.tlog_origin = origin
        return self

    @field_validator("witness_for")
    @classmethod
    def _names_a_log(cls, v: str | None) -> str | None:
        """Set, it names a log: set to nothing (``--witness-for ""``) is a mistake to report,
        never quietly no witness."""
        if v is not None and not any(item.strip() for item in v.split(",")):
            raise ValueError("names no log: give each log's checkpoint verifier key, or "
                             "unset it (STAMPD_WITNESS=on serves a witness of no log yet)")
        return v

    @model_validator(mode="after")
    def _witness_settings(self) -> Settings:
        """The logs witnessed (``witness_for``), which turn the witness on, and the witness's
        name (by default of the public URL, as the log's origin)."""
        self._witnessed = parse_witnessed(self.witness_for or "")
        if self._witnessed:
            self.witness = True
        if not self.witness_name:
            if "witness_name" in self.model_fields_set:
                raise ValueError("STAMPD_WITNESS_NAME must not be empty")
            name = self.public_url.split("://", 1)[-1].rstrip("/") + "/witness"
            if self.witness and self.own_url and not valid_key_name(name):
                raise ValueError(f"the witness name of the public URL, {name!r}, is no note "
                                 "key name (white space or '+'): set STAMPD_WITNESS_NAME")
            self.witness_name = name
        return self

    @model_validator(mode="after")
    def _parse_lists(self) -> Settings:
        self._extra_key_specs = parse_extra_keys(self.extra_keys)
        self._peer_list = parse_peers(self.peers)
        self._witness_list = parse_witnesses(self.witnesses)
        self._mail_stamper_list = parse_mail_stampers(self.mail_stampers)
        self._mail_smtp = parse_mail_server(self.mail_smtp, "smtp")
        self._mail_imap = parse_mail_server(self.mail_imap, "imap")
        if self._mail_stamper_list and not (self._mail_smtp and self._mail_imap
                                            and self.mail_from):
            raise ValueError("STAMPD_MAIL_STAMPERS need our mail account: STAMPD_MAIL_FROM, "
                             "STAMPD_MAIL_SMTP and STAMPD_MAIL_IMAP")
        if self._witness_list and not self.tlog:
            raise ValueError("STAMPD_WITNESSES cosign the transparency log's checkpoints: "
                             "turn it on (STAMPD_TLOG=on) or list no witness")
        if self.witness_quorum > len(self._witness_list):
            raise ValueError(f"STAMPD_WITNESS_QUORUM {self.witness_quorum} is more than the "
                             f"{len(self._witness_list)} witnesses")
        if self.tsa:
            spec = parse_tsa_key(self.tsa_key)
            self._tsa_spec = spec
            if spec not in self._extra_key_specs:  # the TSA key is one more served key
                self._extra_key_specs.append(spec)
        if self.tlog:  # the log key: served, generated and given workers like an extra key
            self._extra_key_specs.append(TLOG_KEY)
        if self.witness:  # the witness key, likewise
            self._extra_key_specs.append(WITNESS_KEY)
        self._mail_settings()
        return self

    def _mail_settings(self) -> None:
        """stampd as an email timestamper: its listener, relay and own addresses; the mail key,
        served and given workers like the log key, when the listener is on."""
        self._mail = parse_mail_inbound(self.mail_listen, self.mail_relay,
                                         self.mail_addresses, self.key_uid)
        if self._mail is not None:
            self._extra_key_specs.append(MAIL_KEY)

    @model_validator(mode="after")
    def _database_dispatch_needs_postgres(self) -> Settings:
        if self.dispatch == "database" and not (self.database_url or "").startswith("postgresql"):
            raise ValueError("STAMPD_DISPATCH=database needs a PostgreSQL STAMPD_DATABASE_URL")
        return self

    @property
    def peer_list(self) -> list[PeerConfig]:
        return list(self._peer_list)

    @property
    def mail_stamper_list(self) -> list[MailStamperConfig]:
        return list(self._mail_stamper_list)

    @property
    def mail_smtp_server(self) -> MailServer | None:
        return self._mail_smtp

    @property
    def mail_imap_server(self) -> MailServer | None:
        return self._mail_imap

    @property
    def mail_stamper_keys(self) -> Path:
        """The email timestampers' public keys, ``<name>.asc``."""
        return self.data_dir / "mail-stampers"

    @property
    def witness_list(self) -> list[WitnessConfig]:
        return list(self._witness_list)

    @property
    def quorum(self) -> int:
        """Cosignatures the published policy asks for: ``witness_quorum``, by default a
        majority of the witnesses (0 without witnesses)."""
        n = len(self._witness_list)
        return self.witness_quorum or (n // 2 + 1 if n else 0)

    @property
    def extra_key_specs(self) -> list[KeySpec]:
        return list(self._extra_key_specs)

    @property
    def tsa_spec(self) -> KeySpec | None:
        """The key that signs RFC 3161 tokens; None when RFC 3161 is off."""
        return self._tsa_spec

    @property
    def tlog_spec(self) -> KeySpec | None:
        """The log key (`TLOG_KEY`, one of `extra_key_specs`); None when the log is off."""
        return TLOG_KEY if self.tlog else None

    @property
    def witness_spec(self) -> KeySpec | None:
        """The witness key (`WITNESS_KEY`, one of `extra_key_specs`); None when no witness."""
        return WITNESS_KEY if self.witness else None

    @property
    def mail_inbound(self) -> MailInbound | None:
        """stampd as an email timestamper: its listener, relay and own addresses; None when
        the listener is off."""
        return self._mail

    @property
    def mail_spec(self) -> KeySpec | None:
        """The mail key (`MAIL_KEY`, one of `extra_key_specs`); None when mail is off."""
        return MAIL_KEY if self._mail is not None else None

    @property
    def witnessed(self) -> dict[str, list[Ed25519Verifier]]:
        """The logs this witness cosigns for: each origin's checkpoint keys."""
        return {origin: list(keys) for origin, keys in self._witnessed.items()}

    @property
    def tsa_common_name(self) -> str:
        return self.tsa_subject or f"stampd TSA at {self.public_url}"

    @property
    def worker_count(self) -> int:
        return self.workers or usable_cpus()

    @property
    def db_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'stampd.sqlite3').resolve()}"

    @property
    def public_url(self) -> str:
        if self.own_url:
            return self.own_url
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/"

    @property
    def keys_dir(self) -> Path:
        return self.data_dir / "keys"

    @property
    def log_repo(self) -> Path:
        return self.data_dir / "log.git"

    @property
    def api_process_count(self) -> int:
        """``api_processes``, or the default: one HTTP process per three CPUs, at least one.
        (An HTTP process spends about a third of a stamp's CPU, its workers and their agents
        the rest, so one HTTP process keeps about two cores' workers busy.)"""
        return self.api_processes or max(1, usable_cpus() // 3)

    @property
    def run_dir(self) -> Path:
        return self.data_dir / "run"

    @property
    def serve_socket(self) -> Path:
        """``stampd serve``'s Unix socket: where its workers connect (socket dispatch), and
        its HTTP processes, when it runs several (its coordinator: `server.coordinator`)."""
        return self.run_dir / "serve.sock"

    @property
    def shared_journal(self) -> bool:
        """Whether ``stampd serve`` keeps one journal for its HTTP processes: several of them
        on one SQLite file. (PostgreSQL takes every process's commits itself.)"""
        return self.api_process_count > 1 and self.db_url.startswith("sqlite")

    @property
    def worker_homes_dir(self) -> Path:
        """Where the workers' private homes go: ``runtime_dir``, by default a private
        directory of the data directory (the supervisor makes it, mode 0700)."""
        return self.runtime_dir or self.run_dir / "workers"

    def read_passphrase(self) -> str | None:
        if self.passphrase_file is not None:
            return self.passphrase_file.read_text().rstrip("\n")
        return self.passphrase


def env_example() -> str:
    """deploy/stampd.env: every setting with its default and description."""
    lines = ["# stampd settings: an environment file for systemd's EnvironmentFile= or",
             "# docker's --env-file. Every setting, with its default; uncomment to change.",
             "# Generated by `python -m server.settings`.", ""]
    for name, field in Settings.model_fields.items():
        default = "" if field.default is None else field.default
        lines += [f"# {field.description}", f"#STAMPD_{name.upper()}={default}", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    print(env_example(), end="")
