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

DEMO_PROMPT := Count how many vowels are in the word 'elephant', incrementing a counter named 'vowels' for each one. Also add a note listing the vowels you found. Then show the final state.

# The walkthrough as an agent run: the real Wasm tools, and the model from
# guest-examples/scripts/vowels.json (offline), or a real OpenAI model when
# OPENAI_API_KEY is set (OPENAI_MODEL, default gpt-4o-mini).
demo: build
	@if [ -n "$$OPENAI_API_KEY" ]; then model="--model openai:$${OPENAI_MODEL:-gpt-4o-mini}"; \
	 else model="--script guest-examples/scripts/vowels.json"; fi; \
	 $(AIRLOCK) run --tool $(GUEST_DIR)/stateful.wasm $$model "$(DEMO_PROMPT)"
