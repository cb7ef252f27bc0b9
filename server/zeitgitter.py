"""Zeitgitter protocol v1: validation of request fields (pure).

Fields arrive as a mapping of name -> list of values (a field sent twice is an error, so a
client cannot smuggle a second value past the check).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from server.errors import BadRequest, InvalidCommitId, InvalidTagName, UnknownRequest
from workers.gitobjects import BranchRequest, TagRequest

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
