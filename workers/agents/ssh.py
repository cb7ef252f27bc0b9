"""A private ssh-agent per worker, and a persistent connection that signs with it.

The SSH counterpart of :mod:`workers.agents.gpg`: every signing worker that serves an SSH key runs
its own ssh-agent in its own 0700 home. :class:`SshAgent` starts one, loads the secret key from
a read-only key file and stops it again by PID; :class:`SshAgentConnection` keeps one Unix
socket open and speaks the agent protocol (OpenSSH ``PROTOCOL.agent``, draft-miller-ssh-agent):
``SSH2_AGENTC_SIGN_REQUEST`` turns the SSHSIG signed data into a signature blob, no process per
signature. The SSHSIG around it is built by :mod:`formats.sshsig`.

How the agent is run: ``ssh-agent -D -a <home>/agent.sock`` stays in the foreground, so it is
our own child with the PID :class:`subprocess.Popen` reports (it prints that PID on stdout once
its socket listens, and we check it), we reap it, and nothing is left to init. SIGTERM makes it
remove its socket and exit; SIGKILL is the fallback. ssh-agent ignores SIGPIPE itself (checked
in /proc), so a client hanging up mid-request cannot kill it. The key is loaded with
``ssh-add``, once per agent start, with no terminal and no askpass program: nothing can ever
prompt. Passphrase-protected keys are refused (an agent holds keys decrypted anyway; protect
the key file).

Neither class is meant to be shared across processes; a connection serialises its own calls
with a lock, so sharing it between threads is safe but gains nothing (ssh-agent answers one
request at a time).
"""

from __future__ import annotations

import logging
import os
import re
import selectors
import struct
import subprocess
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import IO

from formats.sshsig import (
    DEFAULT_HASH,
    SshPublicKey,
    SshReader,
    SshSigError,
    check_signature_blob,
    ssh_string,
    ssh_uint32,
    sshsig_armor,
    sshsig_signed_data,
)
from procs.prctl import die_with_parent
from workers.agents.base import AgentProcess, run_tool
from workers.agents.base import stderr_tail as _stderr_tail
from workers.agents.unixsocket import (
    DEFAULT_TIMEOUT,
    AgentSocket,
    check_socket_path,
    remove_stale_socket,
)
from workers.errors import AgentError

__all__ = [
    "DEFAULT_TIMEOUT",
    "SshAgent",
    "SshAgentConnection",
    "SshAgentError",
]

log = logging.getLogger(__name__)

# Agent protocol message numbers (PROTOCOL.agent / draft-miller-ssh-agent).
SSH_AGENT_FAILURE = 5
SSH_AGENT_SUCCESS = 6
SSH2_AGENTC_REQUEST_IDENTITIES = 11
SSH2_AGENT_IDENTITIES_ANSWER = 12
SSH2_AGENTC_SIGN_REQUEST = 13
SSH2_AGENT_SIGN_RESPONSE = 14
SSH_AGENT_EXTENSION_FAILURE = 28

_START_TIMEOUT = 10.0  # for the agent to announce its socket after it was spawned
_TOOL_TIMEOUT = 60.0  # for one ssh-add or ssh-keygen command
_MAX_MESSAGE = 256 * 1024  # ssh-agent's own limit for one message (AGENT_MAX_LEN)
_SOCKET_NAME = "agent.sock"
_PID_LINE = re.compile(rb"echo Agent pid (\d+);")
# Variables that could point ssh tools at another agent or at a way to prompt.
_SCRUBBED_ENV = ("SSH_AUTH_SOCK", "SSH_AGENT_PID", "SSH_ASKPASS", "DISPLAY", "WAYLAND_DISPLAY")


class SshAgentError(AgentError):
    """ssh-agent (or ssh-add acting on it) failed: dead agent, ``SSH_AGENT_FAILURE``, bad data."""


# --------------------------------------------------------------------------------------------
# The agent protocol


