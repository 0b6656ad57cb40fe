// The stateful walkthrough in JavaScript: the same three tools as the Rust
// example, with the same results, ops and errors (tests/all/conformance.rs
// checks it).
//
// Build: npx componentize-js app.js --wit ../../../wit -n tool-host -d http -d fetch-event -o stateful.wasm
//
// WIT mapping (componentize-js): records are objects, variants are
// `{tag, val}`, `option<T>` is `T | undefined`, and a `result` export
// returns the ok value or throws the error value.

import { RunContext } from "airlock:tool/context@0.1.2";

// Warm-up at build time. componentize-js runs the bindings it generates
// (the code that reads a call's arguments out of memory and writes its
// result back) in a JavaScript realm of their own, and SpiderMonkey makes
// a realm's built-ins the first time they are used. Without this, the
// first call in every fresh instance makes the ones the bindings use
// (typed arrays, DataView, promises, iterators): about 45 µs of a 130 µs
// call (docs/performance.md). Top-level code runs once, when the component
// is built, and the snapshot keeps what it made, so every instance starts
// with them. `RunContext` is a class of the bindings' realm, and its
// constructor is that realm's `Function`.
try {
  RunContext.constructor(`
    const bytes = new Uint8Array(8);
    new TextEncoder().encodeInto("warm", bytes);
    new TextDecoder().decode(bytes);
    new DataView(bytes.buffer).setUint32(0, 1, true);
    const handle = Object.create(Object.prototype);
    Object.defineProperty(handle, Symbol("handle"), { writable: true, value: 1 });
    for (const _ of [handle]);
    (async function () {})();
    const registry = new FinalizationRegistry(() => {});
    registry.register(handle, 1, handle);
    registry.unregister(handle);
  `)();
} catch {
  // Nothing is lost but the first call's time.
}

const SPECS = [
  {
    name: "increment",
    description: "Add 1 to the counter with the given name and return its new value.",
    parameters: {
      type: "object",
      properties: { name: { type: "string", description: "Counter name" } },
      required: ["name"],
      additionalProperties: false,
    },
  },
  {
    name: "add_note",
    description: "Append a note to the run's list of notes.",
    parameters: {
      type: "object",
      properties: { text: { type: "string", description: "The note" } },
      required: ["text"],
      additionalProperties: false,
    },
  },
  {
    name: "show_state",
    description: "Show all counters and notes.",
    parameters: { type: "object", properties: {}, additionalProperties: false },
  },
];

const failed = (message) => ({ tag: "failed", val: message });

// The value of a deps key, parsed; undefined if missing.
function read(ctx, key) {
  const text = ctx.get(key);
  return text === undefined ? undefined : JSON.parse(text);
}

function stringArg(args, field) {
  const value = args[field];
  if (typeof value !== "string") {
    throw { tag: "invalid-args", val: `\`${field}\` must be a string` };
  }
  return value;
}

const isObject = (v) => v !== null && typeof v === "object" && !Array.isArray(v);
const output = (result, updates = []) => ({ result: JSON.stringify(result), updates });

function call(ctx, name, argsText) {
  const args = JSON.parse(argsText);
  switch (name) {
    case "increment": {
      const counter = stringArg(args, "name");
      let counters = read(ctx, "counters");
      if (counters === undefined || counters === null) counters = {};
      if (!isObject(counters)) throw failed('deps key "counters" is not an object');
      const current = Object.hasOwn(counters, counter) ? counters[counter] : 0;
      if (!Number.isSafeInteger(current)) {
        throw failed(`counter ${JSON.stringify(counter)} is not an integer`);
      }
      counters[counter] = current + 1;
      return output({ counter, value: current + 1 }, [
        { tag: "set", val: { key: "counters", value: JSON.stringify(counters) } },
      ]);
    }
    case "add_note": {
      const text = stringArg(args, "text");
      const notes = read(ctx, "notes");
      const count = Array.isArray(notes) ? notes.length : 0;
      return output({ added: text, total: count + 1 }, [
        { tag: "append", val: { key: "notes", value: JSON.stringify(text) } },
      ]);
    }
    case "show_state": {
      const counters = read(ctx, "counters");
      const notes = read(ctx, "notes");
      return output({
        counters: counters === undefined || counters === null ? {} : counters,
        notes: notes === undefined || notes === null ? [] : notes,
      });
    }
    default:
      throw failed(`no tool named ${JSON.stringify(name)}`);
  }
}

export const tool = {
  describe() {
    return SPECS.map(({ name, description, parameters }) => ({
      name,
      description,
      parameters: JSON.stringify(parameters),
    }));
  },
  call,
};
