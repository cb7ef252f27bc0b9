#!/bin/sh
# The client installs alone (`make client-only`, part of `make test`): a fresh venv in a
# temporary directory gets the client lock's packages and the project without extras, as
# `pip install .` would install it, and must then have `stampd verify` and friends, none of the
# server's dependencies, and a `stampd serve` that exits 2 naming the extra. uv installs (its
# cache makes this a few seconds). Any failure stops with a line starting "client-only:".
# usage: sh tests/client_only.sh PYTHON UV CLIENT_LOCK
set -eu

python=$1
uv=$2
lock=$3
root=$(pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT INT TERM

fail() { echo "client-only: $*" >&2; exit 1; }

"$python" -m venv --without-pip "$tmp/venv"
vpy=$tmp/venv/bin/python
"$uv" pip install --quiet --python "$vpy" --require-hashes -r "$lock" \
    || fail "installing $lock failed"
"$uv" pip install --quiet --python "$vpy" --no-deps "$root" \
    || fail "installing the project (no extras) failed"

# Outside the source tree and without PYTHONPATH: only what was installed is importable.
cd "$tmp"
unset PYTHONPATH
for cmd in stamp verify audit hook; do
    "$tmp/venv/bin/stampd" "$cmd" --help >/dev/null || fail "stampd $cmd --help failed"
done
"$vpy" -m stampd verify --help >/dev/null || fail "python -m stampd verify --help failed"

for mod in fastapi sqlalchemy uvicorn alembic psycopg prometheus_client msgspec aiosmtpd; do
    if "$vpy" -c "import $mod" 2>/dev/null; then
        fail "$mod is importable in a client-only install: a server dependency crept in"
    fi
done

status=0
"$tmp/venv/bin/stampd" serve >"$tmp/out" 2>"$tmp/err" || status=$?
expected="stampd serve: the server is not installed here: pip install 'stampd[server]'"
[ "$status" = 2 ] || fail "stampd serve exited $status, not 2: $(cat "$tmp/err")"
[ "$(cat "$tmp/err")" = "$expected" ] \
    || fail "stampd serve said: $(cat "$tmp/err"); expected the one line: $expected"
[ ! -s "$tmp/out" ] || fail "stampd serve wrote to stdout: $(cat "$tmp/out")"
echo "client-only: the client installs and runs without the server's dependencies"
