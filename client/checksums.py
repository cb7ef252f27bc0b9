"""Checksum lines of local files, as ``sha256sum -b`` prints them: which files a list of paths
names, what each is called in a manifest, and hashing them with a progress line on a terminal.

Names (what ``stampd stamp FILE|DIR...`` puts in a manifest): each file is named by its path
relative to the current directory, as given (``stampd stamp dist`` names ``dist/a.tar.gz`` and
``dist/sub/b``; ``stampd stamp .`` names ``a.tar.gz``), as ``sha256sum -b`` prints them for those
arguments; ``/`` separates components. So ``sha256sum -c SHA256SUMS.asc``, ``gpg --decrypt
SHA256SUMS.asc | sha256sum -c -`` and ``stampd verify SHA256SUMS.asc --dir .`` find the files
again from the same directory. A path outside the current directory (``../x``, an absolute path
elsewhere) is refused: its name would lead outside the directory the check runs in. Entries are
sorted by the bytes of their names (``LC_ALL=C sort``). A file given twice is refused.

Inside a directory: a symlink to a regular file is hashed through the link (``sha256sum -c``
reads through it too); a symlink to a directory is not followed, and a dangling symlink, a FIFO,
a socket or a device is not read: each of these is *skipped and reported*. A path given on the
command line is followed when it is a symlink.

A name with a backslash or a newline is written with coreutils' escapes (the line starts with
``\\``; ``\\\\`` and ``\\n`` in the name). A name that a manifest cannot hold (not UTF-8, another
control character, ending in a space or tab: an OpenPGP cleartext signature does not cover
trailing white space) is refused, never dropped.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import re
import stat
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from client.errors import CommandError

ALGORITHMS = {"sha256": 64, "sha512": 128}
PROGRESS_AFTER = 1.0  # seconds before a progress line appears on a terminal
PROGRESS_EVERY = 0.2
MAX_REPORTED = 10  # names given in one message
_UNNAMEABLE = re.compile(r"[\x00-\x09\x0b-\x1f\x7f]|[ \t]$")


class FilesError(CommandError):
    """The paths given cannot be made into a manifest (unreadable, unnameable, duplicate
    names, no files at all): exit status 2."""

    exit_code = 2


@dataclass(frozen=True)
class Entry:
    name: str  # the name in the manifest (unescaped), "/" between components
    path: Path  # where to read it
    size: int


@dataclass(frozen=True)
class Skipped:
    path: Path
    why: str


def escape(name: str) -> tuple[str, str]:
    """(line prefix, name) as coreutils writes them: ``\\`` and the escaped name when the name
    holds a backslash or a newline."""
    if "\\" not in name and "\n" not in name:
        return "", name
    return "\\", name.replace("\\", "\\\\").replace("\n", "\\n")


def unescape(name: str) -> str:
    """The name of an escaped line (``\\\\`` and ``\\n``, as ``sha256sum -c`` reads them)."""
    return re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), name)


def checksum_line(digest: str, name: str) -> str:
    """``<hex> *<name>`` (binary mode), escaped as coreutils does, without the newline."""
    prefix, escaped = escape(name)
    return f"{prefix}{digest} *{escaped}"


_LINE = re.compile(r"(\\?)(?:([0-9a-f]+)(?: [ *](.*))?|SHA(?:256|512) \((.*)\) = ([0-9a-f]+))")


def parse_line(line: str) -> tuple[str, str | None]:
    """(digest, name or None) of a checksum line the server accepted (see
    `formats.manifests`); names are unescaped."""
    m = _LINE.fullmatch(line)
    if not m:
        raise ValueError(f"not a checksum line: {line[:100]!r}")
    escaped, digest, name = m.group(1), m.group(2) or m.group(5), m.group(3) or m.group(4)
    if name is not None and escaped:
        name = unescape(name)
    return digest, name


def _nameable(name: str) -> str | None:
    """Why ``name`` cannot be in a manifest, or None."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return "not UTF-8"
    if _UNNAMEABLE.search(name):
        return "a control character other than newline, or a trailing space or tab"
    return None


