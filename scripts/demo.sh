#!/usr/bin/env bash
# The stateful walkthrough, one `airlock call` at a time: count the vowels
# of "elephant" with three increments, add a note, show the final state.
# Deps are carried between calls in a file (--deps / --save-deps).
set -euo pipefail

airlock=${AIRLOCK:?set AIRLOCK to the airlock binary}
tool=${TOOL:?set TOOL to stateful.wasm}
state=$(mktemp -d)/deps.json
echo '{}' > "$state"

step() {
  echo
  echo "\$ airlock call stateful.wasm $1 '$2'"
  "$airlock" call "$tool" "$1" "$2" --deps "$state" --save-deps "$state"
}

for vowel in e e a; do
  echo; echo "# the model found the vowel '$vowel'"
  step increment '{"name": "vowels"}'
done
step add_note '{"text": "vowels in elephant: e, e, a"}'
step show_state '{}'
