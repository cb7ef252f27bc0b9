"""Zeitgitter protocol v1: validation of request fields (pure).

Fields arrive as a mapping of name -> list of values (a field sent twice is an error, so a
client cannot smuggle a second value past the check).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from server.errors import (
    BadRequest,
    InvalidCommitId,
    InvalidTagName,
    StampError,
    UnknownRequest,
)
from workers.gitobjects import BranchRequest, TagRequest
from workers.keyset import ServedKey

HEX40 = re.compile(r"[0-9a-f]{40}")
TAGNAME = re.compile(r"[_a-zA-Z][-._a-zA-Z0-9]{0,99}")

STAMP_TAG = "stamp-tag-v1"
STAMP_BRANCH = "stamp-branch-v1"
GET_PUBLIC_KEY = "get-public-key-v1"

Fields = Mapping[str, Sequence[str]]


def _one(fields: Fields, name: str, required: bool = True) -> str | None:
    values = fields.get(name)
    if not values:
        if required:
            raise BadRequest(f"missing field '{name}'")
        return None
    if len(values) > 1:
        raise BadRequest(f"field '{name}' given more than once")
    return values[0]


def _object_id(fields: Fields, name: str, required: bool = True) -> str | None:
    value = _one(fields, name, required)
    if value is None:
        return None
    if not HEX40.fullmatch(value):
        raise InvalidCommitId(f"field '{name}' must be 40 lowercase hex digits")
    return value


def _tagname(fields: Fields) -> str:
    value = _one(fields, "tagname")
    assert value is not None
    if not TAGNAME.fullmatch(value) or ".." in value:
        raise InvalidTagName(
            "field 'tagname' must match [_a-zA-Z][-._a-zA-Z0-9]{0,99} and contain no '..'"
        )
    return value


def parse_stamp_request(fields: Fields) -> TagRequest | BranchRequest:
    """Validate a POSTed form; raise a `BadRequest` subclass on any problem."""
    request = _one(fields, "request")
    if request == STAMP_TAG:
        commit = _object_id(fields, "commit")
        assert commit is not None
        return TagRequest(commit=commit, tagname=_tagname(fields))
    if request == STAMP_BRANCH:
        commit = _object_id(fields, "commit")
        tree = _object_id(fields, "tree")
        assert commit is not None and tree is not None
        parent = _object_id(fields, "parent", required=False)
        if parent == commit:
            raise BadRequest("'parent' and 'commit' must differ")
        return BranchRequest(commit=commit, tree=tree, parent=parent)
    raise UnknownRequest("unknown request type")


def choose_key(keys: Sequence[ServedKey], fmt: str | None, fingerprint: str | None,
               error: type[StampError] = BadRequest) -> ServedKey:
    """The key a request asked for (``format=openpgp|ssh``, ``key=<fingerprint>``); the
    primary key when it asked for none."""
    if fmt is not None and fmt not in ("openpgp", "ssh"):
        raise error("field 'format' must be 'openpgp' or 'ssh'")
    if fingerprint is not None:
        want = fingerprint if fingerprint.startswith("SHA256:") else fingerprint.upper()
        for key in keys:
            if key.fingerprint == want:
                if fmt is not None and key.format != fmt:
                    raise error(f"key {fingerprint} is not an {fmt} key")
                return key
        raise error(f"this server has no key {fingerprint}")
    if fmt is not None:
        for key in keys:
            if key.format == fmt:
                return key
        raise error(f"this server has no {fmt} key")
    return keys[0]


def key_fields(fields: Fields, error: type[StampError] = BadRequest
               ) -> tuple[str | None, str | None]:
    """The optional ``format`` and ``key`` fields."""
    out = []
    for name in ("format", "key"):
        values = fields.get(name)
        if values and len(values) > 1:
            raise error(f"field '{name}' given more than once")
        out.append(values[0] if values else None)
    return out[0], out[1]
