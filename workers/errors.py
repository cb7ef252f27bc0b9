"""The one base of every error the workers layer raises, and the base of the agents' errors.

A caller above the workers (the supervisor, the command line) catches `WorkerError` or one of
its kinds, never a list of unrelated classes: `AgentError` covers both agents (gpg-agent:
`workers.agents.gpg.GpgAgentError`, ssh-agent: `workers.agents.ssh.SshAgentError`). Each error
has ``message``, what it says on one line or as raised. The kinds of errors live where they are
raised (`workers.keys.store.KeyStoreError`, `workers.keys.keyset.KeyUnusable` and `TsaError`,
`workers.agents.programs.ProgramError`, `workers.keys.gnupg.GpgError`,
`workers.config.ConfigError`, `workers.pool.RuntimeDirError`); they only derive from here.
"""

from __future__ import annotations

__all__ = ["AgentError", "WorkerError"]


class WorkerError(Exception):
    """Base of the workers layer's errors. ``message``: what it says."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class AgentError(WorkerError):
    """An agent (gpg-agent or ssh-agent, or a tool acting on its home) failed: it died, refused
    a request, answered nonsense or did not answer in time. A worker whose agent fails exits,
    and its jobs go to another worker."""
