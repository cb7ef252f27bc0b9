"""/openapi.json tells the truth, and /docs loads nothing from another host.

A live server (the test key and an SSH key, so that both key formats and
``/v1/keys/allowed_signers`` are answered) serves the document; it must be valid OpenAPI 3.1,
name every route of the app, and schemathesis then fuzzes every operation with it: valid and
invalid requests, each answer checked against the document (status code, Content-Type,
headers, body schema), no 5xx, valid data accepted and invalid data refused.
"""

from __future__ import annotations

import hashlib
import html.parser
import json
import re
import shutil
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from server.api.app import create_app
from server.api.stamps import PAGE_MAX
from server.settings import Settings
from tests.helpers import Server, seed_data_dir, start_server

if TYPE_CHECKING:
    import schemathesis
    from schemathesis.config import SchemathesisConfig
    from schemathesis.hooks import HookContext
    from schemathesis.schemas import BaseSchema

# (schemathesis is imported where it is used: at collection it cost each test process that
# never runs these tests 0.4 s of CPU, with what it imports)

H256 = hashlib.sha256(b"openapi\n").hexdigest()
EXAMPLES = 12  # per operation in the fuzzing phase; with the coverage phase ~500 requests


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    data = seed_data_dir(tmp_path_factory.mktemp("openapi") / "data")
    s = start_server(data, workers=1, extra_env={"STAMPD_EXTRA_KEYS": "ssh:ed25519",
                                                 "STAMPD_TSA": "true"}, wait=False)
    try:
        s.wait_ready(workers=3)
    except BaseException:
        s.stop()
        raise
    yield s
    s.stop()
    shutil.rmtree(s.runtime_dir, ignore_errors=True)


def get(server: Server, path: str, accept: str = "*/*") -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(server.url + path.lstrip("/"), headers={"Accept": accept})
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()


@pytest.fixture(scope="module")
def document(server: Server) -> dict[str, Any]:
    status, headers, body = get(server, "/openapi.json")
    assert status == 200 and headers["content-type"] == "application/json"
    doc: dict[str, Any] = json.loads(body)
    return doc


# -- the document -----------------------------------------------------------------------------


def test_document_is_valid_openapi_3(document: dict[str, Any]) -> None:
    # Imported here: every test process collects this module, few run this test.
    from openapi_spec_validator import validate

    assert document["openapi"].startswith("3.1.")
    validate(document)  # raises on any violation of the OpenAPI 3.1 schema


def test_document_is_the_routes(document: dict[str, Any], tmp_path: Path) -> None:
    """FastAPI generates the document from the app's routes: each route that is not hidden
    (git's dumb HTTP protocol, /docs, /openapi.json, the browser pages) is an operation with
    an operationId and a tag of its own. FastAPI's 422 answer is not listed: the routes check
    their own inputs and never give it (a 422 of POST /add-checkpoint is the witness's)."""
    app = create_app(Settings(data_dir=tmp_path)).app
    assert isinstance(app, FastAPI)
    routes = {(method, path) for path, ops in get_openapi(
        title="routes", version="0", routes=app.routes)["paths"].items() for method in ops}
    operations = {(m, p): op for p, ops in document["paths"].items() for m, op in ops.items()}
    assert set(operations) == routes
    assert not any(p.startswith(("/log.git", "/docs", "/web/")) for _, p in operations)
    ids = [op["operationId"] for op in operations.values()]
    assert len(set(ids)) == len(ids) and all(re.fullmatch("[a-z][A-Za-z0-9]+", i) for i in ids)
    assert all(op["tags"] and op["summary"] for op in operations.values())
    assert not any(answer.get("description") == "Validation Error"
                   for op in operations.values() for answer in op["responses"].values())
    assert not {"HTTPValidationError", "ValidationError"} & set(document["components"]["schemas"])
    # The raw ASGI POST / and POST /tsr are described by hand (openapi_extra).
    assert {"application/x-www-form-urlencoded", "multipart/form-data"} == set(
        operations["post", "/"]["requestBody"]["content"])
    assert set(operations["post", "/tsr"]["requestBody"]["content"]) == {
        "application/timestamp-query"}


def test_document_lists_the_served_keys(server: Server, document: dict[str, Any]) -> None:
    _, _, body = get(server, "/v1/keys")
    keys = json.loads(body)["keys"]
    props = document["components"]["schemas"]["StampSHA256"]["properties"]
    # the keys that sign stamps; not the TSA key, which signs RFC 3161 tokens only
    assert props["key"]["enum"] == [k["fingerprint"] for k in keys
                                    if k["purpose"] == "stamps"]
    assert any(k["purpose"] == "rfc3161" for k in keys)
    assert props["format"]["enum"] == ["openpgp", "ssh"]
    page = document["paths"]["/v1/stamps/sha256/{digest}"]["get"]["parameters"]
    assert next(p for p in page if p["name"] == "limit")["schema"]["maximum"] == PAGE_MAX


