"""The public log: a bare git repository written with pygit2.

Each log commit on ``refs/heads/main`` holds ``hashes.log`` (the period's stamped git object
ids, sorted and unique, one per line), ``pubkey.asc`` (the server's public key) and, when the
period had digest stamps, ``digests.log`` (``<algorithm> <hex>`` lines, sorted and unique). The
commit object itself is built and signed by a worker; this module only stores it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from pathlib import Path

import pygit2
from pygit2.enums import FileMode, ObjectType, Option, SortMode

MAIN = "refs/heads/main"

_fsync_lock = threading.Lock()
_fsync_on = False


def _enable_fsync() -> None:
    global _fsync_on
    with _fsync_lock:
        if not _fsync_on:
            pygit2.option(Option.ENABLE_FSYNC_GITDIR, True)
            _fsync_on = True


def hashes_log(hashes: Iterable[str]) -> bytes:
    return "".join(f"{h}\n" for h in sorted(set(hashes))).encode("ascii")


class LogRepository:
    def __init__(self, path: Path) -> None:
        _enable_fsync()
        self.path = path
        if (path / "HEAD").exists():
            self.repo = pygit2.Repository(str(path))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            self.repo = pygit2.init_repository(str(path), bare=True, initial_head="main")
            self.repo.config["core.logAllRefUpdates"] = "true"

    def head(self) -> str | None:
        try:
            return str(self.repo.references[MAIN].target)
        except KeyError:
            return None

    def tree(self, hashes: Iterable[str], pubkey: str, digests: Iterable[str] = (),
             peer_keys: Mapping[str, str] | None = None,
             keys: Mapping[str, str] | None = None) -> str:
        """``keys``: further files of the server's own keys (``keys/<name>`` and
        ``allowed_signers``), by path."""
        builder = self.repo.TreeBuilder()
        subtrees: dict[str, dict[str, str]] = {}
        for path, content in sorted((keys or {}).items()):
            top, _, name = path.partition("/")
            if name:
                subtrees.setdefault(top, {})[name] = content
            else:
                builder.insert(top, self.repo.create_blob(content.encode()), FileMode.BLOB)
        for top, files in subtrees.items():
            sub = self.repo.TreeBuilder()
            for name, content in files.items():
                sub.insert(name, self.repo.create_blob(content.encode()), FileMode.BLOB)
            builder.insert(top, sub.write(), FileMode.TREE)
        if peer_keys:
            peers = self.repo.TreeBuilder()
            for name, armored in sorted(peer_keys.items()):
                peers.insert(f"{name}.asc", self.repo.create_blob(armored.encode()),
                             FileMode.BLOB)
            builder.insert("peers", peers.write(), FileMode.TREE)
        builder.insert("hashes.log", self.repo.create_blob(hashes_log(hashes)), FileMode.BLOB)
        digest_lines = hashes_log(digests)
        if digest_lines:
            builder.insert("digests.log", self.repo.create_blob(digest_lines), FileMode.BLOB)
        builder.insert("pubkey.asc", self.repo.create_blob(pubkey.encode()), FileMode.BLOB)
        return str(builder.write())

    def store_commit(self, raw: bytes, expected_parent: str | None) -> str:
        """Write a signed commit object and advance main to it (compare-and-swap)."""
        oid = self.repo.odb.write(ObjectType.COMMIT, raw)
        commit = self.repo[oid]
        assert isinstance(commit, pygit2.Commit)
        parents = [str(p) for p in commit.parent_ids]
        if parents != ([expected_parent] if expected_parent else []):
            raise ValueError(f"log commit {oid} has parents {parents}, expected {expected_parent}")
        if expected_parent is None:
            self.repo.references.create(MAIN, oid, force=False)
        else:
            ref = self.repo.references[MAIN]
            if str(ref.target) != expected_parent:
                raise ValueError("log main branch moved while committing")
            ref.set_target(oid, "stampd log commit")
        return str(oid)

    def branch_head(self, branch: str) -> str | None:
        try:
            return str(self.repo.references[f"refs/heads/{branch}"].target)
        except KeyError:
            return None

    def commit_tree(self, commit_id: str) -> str:
        commit = self.repo[commit_id]
        assert isinstance(commit, pygit2.Commit)
        return str(commit.tree_id)

    def store_on_branch(self, raw: bytes, branch: str, expected_old: str | None) -> str:
        """Write a commit object and point ``branch`` at it, if the branch is still at
        ``expected_old`` (None: the branch must not exist)."""
        oid = self.repo.odb.write(ObjectType.COMMIT, raw)
        name = f"refs/heads/{branch}"
        if expected_old is None:
            self.repo.references.create(name, oid, force=False)
        else:
            ref = self.repo.references[name]
            if str(ref.target) != expected_old:
                raise ValueError(f"branch {branch} moved while stamping")
            ref.set_target(oid, "stampd cross-stamp")
        return str(oid)

    def refs(self) -> list[tuple[str, str]]:
        """(object id, ref name) of every branch and tag, sorted by name (for info/refs)."""
        out = []
        for name in self.repo.references:
            if name.startswith(("refs/heads/", "refs/tags/")):
                out.append((str(self.repo.references[name].resolve().target), name))
        return sorted(out, key=lambda r: r[1])

    def recent(self, n: int) -> list[tuple[str, int, str]]:
        """(id, commit time, first message line) of the newest ``n`` commits on main."""
        head = self.head()
        if head is None:
            return []
        out = []
        for commit in self.repo.walk(head, SortMode.TOPOLOGICAL):
            out.append((str(commit.id), commit.commit_time, commit.message.split("\n")[0]))
            if len(out) >= n:
                break
        return out

    def has(self, oid: str) -> bool:
        return oid in self.repo

    def write_raw_commit(self, raw: bytes) -> str:
        return str(self.repo.odb.write(ObjectType.COMMIT, raw))

    def force_main(self, oid: str) -> None:
        self.repo.references.create(MAIN, oid, force=True)

    def message(self, commit_id: str) -> str:
        commit = self.repo[commit_id]
        assert isinstance(commit, pygit2.Commit)
        return commit.message
