"""Checking sampled stamps: the key a cell's answers must be signed by (ServerKey; a Target adds
what each request asks for), throw-away GnuPG homes holding only a server's published key, and the
checks of each sampled response body the way the real `git timestamp` client checks a stamp: shape
and header lines (split_object), object time and `gpg --verify` (verify_sample), or `ssh-keygen -Y
verify -n git` against the key's allowed-signers line (verify_ssh); a digest receipt's statement
and its cleartext signature (verify_receipt).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from bench.procs import BenchError, run
from formats.receipts import parse_statement, split_receipt

MAX_OBJECT = 8000
CLOCK_SKEW = 30


@dataclass
class ServerKey:
    fingerprint: str  # 40 hex (OpenPGP) or SHA256:... (SSH)
    uid: str  # the user id the server writes into stamps made with this key
    home: Path  # a GNUPGHOME holding only the server's public key, for gpg --verify
    format: str = "openpgp"  # or "ssh"
    signers: Path | None = None  # SSH: an allowed-signers file holding only this key's line
    principal: str = ""  # SSH: the principal of that line (its first word)

    @property
    def armor(self) -> str:
        return "SSH" if self.format == "ssh" else "PGP"


@dataclass
class Target:
    """What the requests of a cell ask for (an extra form field choosing the key) and the key
    every answer must be signed by."""

    key: ServerKey
    field: str = ""  # URL-encoded, e.g. "key=SHA256%3A..."; empty: the server's default key


def gpg_env(home: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["GNUPGHOME"] = str(home)
    return env


def make_home(path: Path) -> Path:
    path.mkdir(parents=True)
    os.chmod(path, 0o700)
    return path


def import_public_key(armored: bytes, home: Path) -> ServerKey:
    make_home(home)
    run(["gpg", "--homedir", str(home), "--batch", "--import"], input=armored, timeout=30,
        env=gpg_env(home))
    out = run(["gpg", "--homedir", str(home), "--batch", "--with-colons", "--list-keys"],
              timeout=30, env=gpg_env(home)).stdout.decode()
    fpr = uid = None
    for line in out.splitlines():
        f = line.split(":")
        if f[0] == "fpr" and fpr is None:
            fpr = f[9]
        elif f[0] == "uid" and uid is None:
            uid = f[9].replace("\\x3a", ":")
    if not fpr or not uid:
        raise BenchError(f"cannot read the published key:\n{out}")
    return ServerKey(fpr, uid, home)


def split_object(text: str, mode: str, prefix: str, uid: str,
                 armor: str = "PGP") -> tuple[str, str, int]:
    """Check a stamp like `git timestamp` does; return (signed payload, armored signature,
    object time). Raises ValueError with the reason. `armor` is PGP (an empty line after the
    BEGIN line: no armor headers) or SSH (git's SSH signatures: base64 right after it)."""
    if len(text) > MAX_OBJECT:
        raise ValueError(f"object longer than {MAX_OBJECT} characters")
    if any(not (" " <= c <= "~" or c == "\n") for c in text):
        raise ValueError("object contains characters other than printable ASCII and newline")
    begin = f"-----BEGIN {armor} SIGNATURE-----"
    if text.count("-----BEGIN ") != 1 or text.count(begin) != 1:
        raise ValueError(f"not exactly one {armor} signature block")
    tail = f"-----END {armor} SIGNATURE-----"
    # Where the signature starts: PGP has an empty line after BEGIN (and no armor headers),
    # SSH (as git writes it) the base64 right after it.
    b64 = "[A-Za-z0-9+/]"
    tag_start = rf"\n{begin}\n\n{b64}" if armor == "PGP" else rf"\n{begin}\n{b64}"
    commit_start = (rf"gpgsig {begin}\n \n {b64}" if armor == "PGP"
                    else rf"gpgsig {begin}\n {b64}")
    uid_re = re.escape(uid)
    ours = rf"{prefix}[0-9a-f]{{{40 - len(prefix)}}}"
    if mode == "tag":
        m = re.match(rf"object {ours}\ntype commit\ntag [_a-zA-Z][-._a-zA-Z0-9]*\n"
                     rf"tagger {uid_re} (\d+) \+0000\n\n", text)
        if not m:
            raise ValueError("tag header is not object/type/tag/tagger <uid> <time> +0000")
        at = text.rfind(f"\n{begin}\n")
        if at < 0 or not re.match(tag_start, text[at:]):
            raise ValueError("armor headers present or signature not at a line start")
        payload, sig = text[:at + 1], text[at + 1:]
        if not sig.endswith(tail + "\n"):
            raise ValueError("object does not end with the signature")
        return payload, sig, int(m.group(1))
    m = re.match(rf"tree [0-9a-f]{{40}}\n(?:parent [0-9a-f]{{40}}\n)?parent {ours}\n"
                 rf"author {uid_re} (\d+) \+0000\ncommitter {uid_re} (\d+) \+0000\n"
                 + commit_start, text)
    if not m:
        raise ValueError("commit header is not tree/parent/author/committer/gpgsig")
    if m.group(1) != m.group(2):
        raise ValueError("author and committer time differ")
    header, sep, message = text.partition("\n\n")
    if not sep:
        raise ValueError("commit has no message")
    kept: list[str] = []
    sig_lines: list[str] = []
    in_sig = False
    for line in header.split("\n"):
        if line.startswith("gpgsig "):
            if sig_lines:
                raise ValueError("more than one gpgsig header")
            in_sig = True
            sig_lines.append(line[len("gpgsig "):])
        elif in_sig and line.startswith(" "):
            sig_lines.append(line[1:])
        else:
            in_sig = False
            kept.append(line)
    if sig_lines[-1] != tail:
        raise ValueError("gpgsig does not end with the armor tail")
    return "\n".join(kept) + "\n\n" + message, "\n".join(sig_lines) + "\n", int(m.group(1))


def verify_sample(path: Path, mode: str, prefix: str, key: ServerKey) -> str | None:
    """None when the sampled response at `path` is a valid stamp, else the reason."""
    if mode == "digest":
        return verify_receipt(path, prefix, key)
    try:
        text = path.read_bytes().decode("ascii")
        payload, sig, t_obj = split_object(text, mode, prefix, key.uid, key.armor)
    except (UnicodeDecodeError, ValueError) as e:
        return f"{path.name}: {e}"
    t_recv = path.stat().st_mtime
    if abs(t_obj - t_recv) > CLOCK_SKEW:
        return f"{path.name}: object time {t_obj} is {t_obj - t_recv:+.0f}s from receipt"
    pfile, sfile = path.with_suffix(".payload"), path.with_suffix(".sig")
    pfile.write_text(payload)
    sfile.write_text(sig)
    if key.format == "ssh":
        return verify_ssh(path.name, payload, sfile, key)
    p = run(["gpg", "--homedir", str(key.home), "--batch", "--status-fd", "1",
             "--trust-model", "always", "--verify", str(sfile), str(pfile)],
            timeout=30, env=gpg_env(key.home), check=False)
    valid = [ln.split() for ln in p.stdout.decode(errors="replace").splitlines()
             if ln.startswith("[GNUPG:] VALIDSIG ")]
    if p.returncode != 0 or len(valid) != 1:
        return f"{path.name}: gpg --verify failed: {p.stderr.decode(errors='replace')[-300:]}"
    v = valid[0]
    # VALIDSIG <fpr> <date> <sig-time> <expire> <version> <reserved> <pk-algo> <hash-algo>
    #          <sig-class> <primary-fpr>
    if v[11].upper() != key.fingerprint.upper():
        return f"{path.name}: signed by {v[11]}, the server publishes {key.fingerprint}"
    if v[10] != "00":
        return f"{path.name}: signature class {v[10]}, not a binary document signature"
    if v[9] not in ("8", "9", "10"):
        return f"{path.name}: hash algorithm {v[9]} is weaker than SHA-256"
    if abs(int(v[4]) - t_recv) > CLOCK_SKEW:
        return f"{path.name}: signature time {v[4]} is {int(v[4]) - t_recv:+.0f}s from receipt"
    return None


def verify_receipt(path: Path, prefix: str, key: ServerKey) -> str | None:
    """A digest receipt (POST /v1/stamps, an OpenPGP key): its statement names a digest of this
    run (`prefix`), the key and a time near the receipt's; `gpg --verify` of the cleartext-signed
    message finds one valid signature by the key, of class 01 (canonical text)."""
    try:
        statement = parse_statement(split_receipt(path.read_bytes().decode("ascii"))[0])
    except (UnicodeDecodeError, ValueError) as e:
        return f"{path.name}: {e}"
    t_recv = path.stat().st_mtime
    if not statement.digest.startswith(prefix) or statement.key.upper() != key.fingerprint.upper():
        return f"{path.name}: digest {statement.digest} or key {statement.key} is not ours"
    if abs(statement.time - t_recv) > CLOCK_SKEW:
        return f"{path.name}: receipt time {statement.time} is {statement.time - t_recv:+.0f}s off"
    p = run(["gpg", "--homedir", str(key.home), "--batch", "--status-fd", "1",
             "--trust-model", "always", "--verify", str(path)],
            timeout=30, env=gpg_env(key.home), check=False)
    valid = [ln.split() for ln in p.stdout.decode(errors="replace").splitlines()
             if ln.startswith("[GNUPG:] VALIDSIG ")]
    if p.returncode != 0 or len(valid) != 1 or valid[0][11].upper() != key.fingerprint.upper():
        return f"{path.name}: gpg --verify failed: {p.stderr.decode(errors='replace')[-300:]}"
    if valid[0][10] != "01":
        return f"{path.name}: signature class {valid[0][10]}, not a canonical text signature"
    return None


def verify_ssh(name: str, payload: str, sfile: Path, key: ServerKey) -> str | None:
    """`ssh-keygen -Y verify -n git` (what `git verify-tag` runs with gpg.format=ssh) against
    an allowed-signers file holding only the key this cell asked for. An SSH signature carries
    no time: the object time, checked by the caller, is the stamp."""
    assert key.signers is not None
    p = run(["ssh-keygen", "-Y", "verify", "-n", "git", "-f", str(key.signers),
             "-I", key.principal, "-s", str(sfile)], input=payload.encode(), timeout=30,
            check=False)
    out = (p.stdout + p.stderr).decode(errors="replace")
    if p.returncode != 0:
        return f"{name}: ssh-keygen -Y verify failed ({p.returncode}): {out.strip()[-300:]}"
    m = re.search(r'^Good "git" signature for (\S+) with \S+ key (SHA256:\S+)$', out, re.M)
    if not m:
        return f"{name}: ssh-keygen -Y verify said: {out.strip()[-300:]}"
    if m.group(1) != key.principal or m.group(2) != key.fingerprint:
        return f"{name}: signed for {m.group(1)} by {m.group(2)}, asked for {key.fingerprint}"
    return None
