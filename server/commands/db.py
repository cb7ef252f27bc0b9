"""``stampd db``: the database's migrations (upgrade, downgrade, check)."""

from __future__ import annotations

import argparse

from server.commands.datadir import make_data_dir
from server.commands.options import build_settings
from server.errors import CommandFailed


def cmd_db(args: argparse.Namespace) -> int:
    from server import db

    settings = build_settings(args)
    if args.db_command in ("upgrade", "downgrade"):
        known = db.revisions()  # (checked before anything is made: a typo creates nothing)
        if args.revision not in (*known, "head", "base"):
            raise CommandFailed(f"unknown revision {args.revision!r}: this release knows "
                                f"{known[0]} to {known[-1]}, head and base", usage=True)
    make_data_dir(settings)
    engine = db.make_engine(settings.db_url)
    try:
        if args.db_command == "upgrade":
            db.upgrade(engine, args.revision)
        elif args.db_command == "downgrade":
            db.downgrade(engine, args.revision)
        else:
            db.check(engine)
            print("schema matches the models")
    finally:
        engine.dispose()
    return 0
