"""The property-based generator of the fuzzer: schemathesis (v4) reads the live server's
``/openapi.json`` and Hypothesis draws requests for every operation in it, conforming ones
(``schema+``) and ones that break the schema on purpose (``schema-``), with a fixed seed. Each
generated case is turned into raw bytes (`requests` encodes forms, JSON and multipart as
schemathesis would send them) and goes through the same exchange and checks as the raw cases.

The values are Hypothesis's, so they are not unique per request as the raw generator's markers
are: the 40/64/128-digit hex values a request carries are its markers, and `bench.fuzz` only
holds a refused request's marker against the journal when no answered or unsettled request
carried the same value.
"""

from __future__ import annotations

import re
import warnings
from typing import Any

from bench.fuzz_http import Case, Req

HEX_TOKEN = re.compile(r"(?<![0-9a-f])(?:[0-9a-f]{128}|[0-9a-f]{64}|[0-9a-f]{40})(?![0-9a-f])")


class SchemaUnavailable(Exception):
    """The server serves no usable OpenAPI document."""


def hex_markers(*texts: bytes | str) -> tuple[str, ...]:
    found: list[str] = []
    for t in texts:
        s = t.decode("latin-1") if isinstance(t, bytes) else t
        found += HEX_TOKEN.findall(s)
    return tuple(dict.fromkeys(found))


def _raw(kwargs: dict[str, Any], hostport: str) -> tuple[str, str, bytes] | None:
    """(method, target, bytes) of a case's request as `requests` would send it; None when
    `requests` refuses it (e.g. a header value with a line break)."""
    import requests

    try:
        req = requests.Request(method=kwargs["method"], url=kwargs["url"],
                               headers=kwargs.get("headers"), params=kwargs.get("params"),
                               data=kwargs.get("data"), json=kwargs.get("json"),
                               files=kwargs.get("files"), cookies=kwargs.get("cookies"))
        p = req.prepare()
    except (ValueError, TypeError, requests.RequestException):
        return None
    method = p.method or "GET"
    target = p.path_url
    lines = [f"{method} {target} HTTP/1.1".encode("latin-1", "replace"),
             b"Host: " + hostport.encode()]
    for name, value in p.headers.items():
        if name.lower() == "host":
            continue
        v = value if isinstance(value, bytes) else str(value).encode("latin-1", "replace")
        if b"\r" in v or b"\n" in v:
            return None
        lines.append(name.encode("latin-1", "replace") + b": " + v)
    body = p.body or b""
    if isinstance(body, str):
        body = body.encode("utf-8")
    if body and "Content-Length" not in p.headers:
        lines.append(b"Content-Length: " + str(len(body)).encode())
    return method, target, b"\r\n".join(lines) + b"\r\n\r\n" + body


MAX_WAIT = 1.0  # seconds: the most a fuzzed proof request may wait (the server allows 60)


def cap_wait(kwargs: dict[str, Any]) -> bool:
    """Lower a drawn ``wait`` above ``MAX_WAIT`` (that the server would honour, up to 60 s) to
    ``MAX_WAIT``, so that a request the server rightly keeps waiting is no hang; True if it
    did. Malformed waits are left as drawn."""
    params = kwargs.get("params")
    if not isinstance(params, dict) or "wait" not in params:
        return False
    values = params["wait"] if isinstance(params["wait"], list) else [params["wait"]]
    capped = False
    out = []
    for v in values:
        try:
            seconds = float(v)
        except (TypeError, ValueError):
            out.append(v)
            continue
        if MAX_WAIT < seconds <= 60:
            v, capped = str(MAX_WAIT), True
        out.append(v)
    params["wait"] = out if isinstance(params["wait"], list) else out[0]
    return capped


def _draw(strategy: Any, n: int, seed: int) -> list[Any]:
    """Up to ``n`` examples of ``strategy``, the same ones for the same seed."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hseed

    drawn: list[Any] = []

    @settings(max_examples=n, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck), report_multiple_bugs=False)
    @hseed(seed)
    @given(strategy)
    def collect(case: Any) -> None:
        drawn.append(case)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        collect()
    return drawn


def schema_cases(base_url: str, n: int, seed: int, hostport: str) -> tuple[list[Case], str]:
    """About ``n`` cases drawn from the server's OpenAPI document (fewer when the operations
    have fewer distinct examples), and a line saying what was drawn."""
    import schemathesis
    from schemathesis import GenerationMode

    url = base_url.rstrip("/") + "/openapi.json"
    try:
        schema = schemathesis.openapi.from_url(url, timeout=10)
    except Exception as e:  # schemathesis wraps loading errors in several types
        raise SchemaUnavailable(f"{url}: {type(e).__name__}: {str(e)[:300]}") from None
    ops = []
    for result in schema.get_all_operations():
        try:
            ops.append(result.ok())
        except Exception as e:
            raise SchemaUnavailable(f"{url}: an operation does not load: {e}") from None
    if not ops:
        raise SchemaUnavailable(f"{url}: no operations")
    modes = [(GenerationMode.POSITIVE, "schema+"), (GenerationMode.NEGATIVE, "schema-")]
    # Operations without inputs have one example (and nothing to break): the budget goes to
    # the others, in rounds with another seed each, until it is spent.
    active = [(i, op, mode, gen) for i, (op, (mode, gen)) in
              enumerate((op, m) for op in ops for m in modes)]
    pools: dict[int, list[Case]] = {a[0]: [] for a in active}
    skipped = 0
    capped = 0
    unsatisfiable: list[str] = []
    for attempt in range(4):
        have = sum(len(p) for p in pools.values())
        if have >= n or not active:
            break
        per = max(1, (n - have) // len(active) + 1)
        still = []
        for index, op, mode, gen in active:
            try:
                strategy = op.as_strategy(generation_mode=mode)
                drawn = _draw(strategy, per, seed + attempt)
            except Exception as e:  # e.g. nothing to break in an operation without inputs
                unsatisfiable.append(f"{gen} {op.method.upper()} {op.path} ({type(e).__name__})")
                continue
            for case in drawn:
                kwargs = case.as_transport_kwargs(base_url=base_url.rstrip("/"))
                capped += cap_wait(kwargs)
                raw = _raw(kwargs, hostport)
                if raw is None:
                    skipped += 1
                    continue
                method, target, wire = raw
                pools[index].append(Case(gen, f"{op.method.upper()} {op.path}", [wire],
                                         [Req(method, target, hex_markers(wire))]))
            if len(drawn) >= per:  # it may have more to give
                still.append((index, op, mode, gen))
        active = still
    queues = [p for p in pools.values() if p]
    out: list[Case] = []
    i = 0
    while len(out) < n and any(queues):
        queue = queues[i % len(queues)]
        if queue:
            out.append(queue.pop(0))
        i += 1
    note = (f"{len(ops)} operations from {url}, {len(out)} cases"
            + (f" ({skipped} drawn cases not sendable by requests, left out)" if skipped else "")
            + (f" ({capped} drawn waits above {MAX_WAIT:g} s lowered to it)" if capped else "")
            + (f"; nothing to draw for {len(unsatisfiable)}: {', '.join(unsatisfiable)}"
               if unsatisfiable else ""))
    return out, note
