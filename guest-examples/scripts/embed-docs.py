#!/usr/bin/env python3
"""Adds a WIT package's doc comments to a built component.

    embed-docs.py COMPONENT.wasm WIT_DIR OUT.wasm

Toolchains (cargo, componentize-py, componentize-js) drop WIT doc comments
when they build a component. Airlock reads them, for tool and parameter
descriptions, from a `package-docs` custom section at the component's top
level, in the format wit-component writes. This takes that section from
`wasm-tools component wit WIT_DIR --wasm` (the WIT package, encoded by the
canonical encoder) and appends it to a copy of the component. Nothing else
of the component changes. Needs `wasm-tools` (`$WASM_TOOLS`, else on PATH,
else in $CARGO_HOME/bin).
"""

import os
import shutil
import subprocess
import sys
import tempfile

SECTION = "package-docs"


def leb128(n):
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def read_leb128(data, at):
    n = shift = 0
    while True:
        byte = data[at]
        at += 1
        n |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return n, at


def top_level_section(data, name):
    """The payload of the custom section `name` at the binary's top level."""
    at = 8  # magic and version/layer
    while at < len(data):
        section_id = data[at]
        size, body = read_leb128(data, at + 1)
        end = body + size
        if section_id == 0:
            name_len, name_at = read_leb128(data, body)
            if data[name_at:name_at + name_len].decode() == name:
                return data[name_at + name_len:end]
        at = end
    return None


def wasm_tools():
    if os.environ.get("WASM_TOOLS"):
        return os.environ["WASM_TOOLS"]
    found = shutil.which("wasm-tools")
    if found:
        return found
    cargo_home = os.environ.get("CARGO_HOME", os.path.expanduser("~/.cargo"))
    return os.path.join(cargo_home, "bin", "wasm-tools")


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    component, wit_dir, out = sys.argv[1:]
    with tempfile.TemporaryDirectory() as tmp:
        encoded = os.path.join(tmp, "package.wasm")
        subprocess.run(
            [wasm_tools(), "component", "wit", wit_dir, "--wasm", "-o", encoded],
            check=True,
        )
        with open(encoded, "rb") as f:
            docs = top_level_section(f.read(), SECTION)
    if docs is None:
        sys.exit(f"{wit_dir}: the encoded package has no {SECTION} section")
    with open(component, "rb") as f:
        data = f.read()
    if top_level_section(data, SECTION) is not None:
        sys.exit(f"{component}: already has a {SECTION} section")
    name = SECTION.encode()
    payload = leb128(len(name)) + name + docs
    section = b"\x00" + leb128(len(payload)) + payload
    staged = out + ".tmp"
    with open(staged, "wb") as f:
        f.write(data + section)
    os.replace(staged, out)


if __name__ == "__main__":
    main()
