"""``stampd audit TARGET [--json] [--peer-keys DIR] [--server URL] [--state FILE] [--no-tlog]``:
audit a log clone or URL, and the server's transparency log, and print the report."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from client.audit.auditor import audit
from client.audit.errors import EmptyLog
from client.audit.report import TLOG_CHECKED, TLOG_FAILED
from client.audit.repository import cloned
from client.audit.state import default_state_file
from client.audit.tlog import TlogOptions


def cmd_audit(args: argparse.Namespace) -> int:
    """``stampd audit TARGET [--json] [--peer-keys DIR] [--server URL] [--state FILE]
    [--no-tlog]``, TARGET a log clone, its URL or the server's: 0 ok, 1 failures, 4 failures
    that show two histories of the transparency log (a fork:
    `client.audit.report.FORK_RULES`); an unreadable target or state file raises an
    `AuditError` (exit status 2), a log with no commit yet `EmptyLog` (3).

    A log with no commit yet (a new server's, for its first STAMPD_COMMIT_INTERVAL) still
    has its transparency log checked: its report is printed, a failure is 1 or 4 as ever, and
    when it passes the status is still 3 (the git log's checks wait for its first commit),
    the line on stderr saying the transparency log passed."""
    target = str(args.target)
    peer_keys = getattr(args, "peer_keys", None)
    tlog = None
    if not getattr(args, "no_tlog", False):
        state = getattr(args, "state", None)
        tlog = TlogOptions(server=getattr(args, "server", None),
                           state=Path(state) if state else default_state_file())
    with cloned(target) as (path, name):
        report = audit(path, Path(peer_keys) if peer_keys else None, target=name, tlog=tlog)
    if report.empty and report.ok and report.tlog.status not in (TLOG_CHECKED, TLOG_FAILED):
        raise EmptyLog(name)  # nothing was checked at all
    if tlog is None:
        report.tlog.warnings.append("--no-tlog")
    if getattr(args, "json", False):
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(report.render())
    if not report.ok:
        return 4 if report.forked else 1
    if report.empty:
        raise EmptyLog(name, f"the transparency log (size {report.tlog.size}) was checked "
                       "meanwhile: ok")
    return 0
