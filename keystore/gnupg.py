"""The GnuPG command line, written once: running gpg in a home, temporary homes, and the two
machine-readable outputs of gpg that stampd reads.

- `run_gpg`: ``gpg --homedir HOME --batch --no-tty [--no-autostart] ARGS`` with a timeout and
  stdin closed (or fed ``input``); `GpgError` when gpg cannot be run at all.
- `GnupgHome`: a GNUPGHOME (import keys, list them, verify a detached signature);
  `TempGnupgHome`: a private temporary one, a short path under /tmp with mode 0700, removed
  (after its agent, if it may start one, is told to exit) on `close`.
- `GnupgHome.list_keys`: the ``--with-colons`` key listing, read by
  `formats.gpglisting.parse_key_listing` (the one reader of it, the agent's too).
- `GpgStatus.parse`: the ``--status-fd`` lines (also what ``git verify-* --raw`` prints),
  tallied by `formats.gpgstatus`: ``VALIDSIG`` as `ValidSig` (signature time in epoch or ISO
  8601 form), ``NEWSIG`` and
  ``GOODSIG`` counts, the keywords of failed signatures, and every record for callers that need
  more.

A home that may not start an agent (the default) gets ``no-autostart`` in its ``gpg.conf`` too,
so gpg started by git with ``GNUPGHOME`` set starts none either: verifying needs no agent.

Why not python-gnupg (``gnupg``, a declared dependency): it cannot stand in for `run_gpg` and
`GnupgHome` without changing what their callers get. It waits for gpg without a timeout
(`run_gpg` gives up after `GPG_TIMEOUT` with a `GpgError`); it cannot hand gpg an inherited
descriptor (`keystore.store` passes a key's passphrase with ``--passphrase-fd`` and
``pass_fds``, apart from the key data on stdin); it reads the status lines from stderr mixed
with gpg's messages (`Imported.stderr` keeps them apart), and turns a listing's escaped user-id
bytes into characters one by one (`formats.gpglisting` reads them as UTF-8); every `gnupg.GPG` runs
``gpg --version`` first, and every call starts two reader threads. `GpgStatus.parse` also reads
what ``git verify-* --raw`` prints, which no python-gnupg call produces. So stampd keeps this
small wrapper and imports no python-gnupg.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from formats.gpglisting import Key, parse_key_listing
from formats.gpgstatus import SignatureTally
from keystore.errors import KeysError

GPG = "gpg"
GPGCONF = "gpgconf"
GPG_TIMEOUT = 60.0
# Temporary homes go here rather than to $TMPDIR: an agent's socket path must stay short.
SHORT_TMP = "/tmp"
# Keywords of a signature that did not verify (or of input that held none).

class GpgError(KeysError):
    """gpg could not be run at all: it is not installed, or it did not finish in time."""


def run_gpg(home: Path, *args: str, input: bytes | None = None, timeout: float = GPG_TIMEOUT,
            autostart: bool = False, pass_fds: Sequence[int] = ()
            ) -> subprocess.CompletedProcess[bytes]:
    """Run gpg in ``home``; its exit status is the caller's to judge."""
    cmd = [GPG, "--homedir", str(home), "--batch", "--no-tty",
           *(() if autostart else ("--no-autostart",)), *args]
    try:
        return subprocess.run(cmd, input=input, capture_output=True, timeout=timeout,
                              check=False, pass_fds=tuple(pass_fds),
                              stdin=subprocess.DEVNULL if input is None else None)
    except FileNotFoundError:
        raise GpgError("gpg is not installed (not on PATH): stampd needs GnuPG 2.2.8 or later; "
                       "install it, e.g. `apt-get install gnupg`") from None
    except subprocess.TimeoutExpired:
        raise GpgError("gpg did not finish in time") from None


# --------------------------------------------------------------------------- status lines


class GpgStatus(SignatureTally):
    """The ``[GNUPG:]`` status lines of one gpg run (`formats.gpgstatus`)."""

    @classmethod
    def parse(cls, text: str) -> GpgStatus:
        st = cls()
        st.add_lines(text)
        return st


# --------------------------------------------------------------------------- homes


@dataclass(frozen=True)
class Imported:
    """The outcome of ``gpg --import``."""

    ok: bool  # gpg said IMPORT_OK (it may exit 2 after a good import when it has no agent)
    fingerprints: tuple[str, ...]  # from the IMPORT_OK lines
    stderr: str


