"""``stampd stamp FILE|DIR... [-o FILE] [--algorithm sha256|sha512]``: hash the files, have one
manifest of them stamped (``POST /v1/manifests``), check the signed answer
(`client.stamp.answers.check_manifest_answer`) with the trusted key, and only then write it
(default ``SHA256SUMS.asc``); the key is pinned as for git stamps."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from client.checksums import ALGORITHMS, FilesError, Progress, Skipped, collect, hash_files
from client.stamp.answers import check_manifest_answer
from client.stamp.errors import StampFailed, UsageError
from client.stamp.git import git
from client.stamp.remote import post_manifest, server_url
from client.stamp.trust import OpenPgpTrust, SshTrust, openpgp_trust, pin_keys, ssh_trust
from client.verify.tlog import write_publishable
from formats.manifests import Header
from formats.sshsig import SshPublicKey


@dataclass(frozen=True)
class Written:
    path: Path
    files: int
    skipped: list[Skipped]
    header: Header
    signer: str
    origin: str
    url: str
    answer: bytes  # the signed manifest as answered and written
    in_repository: bool



def _in_repository(repo: Path) -> bool:
    try:
        git(repo, "rev-parse", "--git-dir")
    except StampFailed:
        return False
    return True


def stamp_files(paths: list[Path], *, server: str | None, output: Path | None = None,
                algorithm: str = "sha256", fmt: str | None = None, key: str | None = None,
                repo: Path = Path("."), clock: Callable[[], float] = time.time) -> Written:
    """Hash the files under ``paths``, have one manifest of them stamped, check the answer and
    only then write it to ``output`` (default ``SHA256SUMS.asc``); raise a `StampFailed`."""
    if algorithm not in ALGORITHMS:
        raise UsageError(f"--algorithm must be sha256 or sha512, not {algorithm!r}")
    if fmt is None:
        fmt = "ssh" if key is not None and key.startswith("SHA256:") else "openpgp"
    if fmt == "openpgp" and key is not None and key.startswith("SHA256:"):
        raise UsageError("an SSH key fingerprint (--key SHA256:...) goes with --format ssh")
    if output is None:
        output = Path(f"{algorithm.upper()}SUMS.asc")
    if output.is_dir():
        raise UsageError(f"-o {output} is a directory")
    url = server_url(repo, server)
    try:
        files, skipped = collect(paths, exclude=output)
        size = sum(f.size for f in files)
        lines = hash_files(files, algorithm, Progress("hashing", len(files), size))
    except FilesError as e:
        raise UsageError(e.message) from None
    body = "\n".join(lines) + "\n"

    query: dict[str, str] = {}
    openpgp: bytes | None = None
    ssh: SshPublicKey | None = None
    trust: OpenPgpTrust | SshTrust
    if fmt == "ssh":
        trust = ssh_trust(repo, url, key)
        ssh = trust.key
        query = {"format": "ssh", "key": trust.key.fingerprint}
    else:
        trust = openpgp_trust(repo, url, Path(key) if key else None)
        openpgp = trust.armored
    origin = trust.origin

    asked = int(clock())
    answer = post_manifest(url, body.encode("utf-8"), query)
    manifest, signer = check_manifest_answer(
        answer, body=body, algorithm=algorithm, fmt=fmt, server=url, openpgp=openpgp, ssh=ssh,
        origin=origin, asked=asked, now=int(clock()))
    try:
        write_publishable(output, answer)
    except OSError as e:
        raise StampFailed(f"cannot write {output}: {e.strerror} (the manifest is stamped: "
                          f"GET {url.rstrip('/')}/v1/manifests/{manifest.header.serial})"
                          ) from None
    # Trust on first use, as for git stamps: the key is pinned in the repository's config (a
    # pin in any git config scope is honoured) and kept beside it; outside a repository
    # nothing is pinned.
    in_repository = _in_repository(repo)
    if in_repository:
        pin_keys(repo, trust)
    elif trust.pins:
        origin = (origin.split(", now pinned")[0] + " (not pinned: no git repository here; "
                  "give --key to trust a key you hold)")
    return Written(output, len(files), skipped, manifest.header, signer, origin, url, answer,
                   in_repository)


def report_written(res: Written) -> list[str]:
    h = res.header
    return [f"manifest:      {res.path} ({res.files} files, {h.algorithm})",
            f"time:          {h.utc} ({h.time})",
            f"key:           {res.signer} ({res.origin})",
            f"server:        {h.server} (serial {h.serial})"]

