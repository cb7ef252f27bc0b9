"""The checkpoints `stampd audit` has seen, kept between runs: per log origin, the log's verifier
key and the signed checkpoints (verbatim notes) that the next audit must find its tree
consistent with.

The file is JSON, ``$XDG_STATE_HOME/stampd/tlog-checkpoints.json`` (``~/.local/state/...``
without XDG_STATE_HOME), or the path given with ``--state``::

    {"version": 1, "logs": {"<origin>": {"vkey": "<vkey>", "checkpoints": ["<note>", ...]}}}

Written atomically (a temporary file renamed over it). What an audit keeps for an origin:
today's checkpoint, and every stored one that it could not show to be a prefix of today's tree
(inconsistent ones, the evidence of a split view, stay until the user removes them; larger
ones, from a host that was ahead). A stored checkpoint shown consistent is implied by today's,
which is kept, so dropping it loses nothing.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from client.audit.errors import AuditError

STATE_NAME = "tlog-checkpoints.json"
VERSION = 1


class StateError(AuditError):
    """The state file cannot be read or written (exit status 2)."""


def default_state_file() -> Path:
    """``$XDG_STATE_HOME/stampd/tlog-checkpoints.json``, else ``~/.local/state/stampd/...``."""
    base = os.environ.get("XDG_STATE_HOME") or ""
    root = Path(base) if os.path.isabs(base) else Path.home() / ".local" / "state"
    return root / "stampd" / STATE_NAME


@dataclass
class SeenLog:
    vkey: str
    checkpoints: list[str] = field(default_factory=list)


@dataclass
class SeenCheckpoints:
    """The state file's contents; `load` it, change ``logs``, `save` it."""

    path: Path
    logs: dict[str, SeenLog] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path) -> SeenCheckpoints:
        """The state at ``path`` (empty if there is no file yet); `StateError` if unreadable."""
        try:
            raw = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return cls(path)
        except OSError as e:
            raise StateError(f"cannot read the audit state {path}: {e.strerror}") from None
        try:
            data = json.loads(raw)
            if not isinstance(data, dict) or data.get("version") != VERSION:
                raise ValueError(f"not version {VERSION}")
            logs = {}
            for origin, log in data["logs"].items():
                cps = log["checkpoints"]
                if not (isinstance(origin, str) and isinstance(log["vkey"], str)
                        and isinstance(cps, list) and all(isinstance(c, str) for c in cps)):
                    raise ValueError(f"bad record for {origin!r}")
                logs[origin] = SeenLog(log["vkey"], list(cps))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise StateError(f"the audit state {path} is not a stampd audit state file "
                             f"({e}); move it away to start afresh") from None
        return cls(path, logs)

    def save(self) -> None:
        """Write the state atomically (creating its directory)."""
        data = {"version": VERSION,
                "logs": {o: {"vkey": s.vkey, "checkpoints": s.checkpoints}
                         for o, s in sorted(self.logs.items())}}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".tlog-checkpoints-", dir=self.path.parent)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    json.dump(data, f, indent=1)
                    f.write("\n")
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, self.path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        except OSError as e:
            raise StateError(f"cannot write the audit state {self.path}: {e.strerror}") from None
