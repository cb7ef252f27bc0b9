"""The configuration of the worker processes, handed to them explicitly.

The service builds a `PoolConfig` from its settings and writes it, as one JSON document, to the
stdin of ``python -m workers.pool`` (a pipe it closes after writing); the supervisor derives a
`WorkerConfig` for each of its workers and hands it over the same way to
``python -m workers.worker``. Neither process reads the service's settings or ``STAMPD_*``
environment variables. The configuration holds secrets (the key's passphrase, the database DSN
with its password): a pipe keeps them out of every command line and environment, and the
dataclasses leave them out of their ``repr``. Never log a configuration's JSON.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

from formats.keys import MAIL, PRIMARY, TLOG, WITNESS, KeySpec
from keystore.keyset import key_dir
from workers.errors import WorkerError

DispatchMode = Literal["socket", "database"]
KeyFormat = Literal["openpgp", "ssh"]
LOG_LEVELS = ("CRITICAL", "ERROR", "WARNING", "INFO", "DEBUG")


class ConfigError(WorkerError, ValueError):
    """A configuration document that is not what this module writes. (Its message never
    quotes a value: values may be secret.)"""


@dataclass(frozen=True)
class DispatchConfig:
    """How a worker gets its jobs: from the host's dispatcher, in ``stampd serve``, over its
    Unix socket (``socket``), or from the ``jobs`` table of a PostgreSQL database shared by
    several hosts (``database``)."""

    mode: DispatchMode
    socket: Path | None = None  # socket: the dispatcher's Unix socket
    dsn: str | None = field(default=None, repr=False)  # database: libpq DSN (may hold a password)

    def __post_init__(self) -> None:
        if self.mode not in ("socket", "database"):
            raise ConfigError("dispatch mode must be 'socket' or 'database'")
        if self.mode == "socket" and self.socket is None:
            raise ConfigError("socket dispatch needs the socket's path")
        if self.mode == "database" and not self.dsn:
            raise ConfigError("database dispatch needs a DSN")

    def to_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "socket": None if self.socket is None else str(self.socket),
                "dsn": self.dsn}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DispatchConfig:
        mode = _str(d, "mode")
        if mode not in ("socket", "database"):
            raise ConfigError("dispatch mode must be 'socket' or 'database'")
        path = _opt_str(d, "socket")
        return cls(cast(DispatchMode, mode), None if path is None else Path(path),
                   _opt_str(d, "dsn"))


@dataclass(frozen=True)
class WorkerConfig:
    """Everything one signing worker needs: who it is, which key it serves and from where,
    how it gets jobs."""

    name: str  # unique among the workers sharing a dispatcher: "<host>:<supervisor pid>:<n>"
    home: Path  # private 0700 directory for the agent (GNUPGHOME)
    key_dir: Path  # the key store directory of the key it serves
    dispatch: DispatchConfig
    key_id: str = PRIMARY
    format: KeyFormat = "openpgp"
    passphrase: str | None = field(default=None, repr=False)  # of an OpenPGP key
    log_level: str = "INFO"
    # The supervisor's PID: the worker is orphaned once its parent is another (None: the
    # parent it finds when it starts, which may already be another).
    supervisor: int | None = None
    # Set for the TSA key only (RFC 3161, `workers.tsa`): the common name of the self-signed
    # TSA certificate the start-up check makes when the key has none, and its validity (days).
    tsa_subject: str | None = None
    tsa_days: int = 3650
    # The role of a key of one purpose of its own (`formats.keys.TLOG`: the log key, which signs
    # checkpoint notes only); None for the primary and the extra keys.
    role: str | None = None

    def __post_init__(self) -> None:
        if self.format not in ("openpgp", "ssh"):
            raise ConfigError("key format must be 'openpgp' or 'ssh'")
        _check_role(self.role, self.format)
        _check_tsa_days(self.tsa_days)
        _check_log_level(self.log_level)

    def to_json(self) -> str:
        return json.dumps({
            "name": self.name, "home": str(self.home), "key_dir": str(self.key_dir),
            "dispatch": self.dispatch.to_dict(), "key_id": self.key_id, "format": self.format,
            "passphrase": self.passphrase, "log_level": self.log_level,
            "supervisor": self.supervisor, "tsa_subject": self.tsa_subject,
            "tsa_days": self.tsa_days, "role": self.role,
        })

    @classmethod
    def from_json(cls, text: str | bytes) -> WorkerConfig:
        d = _load(text)
        fmt = _str(d, "format")
        if fmt not in ("openpgp", "ssh"):
            raise ConfigError("key format must be 'openpgp' or 'ssh'")
        return cls(name=_str(d, "name"), home=Path(_str(d, "home")),
                   key_dir=Path(_str(d, "key_dir")),
                   dispatch=DispatchConfig.from_dict(_dict(d, "dispatch")),
                   key_id=_str(d, "key_id"), format=cast(KeyFormat, fmt),
                   passphrase=_opt_str(d, "passphrase"), log_level=_str(d, "log_level"),
                   supervisor=None if d.get("supervisor") is None else _int(d, "supervisor"),
                   tsa_subject=_opt_str(d, "tsa_subject"), tsa_days=_int(d, "tsa_days"),
                   role=_opt_str(d, "role"))


@dataclass(frozen=True)
class PoolConfig:
    """Everything the supervisor needs: how many workers of which keys, where their homes go,
    and what each worker is told (`worker_config`). ``extra_keys`` also holds the keys of a
    role of their own (`formats.keys.TLOG_KEY`): their workers are started like an extra key's."""

    workers: int  # workers of the primary key
    keys_dir: Path  # the key store: the primary key, extra keys in subdirectories
    runtime_dir: Path  # where the workers' private homes are made (workers.pool makes it)
    dispatch: DispatchConfig
    extra_keys: tuple[KeySpec, ...] = ()
    extra_key_workers: int = 1  # workers of each extra key
    passphrase: str | None = field(default=None, repr=False)  # of the OpenPGP keys
    log_level: str = "INFO"
    # RFC 3161: the extra key that is the TSA key (one of ``extra_keys``), the common
    # name of its self-signed certificate and that certificate's validity in days; its workers
    # get them in their `WorkerConfig` (``tsa_subject``, ``tsa_days``).
    tsa_key: KeySpec | None = None
    tsa_subject: str | None = None
    tsa_days: int = 3650

    def __post_init__(self) -> None:
        if self.workers < 1 or self.extra_key_workers < 1:
            raise ConfigError("worker counts must be at least 1")
        for spec in self.extra_keys:
            if spec.format not in ("openpgp", "ssh"):
                raise ConfigError("key format must be 'openpgp' or 'ssh'")
            _check_role(spec.role, spec.format)
        if self.tsa_key is not None:
            if self.tsa_key not in self.extra_keys:
                raise ConfigError("the TSA key must be one of the extra keys")
            if not self.tsa_subject:
                raise ConfigError("the TSA key needs the subject of its certificate")
        _check_tsa_days(self.tsa_days)
        _check_log_level(self.log_level)

    def worker_config(self, name: str, home: Path, key: KeySpec | None = None,
                      supervisor: int | None = None) -> WorkerConfig:
        """The configuration of worker ``name`` with home ``home``, serving the extra key
        ``key`` (None: the primary key), started by the supervisor with PID ``supervisor``."""
        if key is None:
            return WorkerConfig(name, home, self.keys_dir, self.dispatch,
                                passphrase=self.passphrase, log_level=self.log_level,
                                supervisor=supervisor)
        tsa = key == self.tsa_key
        return WorkerConfig(name, home, key_dir(self.keys_dir, key), self.dispatch, key_id=key.id,
                            format=cast(KeyFormat, key.format),
                            passphrase=self.passphrase if key.format == "openpgp" else None,
                            log_level=self.log_level, supervisor=supervisor,
                            tsa_subject=self.tsa_subject if tsa else None,
                            tsa_days=self.tsa_days, role=key.role)

    def to_json(self) -> str:
        return json.dumps({
            "workers": self.workers, "keys_dir": str(self.keys_dir),
            "runtime_dir": str(self.runtime_dir), "dispatch": self.dispatch.to_dict(),
            "extra_keys": [{"format": k.format, "algo": k.algo, "role": k.role}
                           for k in self.extra_keys],
            "extra_key_workers": self.extra_key_workers, "passphrase": self.passphrase,
            "log_level": self.log_level,
            "tsa_key": None if self.tsa_key is None else {"format": self.tsa_key.format,
                                                          "algo": self.tsa_key.algo},
            "tsa_subject": self.tsa_subject, "tsa_days": self.tsa_days,
        })

    @classmethod
    def from_json(cls, text: str | bytes) -> PoolConfig:
        d = _load(text)
        extra = d.get("extra_keys")
        if not isinstance(extra, list) or not all(isinstance(k, dict) for k in extra):
            raise ConfigError("field 'extra_keys' must be a list of objects")
        tsa = None if d.get("tsa_key") is None else _dict(d, "tsa_key")
        return cls(workers=_int(d, "workers"), keys_dir=Path(_str(d, "keys_dir")),
                   runtime_dir=Path(_str(d, "runtime_dir")),
                   dispatch=DispatchConfig.from_dict(_dict(d, "dispatch")),
                   extra_keys=tuple(KeySpec(_str(k, "format"), _str(k, "algo"),
                                            _opt_str(k, "role")) for k in extra),
                   extra_key_workers=_int(d, "extra_key_workers"),
                   passphrase=_opt_str(d, "passphrase"), log_level=_str(d, "log_level"),
                   tsa_key=None if tsa is None else KeySpec(_str(tsa, "format"),
                                                            _str(tsa, "algo")),
                   tsa_subject=_opt_str(d, "tsa_subject"), tsa_days=_int(d, "tsa_days"))


