"""What a worker process tells its supervisor (`workers.pool`): its exit status, its agent's
PID file and its one-line status file in its home.
"""

from __future__ import annotations

import os
from pathlib import Path

EXIT_CONFIG = 2
EXIT_AGENT_DIED = 3
EXIT_NO_DISPATCHER = 4
EXIT_KEY_UNUSABLE = 5  # the key cannot be loaded, or is not its public key's (see STATUS_FILE)
AGENT_PID_FILE = "agent.pid"
# One line the supervisor reads after the worker exited: READY once the key is loaded, or
# UNUSABLE and the one-line reason why it cannot be.
STATUS_FILE = "status"
READY = "ready"
UNUSABLE = "unusable"


def write_status(home: Path, status: str) -> None:
    """Replace the worker's one-line status in its home (`STATUS_FILE`)."""
    tmp = home / f"{STATUS_FILE}.tmp"
    tmp.write_text(" ".join(status.split()) + "\n")
    os.replace(tmp, home / STATUS_FILE)


def read_status(home: Path) -> str | None:
    """The status a worker left in ``home``; None when it wrote none."""
    try:
        return (home / STATUS_FILE).read_text().strip() or None
    except OSError:
        return None
