"""The post-commit hook's default branch name (client.hook), without git or servers.

The hook itself, against a live stampd, is tested in tests/system/test_hook.py.
"""

from __future__ import annotations

from client.hook import default_branch


def test_default_branch_is_the_one_git_timestamp_makes_up() -> None:
    from git_timestamp.timestamp import timestamp_branch_name  # type: ignore[import-untyped]

    for url in ("http://localhost:8080", "https://gitta.zeitgitter.net",
                "https://stamps.example.org/", "http://127.0.0.1:8080", "https://www.igitt.ch",
                "http://[::1]:8080/"):
        expected = timestamp_branch_name(url.replace("/", ".").split(".")[1:])
        assert default_branch(url) == expected, url
    assert default_branch("http://localhost:8080") == "localhost-8080-timestamps"
