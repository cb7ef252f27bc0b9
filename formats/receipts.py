"""Digest receipts: the canonical statement stampd signs for a digest, and its parser.

A statement is eight lines, each ending in LF, in this order and nothing else::

    stampd receipt v1
    algorithm: sha256
    digest: <lowercase hex, 64 digits for sha256, 128 for sha512>
    time: <Unix seconds>
    utc: <the same second as YYYY-MM-DDTHH:MM:SSZ>
    server: <the server's URL>
    serial: <decimal journal serial number>
    key: <fingerprint of the signing key: 40 uppercase hex (OpenPGP) or SHA256:<base64> (SSH)>

With an OpenPGP key the receipt is the statement as a cleartext-signed message
(``gpg --verify`` checks it); with an SSH key it is the statement followed by its armored SSH
signature, namespace ``stampd`` (``ssh-keygen -Y verify -n stampd`` checks it).
"""

from __future__ import annotations

import re
import time
from dataclasses import asdict, dataclass
from typing import Any

ALGORITHMS = {"sha256": 64, "sha512": 128}
HEADER = "stampd receipt v1"
# The SSH signature namespace (SSHSIG) of receipts and manifests signed by an SSH key (git
# objects are signed in "git"): the workers sign in it, the client verifies in it.
RECEIPT_NAMESPACE = "stampd"
BEGIN_SIGNED = "-----BEGIN PGP SIGNED MESSAGE-----"
BEGIN_SIG = "-----BEGIN PGP SIGNATURE-----"
END_SIG = "-----END PGP SIGNATURE-----"


@dataclass(frozen=True)
class DigestRequest:
    algorithm: str
    digest: str


class MalformedReceipt(ValueError):
    """The text is not a receipt of this format."""


@dataclass(frozen=True)
class Statement:
    algorithm: str
    digest: str
    time: int
    server: str
    serial: int
    key: str

    @property
    def utc(self) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.time))

    def text(self) -> str:
        return (f"{HEADER}\nalgorithm: {self.algorithm}\ndigest: {self.digest}\n"
                f"time: {self.time}\nutc: {self.utc}\nserver: {self.server}\n"
                f"serial: {self.serial}\nkey: {self.key}\n")

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "utc": self.utc}


STATEMENT_FIELDS = {  # the lines of a statement after its header: name -> pattern of the value
    "algorithm": r"(sha256|sha512)",
    "digest": r"([0-9a-f]{64}|[0-9a-f]{128})",
    "time": r"(0|[1-9][0-9]{0,11})",
    "utc": r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)",
    "server": r"([!-~]{1,500})",
    "serial": r"([1-9][0-9]{0,18})",
    "key": r"([0-9A-F]{40}|SHA256:[A-Za-z0-9+/]{43})",
}


def parse_statement(text: str) -> Statement:
    lines = text.split("\n")
    if lines[-1:] == [""]:
        lines.pop()
    if len(lines) != 8 or lines[0] != HEADER:
        raise MalformedReceipt("not a 'stampd receipt v1' statement of eight lines")
    values: dict[str, str] = {}
    for line, (name, pattern) in zip(lines[1:], STATEMENT_FIELDS.items(), strict=True):
        m = re.fullmatch(rf"{name}: {pattern}", line)
        if not m:
            raise MalformedReceipt(f"bad or misplaced '{name}' line: {line[:80]!r}")
        values[name] = m.group(1)
    st = Statement(algorithm=values["algorithm"], digest=values["digest"],
                   time=int(values["time"]), server=values["server"],
                   serial=int(values["serial"]), key=values["key"])
    if len(st.digest) != ALGORITHMS[st.algorithm]:
        raise MalformedReceipt(f"digest length does not fit {st.algorithm}")
    if values["utc"] != st.utc:
        raise MalformedReceipt("'utc' and 'time' disagree")
    return st


SSH_BEGIN = "-----BEGIN SSH SIGNATURE-----"
SSH_END = "-----END SSH SIGNATURE-----"


def split_receipt(receipt: str) -> tuple[str, str]:
    """(statement text, armored signature) of a receipt: an OpenPGP cleartext-signed message,
    or (SSH keys) the statement followed by its armored SSH signature (namespace stampd)."""
    text = receipt.replace("\r\n", "\n")
    if text.startswith(HEADER + "\n"):
        statement, sep, sig = text.partition(SSH_BEGIN + "\n")
        if not sep or not sig.rstrip("\n").endswith(SSH_END) or SSH_BEGIN in sig:
            raise MalformedReceipt("not a receipt with one SSH signature")
        return statement, SSH_BEGIN + "\n" + sig
    if not text.startswith(BEGIN_SIGNED + "\n"):
        raise MalformedReceipt("not a cleartext-signed message")
    head, sep, rest = text[len(BEGIN_SIGNED) + 1:].partition("\n\n")
    if not sep or not all(h.startswith("Hash: ") for h in head.split("\n")):
        raise MalformedReceipt("bad armor headers")
    body, sep, sig = rest.partition("\n" + BEGIN_SIG + "\n")
    if not sep or not sig.rstrip("\n").endswith(END_SIG):
        raise MalformedReceipt("no signature block")
    if (BEGIN_SIG in sig) or (BEGIN_SIGNED in body):
        raise MalformedReceipt("more than one signed message or signature")
    lines = [line[2:] if line.startswith("- ") else line for line in body.split("\n")]
    return "\n".join(lines) + "\n", BEGIN_SIG + "\n" + sig


def check_digest(algorithm: str, digest: str) -> None:
    """Raise ValueError unless ``digest`` is lowercase hex of the algorithm's length."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r}; use sha256 or sha512")
    if len(digest) != ALGORITHMS[algorithm] or not re.fullmatch(r"[0-9a-f]+", digest):
        raise ValueError(
            f"{algorithm} digest must be {ALGORITHMS[algorithm]} lowercase hex digits")
