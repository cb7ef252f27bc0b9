"""``stampd worker``: the signing worker pool alone, beside a ``stampd serve --no-workers`` or
on a worker host of several."""

from __future__ import annotations

import argparse

from server.commands.checks import check_database, require_migrated, require_programs
from server.commands.datadir import WORKERS_LOCK, DataDirLock, make_data_dir
from server.commands.options import build_settings
from server.commands.registration import adopt_tsa_chain, register_keys, register_tsa_chain
from server.settings import Settings
from server.supervisor import child_env, pool_config


def cmd_worker(args: argparse.Namespace) -> int:
    settings = build_settings(args)
    lock = DataDirLock(settings.run_dir, WORKERS_LOCK, "stampd worker")
    try:
        lock.acquire(create=False)
        require_programs(settings)
        check_database(settings)
        make_data_dir(settings)
        lock.acquire()
        return _work(settings)
    finally:
        lock.release()


def _work(settings: Settings) -> int:
    from server import db
    from workers.pool import WorkerPool

    if settings.dispatch == "database":  # a worker host: API hosts serve what it registers
        engine = db.make_engine(settings.db_url)
        try:
            require_migrated(engine)
            register_keys(settings, engine)
        finally:
            engine.dispose()
    adopt_tsa_chain(settings)
    pool = WorkerPool(pool_config(settings), env=child_env())
    pool.prepare(check_keys=True)  # a key that cannot sign stops the start here, in one line
    register_tsa_chain(settings)
    return pool.run()
