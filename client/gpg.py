"""The client's access to GnuPG, on python-gnupg (``gnupg``): private temporary GNUPGHOMEs,
importing and listing public keys, verifying a detached signature.

python-gnupg runs gpg, feeds it, and reads its key listings and import results. Three things the
client needs it cannot express, so they are kept here, small:

- `SignatureStatus`: python-gnupg's `gnupg.Verify` keeps only the last signature it saw. The
  client refuses a signature block holding several signatures (the multiple-signature attack),
  so this subclass also counts ``NEWSIG``/``GOODSIG``/``VALIDSIG`` lines and keeps every
  well-formed ``VALIDSIG`` with its signature class, and the keywords of failed signatures. It
  also reads the status lines ``git verify-tag|verify-commit --raw`` prints (`parse`).
- A timeout: python-gnupg waits for gpg without one; `_Gpg` kills a gpg run that takes longer
  than `GPG_TIMEOUT` (`GpgError` "gpg did not finish in time"). This overrides the private
  ``GPG._collect_output`` (python-gnupg is pinned exactly for it; tests/unit/test_client_gpg.py
  fails when it stops taking effect), because python-gnupg (0.5.7, its latest release) has no
  public way: every call ends in ``_collect_output``, which joins its reader threads and waits
  for gpg without a bound, and the process is made in the private ``_open_subprocess``, so
  nothing public can kill it. A ``gpgbinary`` wrapper around coreutils' ``timeout`` would need
  a program macOS lacks. The way out is to leave python-gnupg: ``subprocess.run(timeout=)``
  with `formats.gpgstatus` and `formats.gpglisting` reading the output, as
  `keystore.gnupg` does (the same readers), which also drops the dependency and its lock
  entries.
- Quiet logs: python-gnupg logs a warning for every non-zero exit of gpg (a bad signature is
  one) and a traceback when gpg is missing; the client reports these itself, as one line, so
  the ``gnupg`` logger is limited to critical records.

A home gets ``no-autostart`` in its ``gpg.conf`` and on every gpg command line, so neither gpg
run here nor gpg started by git with ``GNUPGHOME`` set starts an agent: verifying needs none.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import tempfile
import threading
import types
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gnupg

from formats.gpgstatus import SignatureTally

GPG_TIMEOUT = 60.0
# Temporary homes go here rather than to $TMPDIR: a gpg socket path must stay short.
SHORT_TMP = "/tmp"
NOT_INSTALLED = ("gpg is not installed (not on PATH): stampd needs GnuPG 2.2.8 or later; "
                 "install it, e.g. `apt-get install gnupg`")

logging.getLogger("gnupg").setLevel(logging.CRITICAL)


class GpgError(Exception):
    """gpg could not be run at all: it is not installed, or it did not finish in time."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


# --------------------------------------------------------------------------- status lines


class SignatureStatus(gnupg.Verify, SignatureTally):
    """python-gnupg's verification result, plus every signature's status
    (`formats.gpgstatus.SignatureTally`: how many gpg saw, found good, each well-formed
    ``VALIDSIG`` in `valid_sigs`, the keywords of the failed ones in `errors`)."""

    def __init__(self, gpg: Any) -> None:
        gnupg.Verify.__init__(self, gpg)
        SignatureTally.__init__(self)

    @classmethod
    def parse(cls, text: str) -> SignatureStatus:
        """The ``[GNUPG:]`` lines of ``text`` (what ``git verify-* --raw`` prints)."""
        status = cls(types.SimpleNamespace(error_map=None))
        status.add_lines(text)
        return status

    def handle_status(self, key: str, value: str) -> None:
        self.add(key, value.split())
        # python-gnupg's own fields (valid, status, problems...); a line it cannot take apart
        # is already counted above.
        with contextlib.suppress(ValueError, IndexError):
            super().handle_status(key, value)


# --------------------------------------------------------------------------- homes


class _Gpg(gnupg.GPG):
    """python-gnupg's GPG with a time limit on each gpg run."""

    result_map = {**gnupg.GPG.result_map, "verify": SignatureStatus}
    timeout = GPG_TIMEOUT
    timed_out = False

    def _collect_output(self, process: Any, result: Any, writer: Any = None,
                        stdin: Any = None) -> Any:
        def expire() -> None:
            if process.poll() is None:
                self.timed_out = True
                process.kill()

        timer = threading.Timer(self.timeout, expire)
        timer.daemon = True
        timer.start()
        try:
            return super()._collect_output(process, result, writer, stdin)
        finally:
            timer.cancel()


@dataclass(frozen=True)
class Key:
    """A public key of a home: its primary fingerprint, every fingerprint (the primary key's,
    then its subkeys'), and its user ids."""

    fingerprint: str
    fingerprints: tuple[str, ...]
    uids: tuple[str, ...]


