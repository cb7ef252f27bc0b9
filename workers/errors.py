"""The one base of every error the workers layer raises, the base of the agents' errors, and
the TSA's error.

A caller above the workers (the supervisor, the command line) catches `WorkerError` or one of
its kinds, never a list of unrelated classes: `AgentError` covers both agents (gpg-agent:
`workers.agents.gpg.GpgAgentError`, ssh-agent: `workers.agents.ssh.SshAgentError`). Each error
has ``message``, what it says on one line or as raised. The kinds of errors live where they are
raised (`workers.agents.programs.ProgramError`, `workers.config.ConfigError`,
`workers.pool.RuntimeDirError`), but `TsaError`: here so that a worker that is no TSA need not
import `workers.tsa`; they only derive from here. The key store's errors (`keystore`, below the
workers) derive from `keystore.errors.KeysError`.
"""

from __future__ import annotations

__all__ = ["AgentError", "TsaError", "WorkerError"]


class WorkerError(Exception):
    """Base of the workers layer's errors. ``message``: what it says."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class AgentError(WorkerError):
    """An agent (gpg-agent or ssh-agent, or a tool acting on its home) failed: it died, refused
    a request, answered nonsense or did not answer in time. A worker whose agent fails exits,
    and its jobs go to another worker."""


class TsaError(WorkerError, ValueError):
    """A key that cannot be a TSA key, or a certificate chain that does not fit the key
    (`workers.tsa`; here so that a worker that is no TSA need not import that module)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = " ".join(message.split())
