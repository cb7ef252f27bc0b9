"""Pure parts of `stampd audit` (client.audit): the line checks of the log files, which refs of
a clone are audited, and how a failure is written; without servers or git.

Audits of real, cross-stamped logs are in tests/system/test_audit.py.
"""

from __future__ import annotations

import pytest

from client.audit.errors import EmptyLog, TargetError
from client.audit.logfiles import DIGEST_LINE, HASH_LINE, check_lines
from client.audit.report import Failure
from client.audit.repository import AuditedRefs, audited_refs


def test_line_checks() -> None:
    a, b = "a" * 40, "b" * 40
    assert check_lines(f"{a}\n{b}\n".encode(), HASH_LINE, "an id") == []
    assert check_lines(b"", HASH_LINE, "an id") == []
    # SHA-256 repositories' ids (64 digits) sort among the SHA-1 ones; other lengths do not pass.
    c = a + "0" * 24
    assert check_lines(f"{a}\n{c}\n{b}\n".encode(), HASH_LINE, "an id") == []
    assert check_lines(f"{a}\n{c[:50]}\n".encode(), HASH_LINE, "an id") != []
    assert check_lines(f"{a}\n{b}".encode(), HASH_LINE, "an id") == [
        "does not end with a newline"]
    assert check_lines(f"{a.upper()}\n".encode(), HASH_LINE, "an id")[0].startswith(
        "line 1 is not an id")
    assert check_lines(f"{a}\n\n{b}\n".encode(), HASH_LINE, "an id")[0].startswith(
        "line 2 is not an id")
    many = "".join(f"{i:040x}\n" for i in range(20, 0, -1)).encode()
    problems = check_lines(many, HASH_LINE, "an id")
    assert len(problems) == 6 and problems[-1] == "and 14 more problem(s)"
    sha512 = "sha512 " + "f" * 128
    assert check_lines(f"sha256 {'0' * 64}\n{sha512}\n".encode(), DIGEST_LINE, "d") == []
    assert check_lines(f"sha256 {'0' * 63}\n".encode(), DIGEST_LINE, "d") != []
    assert check_lines("é\n".encode(), HASH_LINE, "an id") == ["is not ASCII"]


LOCAL = ["refs/heads/main", "refs/heads/b-timestamps", "refs/heads/c-timestamps",
         "refs/tags/v1"]
ORIGIN = ["refs/remotes/origin/HEAD", "refs/remotes/origin/main",
          "refs/remotes/origin/b-timestamps"]
UP = ["refs/remotes/up/main", "refs/remotes/up/x-timestamps"]


def test_a_bare_mirror_or_the_servers_log_is_audited_at_its_local_refs() -> None:
    assert audited_refs(LOCAL, None) == AuditedRefs(
        "refs/heads/main", {"b": "refs/heads/b-timestamps", "c": "refs/heads/c-timestamps"},
        None)
    # A remote-tracking peer branch without a remote-tracking main does not count.
    assert audited_refs([*LOCAL, "refs/remotes/origin/z-timestamps"], None).main == \
        "refs/heads/main"
    with pytest.raises(TargetError, match="no 'main' branch"):
        audited_refs(["refs/heads/b-timestamps"], None)
    # no branch at all: a log before its first commit (nothing to check yet, exit status 3)
    with pytest.raises(EmptyLog, match=r"^http://x/log\.git: the log has no commit yet") as e:
        audited_refs([], None, "http://x/log.git")
    assert e.value.exit_code == 3


def test_a_clone_is_audited_at_what_its_remote_published() -> None:
    """Remote-tracking refs win over (possibly stale) local branches, and only that remote's
    peer branches are audited."""
    origin = AuditedRefs("refs/remotes/origin/main", {"b": "refs/remotes/origin/b-timestamps"},
                         "origin")
    assert audited_refs([*LOCAL, *ORIGIN], "origin") == origin
    assert audited_refs([*LOCAL, *ORIGIN], None) == origin
    assert audited_refs(ORIGIN, None) == origin  # a clone whose local main was deleted
    # Several remotes: the remote of main's upstream, else origin, else the only one.
    assert audited_refs([*LOCAL, *ORIGIN, *UP], "up") == AuditedRefs(
        "refs/remotes/up/main", {"x": "refs/remotes/up/x-timestamps"}, "up")
    assert audited_refs([*LOCAL, *ORIGIN, *UP], None) == origin
    assert audited_refs([*LOCAL, *ORIGIN, *UP], ".") == origin  # a local upstream
    assert audited_refs([*LOCAL, *ORIGIN, *UP], "gone") == origin  # not fetched
    assert audited_refs([*LOCAL, *UP], None).remote == "up"
    with pytest.raises(TargetError, match="several remotes"):
        audited_refs([*LOCAL, *UP, "refs/remotes/other/main"], None)
    # A remote name with a slash.
    assert audited_refs(["refs/remotes/a/b/main", "refs/remotes/a/b/p-timestamps"],
                        "a/b").peers == {"p": "refs/remotes/a/b/p-timestamps"}


def test_a_failure_names_its_rule_and_commit_first() -> None:
    c = "c" * 40
    assert str(Failure("main", "unsigned", "is not signed", c)) == \
        f"[main/unsigned] {c}: is not signed"
    assert str(Failure("peers", "key-changed", "m", c, "peers/b.asc", "refs/heads/b-timestamps")
               ) == f"[peers/key-changed] {c} refs/heads/b-timestamps peers/b.asc: m"
