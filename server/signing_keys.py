"""Which keys a server serves, agreed through the database.

A host that signs (``stampd serve`` with workers, ``stampd worker``) registers the public half
of every key it holds in the ``signing_keys`` table at start. An API host of the several-hosts
setup (``stampd serve --no-workers`` with ``STAMPD_DISPATCH=database``) needs no key files at
all: it serves exactly the registered keys. Wherever key files and the registry both exist they
must agree, key by key (same fingerprint for the same key id); a host whose files disagree
refuses to start, saying which key and which host registered the other one. The registry
changes only when a key is first registered, or on purpose with ``stampd keys register
--replace``.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

from sqlalchemy import Connection, Engine, delete, select
from sqlalchemy import update as sa_update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from formats.keys import PRIMARY, KeySpec, ServedKey, spec_of
from keystore.keyset import SshKeyStore, key_dir, served_keys
from keystore.store import KeyStore
from server import db
from server.errors import KeyRegistryError
from server.models import SigningKey

REPLACE_HINT = ("if the key was replaced on purpose, run `stampd keys register --replace` on "
                "the host holding the new key")


def this_host(data_dir: Path) -> str:
    """How a registration names its host: host name and data directory."""
    return f"{socket.gethostname()}:{data_dir.resolve()}"[:255]


def _spec_public_file(keys_dir: Path, spec: KeySpec) -> Path:
    """Where ``keys_dir`` keeps the public half of the extra key ``spec``."""
    store = KeyStore if spec.format == "openpgp" else SshKeyStore
    return store(key_dir(keys_dir, spec)).public_key_file


def public_file(keys_dir: Path, key: ServedKey) -> Path:
    """The file of ``keys_dir`` that holds ``key``'s public half."""
    if key.id == PRIMARY:
        return KeyStore(keys_dir).public_key_file
    return _spec_public_file(keys_dir, spec_of(key.id))


def local_keys(keys_dir: Path, specs: list[KeySpec]) -> list[ServedKey]:
    """The keys of ``specs`` whose public halves ``keys_dir`` holds, the primary first; empty
    when it holds no primary key (an API host that takes its keys from the database)."""
    if not KeyStore(keys_dir).public_key_file.exists():
        return []
    return served_keys(keys_dir, [s for s in specs if _spec_public_file(keys_dir, s).exists()])


def _key(row: SigningKey) -> ServedKey:
    return ServedKey(row.id, row.format, row.fingerprint, row.algorithm, row.public, row.uid,
                     primary=row.is_primary)


def _registrations(engine: Engine) -> list[tuple[ServedKey, str]]:
    """Every registered key with the host that registered it, the primary first."""
    with Session(engine) as s:
        rows = s.scalars(select(SigningKey).order_by(SigningKey.is_primary.desc(),
                                                     SigningKey.id)).all()
        return [(_key(r), r.host) for r in rows]


def registered(engine: Engine) -> list[ServedKey]:
    """Every registered key, the primary first."""
    return [key for key, _ in _registrations(engine)]


def _disagreement(keys_dir: Path, mine: ServedKey, theirs: ServedKey, host: str) -> str:
    return (f"key {mine.id} in {public_file(keys_dir, mine)} has fingerprint "
            f"{mine.fingerprint}, but the database has {theirs.fingerprint} for it "
            f"(registered by {host}): every host must hold the same keys; {REPLACE_HINT}")


def check_agree(keys_dir: Path, mine: list[ServedKey], theirs: list[ServedKey],
                hosts: dict[str, str] | None = None) -> None:
    """Raise `KeyRegistryError` for the first of ``mine`` that the registry ``theirs`` holds
    with another fingerprint, or does not hold at all."""
    by_id = {k.id: k for k in theirs}
    for key in mine:
        other = by_id.get(key.id)
        if other is None:
            raise KeyRegistryError(
                f"key {key.id} in {public_file(keys_dir, key)} is not registered in the "
                "database: no host that signs serves it (start the worker host holding it, "
                f"or remove the file); {REPLACE_HINT}")
        if other.fingerprint != key.fingerprint:
            raise KeyRegistryError(_disagreement(keys_dir, key, other,
                                                 (hosts or {}).get(key.id, "another host")))


