"""The post-commit hook's default branch name and its --server check (client.hook), without
git or servers.

The hook itself, against a live stampd, is tested in tests/system/test_hook.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from client.hook import check_server_url, default_branch


def test_default_branch_is_the_one_git_timestamp_makes_up() -> None:
    from git_timestamp.timestamp import timestamp_branch_name  # type: ignore[import-untyped]

    for url in ("http://localhost:8080", "https://gitta.zeitgitter.net",
                "https://stamps.example.org/", "http://127.0.0.1:8080", "https://www.igitt.ch",
                "http://[::1]:8080/"):
        expected = timestamp_branch_name(url.replace("/", ".").split(".")[1:])
        assert default_branch(url) == expected, url
    assert default_branch("http://localhost:8080") == "localhost-8080-timestamps"


def test_a_server_without_a_scheme_is_refused_naming_the_url_meant(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--server localhost:8080`` is not guessed at (it would have become https:// and failed
    on TLS): one line names the URL to give, exit status 2, nothing installed."""
    from stampd import cli

    for given, meant in (("localhost:8080", "http://localhost:8080"),
                         ("127.0.0.1:8080/", "http://127.0.0.1:8080/"),
                         ("stamps.example.org", "https://stamps.example.org")):
        assert cli.main(["hook", "install", "--server", given, "--repo", str(tmp_path)]) == 2
        err = capsys.readouterr().err
        assert err == (f"stampd hook install: --server needs a scheme: give {meant}, not "
                       f"{given!r}\n"), err
    assert not list(tmp_path.iterdir())
    assert check_server_url("http://localhost:8080") == "http://localhost:8080"
