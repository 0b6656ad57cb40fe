# Airlock: two commands on a fresh machine.
#   make demo   installs what is missing, builds, runs the walkthrough offline
#   make test   builds and passes the tests (fmt, clippy, unit + integration)

CARGO        ?= cargo
GUEST_TARGET := wasm32-wasip2
GUEST_DIR    := target/guests/$(GUEST_TARGET)/release
AIRLOCK      := target/debug/airlock

.PHONY: all setup guests build lint test demo

all: build

# Toolchain pieces a fresh machine lacks. Idempotent and quick when present.
setup:
	@command -v rustup >/dev/null || { echo "error: rustup is required (https://rustup.rs)"; exit 1; }
	@rustup target list --installed | grep -qx '$(GUEST_TARGET)' || rustup target add $(GUEST_TARGET)
	@rustup component list --installed | grep -q '^rustfmt' || rustup component add rustfmt
	@rustup component list --installed | grep -q '^clippy' || rustup component add clippy

# The guest components in guest-examples/, built once into their own target
# dir (the tests reuse them and never wait on the host build's lock).
guests: setup
	$(CARGO) build --release --target $(GUEST_TARGET) \
	  --manifest-path guest-examples/Cargo.toml --target-dir target/guests

build: guests
	$(CARGO) build --all-targets

lint: setup
	$(CARGO) fmt --all -- --check
	$(CARGO) fmt --manifest-path guest-examples/Cargo.toml --all -- --check
	$(CARGO) clippy --all-targets -- -D warnings
	$(CARGO) clippy --release --target $(GUEST_TARGET) \
	  --manifest-path guest-examples/Cargo.toml --target-dir target/guests -- -D warnings

test: build lint
	$(CARGO) test

demo: build
	@AIRLOCK=$(AIRLOCK) TOOL=$(GUEST_DIR)/stateful.wasm scripts/demo.sh
