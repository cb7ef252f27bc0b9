"""A private gpg-agent per worker, and a persistent Assuan connection that signs with it.

gpg-agent serves secret-key operations one at a time, so every signing worker runs its own
agent in its own 0700 home (docs/agents.md). :class:`GpgAgent` starts one, imports the
secret key from a read-only key file and stops it again by PID; :class:`AssuanConnection`
keeps one Unix socket open and turns a digest into signature values with
``SIGKEY``/``SETHASH``/``PKSIGN`` — no process per signature — and reads a key's public part
with ``READKEY`` (for TSA certificates). The OpenPGP packet around those values is built by
:mod:`formats.openpgp`.

How the agent is run: ``gpg-agent --daemon`` forks and leaves an orphan of init. Its PID
cannot be waited for, and once killed it lingers as a zombie until init gets round to reaping
it (seen on this machine), so "the PID is gone" cannot be awaited. We instead bind the
agent's socket ourselves and start ``gpg-agent --supervised`` as our own child with the
listening socket on file descriptor 3, the systemd socket-activation convention GnuPG
documents. The agent then has the PID :class:`subprocess.Popen` reports (confirmed with
``GETINFO pid``), we reap it, and the socket accepts connections before the agent even runs.
Unlike the daemon, a supervised agent does not ignore SIGPIPE, so a client hanging up at the
wrong moment would kill it: we start it with SIGPIPE ignored.
Passphrases reach the agent only as answers to its Assuan ``INQUIRE PASSPHRASE`` (every
connection, ours and gpg's, uses loopback pinentry mode), and ``gpg`` reads them from a pipe
(``--passphrase-fd``), never from a command line. The agent's pinentry is ``/bin/false``, so
nothing can ever prompt. It must *not* run with ``--batch``: in GnuPG 2.2 ``agent_askpin()``
returns "success" with an empty passphrase in batch mode before it looks at loopback mode, so
a protected key fails (the export of one even aborts the agent).

Neither class is meant to be shared across processes; a connection serialises its own calls
with a lock, so sharing it between threads is safe but gains nothing.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import socket
import string
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from formats.gpglisting import Key, ListingError, parse_key_listing
from formats.openpgp import HASH_NAMES, HASH_SIZES, KeyInfo
from formats.sexp import SexpError, signature_values
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
    "AgentError",
    "AssuanConnection",
    "GpgAgent",
    "GpgAgentError",
    "agent_socket_path",
]

log = logging.getLogger(__name__)

_START_TIMEOUT = 10.0  # for the agent's greeting after it was spawned
_GPG_TIMEOUT = 120.0  # for one gpg or gpgconf command
_ASSUAN_LINE_MAX = 1000  # Assuan's limit for one line, newline included
_MAX_RESPONSE = 1 << 20  # bytes of one response we are willing to buffer
_MAX_PASSPHRASE = 255  # gpg-agent's MAX_PASSPHRASE_LEN
_NO_PINENTRY = "/bin/false"  # a "pinentry" that fails at once: nothing may ever prompt
_HEX40 = re.compile(r"[0-9A-Fa-f]{40}")

# How the agent is exec'd: the listening socket arrives as the shell's stdin and moves to fd 3 (a
# POSIX shell names only descriptors 0-9, the socket's number in the parent may be any);
# LISTEN_PID is the shell's PID, which exec keeps. SIGPIPE is ignored: only gpg-agent's --daemon
# branch ignores it, so a supervised agent writing to a client that hung up would die of it.
_SUPERVISED_SHIM = (
    "trap '' PIPE; exec 3<&0 0</dev/null; LISTEN_PID=$$; export LISTEN_PID; exec \"$@\""
)


class GpgAgentError(AgentError):
    """gpg-agent (or gpg acting on its home) failed: dead agent, ``ERR`` answer, bad data.

    ``code`` is the GnuPG error code of an ``ERR`` line (source in the high bits, see
    libgpg-error), ``None`` for failures without one.
    """

    def __init__(self, message: str, *, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


# --------------------------------------------------------------------------------------------
# Small helpers


def _percent_unescape(data: bytes) -> bytes:
    """Undo Assuan/gpgconf ``%XX`` escaping; :class:`ValueError` for a broken escape."""
    if b"%" not in data:
        return data
    out = bytearray()
    pos = 0
    while True:
        percent = data.find(b"%", pos)
        if percent < 0:
            out += data[pos:]
            return bytes(out)
        out += data[pos:percent]
        hex_digits = data[percent + 1 : percent + 3]
        if len(hex_digits) != 2 or not all(chr(c) in string.hexdigits for c in hex_digits):
            raise ValueError(f"bad %-escape {data[percent : percent + 3]!r}")
        out.append(int(hex_digits, 16))
        pos = percent + 3


def _percent_escape(data: bytes) -> bytes:
    """Escape data for a client ``D`` line: ``%``, CR and LF must not appear literally."""
    return data.replace(b"%", b"%25").replace(b"\r", b"%0D").replace(b"\n", b"%0A")


def _data_lines(data: bytes) -> bytes:
    """``data`` as Assuan ``D`` lines that respect the line-length limit."""
    escaped = _percent_escape(data)
    chunk = _ASSUAN_LINE_MAX - 10  # room for "D ", the newline and an escape split below
    lines = []
    pos = 0
    while pos < len(escaped):
        end = min(pos + chunk, len(escaped))
        # Never split a %XX escape across two lines.
        percent = escaped.rfind(b"%", max(pos, end - 2), end)
        if percent >= 0 and end - percent < 3 and end < len(escaped):
            end = percent
        lines.append(b"D " + escaped[pos:end] + b"\n")
        pos = end
    return b"".join(lines)


def _gpg_env(home: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["GNUPGHOME"] = str(home)
    for name in ("LISTEN_FDS", "LISTEN_FDNAMES", "LISTEN_PID", "GPG_AGENT_INFO"):
        env.pop(name, None)
    return env


def _run(
    argv: list[str],
    *,
    home: Path,
    what: str,
    pass_fds: tuple[int, ...] = (),
) -> subprocess.CompletedProcess[bytes]:
    """Run a GnuPG tool in ``home``; any failure to run it at all becomes an
    :class:`GpgAgentError`."""
    return run_tool(argv, env=_gpg_env(home), what=what, error=GpgAgentError,
                    timeout=_GPG_TIMEOUT, pass_fds=pass_fds)


_GPG_CHATTER = re.compile(r"gpg: (keybox '.*' created|.*: trustdb created|Total number processed)")


def _gpg_complaint(result: subprocess.CompletedProcess[bytes]) -> str:
    """What gpg said went wrong, on one line, without its news (a keybox created...)."""
    lines = result.stderr.decode("utf-8", "replace").strip().splitlines()
    complaints = [line for line in lines if not _GPG_CHATTER.match(line)]
    return " | ".join(complaints[-3:]) or _stderr_tail(result)


def agent_socket_path(home: Path, gpgconf: str = "gpgconf") -> Path:
    """Where the agent of ``home`` listens (``gpgconf --list-dirs agent-socket``).

    Starts no process besides gpgconf itself.
    """
    result = _run(
        [gpgconf, "--homedir", str(home), "--list-dirs", "agent-socket"],
        home=home,
        what="agent socket path",
    )
    try:
        path = _percent_unescape(result.stdout.strip())
    except ValueError:
        path = b""
    if result.returncode != 0 or not path:
        raise GpgAgentError(
            f"gpgconf cannot name the agent socket of {home}: {_stderr_tail(result)}")
    return Path(os.fsdecode(path))


# --------------------------------------------------------------------------------------------
# Assuan


class AssuanConnection(AgentSocket):
    """One persistent Assuan connection to gpg-agent.

    Requests are written in one go and answers read through a buffer; every request has a
    deadline of :attr:`timeout` seconds. ``ERR`` answers raise :class:`GpgAgentError` and leave the
    connection usable; a timeout, a closed socket or a protocol violation also raises
    :class:`GpgAgentError` and makes the connection unusable (every later call fails at once).
    """

    agent_name = "gpg-agent"
    error = GpgAgentError

    def __init__(
        self,
        sock: socket.socket,
        *,
        passphrase: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        """Take over ``sock``, a socket already connected to the agent; read its greeting."""
        super().__init__(sock, timeout=timeout)
        self._passphrase = passphrase.encode("utf-8") if passphrase is not None else None
        self._buffer = bytearray()
        self._scanned = 0  # bytes at the start of _buffer known to hold no newline
        try:
            with self._lock:
                self._read_response(time.monotonic() + timeout)  # the greeting
                # Never let the agent look for a pinentry; passphrases come through INQUIRE.
                self._send(b"OPTION pinentry-mode=loopback\n")
                self._read_response(time.monotonic() + timeout)
        except BaseException:
            self.close()
            raise

    def sign(self, keygrip: str, hash_algo: int, digest: bytes) -> list[int]:
        """Sign ``digest`` (made with OpenPGP hash algorithm ``hash_algo``) with a key.

        Returns the signature values in OpenPGP order: RSA ``[s]``; DSA, ECDSA, EdDSA ``[r, s]``.
        """
        return self.sign_many(keygrip, hash_algo, [digest])[0]

    def sign_many(self, keygrip: str, hash_algo: int, digests: Sequence[bytes]
                  ) -> list[list[int]]:
        """Sign each of ``digests`` with one key in one round trip: ``SIGKEY`` once, then
        ``SETHASH``/``PKSIGN`` for each digest, all in one write (the agent keeps the key
        across ``PKSIGN`` and answers in order). The values of each signature, as `sign`.
        An ``ERR`` answer to any command raises the first such error, after every answer was
        read (the connection stays in step)."""
        if not _HEX40.fullmatch(keygrip):
            raise ValueError(f"keygrip must be 40 hex digits: {keygrip!r}")
        if hash_algo not in HASH_NAMES:
            raise ValueError(f"unsupported hash algorithm {hash_algo}")
        if not digests:
            return []
        size = HASH_SIZES[hash_algo]
        for digest in digests:
            if len(digest) != size:
                raise ValueError(f"digest of {len(digest)} bytes does not fit hash {hash_algo}")
        setting = f"SETHASH --hash={HASH_NAMES[hash_algo]} "
        request = "".join([f"SIGKEY {keygrip.upper()}\n",
                           *(f"{setting}{digest.hex().upper()}\nPKSIGN\n" for digest in digests)]
                          ).encode("ascii")
        answers: list[bytes] = []
        with self._lock:
            deadline = time.monotonic() + self._timeout * len(digests)
            self._send(request)
            first_error: GpgAgentError | None = None
            for _ in range(1 + 2 * len(digests)):
                try:
                    answers.append(self._read_response(deadline))
                except GpgAgentError as exc:
                    if self._broken is not None:
                        raise
                    first_error = first_error or exc
            if first_error is not None:
                raise first_error
        try:
            return [signature_values(data)[1] for data in answers[2::2]]
        except SexpError as exc:
            raise GpgAgentError(f"gpg-agent returned an unusable signature: {exc}") from exc

    def read_key(self, keygrip: str) -> bytes:
        """The public key of ``keygrip`` as the agent holds it (``READKEY``): a canonical
        S-expression ``(public-key (ecc ...))`` or ``(public-key (rsa ...))``, which
        :func:`formats.sexp.public_key` reads."""
        if not _HEX40.fullmatch(keygrip):
            raise ValueError(f"keygrip must be 40 hex digits: {keygrip!r}")
        data = self.transact(f"READKEY {keygrip.upper()}")
        if not data.startswith(b"(10:public-key"):
            raise GpgAgentError(f"gpg-agent returned no public key for {keygrip.upper()}")
        return data

    def transact(self, command: str) -> bytes:
        """Send one Assuan command; return its ``D`` data (unescaped) once it answers OK."""
        line = command.encode("utf-8")
        if b"\n" in line or b"\r" in line or len(line) >= _ASSUAN_LINE_MAX:
            raise ValueError("an Assuan command is a single line of under 1000 bytes")
        with self._lock:
            deadline = time.monotonic() + self._timeout
            self._send(line + b"\n")
            return self._read_response(deadline)

    # -- internals ----------------------------------------------------------------------

    def _readline(self, deadline: float) -> bytes:
        self._check_usable()
        while True:
            newline = self._buffer.find(b"\n", self._scanned)
            if newline >= 0:
                line = bytes(self._buffer[:newline])
                del self._buffer[: newline + 1]
                self._scanned = 0
                return line
            self._scanned = len(self._buffer)
            if self._scanned > _MAX_RESPONSE:
                raise self._fail("line too long")
            self._buffer += self._recv(65536, deadline)

    def _read_response(self, deadline: float) -> bytes:
        """Read up to the final OK or ERR of one request; return its data."""
        data = bytearray()
        while True:
            line = self._readline(deadline)
            if line.startswith(b"D "):
                try:
                    data += _percent_unescape(line[2:])
                except ValueError as exc:
                    raise self._fail(str(exc)) from exc
                if len(data) > _MAX_RESPONSE:
                    raise self._fail("response too large")
            elif line == b"OK" or line.startswith(b"OK "):
                return bytes(data)
            elif line.startswith(b"ERR "):
                code_text, _, message = line[4:].decode("utf-8", "replace").partition(" ")
                code = int(code_text) if code_text.isdigit() else None
                raise GpgAgentError(f"gpg-agent: {message or code_text}", code=code)
            elif line.startswith(b"INQUIRE "):
                self._answer_inquiry(line[8:].split(b" ", 1)[0])
            elif line[:2] in (b"S ", b"# ") or line in (b"S", b"#", b"END"):
                continue  # status and comment lines, END after data: nothing to act on
            else:
                raise self._fail(f"unexpected line from agent: {line[:40]!r}")

    def _answer_inquiry(self, keyword: bytes) -> None:
        if keyword in (b"PASSPHRASE", b"NEW_PASSPHRASE") and self._passphrase is not None:
            self._send(_data_lines(self._passphrase) + b"END\n")
        elif keyword == b"PINENTRY_LAUNCHED":
            self._send(b"END\n")
        else:
            inquiry = keyword.decode("ascii", "replace")
            log.debug("cancelling agent inquiry", extra={"inquiry": inquiry})
            self._send(b"CAN\n")


# --------------------------------------------------------------------------------------------
# The agent


def _key_info(key: Key) -> KeyInfo:
    if not key.primary.usable:
        raise GpgAgentError(f"key {key.fingerprint} is revoked, expired, invalid or disabled")
    if not key.uids:
        raise GpgAgentError(f"key {key.fingerprint} has no valid user id")
    signer = key.signing_key
    if signer is None:
        raise GpgAgentError(f"key {key.fingerprint} has no usable secret signing key")
    try:
        return KeyInfo(
            fingerprint=signer.fingerprint,
            keygrip=signer.keygrip,
            pubkey_algo=signer.algo,
            bits=signer.bits,
            curve=signer.curve,
            uid=key.uids[0],
        )
    except ValueError as exc:
        raise GpgAgentError(f"cannot sign with key {key.fingerprint}: {exc}") from exc


class GpgAgent(AgentProcess[AssuanConnection]):
    """A gpg-agent serving one private home, started and stopped by this object.

    ``home`` must exist and be private (mode 0700, no group or other access); its path must
    be short, as the agent socket lives in it and socket paths are limited to 107 bytes.
    ``passphrase`` unlocks a protected secret key; it is given to gpg through a pipe and to
    the agent through Assuan inquiries only.
    """

    agent_name = "gpg-agent"
    error = GpgAgentError
    connection = AssuanConnection
    # After KILLAGENT: wait, then SIGTERM, then SIGKILL.
    stop_signals = (None, signal.SIGTERM, signal.SIGKILL)

    def __init__(
        self,
        home: Path,
        *,
        gpg: str = "gpg",
        gpgconf: str = "gpgconf",
        passphrase: str | None = None,
        gpg_agent: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        log_file: Path | None = None,
    ) -> None:
        """``gpg_agent`` defaults to the agent gpgconf names; ``timeout`` is passed to every
        connection; ``log_file`` receives the agent's log (default: discarded)."""
        if passphrase is not None:
            if "\n" in passphrase or "\r" in passphrase:
                raise ValueError("a passphrase cannot contain a line break")
            if len(passphrase.encode("utf-8")) > _MAX_PASSPHRASE:
                raise ValueError(f"a passphrase is at most {_MAX_PASSPHRASE} bytes long")
        super().__init__(home, timeout=timeout)
        self._gpg = gpg
        self._gpgconf = gpgconf
        self._passphrase = passphrase
        self._gpg_agent = gpg_agent
        self._log_file = log_file
        self._socket_path: Path | None = None

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        """Start the agent for :attr:`home` and learn its PID."""
        if self._proc is not None:
            raise GpgAgentError(f"gpg-agent for {self.home} already started (pid {self._pid})")
        self._check_home()
        agent = self._gpg_agent or self._find_agent_program()
        socket_path = agent_socket_path(self.home, self._gpgconf)
        check_socket_path(socket_path, GpgAgentError)
        listener = self._listen(socket_path)
        argv = [
            "/bin/sh", "-c", _SUPERVISED_SHIM, "gpg-agent-shim",
            agent,
            "--homedir", str(self.home),
            "--supervised",
            "--allow-loopback-pinentry",
            "--pinentry-program", _NO_PINENTRY,
            "--disable-scdaemon",
        ]  # fmt: skip
        if self._log_file is not None:
            argv += ["--log-file", str(self._log_file)]
        env = _gpg_env(self.home)
        env["LISTEN_FDS"] = "1"
        try:
            proc = subprocess.Popen(
                argv,
                stdin=listener.fileno(),  # moved to fd 3 by the shim
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env=env,
                start_new_session=True,  # a terminal's Ctrl-C is for us, not for the agent
                preexec_fn=die_with_parent(),  # and it does not outlive us
            )
        except OSError as exc:
            socket_path.unlink(missing_ok=True)
            raise GpgAgentError(f"cannot start gpg-agent {agent}: {exc}") from exc
        finally:
            listener.close()  # the agent holds its own copy
        self._socket_path = socket_path

        def confirm() -> None:
            with AssuanConnection.open(socket_path, timeout=_START_TIMEOUT) as conn:
                reported = conn.transact("GETINFO pid").decode("ascii", "replace").strip()
            if reported != str(proc.pid):
                raise GpgAgentError(f"gpg-agent reports pid {reported!r}, we started {proc.pid}")

        self._confirm_start(proc, socket_path, confirm)

    @property
    def socket_path(self) -> Path:
        """The agent's socket (known once started)."""
        if self._socket_path is None:
            raise GpgAgentError(f"gpg-agent for {self.home} is not started")
        return self._socket_path

    def _connection_options(self) -> dict[str, Any]:
        return {"passphrase": self._passphrase}  # (answers the agent's inquiries)

    def _ask_to_exit(self, proc: subprocess.Popen[bytes]) -> None:
        """``KILLAGENT`` before the signals."""
        if proc.poll() is None and self._socket_path is not None:
            try:
                with AssuanConnection.open(self._socket_path, timeout=1.0) as conn:
                    conn.transact("KILLAGENT")
            except GpgAgentError as exc:
                log.debug("KILLAGENT failed", extra={"pid": proc.pid, "error": str(exc)})

    # -- keys and connections ---------------------------------------------------------------

    def import_secret_key(self, key_file: Path) -> KeyInfo:
        """Import the (one) secret key in ``key_file``; describe the key that will sign.

        That is the primary key if it can sign, else its first usable signing subkey; the
        user id is the primary key's first one.
        """
        self._require_running()
        argv = [
            self._gpg, "--homedir", str(self.home), "--batch", "--no-tty", "--no-autostart",
            "--pinentry-mode", "loopback", "--status-fd", "1",
        ]  # fmt: skip
        with self._passphrase_pipe() as read_fd:
            if read_fd is not None:
                argv += ["--passphrase-fd", str(read_fd)]
            result = _run(
                [*argv, "--import", str(key_file)],
                home=self.home,
                what="import",
                pass_fds=() if read_fd is None else (read_fd,),
            )
        fingerprints, secret_read = self._parse_import_status(result.stdout)
        if result.returncode != 0 or not fingerprints or not secret_read:
            problem = "no secret key in it" if result.returncode == 0 else _gpg_complaint(result)
            raise GpgAgentError(f"cannot import {key_file}: {problem}")
        if len(fingerprints) != 1:
            raise GpgAgentError(f"{key_file} holds {len(fingerprints)} keys, expected one")
        listing = _run(
            [
                self._gpg, "--homedir", str(self.home), "--batch", "--no-tty", "--no-autostart",
                "--with-colons", "--with-keygrip", "--with-fingerprint",
                "--with-subkey-fingerprint", "--list-secret-keys", fingerprints[0],
            ],
            home=self.home,
            what="list secret keys",
        )  # fmt: skip
        if listing.returncode != 0:
            raise GpgAgentError(
                f"cannot list secret key {fingerprints[0]}: {_stderr_tail(listing)}")
        try:
            keys = parse_key_listing(listing.stdout)
        except ListingError as exc:
            raise GpgAgentError(f"cannot sign with key {fingerprints[0]}: {exc}") from None
        if len(keys) != 1:
            raise GpgAgentError(f"listing {fingerprints[0]} shows {len(keys)} secret keys")
        info = _key_info(keys[0])
        log.info(
            "secret key imported",
            extra={"fingerprint": info.fingerprint, "home": str(self.home), "pid": self._pid},
        )
        return info

    # -- internals ------------------------------------------------------------------------

    @contextlib.contextmanager
    def _passphrase_pipe(self) -> Iterator[int | None]:
        """A pipe holding the passphrase for ``gpg --passphrase-fd``; ``None`` without one."""
        if self._passphrase is None:
            yield None
            return
        read_fd, write_fd = os.pipe()
        try:
            # At most 256 bytes: the pipe takes them at once, gpg reads them after we closed.
            os.write(write_fd, self._passphrase.encode("utf-8") + b"\n")
            os.close(write_fd)
            write_fd = -1
            yield read_fd
        finally:
            os.close(read_fd)
            if write_fd >= 0:
                os.close(write_fd)

    def _find_agent_program(self) -> str:
        result = _run([self._gpgconf, "--list-components"], home=self.home, what="find gpg-agent")
        for line in result.stdout.splitlines():
            fields = line.split(b":")
            if fields[0] == b"gpg-agent" and len(fields) >= 3 and fields[2]:
                with contextlib.suppress(ValueError):
                    return os.fsdecode(_percent_unescape(fields[2]))
        raise GpgAgentError(f"gpgconf names no gpg-agent program: {_stderr_tail(result)}")

    def _listen(self, path: Path) -> socket.socket:
        """Bind the agent's listening socket, after making sure no agent owns it."""
        if not path.parent.is_dir():
            _run(
                [self._gpgconf, "--homedir", str(self.home), "--create-socketdir"],
                home=self.home,
                what="create socket directory",
            )
        remove_stale_socket(path, GpgAgentError, "gpg-agent")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(os.fspath(path))
            os.chmod(path, 0o600)
            listener.listen(64)
        except OSError as exc:
            listener.close()
            raise GpgAgentError(f"cannot listen on {path}: {exc}") from exc
        return listener

    @staticmethod
    def _parse_import_status(status: bytes) -> tuple[list[str], bool]:
        """Primary fingerprints imported, and whether a secret key was read."""
        fingerprints: list[str] = []
        secret_read = False
        for line in status.decode("utf-8", "replace").splitlines():
            words = line.split()
            if words[:2] == ["[GNUPG:]", "IMPORT_OK"] and len(words) >= 4:
                if words[3].upper() not in fingerprints:
                    fingerprints.append(words[3].upper())
            elif words[:2] == ["[GNUPG:]", "IMPORT_RES"] and len(words) >= 12:
                secret_read = int(words[11]) > 0
        return fingerprints, secret_read