# -- decoding ----------------------------------------------------------------------------------

def _load(text: str | bytes) -> dict[str, Any]:
    try:
        d = json.loads(text)
    except ValueError:  # (JSONDecodeError quotes the document: it may hold secrets)
        raise ConfigError("the configuration is not JSON") from None
    if not isinstance(d, dict):
        raise ConfigError("the configuration must be a JSON object")
    return d


def _check_role(role: str | None, fmt: str) -> None:
    """The roles a key may have: the log key's (`TLOG`) or the witness key's (`WITNESS`), each
    an ssh-agent key, or the mail key's (`MAIL`), a gpg-agent key."""
    if role is not None and not ((role in (TLOG, WITNESS) and fmt == "ssh")
                                 or (role == MAIL and fmt == "openpgp")):
        raise ConfigError("a key's role must be 'tlog' or 'witness' (an SSH key), 'mail' (an "
                          "OpenPGP key) or none")


def _check_tsa_days(days: int) -> None:
    if days < 1:
        raise ConfigError("a TSA certificate is valid for at least one day")


def _check_log_level(level: str) -> None:
    if level not in LOG_LEVELS:
        raise ConfigError(f"log level must be one of {', '.join(LOG_LEVELS)}")


def _str(d: dict[str, Any], name: str) -> str:
    value = d.get(name)
    if not isinstance(value, str):
        raise ConfigError(f"field {name!r} must be a string")
    return value


def _opt_str(d: dict[str, Any], name: str) -> str | None:
    return None if d.get(name) is None else _str(d, name)


def _int(d: dict[str, Any], name: str) -> int:
    value = d.get(name)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ConfigError(f"field {name!r} must be an integer")
    return value


def _dict(d: dict[str, Any], name: str) -> dict[str, Any]:
    value = d.get(name)
    if not isinstance(value, dict):
        raise ConfigError(f"field {name!r} must be an object")
    return value
