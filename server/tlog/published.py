"""News of the published checkpoint: a call on the event loop each time the file
``<root>/checkpoint`` is replaced (`server.tlog.store.TileWriter.publish` writes it whole and
renames it into place), in whichever process of the host wrote it.

On Linux the kernel tells (inotify on the directory, its descriptor read by the event loop):
nothing runs while nothing is published. Where inotify is missing (another system, or the
host's ``fs.inotify.max_user_watches`` or ``max_user_instances`` used up), the file's identity
(inode, time, size) is looked at every `POLL` seconds instead, once for the whole process.

(Written here, 40 lines over ctypes, rather than taken from watchfiles, which uvicorn brings:
its Rust side runs in a thread of its own that wakes every ``step`` milliseconds and takes the
GIL to look for changes, in every HTTP process, all day; here nothing wakes until the kernel
has news.)
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import struct
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

POLL = 0.5  # seconds between looks without inotify
_IN_CLOSE_WRITE = 0x00000008
_IN_MOVED_TO = 0x00000080
_IN_CREATE = 0x00000100
_IN_Q_OVERFLOW = 0x00004000
_IN_IGNORED = 0x00008000
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len; then len bytes of name
_NAME = b"checkpoint"


def _inotify(directory: Path) -> int:
    """An inotify descriptor (non-blocking) watching ``directory`` for files written or
    renamed into it; OSError where there is none."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        init, add = libc.inotify_init1, libc.inotify_add_watch
    except (OSError, AttributeError) as e:
        raise OSError(f"no inotify here: {e}") from None
    fd = init(os.O_NONBLOCK | os.O_CLOEXEC)
    if fd < 0:
        raise OSError(ctypes.get_errno(), "inotify_init1")
    if add(fd, os.fsencode(directory), _IN_CLOSE_WRITE | _IN_MOVED_TO | _IN_CREATE) < 0:
        err = ctypes.get_errno()
        os.close(fd)
        raise OSError(err, f"inotify_add_watch {directory}")
    return fd


class CheckpointWatch:
    """Calls ``on_change`` (on the event loop) after ``<root>/checkpoint`` was written or
    replaced; it may call it for other reasons too (the kernel's queue overflowed), never
    fails to call it after a change. `start` on the loop, `stop` when done."""

    def __init__(self, root: Path, on_change: Callable[[], None], *,
                 poll: float = POLL) -> None:
        self.root = root
        self.on_change = on_change
        self.poll = poll
        self._fd: int | None = None
        self._task: asyncio.Task[None] | None = None
        self.kernel = False  # whether the kernel tells (else: polling)

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            self._fd = _inotify(self.root)
        except OSError as e:
            log.warning("the published checkpoint is looked at every %g s (inotify: %s)",
                        self.poll, e)
            self._task = loop.create_task(self._polling())
            return
        loop.add_reader(self._fd, self._readable)
        self.kernel = True

    def _readable(self) -> None:
        assert self._fd is not None
        changed = lost = False
        while True:
            try:
                data = os.read(self._fd, 64 * 1024)
            except BlockingIOError:
                break
            except OSError as e:  # (not seen: the descriptor is ours)
                log.warning("inotify read failed (%s): polling the checkpoint instead", e)
                self._stop_kernel()
                self._task = asyncio.get_running_loop().create_task(self._polling())
                changed = True
                break
            at = 0
            while at + _EVENT.size <= len(data):
                _, mask, _, size = _EVENT.unpack_from(data, at)
                name = data[at + _EVENT.size:at + _EVENT.size + size].rstrip(b"\0")
                at += _EVENT.size + size
                if mask & (_IN_Q_OVERFLOW | _IN_IGNORED) or name == _NAME:
                    changed = True
                lost = lost or bool(mask & _IN_IGNORED)  # the directory went: no more news
        if lost and self._fd is not None:
            log.warning("%s is gone: the published checkpoint is looked at every %g s",
                        self.root, self.poll)
            self._stop_kernel()
            self._task = asyncio.get_running_loop().create_task(self._polling())
        if changed:
            self.on_change()

    async def _polling(self) -> None:
        seen: tuple[int, int, int] | None = None
        while True:
            try:
                st = (self.root / _NAME.decode()).stat()
                now: tuple[int, int, int] | None = (st.st_ino, st.st_mtime_ns, st.st_size)
            except OSError:
                now = None
            if now != seen:
                seen = now
                self.on_change()
            await asyncio.sleep(self.poll)

    def _stop_kernel(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(Exception):
                asyncio.get_running_loop().remove_reader(self._fd)
            os.close(self._fd)
            self._fd = None
        self.kernel = False

    async def stop(self) -> None:
        self._stop_kernel()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