@dataclass(frozen=True)
class Imported:
    """What ``gpg --import`` did."""

    ok: bool  # gpg said IMPORT_OK (it may exit 2 after a good import when it has no agent)
    fingerprints: tuple[str, ...]
    stderr: str  # gpg's messages, without the status lines


def _uid(text: str) -> str:
    # python-gnupg reads the listing as Latin-1 and undoes gpg's \xNN escapes one byte each:
    # the user id's bytes, which are UTF-8.
    return text.encode("latin-1", "replace").decode("utf-8", "replace")


class GpgHome:
    """A GNUPGHOME whose gpg runs never start an agent."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self._gpg = _Gpg(gnupghome=str(path), options=["--no-autostart"])
        except OSError:
            raise GpgError(NOT_INSTALLED) from None
        except ValueError as e:  # gpg ran, but would not list its configuration
            raise GpgError(f"gpg does not work: {str(e)[-200:]}") from None
        self._check()

    def _check(self) -> None:
        if self._gpg.timed_out:
            self._gpg.timed_out = False
            raise GpgError("gpg did not finish in time")

    def import_keys(self, data: bytes) -> Imported:
        result = self._gpg.import_keys(data)
        self._check()
        messages = [line for line in str(result.stderr or "").splitlines(keepends=True)
                    if not line.startswith("[GNUPG:] ")]
        return Imported(ok=bool(result.fingerprints),
                        fingerprints=tuple(f.upper() for f in result.fingerprints),
                        stderr="".join(messages))

    def list_keys(self) -> list[Key]:
        """The public keys, in listing order (a key whose fingerprint is not listed is left
        out)."""
        listing = self._gpg.list_keys()
        self._check()
        keys = []
        for k in listing:
            if not k.get("fingerprint"):
                continue
            subkeys = tuple(str(s[2]).upper() for s in k.get("subkeys", ()) if s[2])
            keys.append(Key(fingerprint=k["fingerprint"].upper(),
                            fingerprints=(k["fingerprint"].upper(), *subkeys),
                            uids=tuple(_uid(u) for u in k.get("uids", ()))))
        return keys

    def verify_detached(self, payload: bytes, signature: str) -> tuple[bool, SignatureStatus]:
        """Verify an armored detached ``signature`` over ``payload`` (any key of the home is
        trusted): (whether gpg exited 0, its status)."""
        fd, name = tempfile.mkstemp(suffix=".asc", dir=self.path)
        try:
            with os.fdopen(fd, "w", encoding="ascii") as f:
                f.write(signature)
            try:
                result = self._gpg.verify_data(name, payload,
                                               extra_args=["--trust-model", "always"])
            except OSError:  # gpg stopped reading the payload: it found no signature to check
                self._check()
                return False, SignatureStatus(None)
        finally:
            os.unlink(name)
        self._check()
        assert isinstance(result, SignatureStatus)
        return result.returncode == 0, result


    def _run(self, *args: str) -> tuple[int, str]:
        """(exit status, standard output) of ``gpg ARGS`` in this home, without an agent."""
        try:
            r = subprocess.run(["gpg", "--homedir", str(self.path), "--batch", "--no-tty",
                                "--no-autostart", *args], capture_output=True,
                               timeout=GPG_TIMEOUT, check=False)
        except FileNotFoundError:
            raise GpgError(NOT_INSTALLED) from None
        except subprocess.TimeoutExpired:
            raise GpgError("gpg did not finish in time") from None
        return r.returncode, r.stdout.decode("utf-8", "replace")

    def verify_files(self, files: Sequence[Path]) -> tuple[int, str]:
        """``gpg --verify-files`` of signed messages (`formats.openpgp.signed_message`), any
        key of the home trusted: (exit status, the status lines), one ``NEWSIG`` per
        signature, the files in order."""
        return self._run("--status-fd", "1", "--trust-model", "always", "--verify-files",
                         *map(str, files))

    def key_listing(self) -> str:
        """``gpg --with-colons --fixed-list-mode --check-sigs``: every key of the home with its
        expiry and checked revocations (`formats.gpgkeys.parse_key_listing` reads it)."""
        return self._run("--with-colons", "--fixed-list-mode", "--check-sigs")[1]


class TempGpgHome(GpgHome):
    """A private temporary GNUPGHOME: a short path under /tmp, mode 0700, whose ``gpg.conf``
    says ``no-autostart`` and the ``conf`` lines; removed on `close` (or leaving ``with``)."""

    def __init__(self, prefix: str = "stampd-c", *, conf: Sequence[str] = ()) -> None:
        path = Path(tempfile.mkdtemp(prefix=prefix,
                                     dir=SHORT_TMP if os.path.isdir(SHORT_TMP) else None))
        try:
            path.chmod(0o700)
            (path / "gpg.conf").write_text("\n".join(["no-autostart", *conf, ""]))
            super().__init__(path)
        except BaseException:
            shutil.rmtree(path, ignore_errors=True)
            raise

    def __enter__(self) -> TempGpgHome:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
