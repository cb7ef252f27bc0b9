# stampd — the two commands of the quick start are `make serve` and `make test`; `make` alone
# lists every target (`make help`).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The venv is built in two stages, each done once its stamp is newer than what it installs:
# SERVE_STAMP, the server (SERVER_LOCK), all `make serve` needs; STAMP, the test tools
# (LOCK) installed over it, which `make test` and the checks need.
SERVE_STAMP := $(VENV)/.installed-server
STAMP := $(VENV)/.installed
# The pinned, hashed dependencies (docs/development.md, "Dependencies"): SERVER_LOCK, the
# server without the test tools, is what `make serve` and deploy/Dockerfile install; LOCK, the
# server and the test tools, what the venv of `make test` is completed with (it pins the
# server's packages as SERVER_LOCK does: tests/unit/test_packaging.py); CLIENT_LOCK, the client
# alone (`pip install .`), is what the client-only check installs.
LOCK := requirements/test.lock
CLIENT_LOCK := requirements/client.lock
SERVER_LOCK := requirements/server.lock
UV_COMPILE := $(BIN)/uv pip compile pyproject.toml --quiet --generate-hashes --universal \
	--python-version 3.11 --custom-compile-command 'make lock'

.PHONY: help server-venv venv assets assets-check serve test lint sysdeps lock lock-check \
	client-only bench bench-manifest bench-scale fuzz soak crash slow readflood proof clean \
	clean-data

## List the targets, each with the first sentence of its note (what `make` alone does).
help:
	@echo "make TARGET (settings of the server from the environment: STAMPD_PORT=8081 make serve)"
	@awk -v width=100 ' \
		/^## / { note = note (note == "" ? "" : " ") substr($$0, 4); next } \
		/^[a-z][-a-z]*:/ && note != "" { \
			at = index(note, ". "); if (at) note = substr(note, 1, at); \
			line = sprintf("  %-15s", substr($$0, 1, index($$0, ":") - 1)); \
			n = split(note, word, " "); \
			for (i = 1; i <= n; i++) { \
				if (length(line) + 1 + length(word[i]) > width && length(line) > 18) { \
					print line; line = sprintf("%17s", ""); \
				} \
				line = line " " word[i]; \
			} \
			print line; \
		} \
		{ note = "" }' $(firstword $(MAKEFILE_LIST))

# The venv's stages are built by a make run under a lock (flock, util-linux), so that two
# makes at once (`make serve`, and `make test` in another terminal) do not install into the
# same venv together: the second waits, then finds the stage built. (`+`: `make -n` runs it
# too, and the inner make then only prints what it would do.)
# (Not .venv/.lock: uv takes that one itself while it installs, and would wait for this make.)
LOCKED := mkdir -p $(VENV) && flock $(VENV)/.make-lock $(MAKE) --no-print-directory

## The venv with the server alone (requirements/server.lock): what `make serve` needs.
server-venv:
	+@$(LOCKED) $(SERVE_STAMP)

## The whole venv: the server and the test tools (requirements/test.lock), git-timestamp among
## them; what `make test` needs.
venv:
	+@$(LOCKED) $(STAMP)

# A changed lock or pyproject.toml reinstalls. The project itself is installed without its
# dependencies: they all come from the locks, hash-checked; `uv pip check` fails when a lock
# lacks one pyproject.toml asks for. uv (at the version test.lock pins, installed first with
# the venv's pip) installs them: a second or two from its cache, where pip took ~55 s from its
# own on the 2-core machine; it says what it installs.
UV_PIP := $(BIN)/uv pip --quiet
UV_INTO := --python $(BIN)/python
$(SERVE_STAMP): pyproject.toml $(SERVER_LOCK)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check "$$(grep -o '^uv==[^ ]*' $(LOCK))"
	$(BIN)/uv pip install $(UV_INTO) --require-hashes -r $(SERVER_LOCK)
	$(UV_PIP) install $(UV_INTO) --no-deps -e .
	$(UV_PIP) check $(UV_INTO)
	touch $(SERVE_STAMP)

$(STAMP): $(SERVE_STAMP) $(LOCK)
	$(BIN)/uv pip install $(UV_INTO) --require-hashes -r $(LOCK)
	$(UV_PIP) check $(UV_INTO)
	touch $(STAMP)

# The web pages' npm packages (web/package-lock.json), for `make assets`, `make assets-check`
# and the browser tests (axe-core, the verify core's tests under Node). Not needed to serve:
# the built files are committed under server/web/static.
NODE_STAMP := web/node_modules/.installed
$(NODE_STAMP): web/package.json web/package-lock.json
	cd web && npm ci --prefer-offline --no-audit --no-fund --loglevel=error
	touch $(NODE_STAMP)

