"""``stampd audit TARGET [--json] [--peer-keys DIR]``: audit a log clone or URL and print the
report."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from client.audit.auditor import audit
from client.audit.repository import local_copy


def cmd_audit(args: argparse.Namespace) -> int:
    """``stampd audit TARGET [--json] [--peer-keys DIR]``: 0 ok, 1 failures; an unreadable
    target raises an `AuditError` (exit status 2), a log with no commit yet `EmptyLog` (3)."""
    target = str(args.target)
    peer_keys = getattr(args, "peer_keys", None)
    with local_copy(target) as path:
        report = audit(path, Path(peer_keys) if peer_keys else None, target=target)
    if getattr(args, "json", False):
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(report.render())
    return 0 if report.ok else 1
