"""Verification of stamps with the real gpg and git binaries (test helpers)."""

from __future__ import annotations

import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

SIG_BEGIN = "-----BEGIN PGP SIGNATURE-----"


def keyring(pubkey: Path | str, home: Path) -> Path:
    """A GNUPGHOME at ``home`` holding (and trusting nothing but) ``pubkey``."""
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    r = subprocess.run(["gpg", "--homedir", str(home), "--batch", "--status-fd", "1",
                        "--import", str(pubkey)], capture_output=True, timeout=60, check=False)
    # gpg exits 2 after a good import when it cannot reach an agent (long paths).
    assert b"IMPORT_OK" in r.stdout, r.stderr
    return home


@dataclass
class Verified:
    fingerprint: str
    created: int


def verify_detached(payload: bytes, signature: str, home: Path) -> Verified:
    """`gpg --verify` a detached armored signature; raise AssertionError unless VALIDSIG."""
    with tempfile.NamedTemporaryFile("w", suffix=".asc", delete=False) as f:
        f.write(signature)
        sig_path = f.name
    try:
        r = subprocess.run(
            ["gpg", "--homedir", str(home), "--batch", "--status-fd", "1", "--verify",
             sig_path, "-"],
            input=payload, capture_output=True, timeout=60, check=False,
        )
    finally:
        Path(sig_path).unlink()
    status = r.stdout.decode()
    m = re.search(r"^\[GNUPG:\] VALIDSIG (\S+) \S+ (\d+) ", status, re.MULTILINE)
    assert r.returncode == 0 and m, f"gpg --verify failed: {status}\n{r.stderr.decode()}"
    return Verified(fingerprint=m.group(1), created=int(m.group(2)))


def split_tag(text: str) -> tuple[bytes, str]:
    pos = text.rindex("\n" + SIG_BEGIN + "\n") + 1
    return text[:pos].encode(), text[pos:]


def split_commit(text: str) -> tuple[bytes, str]:
    m = re.search(
        r"^gpgsig (-----BEGIN PGP SIGNATURE-----\n(?: .*\n)+?) -----END PGP SIGNATURE-----\n",
        text, re.MULTILINE,
    )
    assert m, "no gpgsig header"
    sig = (m.group(1) + " -----END PGP SIGNATURE-----\n").replace("\n ", "\n")
    payload = text[: m.start()] + text[m.end():]
    return payload.encode(), sig


def verify_stamp(text: str, home: Path) -> Verified:
    if text.startswith("object "):
        payload, sig = split_tag(text)
    else:
        payload, sig = split_commit(text)
    assert text.count(SIG_BEGIN) == 1, "exactly one signature"
    return verify_detached(payload, sig, home)


def stamp_time(text: str) -> int:
    m = re.search(r"^(?:tagger|committer) .* (\d+) \+0000$", text, re.MULTILINE)
    assert m, "no tagger/committer line"
    return int(m.group(1))
