"""``stampd keys`` (the signing keys: show, generate, import, export-public, register) and
``stampd tsa`` (the RFC 3161 key's certificate: csr, import-cert)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from server.commands.checks import require_programs
from server.commands.datadir import make_data_dir
from server.commands.options import build_settings
from server.commands.registration import register_keys, register_tsa_chain
from server.errors import CommandFailed


def export_public(keys_dir: Path, specs: list[Any], target: Path) -> None:
    """Copy the public half of every key in ``keys_dir`` to ``target`` in the key store's own
    layout (``pubkey.asc``, ``<id>/pubkey.asc``, ``<id>/id.pub``), so that ``target`` can be an
    API host's ``keys/``; plus ``allowed_signers`` (SSH keys) for verifiers. No secret key is
    read."""
    import shutil

    from formats.keys import allowed_signers
    from keystore.keyset import SshKeyStore, key_dir, served_keys
    from keystore.store import KeyStore

    keys = served_keys(keys_dir, specs)  # checks every public key parses
    target.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(KeyStore(keys_dir).public_key_file, target / "pubkey.asc")
    for spec in specs:
        src = key_dir(keys_dir, spec)
        public = (KeyStore(src).public_key_file if spec.format == "openpgp"
                  else SshKeyStore(src).public_key_file)
        (target / spec.id).mkdir(exist_ok=True)
        shutil.copyfile(public, target / spec.id / public.name)
    signers = allowed_signers(keys)
    if signers:
        (target / "allowed_signers").write_text(signers)
    print(f"public keys of {len(keys)} signing key(s) written to {target}")


def cmd_keys(args: argparse.Namespace) -> int:
    from keystore.store import KeyStore

    settings = build_settings(args)
    store = KeyStore(settings.keys_dir)
    if args.keys_command in ("generate", "import"):
        make_data_dir(settings)
    if args.keys_command == "generate":
        if store.exists() and not args.force:
            raise CommandFailed(f"a key exists in {store.dir}; use --force to replace it")
        store.generate(settings.key_uid, settings.key_algo, settings.read_passphrase())
    elif args.keys_command == "import":
        store.import_key(args.file, settings.read_passphrase())
    from formats.keys import (
        TLOG_KEY,
        WITNESS_KEY,
        KeySpec,
        allowed_signers,
        tlog_vkey,
        witness_vkey,
    )
    from keystore.keyset import served_keys, stored_key_specs

    # The configured extra keys (and the log key), and any other the data directory holds.
    stored = stored_key_specs(settings.keys_dir)
    specs = settings.extra_key_specs
    specs += [s for s in stored if s not in specs]
    missing: list[KeySpec] = []
    if args.keys_command in ("show", "generate", "import"):
        # A key the server makes at its first start may not be there yet: named, not needed.
        missing = [s for s in specs if s not in stored]
        specs = [s for s in specs if s in stored]
    keys = served_keys(settings.keys_dir, specs)
    if args.keys_command == "export-public":
        export_public(settings.keys_dir, specs, args.dir)
        return 0
    if args.keys_command == "register":
        from server import db

        make_data_dir(settings)
        engine = db.make_engine(settings.db_url)
        try:
            db.upgrade(engine)
            count = register_keys(settings, engine, replace=args.replace)
        finally:
            engine.dispose()
        print(f"registered {count} signing key(s) in the database"
              + (" (replacing every other registration)" if args.replace else ""))
        return 0
    if getattr(args, "ssh", False):
        signers = allowed_signers(keys)
        if not signers:
            raise CommandFailed(f"no SSH key in {settings.keys_dir} "
                               "(set STAMPD_EXTRA_KEYS=ssh:ed25519 and start the server once)")
        print(signers, end="")
        return 0
    key = store.public_key()
    print(f"fingerprint: {key.fingerprint}\nuser id:     {key.uid}\n"
          f"algorithm:   {key.algorithm}\npublic key:  {store.public_key_file}")
    for extra in keys[1:]:
        print(f"\nkey {extra.id}:\n  format:      {extra.format}\n"
              f"  fingerprint: {extra.fingerprint}\n  algorithm:   {extra.algorithm}")
    for extra in keys[1:]:
        if extra.id == TLOG_KEY.id:  # what verifiers of the log's checkpoints are given
            try:
                vkey = tlog_vkey(settings.tlog_origin, extra.public)
            except ValueError as e:
                raise CommandFailed(f"the log key's verifier key: {e}", usage=True) from None
            print(f"\nlog key (tlog): {vkey}")
        if extra.id == WITNESS_KEY.id:  # what the logs witnessed and their verifiers are given
            try:
                vkey = witness_vkey(settings.witness_name, extra.public)
            except ValueError as e:
                raise CommandFailed(f"the witness key's verifier key: {e}", usage=True) from None
            print(f"\nwitness key: {vkey}")
    if missing:
        print("\nnot made yet (the server makes them at its first start): "
              + ", ".join(s.id for s in missing))
    return 0


def cmd_tsa(args: argparse.Namespace) -> int:
    """``stampd tsa csr``: a PKCS #10 request for the TSA key, signed through an agent (PEM on
    stdout); ``stampd tsa import-cert FILE``: install a chain issued for it, after checking it
    is for this key and carries the critical time-stamping EKU (docs/tsa.md)."""
    import tempfile

    from formats.tsp import certificates
    from workers import tsa

    settings = build_settings(args)
    spec = settings.tsa_spec
    if spec is None:
        raise CommandFailed("RFC 3161 is off (STAMPD_TSA=false)", usage=True)
    key_dir = settings.keys_dir / spec.id
    if not tsa.secret_key_file(key_dir, spec.format).exists():
        raise CommandFailed(f"no TSA key in {key_dir}: start `stampd serve` (or `stampd worker`) "
                           "once on this host to generate it")
    pem = b""
    if args.tsa_command == "import-cert":
        try:
            pem = args.file.read_bytes()
        except OSError as e:
            raise CommandFailed(f"cannot read {args.file}: {e.strerror}") from None
    require_programs(settings)
    with tempfile.TemporaryDirectory(prefix="stampd-tsa-") as home, \
            tsa.open_key(key_dir, spec.format, Path(home), settings.read_passphrase()) as key:
        if args.tsa_command == "csr":
            csr = tsa.csr(key, settings.tsa_common_name)
            print(certificates.pem(csr, "CERTIFICATE REQUEST"), end="")
            return 0
        chain = tsa.check_import(key.public_key_info, pem)
    path = tsa.write_chain(key_dir, chain)
    register_tsa_chain(settings, replace=True)
    print(f"installed a chain of {len(chain)} certificate(s) in {path}; restart stampd to "
          "serve it")
    return 0