# -- every answer as documented ---------------------------------------------------------------


def _config() -> SchemathesisConfig:
    from schemathesis.config import SchemathesisConfig

    return SchemathesisConfig.from_dict({
        "seed": 12,  # the same requests on every run: a failure here is the code's, not luck's
        "workers": 1,
        # The server answers every request within its own limit (a stamp 503 after
        # STAMPD_REQUEST_TIMEOUT): the client waits longer than that, so that a slow answer on
        # a loaded machine is checked as the answer it is (schemathesis gives up after 10 s).
        "request-timeout": Settings.model_fields["request_timeout"].default + 10,
        "generation": {"max-examples": EXAMPLES, "database": "none", "mode": "all"},
        "phases": {"stateful": {"enabled": False}},
        "checks": {
            # Valid data is accepted (404: a digest never stamped). A body may be valid by
            # the schema and still be larger than STAMPD_MAX_BODY, which no schema can say:
            # 413 is documented for that.
            "positive_data_acceptance": {"expected-statuses": ["2xx", "404", "413"]},
            # Invalid data is refused: the /v1 API says 400, the Zeitgitter protocol 406.
            "negative_data_rejection": {
                "expected-statuses": ["400", "404", "405", "406", "411", "413", "415"]},
        },
    })


def distinct_parent(context: HookContext, case: schemathesis.Case, kwargs: dict[str, Any]
                    ) -> None:
    """The one rule that JSON Schema cannot state (the document says it in words): a branch
    stamp's parent differs from its commit. (A global ``before_call`` hook: the only kind
    that the coverage phase's cases pass through too.)"""
    body = case.body
    if isinstance(body, dict) and isinstance(body.get("parent"), str) \
            and body.get("parent") == body.get("commit"):
        last = body["parent"][-1:]
        body["parent"] = body["parent"][:-1] + ("1" if last != "1" else "2")


@pytest.fixture(scope="module")
def api(server: Server) -> Iterator[BaseSchema]:
    import schemathesis

    # RFC 3161 queries are DER: sent as the bytes generated, like application/octet-stream.
    schemathesis.serializer.alias("application/timestamp-query", "application/octet-stream")
    schemathesis.hook("before_call")(distinct_parent)
    try:
        yield schemathesis.openapi.from_url(server.url + "openapi.json", config=_config())
    finally:
        schemathesis.hooks.unregister(distinct_parent)


def test_every_answer_is_documented(server: Server, api: BaseSchema) -> None:
    """schemathesis's coverage and fuzzing phases against the live server, every check on:
    each answer's status, Content-Type, headers and body as documented, no 5xx, valid data
    accepted, invalid data refused, 405 with Allow for other methods."""
    import schemathesis
    from schemathesis.engine import events

    failures: list[str] = []
    requests = 0
    for event in schemathesis.engine.from_schema(api).execute():
        if isinstance(event, events.ScenarioFinished):
            requests += len(event.recorder.interactions)
            for checks in event.recorder.checks.values():
                for check in checks:
                    if check.failure_info is not None:
                        failures.append(f"{event.phase} {event.recorder.label}: "
                                        f"{check.failure_info.failure.title}: "
                                        f"{check.failure_info.failure.message}\n"
                                        f"  {check.failure_info.code_sample}")
        elif isinstance(event, events.NonFatalError | events.FatalError):
            failures.append(f"error: {event!r}")
    assert not failures, "\n".join(dict.fromkeys(failures)) + "\nserver log:\n" + server.log()
    assert requests > 100  # the phases ran


