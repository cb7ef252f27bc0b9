"""``stampd stamp``: obtain a stamp from any stampd (or Zeitgitter) server, check the answer, and
only then store it: a git tag or branch stamp of a commit, or one signed manifest of files.

The modules, one concern each: `errors` (exit statuses 1, 2 and 3), `answers` (the checks on a
server's answers), `trust` (the trusted server keys, pinned on first use, and the answer's
signature checked with them), `git` (git plumbing and config), `remote` (the server's URL and the
requests to it), `gitstamp` (``--tag``/``--branch``), `manifest` (``FILE|DIR...``), `command`
(`cmd_stamp`). This package gives the API that tests use.
"""

from __future__ import annotations

from client.stamp.answers import check_branch_answer, check_tag_answer
from client.stamp.errors import AnswerRefused, StampFailed, UsageError
from client.stamp.gitstamp import stamp
from client.stamp.manifest import stamp_files
from client.stamp.trust import pin_name

__all__ = [
    "AnswerRefused",
    "StampFailed",
    "UsageError",
    "check_branch_answer",
    "check_tag_answer",
    "pin_name",
    "stamp",
    "stamp_files",
]
