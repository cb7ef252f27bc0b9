"""CPU time of `workers.tsa.build_token` per token, in-process, with a fake signer.

    python -m bench.build_token [--tokens N] [--digest]

A fixed P-256 key and certificate, a fake signer whose (r, s) follow from the signed bytes (so
that, as with a real key, a signature is 70, 71 or 72 bytes: a fixed one hid tokens that cost
9-75 ms, those of 72-byte signatures without certReq), 1000 different jobs (half with certReq);
prints the CPU time per token of 5 runs of N tokens, and their minimum.
``--digest`` prints the SHA-256 of the 1000 tokens instead: the same before and after a change
means the tokens are byte for byte the same.
"""

from __future__ import annotations

import argparse
import hashlib
import time
from datetime import UTC, datetime, timedelta

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from formats.jobs import TimestampJob
from formats.tsp.algorithms import ecdsa_signature
from formats.tsp.certificates import certificate, tbs_certificate
from workers import tsa

POLICY = "2.25.178387009458913539541377305212843591845"
R, S = (1 << 255) - 19, (1 << 254) - 97


def fake_signature(data: bytes) -> bytes:
    """An ECDSA-Sig-Value whose r and s are hashes of ``data``: each has its top bit set half
    the time, as a real signature's (then its DER INTEGER is one byte longer)."""
    r, s = (int.from_bytes(hashlib.sha256(tag + data).digest(), "big") | 1 for tag in (b"r", b"s"))
    return ecdsa_signature(r, s)


def setup() -> tuple[tsa.TsaKey, list[bytes], list[TimestampJob]]:
    private = ec.derive_private_key(0x1234567890ABCDEF, ec.SECP256R1())
    spki = private.public_key().public_bytes(serialization.Encoding.DER,
                                             serialization.PublicFormat.SubjectPublicKeyInfo)
    key = tsa.TsaKey("bench", spki, "sha256_ecdsa", fake_signature)
    now = datetime(2026, 11, 25, tzinfo=UTC)
    tbs = tbs_certificate(spki, {"common_name": "stampd TSA at http://127.0.0.1:8080/",
                                 "organization_name": "stampd"},
                          serial=(1 << 70) | 12345, not_before=now - timedelta(hours=1),
                          not_after=now + timedelta(days=3650),
                          signature_algorithm="sha256_ecdsa")
    chain = [certificate(tbs, "sha256_ecdsa", ecdsa_signature(R, S))]
    jobs = [TimestampJob("sha256", f"{i:064x}", 1000 + i, 1_795_600_000 + i, POLICY,
                         accuracy=1, nonce=str((1 << 63) + i * 7919), cert_req=bool(i % 2))
            for i in range(1000)]
    return key, chain, jobs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.build_token", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=3000, help="tokens per run (3000)")
    ap.add_argument("--digest", action="store_true", help="print the tokens' SHA-256 only")
    args = ap.parse_args(argv)
    key, chain, jobs = setup()
    if args.digest:
        h = hashlib.sha256()
        for job in jobs:
            h.update(tsa.build_token(job, key, chain))
        print(h.hexdigest())
        return 0
    for job in jobs[:200]:  # warm the caches
        tsa.build_token(job, key, chain)
    runs = []
    for _ in range(5):
        t0 = time.process_time()
        for i in range(args.tokens):
            tsa.build_token(jobs[i % len(jobs)], key, chain)
        runs.append((time.process_time() - t0) / args.tokens * 1e6)
    print("build_token, us of CPU per token, 5 runs:", " ".join(f"{r:.0f}" for r in runs),
          f"min {min(runs):.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
