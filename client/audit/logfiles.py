"""The line checks of the log's files: ``hashes.log`` (40- or 64-hex object ids) and
``digests.log`` (``<algorithm> <hex>``), sorted and unique, one entry per newline-terminated
line."""

from __future__ import annotations

import re

HASH_LINE = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")  # SHA-1 or SHA-256 repositories
DIGEST_LINE = re.compile(
    r"sha1 [0-9a-f]{40}|sha256 [0-9a-f]{64}|sha384 [0-9a-f]{96}|sha512 [0-9a-f]{128}")
MAX_LINE_PROBLEMS = 5


def check_lines(data: bytes, pattern: re.Pattern[str], what: str) -> list[str]:
    """Problems of a sorted-unique line file (``hashes.log``, ``digests.log``); [] if none."""
    problems: list[str] = []
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        return ["is not ASCII"]
    if text and not text.endswith("\n"):
        problems.append("does not end with a newline")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    previous: str | None = None
    extra = 0
    for number, line in enumerate(lines, 1):
        problem = None
        if not pattern.fullmatch(line):
            problem = f"line {number} is not {what}: {line[:80]!r}"
        elif previous is not None and line == previous:
            problem = f"line {number} repeats line {number - 1} ({line[:20]}...)"
        elif previous is not None and line < previous:
            problem = f"line {number} is not sorted (it sorts before line {number - 1})"
        if problem:
            if len(problems) < MAX_LINE_PROBLEMS:
                problems.append(problem)
            else:
                extra += 1
        previous = line
    if extra:
        problems.append(f"and {extra} more problem(s)")
    return problems