class GnupgHome:
    """A GNUPGHOME. With ``autostart`` false every gpg run gets ``--no-autostart``."""

    def __init__(self, path: Path, *, autostart: bool = False) -> None:
        self.path = path
        self.autostart = autostart

    def gpg(self, *args: str, input: bytes | None = None, timeout: float = GPG_TIMEOUT,
            pass_fds: Sequence[int] = ()) -> subprocess.CompletedProcess[bytes]:
        return run_gpg(self.path, *args, input=input, timeout=timeout,
                       autostart=self.autostart, pass_fds=pass_fds)

    def import_keys(self, data: bytes) -> Imported:
        r = self.gpg("--status-fd", "1", "--import", input=data)
        st = GpgStatus.parse(r.stdout.decode("utf-8", "replace"))
        fprs = tuple(w[2].upper() for w in st.records if w[0] == "IMPORT_OK" and len(w) > 2)
        return Imported(ok=any(w[0] == "IMPORT_OK" for w in st.records), fingerprints=fprs,
                        stderr=r.stderr.decode("utf-8", "replace"))

    def list_keys(self, *, secret: bool = False) -> list[Key]:
        """The keys of the home (`formats.gpglisting.ListingError` for a user id that is not
        UTF-8)."""
        r = self.gpg("--with-colons", "--fingerprint",
                     "--list-secret-keys" if secret else "--list-keys")
        return parse_key_listing(r.stdout)

    def verify_detached(self, payload: bytes, signature: str) -> tuple[bool, GpgStatus]:
        """``gpg --verify`` an armored detached signature over ``payload`` (any key of the home
        is trusted); (whether gpg exited 0, its status lines)."""
        fd, name = tempfile.mkstemp(suffix=".asc", dir=self.path)
        try:
            with os.fdopen(fd, "w", encoding="ascii") as f:
                f.write(signature)
            r = self.gpg("--trust-model", "always", "--status-fd", "1", "--verify", name, "-",
                         input=payload)
        finally:
            os.unlink(name)
        return r.returncode == 0, GpgStatus.parse(r.stdout.decode("utf-8", "replace"))

    def verify_cleartext(self, signed: bytes) -> tuple[bool, GpgStatus, bytes]:
        """``gpg --verify`` a clear-signed message (any key of the home is trusted); (whether
        gpg exited 0, its status lines, the signed text as gpg reads it: dash-escaping
        undone, CR LF as LF)."""
        fd, name = tempfile.mkstemp(suffix=".txt", dir=self.path)
        os.close(fd)
        try:
            r = self.gpg("--trust-model", "always", "--status-fd", "1", "--yes",
                         "--output", name, "--decrypt", "-", input=signed)
            with open(name, "rb") as f:
                text = f.read()
        finally:
            os.unlink(name)
        return (r.returncode == 0, GpgStatus.parse(r.stdout.decode("utf-8", "replace")),
                text.replace(b"\r\n", b"\n"))


class TempGnupgHome(GnupgHome):
    """A private, temporary GNUPGHOME (mode 0700, a short path under /tmp), removed on `close`.

    ``conf`` lines go into its ``gpg.conf`` (after ``no-autostart`` unless ``autostart``).
    """

    def __init__(self, prefix: str = "stampd-g", *, autostart: bool = False,
                 conf: Sequence[str] = ()) -> None:
        tmp = SHORT_TMP if os.path.isdir(SHORT_TMP) else None
        super().__init__(Path(tempfile.mkdtemp(prefix=prefix, dir=tmp)), autostart=autostart)
        try:
            os.chmod(self.path, 0o700)
            lines = [*(() if autostart else ("no-autostart",)), *conf]
            if lines:
                (self.path / "gpg.conf").write_text("".join(f"{x}\n" for x in lines))
        except BaseException:
            shutil.rmtree(self.path, ignore_errors=True)
            raise

    def __enter__(self) -> TempGnupgHome:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        if self.autostart:  # an agent may have started: it must not outlive its home
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                subprocess.run([GPGCONF, "--homedir", str(self.path), "--kill", "all"],
                               capture_output=True, timeout=30, check=False,
                               stdin=subprocess.DEVNULL)
        shutil.rmtree(self.path, ignore_errors=True)
