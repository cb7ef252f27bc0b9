"""The git stamps in a repository that prove when its commits existed at the latest.

A branch stamp (a commit on a timestamp branch, whose last parent is the commit stamped) or a
tag stamp (a signed tag of a commit) proves that the commit it stamps existed when the server
signed it -- and with it every commit of its history, which the stamped commit's id commits
to. So a commit's **earliest stamp** is the earliest of the stamps of the commit itself and of
all its descendants; `earliest_stamps` finds it for every commit asked about in one walk of
the history (``git rev-list --topo-order --parents``), whatever their number.

**Where stamps are looked for.** Timestamp branches: ``stampd.branch`` (the hook's) and every
branch named ``*-timestamps`` (``git timestamp``'s and stampd's names), local or
remote-tracking (a CI clone has ``origin/...``), each walked along its first parents while its
commits are merges (the oldest stamp has one parent); and every annotated tag that tags a
commit and is signed. Only those whose tagger/committer is the user id of a trusted server key
count (when OpenPGP keys are trusted), and only those whose signature verifies with a trusted
key (`verify_stamps`: OpenPGP stamps batched through one ``gpg --verify-files`` per 200, SSH
stamps each through ``ssh-keygen -Y verify``, several at a time). A stamp that does not verify
is passed over: the next earliest is taken.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from client.gpg import GpgError, TempGpgHome
from client.verify.errors import CannotCheck, Invalid, Malformed, Unsupported, VerifyError
from client.verify.gitread import (
    config,
    first_parent_chain,
    parents_graph,
    read_objects,
    refs,
)
from client.verify.gitstamp import describe_git_object
from client.verify.keys import KEYRING_PREFIX, read_key_file, ssh_keys_from
from client.verify.trust import Trusted, repository_keys
from formats.gitobjects import SHA1, split_signed
from formats.gpgstatus import SignatureTally, ValidSig
from formats.openpgp import dearmor_signature, signed_message
from formats.sshsig import SshPublicKey

TIMESTAMP_SUFFIX = "-timestamps"
GPG_BATCH = 200
_GOOD_SSH = re.compile(r'Good "git" signature for \S+ with \S+ key (SHA256:[A-Za-z0-9+/=]+)')


@dataclass(frozen=True)
class GitStamp:
    """A stamp object found in the repository, not yet verified."""

    kind: str  # "branch" or "tag"
    oid: str
    ref: str  # where it was found
    stamped: str  # the commit it stamps
    time: int  # its tagger/committer time: the signature's
    signer: str  # its tagger/committer user id
    fmt: str  # "openpgp" or "ssh"
    payload: bytes
    signature: bytes

    def describe(self) -> str:
        where = self.ref.removeprefix("refs/heads/").removeprefix("refs/")
        return f"{self.kind} stamp {self.oid[:12]} ({where})"


@dataclass(frozen=True)
class VerifiedStamp:
    stamp: GitStamp
    signature: ValidSig  # (SSH: the fingerprint as both keys, the stamp's time as created)
    key_origin: str


def timestamp_branches(repo: Path) -> list[str]:
    """The refs of the timestamp branches: ``stampd.branch`` and ``*-timestamps``, local and
    remote-tracking."""
    named = config(repo, "stampd.branch")
    found = []
    for ref, _, kind in refs(repo, "refs/heads", "refs/remotes"):
        if kind != "commit":
            continue
        short = ref.split("/", 3)[-1] if ref.startswith("refs/remotes/") else \
            ref.removeprefix("refs/heads/")
        if short.endswith(TIMESTAMP_SUFFIX) or (named is not None and short == named):
            found.append(ref)
    return found


def _stamp_of(kind: str, oid: str, ref: str, body: bytes, object_format: str
              ) -> GitStamp | None:
    """The stamp an object is, or None when it is no signed tag or commit of a commit."""
    try:
        obj = describe_git_object(kind, body.decode("utf-8", "replace"))
    except (Malformed, Invalid, Unsupported):
        return None
    payload, signature, count = split_signed(kind, body, object_format)
    if signature is None or count != 1 or not obj.stamped:
        return None
    return GitStamp("tag" if kind == "tag" else "branch", oid, ref, obj.stamped, obj.time,
                    obj.signer, obj.signature, payload, signature)


def find_git_stamps(repo: Path, object_format: str = SHA1, uids: set[str] | None = None
                    ) -> list[GitStamp]:
    """Every branch and tag stamp of the repository (see the module docstring) whose signer is
    one of ``uids`` (None: any)."""
    chain: dict[str, str] = {}  # stamp commit -> the ref it was found on
    for ref in timestamp_branches(repo):
        for ids in first_parent_chain(repo, ref):
            if ids[0] in chain:
                break  # (another ref's chain, seen already)
            chain[ids[0]] = ref
            if len(ids) < 3:  # the oldest stamp: one parent, the commit it stamps
                break
    tags = {oid: ref for ref, oid, kind in refs(repo, "refs/tags") if kind == "tag"}
    objects = read_objects(repo, [*chain, *tags])
    stamps = []
    for oid, (kind, body) in objects.items():
        if kind not in ("tag", "commit"):
            continue
        stamp = _stamp_of(kind, oid, chain.get(oid) or tags[oid], body, object_format)
        if stamp is None or (kind == "tag" and b"\ntype commit\n" not in body[:200]):
            continue
        if kind == "commit" and oid in chain:
            parents = [line[7:].decode() for line in body.split(b"\n\n", 1)[0].split(b"\n")
                       if line.startswith(b"parent ")]
            if not parents or parents[-1] != stamp.stamped:
                continue
        if uids is None or stamp.signer in uids:
            stamps.append(stamp)
    return stamps


# --------------------------------------------------------------------------- the earliest


def earliest_stamps(repo: Path, targets: Sequence[str], exclude: Iterable[str],
                    stamps: Sequence[GitStamp],
                    verify: Callable[[list[GitStamp]], dict[str, VerifiedStamp | str]]
                    ) -> tuple[dict[str, VerifiedStamp | None], dict[str, str], set[str]]:
    """({target commit: its earliest verified stamp, or None}, {stamp id: why it was passed
    over}, the targets that stamps cover of which none verifies) for commits ``targets``, none
    of whose stamps can be reached from ``exclude`` (the range's exclusions, or the target's
    parents). ``verify`` checks a list of stamps; only the earliest candidates are given to it,
    and again the next ones for those that fail."""
    by_commit: dict[str, list[GitStamp]] = {}
    for s in stamps:
        by_commit.setdefault(s.stamped, []).append(s)
    graph = parents_graph(repo, by_commit, exclude)
    alive = {s.oid: s for s in stamps}
    verified: dict[str, VerifiedStamp] = {}
    failed: dict[str, str] = {}
    wanted = set(targets)
    covered: set[str] | None = None
    while True:
        best: dict[str, tuple[int, str]] = {}
        for commit, own in by_commit.items():
            times = [(s.time, s.oid) for s in own if s.oid in alive]
            if times:
                best[commit] = min(times)
        for commit, parents in graph:  # children before parents
            mine = best.get(commit)
            if mine is None:
                continue
            for p in parents:
                if p not in best or mine < best[p]:
                    best[p] = mine
        if covered is None:
            covered = {t for t in wanted if t in best}
        needed = {best[t][1] for t in wanted if t in best} - set(verified)
        if not needed:
            break
        results = verify([alive[oid] for oid in sorted(needed)])
        for oid in needed:
            result = results.get(oid, "not checked")
            if isinstance(result, VerifiedStamp):
                verified[oid] = result
            else:
                failed[oid] = result
                del alive[oid]
    found = {t: verified[best[t][1]] if t in best else None for t in targets}
    return found, failed, {t for t in covered or () if found[t] is None}


# --------------------------------------------------------------------------- verifying


@dataclass
class StampKeys:
    """The server keys stamps are checked with: ``--key`` (an armored OpenPGP key, or an SSH
    .pub or allowed-signers file), else those pinned in the repository, each format loaded
    when first needed."""

    repo: Path
    key_file: Path | None
    _openpgp: Trusted | str | None = None
    _ssh: Trusted | str | None = None

    def _from_file(self, fmt: str) -> Trusted | str:
        assert self.key_file is not None
        data = read_key_file(self.key_file)
        if b"-----BEGIN PGP PUBLIC KEY BLOCK-----" in data or data[:1] in (b"\x99", b"\xc6"):
            if fmt == "openpgp":
                return Trusted(data, (), f"key file {self.key_file}")
        elif fmt == "ssh":
            keys = tuple(ssh_keys_from(data.decode("ascii", "replace")))
            if keys:
                return Trusted(None, keys, f"key file {self.key_file}")
        what = "an OpenPGP key" if fmt == "openpgp" else "an SSH key"
        return f"--key {self.key_file} holds no {what}"

    def get(self, fmt: str) -> Trusted | str:
        """The trusted keys of ``fmt``, or why there are none."""
        cached = self._openpgp if fmt == "openpgp" else self._ssh
        if cached is None:
            if self.key_file is not None:
                cached = self._from_file(fmt)
            else:
                try:
                    cached = repository_keys(fmt, self.repo)
                except VerifyError as e:  # (Usage: none pinned)
                    cached = e.message
            if fmt == "openpgp":
                self._openpgp = cached
            else:
                self._ssh = cached
        return cached

    def uids(self) -> set[str] | None:
        """The user ids of the trusted OpenPGP keys: a stamp's tagger or committer is one of
        them (SSH stamps too carry the OpenPGP key's user id); None when no OpenPGP key is
        trusted (then any signer is looked at)."""
        trusted = self.get("openpgp")
        if isinstance(trusted, str) or trusted.openpgp is None:
            return None
        try:
            with TempGpgHome(KEYRING_PREFIX) as home:
                home.import_keys(trusted.openpgp)
                return {uid for key in home.list_keys() for uid in key.uids}
        except GpgError as e:
            raise CannotCheck(e.message) from None


def _segments(status: str) -> list[SignatureTally]:
    """The status lines of a ``gpg --verify-files`` run, one tally per ``NEWSIG``."""
    tallies: list[SignatureTally] = []
    for line in status.splitlines():
        if not line.startswith("[GNUPG:] "):
            continue
        words = line[9:].split()
        if not words:
            continue
        if words[0] == "NEWSIG":
            tallies.append(SignatureTally())
        if tallies:
            tallies[-1].add(words[0], words[1:])
    return tallies


def gpg_verify_many(home: TempGpgHome, items: Sequence[tuple[bytes, bytes]]
                    ) -> list[SignatureTally | None]:
    """Each (payload, armored detached signature) checked by gpg in ``home``: its tally (one
    signature's status lines), None when the signature could not even be read. One
    ``gpg --verify-files`` per `GPG_BATCH`, as many at once as there are cores (they only read
    the keyring); a batch whose signatures gpg does not report one each (a block of several
    signatures, an unreadable one) is checked again one by one."""
    def batch(start: int) -> list[SignatureTally | None]:
        chunk = items[start:start + GPG_BATCH]
        files = []
        for i, (payload, signature) in enumerate(chunk):
            try:
                packets = dearmor_signature(signature.decode("ascii", "replace"))
            except ValueError:
                packets = b""
            path = Path(tmp) / f"{start + i}.gpg"
            path.write_bytes(signed_message(payload, packets) if packets else b"")
            files.append(path)
        _, status = home.verify_files(files)
        tallies = _segments(status)
        if len(tallies) == len(chunk):
            return list(tallies)
        out: list[SignatureTally | None] = []
        for path in files:  # one by one: who has several signatures, or none
            _, status = home.verify_files([path])
            one = _segments(status)
            out.append(one[0] if len(one) == 1 else None)
        return out

    with tempfile.TemporaryDirectory(prefix="stampd-vf", dir=home.path) as tmp, \
            ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        batches = pool.map(batch, range(0, len(items), GPG_BATCH))
        return [tally for b in batches for tally in b]


def _ssh_verify_stamp(stamp: GitStamp, signers: Path, keys: Sequence[SshPublicKey]
                      ) -> str | None:
    """The fingerprint of the trusted key whose good signature the SSH stamp carries; None if
    it has none."""
    with tempfile.TemporaryDirectory(prefix=KEYRING_PREFIX) as tmp:
        sig = Path(tmp) / "stamp.sig"
        sig.write_bytes(stamp.signature)
        for i, _ in enumerate(keys):
            try:
                r = subprocess.run(["ssh-keygen", "-Y", "verify", "-n", "git", "-f",
                                    str(signers), "-I", f"stamp-{i}@stampd", "-s", str(sig)],
                                   input=stamp.payload, capture_output=True, timeout=300,
                                   check=False)
            except FileNotFoundError:
                raise CannotCheck("ssh-keygen is not installed (OpenSSH 8.2 or later)") \
                    from None
            good = _GOOD_SSH.findall(r.stdout.decode("utf-8", "replace"))
            if r.returncode == 0 and len(good) == 1:
                return str(good[0])
    return None


def verify_stamps(keys: StampKeys, stamps: Sequence[GitStamp]) -> dict[str, VerifiedStamp | str]:
    """{stamp id: the verified stamp, or why it does not verify} with the trusted keys: an
    OpenPGP stamp's one binary signature by a trusted key, made in its tagger/committer second;
    an SSH stamp's by a trusted SSH key (namespace git; it carries no time: the
    tagger/committer time it covers is the stamp's)."""
    out: dict[str, VerifiedStamp | str] = {}
    pgp = [s for s in stamps if s.fmt == "openpgp"]
    ssh = [s for s in stamps if s.fmt == "ssh"]
    if pgp:
        trusted = keys.get("openpgp")
        if isinstance(trusted, str) or trusted.openpgp is None:
            reason = trusted if isinstance(trusted, str) else "no OpenPGP server key"
            out.update({s.oid: f"not checked: {reason}" for s in pgp})
        else:
            try:
                with TempGpgHome(KEYRING_PREFIX) as home:
                    home.import_keys(trusted.openpgp)
                    pinned = {f for k in home.list_keys() for f in k.fingerprints}
                    tallies = gpg_verify_many(home, [(s.payload, s.signature) for s in pgp])
            except GpgError as e:
                raise CannotCheck(e.message) from None
            for s, tally in zip(pgp, tallies, strict=True):
                out[s.oid] = _judge_openpgp(s, tally, pinned, trusted.origin)
    if ssh:
        trusted = keys.get("ssh")
        if isinstance(trusted, str) or not trusted.ssh:
            reason = trusted if isinstance(trusted, str) else "no SSH server key"
            out.update({s.oid: f"not checked: {reason}" for s in ssh})
        else:
            origin, ssh_keys = trusted.origin, trusted.ssh
            with tempfile.TemporaryDirectory(prefix=KEYRING_PREFIX) as tmp:
                signers = Path(tmp) / "allowed_signers"
                signers.write_text("".join(f'stamp-{i}@stampd namespaces="git" '
                                           f"{k.to_line(comment=False)}\n"
                                           for i, k in enumerate(ssh_keys)), encoding="ascii")
                with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
                    found = list(pool.map(lambda s: _ssh_verify_stamp(s, signers, ssh_keys),
                                          ssh))
            for s, fpr in zip(ssh, found, strict=True):
                if fpr is None:
                    out[s.oid] = f"the SSH signature does not verify with a key of the {origin}"
                else:
                    out[s.oid] = VerifiedStamp(s, ValidSig(fpr, s.time, "ssh", fpr), origin)
    return out


def _judge_openpgp(s: GitStamp, tally: SignatureTally | None, pinned: set[str], origin: str
                   ) -> VerifiedStamp | str:
    if tally is None or tally.newsig != 1:
        return "not exactly one OpenPGP signature"
    if len(tally.valid_sigs) != 1 or tally.errors:
        reason = ", ".join(sorted(set(tally.errors))) or "no valid signature"
        return f"the signature does not verify with a key of the {origin} ({reason})"
    sig = tally.valid_sigs[0]
    if sig.primary not in pinned:
        return f"signed by {sig.primary}, which is not in the {origin}"
    if sig.sig_class != "00":
        return f"signature class {sig.sig_class} is not a binary signature (00)"
    if sig.created != s.time:
        return f"signature made at {sig.created}, but the {s.kind} stamp says {s.time}"
    return VerifiedStamp(s, sig, origin)
