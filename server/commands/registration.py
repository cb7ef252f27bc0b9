"""What a host that signs registers in the shared database (several hosts): the public halves of
its keys, and its TSA certificate chain (which a worker host without one adopts)."""

from __future__ import annotations

import logging
from typing import Any

from server.errors import CommandFailed
from server.settings import Settings

log = logging.getLogger("stampd")


def register_keys(settings: Settings, engine: Any, replace: bool = False) -> int:
    """Register the public halves of the keys this host signs with (`server.signing_keys`);
    returns how many."""
    from keystore.keyset import served_keys
    from server.signing_keys import register, this_host

    keys = served_keys(settings.keys_dir, settings.extra_key_specs)
    register(engine, settings.keys_dir, keys, this_host(settings.data_dir), replace=replace)
    return len(keys)


def adopt_tsa_chain(settings: Settings) -> None:
    """With several hosts, a worker host whose TSA key has no certificate chain yet takes the
    one registered in the database (by the host that made it), so that every host's tokens
    name the same certificate; the worker supervisor checks it is for this key."""
    spec = settings.tsa_spec
    if settings.dispatch != "database" or spec is None:
        return
    from formats.tsp.certificates import parse_chain
    from formats.tsp.errors import TspError
    from keystore.keyset import TSA_CHAIN_FILE
    from server import db
    from server.signing_keys import registered_certificates
    from workers.tsa import write_chain

    chain = settings.keys_dir / spec.id / TSA_CHAIN_FILE
    if chain.exists() or not chain.parent.is_dir():
        return
    engine = db.make_engine(settings.db_url)
    try:
        registered = registered_certificates(engine, spec.id)
    finally:
        engine.dispose()
    if registered:
        try:
            certificates = parse_chain(registered.encode())
        except TspError as e:
            raise CommandFailed(f"the TSA certificate chain registered for key {spec.id} "
                                f"cannot be read: {e}") from None
        write_chain(chain.parent, certificates)
        log.info("took the registered TSA certificate chain of key %s into %s", spec.id, chain)


def register_tsa_chain(settings: Settings, replace: bool = False) -> None:
    """With several hosts, the TSA certificate chain the worker supervisor made (or found) is
    registered with the TSA key, so that API hosts without key files serve it."""
    spec = settings.tsa_spec
    if settings.dispatch != "database" or spec is None:
        return
    from keystore.keyset import TSA_CHAIN_FILE
    from server import db
    from server.signing_keys import register_certificates

    chain = settings.keys_dir / spec.id / TSA_CHAIN_FILE
    if not chain.exists():  # (the supervisor's key check makes it; the server says it lacks)
        return
    engine = db.make_engine(settings.db_url)
    try:
        register_certificates(engine, spec.id, chain.read_text(), replace=replace)
    finally:
        engine.dispose()
