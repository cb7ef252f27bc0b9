"""``python -m tests.make_keys``: generate every test key of tests.helpers (KEY_TYPES and
EXTRA_KEYS) again with `KeyMaker` and write them to tests/data/keys (``LABEL.sec.asc``,
``LABEL.pub.asc``, ``LABEL.fpr``), where `KeyMaker.get` takes them from."""

from __future__ import annotations

import shutil

from tests.helpers import COMMITTED_KEYS, EXTRA_KEYS, KEY_TYPES, KeyMaker, short_tmpdir
from workers.agents.gpg import GpgAgent


def main() -> None:
    home = short_tmpdir("mk")
    agent = GpgAgent(home)
    agent.start()
    try:
        maker = KeyMaker(home, agent)
        COMMITTED_KEYS.mkdir(exist_ok=True)
        for label in [*KEY_TYPES, *EXTRA_KEYS]:
            key = maker._generate(label)
            shutil.copy(key.secret_file, COMMITTED_KEYS / f"{label}.sec.asc")
            shutil.copy(key.public_file, COMMITTED_KEYS / f"{label}.pub.asc")
            (COMMITTED_KEYS / f"{label}.fpr").write_text(key.fingerprint + "\n")
            print(label, key.fingerprint)
    finally:
        agent.stop()
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
