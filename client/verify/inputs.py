"""What ``stampd verify`` reads from its arguments: a target's bytes (a file, ``-`` for standard
input), the digest of a ``--file``, a ``--digest`` given in hex; and the time format of its
messages and reports.
"""

from __future__ import annotations

import hashlib
import re
import sys
import time
from pathlib import Path

from client.verify.errors import Malformed
from formats.receipts import ALGORITHMS


def normalise_digest(digest: str) -> str:
    value = digest.strip().lower()
    if len(value) not in ALGORITHMS.values() or not re.fullmatch(r"[0-9a-f]+", value):
        raise Malformed("--digest must be 64 (sha256) or 128 (sha512) hex digits")
    return value


def file_digest(path: Path, algorithm: str) -> str:
    try:
        with open(path, "rb") as f:
            return hashlib.file_digest(f, algorithm).hexdigest()
    except OSError as e:
        raise Malformed(f"cannot read {path}: {e.strerror}") from None


def read_target(target: str, limit: int) -> bytes:
    """At most ``limit`` + 1 bytes of a file (``-``: standard input)."""
    try:
        if target == "-":
            return sys.stdin.buffer.read(limit + 1)
        with open(target, "rb") as f:
            return f.read(limit + 1)
    except OSError as e:
        raise Malformed(f"cannot read {target}: {e.strerror}") from None


def iso(t: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))
