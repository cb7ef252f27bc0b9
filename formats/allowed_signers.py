"""ssh-keygen's allowed-signers files (``gpg.ssh.allowedSignersFile``), pure: which keys may
sign, for which principals and namespaces, and during which time (ssh-keygen(1), ALLOWED
SIGNERS).

A line is ``<principals> [<options>] <keytype> <base64> [comment]``; ``#`` comments and empty
lines are ignored. The principals are a comma-separated pattern list (quoted when it holds
spaces); the options are comma-separated: ``cert-authority``, ``namespaces="a,b"``,
``valid-after="<time>"``, ``valid-before="<time>"``. A time is ``YYYYMMDD``, ``YYYYMMDDHHMM`` or
``YYYYMMDDHHMMSS``, in UTC with a trailing ``Z``, else in the local time zone (as ssh-keygen
reads it). ssh-keygen accepts a key at a verify time ``t`` when ``valid-after <= t <=
valid-before`` (both inclusive, each bound optional).

This module only reads the file, to say which line a signing key is on and when it was valid
(`AllowedSigner.refusal_at`); whether a signature verifies, and at which time, is for
``ssh-keygen -Y verify -Overify-time=...``.
"""

from __future__ import annotations

import calendar
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

from formats.sshsig import KEY_TYPES, SshPublicKey, SshSigError

__all__ = ["AllowedSigner", "AllowedSignersError", "parse_allowed_signers", "parse_time",
           "ssh_time"]

_TIME = re.compile(r"(\d{8})(\d{4})?(\d{2})?([zZ])?")
_CERT_PREFIX = "-cert-v01@openssh.com"


class AllowedSignersError(ValueError):
    """A line of an allowed-signers file that ssh-keygen would not read either."""


def parse_time(value: str, local: Callable[[time.struct_time], float] = time.mktime) -> int:
    """Seconds since the epoch of an allowed-signers time (``YYYYMMDD[HHMM[SS]][Z]``); without
    ``Z`` it is local time, which ``local`` (`time.mktime`) converts."""
    m = _TIME.fullmatch(value)
    if m is None or (m.group(3) and not m.group(2)):
        raise AllowedSignersError(f"not a time: {value!r} (YYYYMMDD[HHMM[SS]][Z])")
    digits = m.group(1) + (m.group(2) or "0000") + (m.group(3) or "00")
    try:
        parsed = time.strptime(digits, "%Y%m%d%H%M%S")
    except ValueError:
        raise AllowedSignersError(f"not a time: {value!r}") from None
    return calendar.timegm(parsed) if m.group(4) else int(local(parsed))


def ssh_time(t: int) -> str:
    """``t`` as ssh-keygen takes a verify time in UTC: ``YYYYMMDDHHMMSSZ``."""
    return time.strftime("%Y%m%d%H%M%SZ", time.gmtime(t))


def _iso(t: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


@dataclass(frozen=True)
class AllowedSigner:
    """One line: its number, principals (patterns), key, and options."""

    line: int
    principals: tuple[str, ...]
    key: SshPublicKey
    cert_authority: bool = False
    namespaces: tuple[str, ...] | None = None  # None: every namespace
    valid_after: int | None = None
    valid_before: int | None = None

    def allows_namespace(self, namespace: str) -> bool:
        return self.namespaces is None or namespace in self.namespaces

    @property
    def identity(self) -> str:
        """A principal to name with ``ssh-keygen -Y verify -I``: the first one not negated."""
        return next((p for p in self.principals if not p.startswith("!")), self.principals[0])

    def refusal_at(self, t: int) -> str | None:
        """Why this line does not allow its key at time ``t`` (None: it does), naming the
        bound: ``valid-before 2026-...Z`` or ``valid-after ...``."""
        if self.valid_after is not None and t < self.valid_after:
            return f"valid-after {_iso(self.valid_after)}"
        if self.valid_before is not None and t > self.valid_before:
            return f"valid-before {_iso(self.valid_before)}"
        return None

    def window(self) -> str:
        """The line's validity in words: ``valid from A until B``, ``valid until B``..."""
        after = f"from {_iso(self.valid_after)}" if self.valid_after is not None else ""
        before = f"until {_iso(self.valid_before)}" if self.valid_before is not None else ""
        if not after and not before:
            return "valid without a time limit"
        return " ".join(["valid", *(p for p in (after, before) if p)])


def _split_quoted(text: str, sep: str) -> list[str]:
    """``text`` split at ``sep`` outside double quotes (the quotes kept)."""
    parts: list[str] = []
    current: list[str] = []
    quoted = False
    for c in text:
        if c == '"':
            quoted = not quoted
        if c == sep and not quoted:
            parts.append("".join(current))
            current = []
        else:
            current.append(c)
    if quoted:
        raise AllowedSignersError("unterminated quote")
    parts.append("".join(current))
    return parts


def _first_field(text: str) -> tuple[str, str]:
    """(the first whitespace-delimited field, quotes removed; the rest)."""
    text = text.lstrip()
    if text.startswith('"'):
        end = text.find('"', 1)
        if end < 0:
            raise AllowedSignersError("unterminated quote")
        return text[1:end], text[end + 1:]
    quoted = False
    for i, c in enumerate(text):
        if c == '"':
            quoted = not quoted
        elif c in " \t" and not quoted:
            return text[:i], text[i:]
    return text, ""


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] == '"':
        return value[1:-1]
    raise AllowedSignersError(f"option value must be quoted: {value!r}")


def _parse_line(number: int, text: str, local: Callable[[time.struct_time], float]
                ) -> AllowedSigner:
    principals, rest = _first_field(text)
    if not principals or not rest.strip():
        raise AllowedSignersError("no key")
    options = ""
    first, after = _first_field(rest)
    if first.removesuffix(_CERT_PREFIX) not in KEY_TYPES and first not in KEY_TYPES:
        options, rest = first, after
    else:
        rest = rest.lstrip()
    fields = rest.split()
    if len(fields) < 2:
        raise AllowedSignersError("no key after the options")
    try:
        key = SshPublicKey.from_line(f"{fields[0]} {fields[1]}")
    except SshSigError as e:
        raise AllowedSignersError(str(e)) from None
    signer: dict[str, object] = {}
    for option in (_split_quoted(options, ",") if options else []):
        name, eq, value = option.partition("=")
        lname = name.lower()
        if lname == "cert-authority" and not eq:
            signer["cert_authority"] = True
        elif lname == "namespaces" and eq:
            signer["namespaces"] = tuple(_unquote(value).split(","))
        elif lname in ("valid-after", "valid-before") and eq:
            signer[lname.replace("-", "_")] = parse_time(_unquote(value), local)
        else:
            raise AllowedSignersError(f"unknown option {name!r}")
    return AllowedSigner(line=number, principals=tuple(principals.split(",")), key=key,
                         **signer)  # type: ignore[arg-type]


def parse_allowed_signers(text: str, local: Callable[[time.struct_time], float] = time.mktime
                          ) -> tuple[list[AllowedSigner], list[str]]:
    """(the lines of an allowed-signers file read, why each other line was not): a line with
    a key type this module does not know (a certificate, a FIDO key) or a syntax it does not
    follow is left to ssh-keygen, which decides whether a signature verifies."""
    signers, unread = [], []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        try:
            signers.append(_parse_line(number, line, local))
        except AllowedSignersError as e:
            unread.append(f"line {number}: {e}")
    return signers, unread
