"""One error-to-exit-code path for every command: one line, a documented code, no traceback."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from client.errors import CommandError
from server.cli import EXIT_FAILED, EXIT_USAGE, exit_status, main
from server.errors import QueueFull
from server.settings import Settings
from workers.keys.store import KeyStoreError


class Malformed(CommandError):
    exit_code = 2
    kind = "malformed"


def test_exit_status_of_each_error_family() -> None:
    with pytest.raises(ValidationError) as bad:
        Settings(key_uid="no email", peers="bad peer")
    code, message = exit_status(bad.value) or (0, "")
    assert code == EXIT_USAGE and "\n" not in message and "STAMPD_KEY_UID" in message
    assert exit_status(Malformed("two\nlines")) == (2, "malformed: two lines")
    assert exit_status(CommandError("plain")) == (EXIT_FAILED, "plain")
    assert exit_status(QueueFull("busy")) == (EXIT_FAILED, "busy")
    assert exit_status(KeyStoreError("no key")) == (EXIT_FAILED, "no key")
    assert exit_status(FileNotFoundError(2, "No such file", "/x")) == (
        EXIT_FAILED, "No such file: /x")
    assert exit_status(ZeroDivisionError()) is None  # a bug keeps its traceback


def test_main_prints_one_line(tmp_path: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
                              ) -> None:
    assert main(["keys", "--data-dir", str(tmp_path), "show"]) == EXIT_FAILED
    err = capsys.readouterr().err
    assert err.startswith("stampd keys: no public key at ") and err.count("\n") == 1
