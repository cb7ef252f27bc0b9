"""The data directory: made private, and held by one `stampd serve` and one worker pool at a
time (`DataDirLock`)."""

from __future__ import annotations

import os
from pathlib import Path

from server.errors import CommandFailed
from server.settings import Settings


def make_data_dir(settings: Settings) -> None:
    """The data directory, made private (0700) if it does not exist yet: it holds the secret
    keys, the journal and the workers' homes (the systemd units make it 0700 too). Its parents
    are made as the umask says; a data directory that exists is left as it is."""
    settings.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)


SERVE_LOCK = "serve.lock"  # in run/: held by the one `stampd serve` of a data directory
WORKERS_LOCK = "workers.lock"  # in run/: held by whichever runs its workers (serve or worker)


class DataDirLock:
    """An exclusive ``flock`` on ``<data_dir>/run/<name>``, held for as long as the process
    lives (the kernel frees it when the process dies, however it dies; the descriptor is
    close-on-exec, and a forked child closes it, so no child inherits it), with the holder's
    PID and command in the file.

    One `stampd serve` per data directory (`SERVE_LOCK`): a second would send its workers to
    the first one's dispatch socket and delete that socket when it exits. One worker pool per
    data directory (`WORKERS_LOCK`): `stampd serve` with workers, or `stampd worker` beside a
    `stampd serve --no-workers`."""

    held: set[DataDirLock] = set()  # (the locks this process holds; see _drop_in_child)

    def __init__(self, run_dir: Path, name: str, holder: str) -> None:
        self.path = run_dir / name
        self.holder = holder
        self.fd: int | None = None

    def acquire(self, create: bool = True) -> None:
        """Take the lock, or raise `CommandFailed` naming the process that holds it. With
        ``create`` false, nothing is made: where the lock file does not exist (no server ever
        ran here), nothing is taken either (take it later, when the data directory may be
        made)."""
        import fcntl

        if self.fd is not None:
            return
        if create:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT if create else 0),
                         0o600)
        except FileNotFoundError:
            if create:
                raise
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            held = os.pread(fd, 200, 0).decode("utf-8", "replace").split()
            os.close(fd)
            pid = held[0] if held and held[0].isdigit() else "unknown"
            raise CommandFailed(
                f"{' '.join(held[1:]) or 'another stampd'} (pid {pid}) is running on data "
                f"directory {self.path.parent.parent}: stop it first, or give this one another "
                "--data-dir") from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {self.holder}\n".encode(), 0)
        self.fd = fd
        DataDirLock.held.add(self)

    def release(self) -> None:
        DataDirLock.held.discard(self)
        if self.fd is not None:
            os.close(self.fd)  # (frees the lock)
            self.fd = None

    @classmethod
    def _drop_in_child(cls) -> None:
        """In a child forked from a holder (the HTTP manager): close the inherited
        descriptors, or the lock would outlive the holder as long as the child."""
        for lock in cls.held:
            if lock.fd is not None:
                os.close(lock.fd)
                lock.fd = None
        cls.held.clear()


os.register_at_fork(after_in_child=DataDirLock._drop_in_child)
