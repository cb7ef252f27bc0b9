"""Line checks of the audited log files (client.audit), without servers or git.

Audits of real, cross-stamped logs are in tests/system/test_audit.py.
"""

from __future__ import annotations

from client.audit import DIGEST_LINE, HASH_LINE, check_lines


def test_line_checks() -> None:
    a, b = "a" * 40, "b" * 40
    assert check_lines(f"{a}\n{b}\n".encode(), HASH_LINE, "an id") == []
    assert check_lines(b"", HASH_LINE, "an id") == []
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
