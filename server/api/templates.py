"""The one Jinja2 environment of the server's HTML pages (``server/web/templates``): every
value is HTML-escaped unless a page marks it as markup of its own; an undefined name is an
error, not an empty string."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jinja2

TEMPLATE_DIR = Path(__file__).resolve().parent.parent / "web" / "templates"

env = jinja2.Environment(
    loader=jinja2.FileSystemLoader(TEMPLATE_DIR),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
    auto_reload=False,  # packaged files: read and compiled once per process
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=True,
)
# `tojson` (a page's configuration in its JSON data block): as compact as json.dumps with
# these separators, keys in their order; "<", ">", "&" and "'" written as \u escapes.
env.policies["json.dumps_kwargs"] = {"separators": (",", ":"), "sort_keys": False}


def render(name: str, **context: Any) -> str:
    """The template ``name`` rendered with ``context``."""
    return env.get_template(name).render(context)
