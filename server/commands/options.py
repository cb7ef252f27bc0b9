"""The settings a server command runs with: the environment's, overridden by the options it
was given; a bad value in one line that names where it came from."""

from __future__ import annotations

import argparse
from collections.abc import Collection
from typing import Any

from pydantic import ValidationError

from server.errors import CommandFailed
from server.settings import Settings


def build_settings(args: argparse.Namespace) -> Settings:
    """The settings: the environment's, overridden by the options given. A bad value fails
    in one line naming where it came from: the option (``--workers``) when one was given,
    else the variable (``STAMPD_WORKERS``)."""
    overrides: dict[str, Any] = {}
    for name in ("host", "port", "data_dir", "workers", "api_processes", "database_url",
                 "commit_interval", "own_url", "key_uid", "key_algo", "peers"):
        value = getattr(args, name, None)
        if value is not None:
            overrides[name] = value
    if getattr(args, "witness", None):  # (--witness, repeatable: the list STAMPD_WITNESSES)
        overrides["witnesses"] = ",".join(args.witness)
    if getattr(args, "witness_for", None):  # (--witness-for: STAMPD_WITNESS_FOR, overridden)
        given = [v.strip() for v in args.witness_for]
        # (an empty one is refused as the setting would be, not dropped by the join)
        overrides["witness_for"] = ",".join(given) if all(given) else ""
    try:
        return Settings(**overrides)
    except ValidationError as e:
        raise CommandFailed(invalid_settings(e, given=set(overrides)), usage=True) from None


# settings whose option is not named as they are
_OPTIONS = {"witnesses": "--witness", "witness_for": "--witness-for"}


def invalid_settings(exc: ValidationError, given: Collection[str] = ()) -> str:
    """The one-line message of a pydantic ``ValidationError`` of `Settings`: each problem
    with the option that set it (names in ``given``) or else its environment variable."""
    problems = []
    for e in exc.errors():
        where = ""
        if e["loc"]:
            name = str(e["loc"][0])
            where = (_OPTIONS.get(name, f"--{name.replace('_', '-')}") if name in given
                     else f"STAMPD_{name.upper()}") + ": "
        msg = str(e["msg"]).removeprefix("Value error, ")
        problems.append(where + msg)
    return one_line("invalid setting: " + "; ".join(problems))


def one_line(text: str) -> str:
    return " ".join(text.split())
