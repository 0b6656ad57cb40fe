// A tool that reports its progress and shows a picture (WIT 0.1.1's
// `progress` and `show`), in JavaScript. The same tool as `sketch` in
// guest-examples/rust/everything and guest-examples/python/picture
// (tests/all/conformance.rs checks that all three agree).
//
// Build (from guest-examples/js/stateful, whose node_modules it uses):
//   npx componentize-js ../picture/app.js --wit ../../../wit -n tool-host -d http -d fetch-event -o js-picture.wasm

import { report } from "airlock:tool/progress@0.1.2";
import { show } from "airlock:tool/show@0.1.2";

// An 8×8 checkerboard, as a PNG.
const PNG = Uint8Array.from(
  atob(
    "iVBORw0KGgoAAAANSUhEUgAAAAgAAAAICAIAAABLbSncAAAAHUlEQVR42mN44aUORP/BAJnNgFMCUwjCxi1BBzsATxKKwU0wpBwAAAAASUVORK5CYII=",
  ),
  (c) => c.charCodeAt(0),
);

const SKETCH = {
  type: "object",
  properties: { steps: { type: "integer", minimum: 1, maximum: 10 } },
  required: ["steps"],
  additionalProperties: false,
};

export const tool = {
  describe() {
    return [
      {
        name: "sketch",
        description: "Draw a checkerboard in `steps` strokes, reporting each, and show it.",
        parameters: JSON.stringify(SKETCH),
      },
    ];
  },

  call(_ctx, name, args) {
    if (name !== "sketch") {
      throw { tag: "invalid-args", val: `no tool ${name}` };
    }
    const { steps } = JSON.parse(args);
    for (let stroke = 1; stroke <= steps; stroke++) {
      report(stroke, steps, `stroke ${stroke} of ${steps}`);
    }
    show({ tag: "image", val: { data: PNG, mimeType: "image/png" } });
    const result = { steps, shown: "image/png", bytes: PNG.length };
    return { result: JSON.stringify(result), updates: [] };
  },
};
