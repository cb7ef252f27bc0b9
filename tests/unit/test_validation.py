"""Zeitgitter field validation (pure)."""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable

import hypothesis
import pytest
from hypothesis import strategies as st

from server.api.zeitgitter import MAX_FIELDS, parse_stamp_request, parse_urlencoded
from server.errors import BadRequest, InvalidCommitId, InvalidTagName, UnknownRequest
from server.stamping.requests import BranchRequest, TagRequest

C = "0123456789abcdef0123456789abcdef01234567"
T = "89abcdef0123456789abcdef0123456789abcdef"
P = "fedcba9876543210fedcba9876543210fedcba98"


def test_tag_ok() -> None:
    req = parse_stamp_request({"request": ["stamp-tag-v1"], "commit": [C], "tagname": ["v1.0"]})
    assert req == TagRequest(commit=C, tagname="v1.0")


def test_branch_with_and_without_parent() -> None:
    fields = {"request": ["stamp-branch-v1"], "commit": [C], "tree": [T]}
    assert parse_stamp_request(fields) == BranchRequest(commit=C, tree=T, parent=None)
    assert parse_stamp_request({**fields, "parent": [P]}) == BranchRequest(C, T, P)


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"request": ["stamp-tag-v1"], "commit": [C.upper()], "tagname": ["t"]}, InvalidCommitId),
        ({"request": ["stamp-tag-v1"], "commit": [C[:39]], "tagname": ["t"]}, InvalidCommitId),
        ({"request": ["stamp-tag-v1"], "commit": [C + "0"], "tagname": ["t"]}, InvalidCommitId),
        ({"request": ["stamp-tag-v1"], "commit": [C + "\n"], "tagname": ["t"]}, InvalidCommitId),
        ({"request": ["stamp-tag-v1"], "commit": ["g" * 40], "tagname": ["t"]}, InvalidCommitId),
        ({"request": ["stamp-tag-v1"], "commit": [C], "tagname": ["a..b"]}, InvalidTagName),
        ({"request": ["stamp-tag-v1"], "commit": [C], "tagname": ["t\n"]}, InvalidTagName),
        ({"request": ["stamp-tag-v1"], "commit": [C], "tagname": ["t\nx"]}, InvalidTagName),
        ({"request": ["stamp-tag-v1"], "commit": [C], "tagname": ["a" * 101]}, InvalidTagName),
        ({"request": ["stamp-tag-v1"], "commit": [C], "tagname": ["-x"]}, InvalidTagName),
        ({"request": ["stamp-tag-v1"], "commit": [C], "tagname": [""]}, BadRequest),
        ({"request": ["stamp-tag-v1"], "commit": [C]}, BadRequest),
        ({"request": ["stamp-tag-v1"], "commit": [C, C], "tagname": ["t"]}, BadRequest),
        ({"request": ["stamp-branch-v1"], "commit": [C]}, BadRequest),
        ({"request": ["stamp-branch-v1"], "commit": [C], "tree": [T], "parent": ["x"]},
         InvalidCommitId),
        ({"request": ["stamp-branch-v1"], "commit": [C], "tree": [T], "parent": [C]},
         BadRequest),
        ({"request": ["stamp-foo-v1"], "commit": [C]}, UnknownRequest),
        ({"commit": [C]}, BadRequest),
    ],
)
def test_rejected(fields: dict[str, list[str]], error: type[Exception]) -> None:
    with pytest.raises(error):
        parse_stamp_request(fields)


def test_longest_tagname_accepted() -> None:
    name = "a" * 100
    assert parse_stamp_request(
        {"request": ["stamp-tag-v1"], "commit": [C], "tagname": [name]}
    ) == TagRequest(C, name)


C64, T64, P64 = C + "89abcdef" * 3, T + "01234567" * 3, P + "76543210" * 3


def test_sha256_ids_are_accepted() -> None:
    tag = parse_stamp_request({"request": ["stamp-tag-v1"], "commit": [C64], "tagname": ["t"]})
    assert tag == TagRequest(commit=C64, tagname="t") and tag.object_format == "sha256"
    fields = {"request": ["stamp-branch-v1"], "commit": [C64], "tree": [T64], "parent": [P64]}
    branch = parse_stamp_request(fields)
    assert branch == BranchRequest(commit=C64, tree=T64, parent=P64)
    assert branch.object_format == "sha256"
    assert parse_stamp_request({"request": ["stamp-tag-v1"], "commit": [C],
                                "tagname": ["t"]}).object_format == "sha1"


@pytest.mark.parametrize("ids", [
    (C64[:63], T64, None), (C64 + "0", T64, None), (C64.upper(), T64, None),
    (C64, T, None), (C, T64, None), (C64, T64, P), (C, T, P64),
])
def test_bad_and_mixed_length_ids_are_refused(ids: tuple[str, str, str | None]) -> None:
    commit, tree, parent = ids
    fields = {"request": ["stamp-branch-v1"], "commit": [commit], "tree": [tree]}
    if parent is not None:
        fields["parent"] = [parent]
    with pytest.raises(InvalidCommitId) as e:
        parse_stamp_request(fields)
    mixed = len({len(commit), len(tree), len(parent or commit)}) > 1 and len(commit) in (40, 64)
    if mixed and commit.islower():
        assert "must all be SHA-1 (40 hex digits) or all SHA-256 (64)" in e.value.message


@hypothesis.settings(max_examples=400, deadline=None)
@hypothesis.given(st.text(alphabet="ab=&%+;2F0 é", max_size=48))
def test_form_parsing_is_parse_qsl(text: str) -> None:
    """The unquoted fast path parses exactly as parse_qsl (fields, blanks, the field limit)."""

    def parsed(parse: Callable[[str], list[tuple[str, str]]]) -> object:
        try:
            return parse(text)
        except ValueError as e:
            return type(e)

    assert parsed(parse_urlencoded) == parsed(lambda t: urllib.parse.parse_qsl(
        t, keep_blank_values=True, errors="strict", max_num_fields=MAX_FIELDS))
