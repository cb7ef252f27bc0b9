"""``stampd verify``: digest receipts, signed manifests, RFC 3161 tokens and git stamps, checked
with the real gpg, git and ssh-keygen; one module per kind of target (`receipt`, `manifest`,
`token`, `gitstamp`), the keys they check with (`keys`; `trust`: those pinned in the repository,
else fetched), the errors (`errors`), and the command (`command`).

Importing this package is cheap: `cmd_verify` is imported from `client.verify.command` only
when it is asked for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from client.verify.command import cmd_verify

__all__ = ["cmd_verify"]


def __getattr__(name: str) -> Any:
    if name == "cmd_verify":
        from client.verify.command import cmd_verify

        return cmd_verify
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