def test_documented_answers_of_stamped_digest(server: Server, api: BaseSchema) -> None:
    """What random digests never reach: receipts that exist, a page with a Link header, the
    key, the banner and the status page; each answer checked against the document."""
    stamp = api["/v1/stamps"]["POST"]
    for _ in range(3):
        stamp.Case(body={"sha256": H256}, media_type="application/x-www-form-urlencoded"
                   ).call_and_validate()
    answer = stamp.Case(body={"sha256": H256, "format": "ssh"}, media_type="application/json",
                        headers={"Accept": "application/json"}).call_and_validate()
    assert answer.headers["content-type"][0] == "application/json"
    assert answer.json()["key"].startswith("SHA256:")

    receipts = api["/v1/stamps/sha256/{digest}"]["GET"]
    first = receipts.Case(path_parameters={"digest": H256}, query={"limit": 1}
                          ).call_and_validate()
    assert first.status_code == 200 and 'rel="next"' in first.headers["link"][0]
    serial = int(re.findall(r"after=(\d+)", first.headers["link"][0])[0])
    rest = receipts.Case(path_parameters={"digest": H256}, query={"after": serial},
                         headers={"Accept": "application/json"}).call_and_validate()
    page = rest.json()
    assert len(page["receipts"]) == 3 and page["next"] is None and "link" not in rest.headers
    gone = receipts.Case(path_parameters={"digest": H256}, query={"after": 2**63 - 1}
                         ).call_and_validate()
    assert gone.status_code == 404
    assert gone.headers["content-type"][0] == "application/problem+json"

    signers = api["/v1/keys/allowed_signers"]["GET"].Case().call_and_validate()
    assert signers.status_code == 200 and "ssh-ed25519 " in signers.text

    root = api["/"]["GET"]
    key = root.Case(query={"request": "get-public-key-v1"}).call_and_validate()
    assert key.headers["content-type"][0] == "application/pgp-keys"
    page_html = root.Case(headers={"Accept": "text/html"}).call_and_validate()
    assert page_html.headers["content-type"][0].startswith("text/html")
    for media in ("application/x-www-form-urlencoded", "multipart/form-data"):
        tag = api["/"]["POST"].Case(
            body={"request": "stamp-tag-v1", "commit": "a" * 40, "tagname": "v1.0"},
            media_type=media).call_and_validate()
        assert tag.status_code == 200 and tag.text.startswith("object " + "a" * 40)


def test_v1_errors_are_problems(server: Server) -> None:
    """A /v1 path that names nothing, or a method it does not take, is problem+json too; a
    digit that int() refuses is a 400, not a 500."""
    for method, path, status in [("GET", "v1/nothing", 404), ("PUT", "v1/stamps", 405),
                                 ("GET", f"v1/stamps/sha256/{H256}?limit=%C2%B2", 400)]:
        req = urllib.request.Request(server.url + path, method=method)
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=10)
        assert e.value.code == status
        assert e.value.headers["Content-Type"] == "application/problem+json"
        assert json.loads(e.value.read())["status"] == status
    req = urllib.request.Request(server.url, method="PUT")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 405 and set(e.value.headers["Allow"].split(", ")) == {"GET", "POST"}


# -- /docs ------------------------------------------------------------------------------------


class Refs(html.parser.HTMLParser):
    """Every URL an HTML page makes a browser load, and the text of inline scripts."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []
        self.inline: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.urls += [v for k, v in attrs if k in ("src", "href", "action", "srcset", "data")
                      and v is not None]
        self.inline += [f"{k}={v}" for k, v in attrs if k.startswith("on") or k == "style"]
        self._in_script = tag == "script"

    def handle_endtag(self, tag: str) -> None:
        self._in_script = False

    def handle_data(self, data: str) -> None:
        if self._in_script and data.strip():
            self.inline.append(data)


def test_docs_load_nothing_from_another_host(server: Server) -> None:
    status, headers, body = get(server, "/docs", accept="text/html")
    assert status == 200 and headers["content-type"].startswith("text/html")
    csp = {d.split()[0]: d.split()[1:] for d in headers["content-security-policy"].split("; ")}
    assert csp["default-src"] == ["'none'"]
    allowed = {"'self'", "'none'", "data:"}
    assert all(set(sources) <= allowed for sources in csp.values()), csp
    assert csp["script-src"] == ["'self'"] and csp["style-src"] == ["'self'"]
    assert headers["x-content-type-options"] == "nosniff"
    page = body.decode()
    assert not re.search(r"(?i)https?:|//[a-z0-9]", page)
    refs = Refs()
    refs.feed(page)
    assert refs.inline == []  # the CSP would block it
    assert {u.rsplit("/", 1)[-1] for u in refs.urls} == {
        "favicon.png", "swagger-ui.css", "swagger-ui-bundle.js", "init.js"}
    types = {".js": "text/javascript", ".css": "text/css", ".png": "image/png"}
    for url in refs.urls:
        assert url.startswith("/") and not url.startswith("//"), url
        status, headers, asset = get(server, url)
        assert status == 200 and headers["content-type"].startswith(types[Path(url).suffix])
        assert headers["x-content-type-options"] == "nosniff"
        text = asset.decode("utf-8", "replace")
        if url.endswith(".css"):
            # What a style sheet makes a browser load: url(...) and @import.
            loads = re.findall(r"url\(\s*['\"]?([^'\")]*)", text) + re.findall(
                r"@import\s+['\"]([^'\"]+)", text)
            assert loads and all(u.startswith("data:") for u in loads), loads
        if url.endswith(".js"):
            assert not re.search(r"sourceMappingURL=\s*(https?:)?//", text)
        if url.endswith("init.js"):
            assert not re.search(r"(?i)https?:", text)
            assert "validatorUrl: null" in text  # no badge from validator.swagger.io
            assert 'url: "/openapi.json"' in text
