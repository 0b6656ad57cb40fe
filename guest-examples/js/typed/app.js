// The typed example in JavaScript: a plain component exporting
// `example:typed/values` and `version` (../../typed/wit/typed.wit), with the
// same results as the Rust and Python versions (tests/all/plain.rs checks
// that every type round-trips to identical JSON in all three).
//
// Build (from guest-examples/js/stateful, where the toolchain is installed):
//   npx componentize-js ../typed/app.js --wit ../../typed/wit -n typed -d http -d fetch-event -o typed.wasm
//
// WIT mapping (componentize-js): s64/u64 are BigInts, variants are
// `{tag, val}`, a `result` export returns the ok value or throws the error.

// `calls` counts here: in a global of the instance.
let calls = 0;

export function version() {
  return "0.1.0";
}

class Counter {
  constructor(start) {
    this.n = start;
  }

  next() {
    const n = this.n;
    this.n = (n + 1) >>> 0;
    return n;
  }
}

export const values = {
  Counter,

  echo(value) {
    return value;
  },

  add(a, b) {
    return BigInt.asIntN(64, a + b);
  },

  divide(a, b) {
    if (b === 0) {
      throw "division by zero";
    }
    return a / b;
  },

  area(shape) {
    switch (shape.tag) {
      case "circle":
        return Math.PI * shape.val * shape.val;
      case "rectangle":
        return shape.val[0] * shape.val[1];
      default:
        return 0;
    }
  },

  check(at) {
    if (at.x >= 0 && at.x < 100 && at.y >= 0 && at.y < 100) {
      return at;
    }
    throw { code: 422, message: "the point lies outside the square" };
  },

  nothing() {},

  calls() {
    calls += 1;
    return calls;
  },

  makeCounter(start) {
    return new Counter(start);
  },
};
