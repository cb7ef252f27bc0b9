"""A whole server on the local PostgreSQL (fails loudly if PostgreSQL is missing)."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import create_engine, text

from tests.helpers import Server, logged_hashes, stamp_tag, start_server, wait_for


def test_server_on_postgres(seeded_dir: Path, server_factory: list[Server], pg_url: str) -> None:
    (seeded_dir / "stampd.sqlite3").unlink()  # the seeded journal: none is made on PostgreSQL
    server = start_server(seeded_dir, workers=2, commit_interval=2, database_url=pg_url)
    server_factory.append(server)
    commits = [f"{i:040x}" for i in range(1, 21)]
    for c in commits:
        assert stamp_tag(server, c).startswith(f"object {c}\n")
    engine = create_engine(pg_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(text('select "commit" from stamps')).scalars().all()
        assert set(commits) <= set(rows)
        wait_for(lambda: set(commits) <= logged_hashes(seeded_dir), what="log commit")

        def states() -> set[str]:
            with engine.connect() as conn:
                return set(conn.execute(text("select state from log_commits")).scalars().all())

        # main advances first, then the row is marked committed (`LogCommitter._finish`)
        wait_for(lambda: states() == {"committed"}, what="the log commits marked committed")
    finally:
        engine.dispose()
    assert not (seeded_dir / "stampd.sqlite3").exists()
