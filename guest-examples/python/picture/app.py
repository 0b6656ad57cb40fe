"""A tool that reports its progress and shows a picture (WIT 0.1.1's
`progress` and `show`), in Python. The same tool as `sketch` in
guest-examples/rust/everything and guest-examples/js/picture
(tests/all/conformance.rs checks that all three agree).

Build: componentize-py -d wit -w tool-host componentize -p guest-examples/python/picture app -o python-picture.wasm
"""

import base64
import json

from componentize_py_types import Err
from wit_world import exports
from wit_world.imports import progress, show, types

# An 8×8 checkerboard, as a PNG.
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAgAAAAICAIAAABLbSncAAAAHUlEQVR42mN44aUORP/BAJnNgFMCUwjCxi1BBzsATxKKwU0wpBwAAAAASUVORK5CYII="
)

SKETCH = {
    "type": "object",
    "properties": {"steps": {"type": "integer", "minimum": 1, "maximum": 10}},
    "required": ["steps"],
    "additionalProperties": False,
}


class Tool(exports.Tool):
    def describe(self):
        return [
            types.ToolSpec(
                "sketch",
                "Draw a checkerboard in `steps` strokes, reporting each, and show it.",
                json.dumps(SKETCH, separators=(",", ":")),
            )
        ]

    def call(self, ctx, name, args):
        if name != "sketch":
            raise Err(types.ToolError_InvalidArgs(f"no tool {name}"))
        steps = json.loads(args)["steps"]
        for stroke in range(1, steps + 1):
            progress.report(float(stroke), float(steps), f"stroke {stroke} of {steps}")
        show.show(show.Block_Image(show.Media(PNG, "image/png")))
        result = {"steps": steps, "shown": "image/png", "bytes": len(PNG)}
        return types.ToolOutput(json.dumps(result, separators=(",", ":")), [])
