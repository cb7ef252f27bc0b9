"""After a stamp is stored: the server's transparency-log key pinned beside its signing key, and
the stamp's proof of inclusion fetched, checked and kept (`client.verify.tlog`).

The log key (``GET /tlog/vkey``) is pinned on first use in git config as
``timestamper.<server>.tlogkey``, next to the server key's ``timestamper.<server>.keyid``; a
later key that is not the pinned one is reported and no proof is kept. The proof
(``GET /v1/proofs/<serial>?wait=`` or ``/v1/proofs/git/<object id>?wait=``) is checked against
the stamp just stored and the log key, then kept beside the manifest as
``<manifest>.tlog-proof``, or as a note on the git stamp object under
``refs/notes/stampd-tlog``.

None of this can fail a stamp: a server without a log, a proof not ready in time or refused is
one line for standard error (`ProofOutcome.note`), and the stamp stands.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from client.stamp.errors import StampFailed
from client.stamp.git import git, git_config
from client.verify.errors import CannotCheck, Invalid, Malformed
from client.verify.tlog import (
    MAX_WAIT,
    Held,
    ProofUnavailable,
    check_proof,
    cosignature_count,
    fetch_policy,
    fetch_proof,
    fetch_vkey,
    pin_variable,
    proof_path,
    report_line,
    store_proof_note,
    witnessed_by,
    witnessed_line,
    write_publishable,
)
from formats.tlog.policy import Policy

MAX_QUORUM_WAIT = 120  # seconds --quorum-wait may ask for
POLL = 0.5  # seconds between looks at the proof while waiting for the witnesses


@dataclass(frozen=True)
class ProofOutcome:
    line: str | None = None  # the report line: where the proof is kept, index and size
    note: str | None = None  # why there is none, for standard error
    witnessed: str | None = None  # the witnesses' line, when a quorum was waited for


def obtain_proof(repo: Path, server: str, held: Held, wait: int, *, in_repository: bool,
                 serial: int | None = None, object_id: str | None = None,
                 file: Path | None = None, quorum_wait: int = 0,
                 policy: Policy | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> ProofOutcome:
    """Pin the log key and keep the proof of the stamp ``held`` (a manifest written to
    ``file``, by ``serial``; or a git stamp ``object_id`` in ``repo``); with ``quorum_wait``,
    wait up to that many seconds for the proof to carry the cosignatures of a quorum of
    witnesses (of ``policy``, else the server's ``GET /tlog/policy`` for the pinned log key).
    Never raises."""
    later = (f"stampd verify --fetch-proof {file}" if file is not None else
             f"stampd verify --fetch-proof --key KEYFILE {object_id}")
    try:
        vkey = fetch_vkey(server)
    except ProofUnavailable as e:
        return ProofOutcome(note=f"{e.message}: no log proof")
    except (CannotCheck, Malformed) as e:
        return ProofOutcome(note=f"no log proof: {e.message}")
    variable = pin_variable(server)
    pinned = git_config(repo, variable) if in_repository else None
    if pinned is not None and pinned.strip() != vkey:
        return ProofOutcome(note=f"the log key of {server} is {vkey}, not the pinned {pinned} "
                            f"(git config {variable}): no log proof kept; if you trust the new "
                            f"key, remove the pin with git config --unset {variable}")
    pin_note = ""
    if pinned is None and in_repository:
        try:
            git(repo, "config", "--local", variable, vkey)
            pin_note = f", now pinned as {variable}"
        except StampFailed as e:
            return ProofOutcome(note=f"cannot pin the log key: {e.message}")
    elif pinned is None:
        pin_note = ", not pinned: no git repository here"
    else:
        pin_note = f", pinned as {variable}"
    if wait <= 0:
        return ProofOutcome(note=f"log proof not fetched (--proof-wait 0); later: {later}")
    try:
        proof = fetch_proof(server, serial=serial, object_id=object_id,
                            wait=min(wait, MAX_WAIT))
    except ProofUnavailable as e:
        if e.pending:
            return ProofOutcome(note=f"the log proof was not ready within {wait} s; "
                                f"later: {later}")
        return ProofOutcome(note=f"no log proof: {e.message}")
    except CannotCheck as e:
        return ProofOutcome(note=f"no log proof: {e.message}; later: {later}")
    where = str(proof_path(file)) if file is not None else \
        f"note on {object_id} (refs/notes/stampd-tlog)"
    witnessed = None
    quorum_note = None
    if quorum_wait > 0:
        proof, witnessed, quorum_note = _await_quorum(
            server, vkey, proof, held, policy, quorum_wait, clock, sleep,
            serial=serial, object_id=object_id, later=later)
    try:
        proven = check_proof(proof, held, [vkey], source=f"of {server}")
        if file is not None:
            write_publishable(proof_path(file), proof)
        elif object_id is not None:
            store_proof_note(repo, object_id, proof)
    except (Invalid, Malformed) as e:
        return ProofOutcome(note=f"the server's log proof was refused, not kept: {e.message}")
    except CannotCheck as e:
        return ProofOutcome(note=f"cannot keep the log proof: {e.message}")
    except OSError as e:
        return ProofOutcome(note=f"cannot write {where}: {e.strerror}")
    origin = f"log key of {server}{pin_note}"
    return ProofOutcome(line=f"log:           {report_line(proven, origin)}; proof {where}",
                        witnessed=witnessed, note=quorum_note)


def _await_quorum(server: str, vkey: str, proof: bytes, held: Held, policy: Policy | None,
                  wait: int, clock: Callable[[], float], sleep: Callable[[float], None], *,
                  serial: int | None, object_id: str | None, later: str
                  ) -> tuple[bytes, str | None, str | None]:
    """(the best proof seen, the witnesses' line when the quorum held, a note otherwise):
    the proof fetched again every `POLL` s until a quorum of witnesses cosigned its checkpoint
    or ``wait`` seconds passed."""
    if policy is None:
        try:
            policy = fetch_policy(server)
        except (CannotCheck, Malformed) as e:
            return proof, None, f"no witness quorum waited for: {e.message}"
        if vkey not in {v.key.encode() for v, _ in policy.logs}:
            return proof, None, ("no witness quorum waited for: the server's policy is not of "
                                 "its pinned log key")
    deadline = clock() + min(wait, MAX_QUORUM_WAIT)
    best = proof
    while True:
        try:
            w = witnessed_by(best, policy, source=f"of {server}")
        except Invalid as e:
            return proof, None, f"no witness quorum: {e.message}"
        if w.quorum_holds:
            return best, f"witnessed:     {witnessed_line(w, policy)}", None
        if clock() >= deadline:
            return best, None, (f"no witness quorum within {wait} s "
                                f"({len(w.cosigned)} of {len(policy.witnesses)} cosigned; the "
                                f"policy needs {policy.describe()}); later: "
                                f"{later.replace('--fetch-proof', '--upgrade-proof')}")
        sleep(min(POLL, max(0.0, deadline - clock())))
        try:
            new = fetch_proof(server, serial=serial, object_id=object_id)
            check_proof(new, held, [vkey], source=f"of {server}")
        except (CannotCheck, Invalid, Malformed):
            continue
        if cosignature_count(new, policy) >= cosignature_count(best, policy):
            best = new