def _walk(top: Path, prefix: str, exclude: tuple[int, int] | None, files: list[Entry],
          skipped: list[Skipped]) -> None:
    try:
        with os.scandir(top) as it:
            items = list(it)
    except OSError as e:
        raise FilesError(f"cannot read directory {top}: {e.strerror}") from None
    for item in items:
        path, name = Path(item.path), prefix + item.name
        try:
            st = item.stat(follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                try:
                    st = item.stat(follow_symlinks=True)
                except OSError:
                    skipped.append(Skipped(path, "dangling symlink"))
                    continue
                if stat.S_ISDIR(st.st_mode):
                    skipped.append(Skipped(path, "symlink to a directory (not followed)"))
                    continue
        except OSError as e:
            raise FilesError(f"cannot read {path}: {e.strerror}") from None
        if stat.S_ISDIR(st.st_mode):
            _walk(path, name + "/", exclude, files, skipped)
        elif stat.S_ISREG(st.st_mode):
            if (st.st_dev, st.st_ino) != exclude:
                files.append(Entry(name, path, st.st_size))
        else:
            skipped.append(Skipped(path, "not a regular file (FIFO, socket or device)"))


def _name_here(path: Path, cwd: str) -> str:
    """The name of ``path`` relative to ``cwd`` ("" for ``cwd`` itself); `FilesError` for a
    path outside it."""
    rel = os.path.relpath(os.path.abspath(path), cwd)
    if rel == os.curdir:
        return ""
    if rel == os.pardir or rel.startswith(os.pardir + os.sep):
        raise FilesError(f"{path} is outside the current directory (the manifest names files "
                         f"relative to it): run stampd stamp from a directory above {path}")
    return rel.replace(os.sep, "/")


def collect(paths: Iterable[Path], exclude: Path | None = None
            ) -> tuple[list[Entry], list[Skipped]]:
    """The regular files under ``paths`` with their manifest names (relative to the current
    directory), sorted by name, and what was skipped. ``exclude`` (the manifest being written)
    is left out wherever it lies. Raises `FilesError`."""
    here = os.getcwd()
    excluded = None
    if exclude is not None:
        try:
            st = exclude.stat()
            excluded = (st.st_dev, st.st_ino)
        except OSError:
            pass
    files: list[Entry] = []
    skipped: list[Skipped] = []
    for path in paths:
        name = _name_here(path, here)
        try:
            st = path.stat()
        except OSError as e:
            raise FilesError(f"cannot read {path}: {e.strerror}") from None
        if stat.S_ISDIR(st.st_mode):
            _walk(path, name + "/" if name else "", excluded, files, skipped)
        elif stat.S_ISREG(st.st_mode):
            if (st.st_dev, st.st_ino) == excluded:
                raise FilesError(f"{path} is the manifest being written: give another -o")
            files.append(Entry(name, path, st.st_size))
        else:
            raise FilesError(f"{path} is neither a regular file nor a directory")
    bad = [(e.path, why) for e in files if (why := _nameable(e.name)) is not None]
    if bad:
        shown = "; ".join(f"{os.fsdecode(p)!r}: {why}" for p, why in bad[:MAX_REPORTED])
        raise FilesError(f"{len(bad)} file name(s) cannot be put in a manifest ({shown}); "
                         "rename them or leave them out")
    files.sort(key=lambda e: e.name.encode("utf-8"))
    dupes = [a.name for a, b in itertools.pairwise(files) if a.name == b.name]
    if dupes:
        raise FilesError(f"{dupes[0]!r} is given twice ({len(dupes)} such file(s)): give "
                         "each file or directory once")
    if not files:
        raise FilesError("no regular files to stamp")
    return files, skipped


class Progress:
    """``hashing: N/M files, X MiB (P%)`` on stderr, rewritten in place, only on a terminal
    and only once a run has taken more than `PROGRESS_AFTER` seconds; cleared at the end."""

    def __init__(self, verb: str, files: int, size: int = 0, stream: TextIO | None = None
                 ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = self.stream.isatty()
        self.verb, self.files, self.size = verb, files, size
        self.started = self.last = time.monotonic()
        self.shown = False

    def update(self, done: int, done_size: int = 0) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self.started < PROGRESS_AFTER or now - self.last < PROGRESS_EVERY:
            return
        self.last = now
        mib = 1 << 20
        if self.size:
            amount = f", {done_size / mib:.0f}/{self.size / mib:.0f} MiB"
            percent = 100 * done_size // self.size
        else:
            amount, percent = "", 100 * done // max(self.files, 1)
        self.stream.write(f"\r{self.verb}: {done}/{self.files} files{amount} ({percent}%)"
                          "\x1b[K")
        self.stream.flush()
        self.shown = True

    def close(self) -> None:
        if self.shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()


def file_digest(path: Path, algorithm: str) -> str:
    """The hex digest of a file; `OSError` when it cannot be read."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, algorithm).hexdigest()


def hash_files(files: list[Entry], algorithm: str, progress: Progress | None = None
               ) -> list[str]:
    """The manifest lines (binary mode) of ``files``; `FilesError` for an unreadable one."""
    lines = []
    done_size = 0
    try:
        for i, entry in enumerate(files):
            try:
                digest = file_digest(entry.path, algorithm)
            except OSError as e:
                raise FilesError(f"cannot read {entry.path}: {e.strerror}") from None
            lines.append(checksum_line(digest, entry.name))
            done_size += entry.size
            if progress is not None:
                progress.update(i + 1, done_size)
    finally:
        if progress is not None:
            progress.close()
    return lines
