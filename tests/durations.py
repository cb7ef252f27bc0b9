"""Write tests/durations.json from the pytest cache of the last whole run: the seconds of each
test that took half a second or more (the order of a fresh clone's first run; see
``committed_durations`` in tests/conftest.py). Run it after a ``make test`` on a quiet machine:
``.venv/bin/python tests/durations.py``."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".pytest_cache" / "v" / "stampd" / "durations"
TARGET = Path(__file__).with_name("durations.json")


def main() -> int:
    durations = json.loads(CACHE.read_text())
    slow = {k: round(v, 1) for k, v in sorted(durations.items()) if v >= 0.5}
    TARGET.write_text(json.dumps(slow, indent=0, sort_keys=True) + "\n")
    print(f"{len(slow)} of {len(durations)} tests written to {TARGET}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