class SshAgentConnection(AgentSocket):
    """One persistent connection to ssh-agent.

    Every request has a deadline of :attr:`timeout` seconds. ``SSH_AGENT_FAILURE`` answers
    raise :class:`SshAgentError` and leave the connection usable; a timeout, a closed socket or
    a protocol violation also raises :class:`SshAgentError` and makes the connection unusable
    (every later call fails at once).
    """

    agent_name = "ssh-agent"
    error = SshAgentError

    def list_identities(self) -> list[SshPublicKey]:
        """The agent's keys of the types :mod:`formats.sshsig` supports, with their
        comments.

        Keys of other types (certificates, FIDO keys) are left out.
        """
        answer = self._request(SSH2_AGENTC_REQUEST_IDENTITIES, b"", SSH2_AGENT_IDENTITIES_ANSWER)
        keys = []
        try:
            reader = SshReader(answer, "identities answer")
            for _ in range(reader.uint32()):
                blob = reader.string()
                comment = reader.string().decode("utf-8", "replace")
                try:
                    keys.append(SshPublicKey.from_blob(blob, comment))
                except SshSigError as exc:
                    log.debug("agent key not usable", extra={"error": str(exc)})
            reader.end()
        except SshSigError as exc:
            raise self._fail(f"malformed identities answer: {exc}") from exc
        return keys

    def sign(self, pubkey_blob: bytes, data: bytes, flags: int = 0) -> bytes:
        """Sign ``data`` with the agent's key ``pubkey_blob``; return the signature blob.

        The blob is ``string algorithm, string signature`` (RFC 4253 section 6.6). For RSA
        keys pass :data:`formats.sshsig.SSH_AGENT_RSA_SHA2_512`, or the agent signs with
        SHA-1.
        """
        if not 0 <= flags <= 0xFFFFFFFF:
            raise ValueError(f"flags must be a uint32: {flags}")
        payload = ssh_string(pubkey_blob) + ssh_string(data) + ssh_uint32(flags)
        answer = self._request(SSH2_AGENTC_SIGN_REQUEST, payload, SSH2_AGENT_SIGN_RESPONSE)
        try:
            reader = SshReader(answer, "sign response")
            signature = reader.string()
            reader.end()
        except SshSigError as exc:
            raise self._fail(f"malformed sign response: {exc}") from exc
        return signature

    def sign_many(self, pubkey_blob: bytes, datas: Sequence[bytes], flags: int = 0
                  ) -> list[bytes]:
        """`sign` of each of ``datas`` in one round trip: the requests go in one write, and
        the agent answers them in order. A refusal of any raises the first such error, after
        every answer was read (the connection stays in step)."""
        if not 0 <= flags <= 0xFFFFFFFF:
            raise ValueError(f"flags must be a uint32: {flags}")
        messages = []
        for data in datas:
            payload = ssh_string(pubkey_blob) + ssh_string(data) + ssh_uint32(flags)
            if 1 + len(payload) > _MAX_MESSAGE:
                raise ValueError(f"agent request of {len(payload)} bytes exceeds the agent's "
                                 "limit")
            messages.append(struct.pack(">IB", 1 + len(payload), SSH2_AGENTC_SIGN_REQUEST)
                            + payload)
        if not messages:
            return []
        answers = []
        with self._lock:
            deadline = time.monotonic() + self._timeout * len(messages)
            self._send(b"".join(messages))
            for _ in messages:
                answers.append(self._read_message(deadline))
        signatures = []
        for answer_type, body in answers:
            body = self._answer(SSH2_AGENTC_SIGN_REQUEST, answer_type, body,
                                SSH2_AGENT_SIGN_RESPONSE)
            try:
                reader = SshReader(body, "sign response")
                signatures.append(reader.string())
                reader.end()
            except SshSigError as exc:
                raise self._fail(f"malformed sign response: {exc}") from exc
        return signatures

    def sshsig(
        self,
        key: SshPublicKey,
        message: bytes | Iterable[bytes],
        namespace: str,
        hash_alg: str = DEFAULT_HASH,
    ) -> str:
        """``message`` signed as ``ssh-keygen -Y sign -n <namespace>`` does: the armored SSHSIG.

        The agent flags (``rsa-sha2-512`` for RSA) follow from the key type. A bad namespace
        or hash algorithm raises :class:`~formats.sshsig.SshSigError` before anything is
        sent.
        """
        data = sshsig_signed_data(message, namespace, hash_alg)
        signature = self.sign(key.blob, data, key.agent_flags)
        try:
            check_signature_blob(key, signature)
        except SshSigError as exc:
            raise SshAgentError(f"ssh-agent returned an unusable signature: {exc}") from exc
        return sshsig_armor(key.blob, namespace, signature, hash_alg)

    # -- internals ----------------------------------------------------------------------

    def _request(self, msg_type: int, payload: bytes, expect: int) -> bytes:
        """Send one message; return the body of an ``expect`` answer."""
        if 1 + len(payload) > _MAX_MESSAGE:
            raise ValueError(f"agent request of {len(payload)} bytes exceeds the agent's limit")
        with self._lock:
            deadline = time.monotonic() + self._timeout
            self._send(struct.pack(">IB", 1 + len(payload), msg_type) + payload)
            answer_type, body = self._read_message(deadline)
        return self._answer(msg_type, answer_type, body, expect)

    def _read_message(self, deadline: float) -> tuple[int, bytes]:
        """The next message: (type, body)."""
        length = struct.unpack(">I", self._recv_exactly(4, deadline))[0]
        if not 1 <= length <= _MAX_MESSAGE:
            raise self._fail(f"bad message length {length}")
        message = self._recv_exactly(length, deadline)
        return message[0], message[1:]

    def _answer(self, msg_type: int, answer_type: int, body: bytes, expect: int) -> bytes:
        """The body of an ``expect`` answer to request ``msg_type``, else the error."""
        if answer_type == expect:
            return body
        if answer_type in (SSH_AGENT_FAILURE, SSH_AGENT_EXTENSION_FAILURE) and not body:
            raise SshAgentError(f"ssh-agent refused request {msg_type} (SSH_AGENT_FAILURE)")
        raise self._fail(f"unexpected answer type {answer_type} to request {msg_type}")

    def _recv_exactly(self, size: int, deadline: float) -> bytes:
        chunks = []
        missing = size
        while missing:
            chunk = self._recv(missing, deadline)
            chunks.append(chunk)
            missing -= len(chunk)
        return b"".join(chunks)