## Build the web pages' scripts and style (server/web/static) from web/src with the locked npm
## packages (docs/web.md). Commit what it writes.
assets: $(NODE_STAMP)
	node web/build.mjs

## Fail when the committed server/web/static is not what `make assets` builds now.
assets-check: $(NODE_STAMP)
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	node web/build.mjs --outdir "$$tmp/static" && \
	if ! diff -r "$$tmp/static" server/web/static >&2; then \
		echo "assets-check: server/web/static is not what make assets builds; run make assets" >&2; \
		exit 1; \
	fi

## Run the server on 127.0.0.1:8080 with the embedded defaults (data in ./var). Its settings
## come from the environment (docs/settings.md): `STAMPD_PORT=8081 make serve`.
serve: server-venv
	$(BIN)/stampd serve

## Run the whole test suite, and beside it lint, import contracts and types. Six test processes
## on two cores: tests wait on servers, agents and git in part (the cores were busy 77-81% of
## the time with four, 85% with six, 81% with eight); slow kinds of test start first.
## Bytecode caches are written (into gitignored __pycache__ folders) even where the caller's
## environment sets PYTHONDONTWRITEBYTECODE: each of the ~150 servers the tests start would
## otherwise compile stampd again, and pytest rewrite every test module in each process.
## The checks (lint, lock-check, client-only) run beside pytest, not before it: they are a
## few seconds of mostly waiting (mypy's first run ~20 s) that the test processes' waits absorb.
## Their output comes after pytest's; make test fails when either failed.
## A first run (a fresh clone: no bytecode caches yet) collects once in one process before: it
## writes the caches (stampd's modules compiled, the test modules' asserts rewritten) that the
## six test processes would otherwise each make at the same time, ~4 s of CPU apiece (its
## errors, if any, are the test run's to report).
## schemathesis's pytest plugin is not loaded (tests/system/test_openapi.py runs schemathesis's
## engine itself, not the plugin): importing it cost each of the pytest processes ~0.65 s.
test: sysdeps venv $(NODE_STAMP)
	@ls tests/unit/__pycache__/*-pytest-*.pyc >/dev/null 2>&1 || \
		PYTHONDONTWRITEBYTECODE= $(BIN)/pytest --collect-only -q -p no:schemathesis >/dev/null 2>&1 || true
	@tmp=$$(mktemp -d) || exit 1; trap 'rm -rf "$$tmp"' EXIT; \
	{ $(MAKE) --no-print-directory -k -j3 --output-sync=target lint lock-check assets-check \
		client-only >"$$tmp/checks.log" 2>&1; echo $$? >"$$tmp/checks.rc"; } & \
	PYTHONDONTWRITEBYTECODE= $(BIN)/pytest -n 6 --dist worksteal -p no:schemathesis; tests=$$?; \
	wait; cat "$$tmp/checks.log"; checks=$$(cat "$$tmp/checks.rc"); \
	[ "$$checks" = 0 ] || echo "make test: lint, lock-check or client-only failed (above)" >&2; \
	[ "$$tests" = 0 ] && [ "$$checks" = 0 ]

## The system packages the tests need: installed when possible, else one line naming them.
sysdeps:
	sh tests/sysdeps.sh

## Write the lock files again from pyproject.toml (needs PyPI). Locked versions are kept
## where pyproject.toml still allows them; `make lock LOCK_ARGS='-P NAME'` moves NAME on to
## its newest release, `LOCK_ARGS=-U` everything.
lock:
	test -x $(BIN)/uv || { $(PYTHON) -m venv $(VENV) && $(BIN)/pip install -q "$$(grep -o '^uv==[^ ]*' $(LOCK))"; }
	$(UV_COMPILE) $(LOCK_ARGS) --extra test -o $(LOCK)
	$(UV_COMPILE) $(LOCK_ARGS) -o $(CLIENT_LOCK)
	$(UV_COMPILE) $(LOCK_ARGS) --extra server -o $(SERVER_LOCK)

## Fail when the lock files are not what `make lock` would write now (from uv's cache when
## it can, else from PyPI; a few seconds).
lock-check: venv
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	cp $(LOCK) $$tmp/test.lock && cp $(CLIENT_LOCK) $$tmp/client.lock && \
	cp $(SERVER_LOCK) $$tmp/server.lock && \
	for args in "--extra test -o $$tmp/test.lock" "-o $$tmp/client.lock" \
			"--extra server -o $$tmp/server.lock"; do \
		$(UV_COMPILE) --offline $$args 2>/dev/null || $(UV_COMPILE) $$args || exit 1; \
	done && \
	if ! diff -u $(LOCK) $$tmp/test.lock || ! diff -u $(CLIENT_LOCK) $$tmp/client.lock \
			|| ! diff -u $(SERVER_LOCK) $$tmp/server.lock; then \
		echo "lock-check: the lock files are not current with pyproject.toml; run make lock" >&2; \
		exit 1; \
	fi

## The client installs alone: a fresh venv with CLIENT_LOCK and the project (no extras) has
## `stampd verify` and no server dependency, and `stampd serve` names the extra.
client-only: venv
	sh tests/client_only.sh $(PYTHON) $(BIN)/uv $(CLIENT_LOCK)

## ruff, the import-linter contracts (pyproject.toml) and mypy (pinned, configured there).
lint: venv
	$(BIN)/ruff check stampd server workers keystore procs client formats migrations tests bench
	$(BIN)/lint-imports
	$(BIN)/mypy

# The benches of `make bench`, in order (bench/<name>.py, run as python -m bench.<name>).
BENCHES := run scale tsa manifest manifest_flood poison longpoll tlog tlog_load witness mail \
	web verify_range

## Side-by-side benchmark against zeitgitterd, then every other bench (see bench/README.md).
## Each runs even when one before it missed its promise; the failed ones are named at the end.
bench: venv
	$(BIN)/pip install -q -e '.[test,bench]'
	@failed=""; for m in $(BENCHES); do \
		args=""; [ "$$m" = tlog_load ] && args="--witnesses 3"; \
		echo "== python -m bench.$$m $$args"; \
		$(BIN)/python -m bench.$$m $$args || failed="$$failed bench.$$m"; \
	done; \
	[ -z "$$failed" ] || { echo "make bench: missed a promise or could not run:$$failed" >&2; exit 1; }

## The scaling table: workers, API processes and zeitgitterd's agents, server and wrk pinned
## to cores of their own, and a projection to more cores (bench/README.md).
bench-scale: venv
	$(BIN)/pip install -q -e '.[test,bench]'
	$(BIN)/python -m bench.scale

## POST /v1/manifests of 10,000 and 1,000,000 lines: digests/s and peak RSS (bench/README.md).
bench-manifest: venv
	$(BIN)/python -m bench.manifest

# The robustness proof (bench/README.md): fuzzing, a two-API-host PostgreSQL soak, kill -9
# under load, slow clients and a read flood. Each prints its figures and exits nonzero on a
# broken promise.

## Every endpoint and method with generated and mutated requests, on SQLite and PostgreSQL;
## then the SMTP listener (docs/mail.md) with malformed and hostile sessions.
fuzz: venv sysdeps
	$(BIN)/python -m bench.fuzz
	$(BIN)/python -m bench.fuzz_mail

## Two API hosts on one PostgreSQL, under load (60 s).
soak: venv sysdeps
	$(BIN)/python -m bench.soak

## kill -9 under load, and what the log shows afterwards (about 3 minutes).
crash: venv sysdeps
	$(BIN)/python -m bench.crash

## Idle, slowloris and stalled-body clients (about a minute).
slow: venv
	$(BIN)/python -m bench.slow

## Reading a digest's 4,000 receipts while others stamp (about a minute).
readflood: venv
	$(BIN)/python -m bench.readflood

## All five of the robustness proof: fuzz, soak, crash, slow and readflood.
proof: fuzz soak crash slow readflood

## Remove what can be rebuilt: the venv and the caches. Never the data: keys and journal
## stay (see clean-data).
clean:
	rm -rf $(VENV) web/node_modules .mypy_cache .ruff_cache .pytest_cache build *.egg-info
	find stampd server workers keystore procs client formats migrations tests bench -name __pycache__ \
		-type d -prune -exec rm -rf {} +

DATA ?= var
## Delete the server's data directory DATA (./var): its secret signing keys, the journal of
## every stamp and the public log. They cannot be rebuilt. Asks first; without a terminal it
## refuses unless CONFIRM=yes.
clean-data:
	@test -e "$(DATA)" || { echo "clean-data: $(DATA) does not exist"; exit 0; }; \
	echo "clean-data: this deletes $(DATA): the secret signing keys ($(DATA)/keys), the journal" \
		"of every stamp, the public log ($(DATA)/log.git). They cannot be rebuilt."; \
	if [ "$(CONFIRM)" != yes ]; then \
		if [ ! -t 0 ]; then \
			echo "clean-data: refused: no terminal to ask; run make clean-data CONFIRM=yes" >&2; \
			exit 1; \
		fi; \
		printf 'Type yes to delete %s: ' "$(DATA)"; read answer; \
		[ "$$answer" = yes ] || { echo "clean-data: nothing deleted" >&2; exit 1; }; \
	fi; \
	rm -rf -- "$(DATA)" && echo "clean-data: deleted $(DATA)"