def register(engine: Engine, keys_dir: Path, keys: list[ServedKey], host: str,
             replace: bool = False) -> None:
    """Record ``keys`` as served by ``host``. A key already registered with another fingerprint
    is a `KeyRegistryError` naming both, unless ``replace``: then ``keys`` become the whole
    registry (keys of other ids are dropped)."""
    now = int(time.time())
    for _ in range(3):  # two hosts registering the same new key at once: one insert loses
        try:
            with Session(engine) as s, s.begin():
                rows = {r.id: r for r in s.scalars(select(SigningKey)).all()}
                if replace:
                    s.execute(delete(SigningKey))
                    s.flush()
                    rows = {}
                for key in keys:
                    row = rows.get(key.id)
                    if row is not None and row.fingerprint != key.fingerprint:
                        raise KeyRegistryError(_disagreement(keys_dir, key, _key(row), row.host))
                    if row is None:
                        s.add(SigningKey(id=key.id, format=key.format,
                                         fingerprint=key.fingerprint, algorithm=key.algorithm,
                                         public=key.public, uid=key.uid,
                                         is_primary=key.primary, host=host, registered_at=now))
            return
        except IntegrityError:
            continue
    raise KeyRegistryError("could not register the signing keys: other hosts kept "
                           "registering at the same time; start this host again")


def serving_keys(keys_dir: Path, specs: list[KeySpec], dispatch: str,
                 engine: Engine) -> list[ServedKey]:
    """The keys this server serves (the primary first). Key files of this host must agree with
    the registered keys, if any. With workers on this host (socket dispatch) it serves its
    key files' keys (it registered them at start). Otherwise (an API host) it serves the
    registered keys, which must include every extra key ``specs`` names; or, while none is
    registered, its own public key files."""
    mine = local_keys(keys_dir, specs)
    registrations = _registrations(engine)
    theirs = [key for key, _ in registrations]
    hosts = {key.id: host for key, host in registrations}
    if theirs:
        check_agree(keys_dir, mine, theirs, hosts)
    if mine and (dispatch == "socket" or not theirs):
        return mine
    if not theirs:
        raise KeyRegistryError(
            f"no signing keys: {keys_dir} holds none and no host that signs has registered its "
            "keys in the database yet; start a worker host (`stampd worker`) first, or copy "
            "the public keys here (`stampd keys export-public`)")
    ids = {k.id for k in theirs}
    for spec in specs:
        if spec.id not in ids:
            named = ("STAMPD_TLOG=on needs the log key" if spec.role is not None
                     else f"STAMPD_EXTRA_KEYS names {spec.format}:{spec.algo}")
            raise KeyRegistryError(f"{named}, but no host that signs has registered that key "
                                   "in the database")
    return theirs


def register_certificates(engine: Engine, key_id: str, chain_pem: str, *,
                          replace: bool = False) -> None:
    """Record the certificate chain of the registered key ``key_id`` (the TSA key) as this
    host has it. Another chain already registered is a `KeyRegistryError` unless ``replace``
    (`stampd tsa import-cert` makes the imported chain everyone's); so is a key that is not
    registered."""
    def update_row(conn: Connection) -> None:
        row = conn.execute(select(SigningKey.certificates).where(SigningKey.id == key_id)
                           .with_for_update()).first()
        if row is None:
            raise KeyRegistryError(f"key {key_id} is not registered: its certificate chain "
                                   "cannot be")
        if row[0] and row[0] != chain_pem and not replace:
            raise KeyRegistryError(
                f"the TSA certificate chain of key {key_id} on this host differs from the one "
                "another host registered: remove this host's tsa-chain.pem to take the "
                "registered one, or run `stampd tsa import-cert FILE` to make FILE everyone's")
        conn.execute(sa_update(SigningKey).where(SigningKey.id == key_id)
                     .values(certificates=chain_pem))

    db.run_transaction(engine, update_row, what="register a certificate chain")


def registered_certificates(engine: Engine, key_id: str) -> str | None:
    """The certificate chain registered for key ``key_id``, if any."""
    with engine.connect() as conn:
        return conn.execute(select(SigningKey.certificates)
                            .where(SigningKey.id == key_id)).scalar_one_or_none()