# --------------------------------------------------------------------------------------------
# The agent


def _tool_env(socket_path: Path | None) -> dict[str, str]:
    env = {name: value for name, value in os.environ.items() if name not in _SCRUBBED_ENV}
    if socket_path is not None:
        env["SSH_AUTH_SOCK"] = str(socket_path)
    env["SSH_ASKPASS_REQUIRE"] = "never"
    return env


def _run(
    argv: list[str], *, socket_path: Path | None, what: str
) -> subprocess.CompletedProcess[bytes]:
    """Run an OpenSSH tool without terminal (nothing can prompt); failing to run it at all is
    an SshAgentError."""
    return run_tool(argv, env=_tool_env(socket_path), what=what, error=SshAgentError,
                    timeout=_TOOL_TIMEOUT, new_session=True)


class SshAgent(AgentProcess[SshAgentConnection]):
    """An ssh-agent serving one private home, started and stopped by this object.

    ``home`` must exist and be private (mode 0700, no group or other access); its path must
    be short, as the agent socket ``agent.sock`` lives in it and socket paths are limited to
    107 bytes.
    """

    agent_name = "ssh-agent"
    error = SshAgentError
    connection = SshAgentConnection

    def __init__(
        self,
        home: Path,
        *,
        ssh_agent: str = "ssh-agent",
        ssh_add: str = "ssh-add",
        ssh_keygen: str = "ssh-keygen",
        timeout: float = DEFAULT_TIMEOUT,
        log_file: Path | None = None,
    ) -> None:
        """``timeout`` is passed to every connection; ``log_file`` receives the agent's
        stderr (default: discarded)."""
        super().__init__(home, timeout=timeout)
        self._ssh_agent = ssh_agent
        self._ssh_add = ssh_add
        self._ssh_keygen = ssh_keygen
        self._log_file = log_file

    @property
    def socket_path(self) -> Path:
        """Where the agent listens: ``<home>/agent.sock``."""
        return self.home / _SOCKET_NAME

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        """Start the agent for :attr:`home` and learn its PID."""
        if self._proc is not None:
            raise SshAgentError(f"ssh-agent for {self.home} already started (pid {self._pid})")
        self._check_home()
        socket_path = self.socket_path
        check_socket_path(socket_path, SshAgentError)
        remove_stale_socket(socket_path, SshAgentError, "ssh-agent")
        stderr: IO[bytes] | int = subprocess.DEVNULL
        log_handle = None
        if self._log_file is not None:
            try:
                log_handle = stderr = open(self._log_file, "ab")  # noqa: SIM115 - closed below
            except OSError as exc:
                raise SshAgentError(f"cannot open agent log {self._log_file}: {exc}") from exc
        try:
            proc = subprocess.Popen(
                [self._ssh_agent, "-D", "-a", str(socket_path)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=stderr,
                env=_tool_env(None),
                start_new_session=True,  # a terminal's Ctrl-C is for us, not for the agent
                preexec_fn=die_with_parent(),  # and it does not outlive us
            )
        except OSError as exc:
            raise SshAgentError(f"cannot start ssh-agent {self._ssh_agent}: {exc}") from exc
        finally:
            if log_handle is not None:
                log_handle.close()  # the agent holds its own copy

        def confirm() -> None:
            announced = self._read_announced_pid(proc)
            if announced != proc.pid:
                raise SshAgentError(f"ssh-agent announces pid {announced}, we started {proc.pid}")
            with SshAgentConnection.open(socket_path, timeout=_START_TIMEOUT) as conn:
                conn.list_identities()  # the agent answers on its socket

        self._confirm_start(proc, socket_path, confirm)

    # -- keys and connections ---------------------------------------------------------------

    def add_key(self, private_key_file: Path) -> SshPublicKey:
        """Load the unencrypted private key in ``private_key_file``; return its public key.

        The key file must be readable only by its owner (ssh-add insists). Passphrase-protected
        keys are refused. The public key comes from the private key itself
        (``ssh-keygen -y``), so a stale ``.pub`` next to it cannot mislead.
        """
        self._require_running()
        derived = _run(
            [self._ssh_keygen, "-y", "-P", "", "-f", str(private_key_file)],
            socket_path=None,
            what="read public key",
        )
        if derived.returncode != 0:
            problem = _stderr_tail(derived)
            if "passphrase" in problem:
                raise SshAgentError(
                    f"{private_key_file} is passphrase-protected; stampd needs an unencrypted "
                    "SSH key (protect the key file instead)"
                )
            raise SshAgentError(f"cannot read SSH key {private_key_file}: {problem}")
        try:
            key = SshPublicKey.from_line(derived.stdout.decode("utf-8", "replace"))
        except SshSigError as exc:
            raise SshAgentError(f"cannot sign with SSH key {private_key_file}: {exc}") from exc
        added = _run(
            [self._ssh_add, "-q", str(private_key_file)],
            socket_path=self.socket_path,
            what="add key",
        )
        if added.returncode != 0:
            raise SshAgentError(f"ssh-add {private_key_file} failed: {_stderr_tail(added)}")
        with SshAgentConnection.open(self.socket_path, timeout=self._timeout) as conn:
            listed = next((k for k in conn.list_identities() if k.blob == key.blob), None)
        if listed is None:
            raise SshAgentError(f"ssh-add reported success but the agent lacks {private_key_file}")
        log.info(
            "SSH key added",
            extra={"fingerprint": key.fingerprint, "home": str(self.home), "pid": self._pid},
        )
        return listed

    # -- internals ------------------------------------------------------------------------

    @staticmethod
    def _read_announced_pid(proc: subprocess.Popen[bytes]) -> int:
        """Read the agent's stdout up to ``echo Agent pid N;`` (printed once it listens)."""
        assert proc.stdout is not None
        deadline = time.monotonic() + _START_TIMEOUT
        output = b""
        with selectors.DefaultSelector() as selector:
            selector.register(proc.stdout, selectors.EVENT_READ)
            while True:
                match = _PID_LINE.search(output)
                if match:
                    return int(match.group(1))
                remaining = deadline - time.monotonic()
                if remaining <= 0 or len(output) > 4096:
                    raise SshAgentError(f"no pid announced within {_START_TIMEOUT:g} s")
                if not selector.select(remaining):
                    continue
                chunk = os.read(proc.stdout.fileno(), 4096)
                if not chunk:
                    raise SshAgentError("ssh-agent closed its output without announcing a pid")
                output += chunk
