"""The plan: which key types, stamp modes and connection counts are measured (side by side, for
scaling, and stampd only with SSH keys and with two keys at once), and zeitgitterd's default agent
and parallel-signature settings (the best of the sweep in bench/README.md); bench.run walks it and
bench.report lays out the table from it.
"""

from __future__ import annotations

# Chosen from a sweep on the 2-core bench machine (see bench/README.md): agents slightly above
# the number of cores and parallel signatures slightly above the number of agents, as the
# zeitgitterd sample configuration recommends, was among the best for ed25519 and rsa4096.
ZG_AGENTS = 3
ZG_PARALLEL = 4

CONCURRENCY = (1, 16, 64)
# (key type, modes, concurrencies); rsa4096 is bounded to keep the run under 5 minutes.
PLAN: tuple[tuple[str, tuple[str, ...], tuple[int, ...]], ...] = (
    ("ed25519", ("tag", "branch"), CONCURRENCY),
    ("rsa4096", ("tag",), CONCURRENCY),
    ("rsa4096", ("branch",), (16,)),
)
SCALING_CONNS = 16
# stampd only (zeitgitterd has no SSH and serves one key): one stampd with an ed25519 OpenPGP
# primary key and these extra SSH keys, each key with --workers workers of its own.
SSH_KEYS = ("ssh:ed25519", "ssh:ecdsa-p256")
SSH_PLAN: tuple[tuple[str, str, tuple[int, ...]], ...] = (  # (/v1/keys id, mode, concurrencies)
    ("ssh-ed25519", "tag", (1, 16)),
    ("ssh-ecdsa-p256", "tag", (16,)),
)
# Two keys at once: two wrk processes at the same time, TWO_KEYS_CONNS connections each, one
# asking for the primary OpenPGP key and one for the SSH ed25519 key (/v1/keys id, row name).
TWO_KEYS = (("primary", "pgp-ed25519"), ("ssh-ed25519", "ssh-ed25519"))
TWO_KEYS_CONNS = 8
TWO_KEYS_ROW = "2 keys"
