"""The server's commands of the ``stampd`` command line (`stampd.cli`): serve, worker, db,
keys, tsa; and the mapping of every error they raise on purpose to an exit status.

- `parser`: the commands' parsers (`add_commands`) and the logging they run with;
- `options`: the settings a command runs with, from the environment and its options;
- `exits`: the exit status and one-line message of each error a command raises on purpose;
- `serve` (``stampd serve``), `worker` (``stampd worker``), `db` (``stampd db``), `keys`
  (``stampd keys`` and ``stampd tsa``): the commands;
- what they share: `checks` (the programs, the database, the address, checked before anything
  is made), `datadir` (the data directory and its locks), `registration` (the keys and the TSA
  chain a host registers in the shared database).
"""

from server.commands.datadir import WORKERS_LOCK, DataDirLock
from server.commands.exits import exit_status
from server.commands.options import build_settings
from server.commands.parser import add_commands, setup_logging
from server.commands.serve import _prepare

__all__ = ["WORKERS_LOCK", "DataDirLock", "_prepare", "add_commands", "build_settings",
           "exit_status", "setup_logging"]
