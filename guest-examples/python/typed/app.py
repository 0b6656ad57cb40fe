"""The typed example in Python: a plain component exporting
`example:typed/values` and `version` (../../typed/wit/typed.wit), with the
same results as the Rust and JavaScript versions (tests/all/plain.rs checks
that every type round-trips to identical JSON in all three).

Build: componentize-py -d ../../typed/wit -w typed componentize app -o typed.wasm
"""

import math

from componentize_py_types import Err
from wit_world import WitWorld as World
from wit_world import exports
from wit_world.exports import values as v

# `calls` counts here: in a global of the instance.
CALLS = 0


class WitWorld(World):
    def version(self) -> str:
        return "0.1.0"


class Values(exports.Values):
    def echo(self, value: v.Everything) -> v.Everything:
        return value

    def add(self, a: int, b: int) -> int:
        # s64 arithmetic wraps, as in the other languages.
        total = (a + b + 2**63) % 2**64 - 2**63
        return total

    def divide(self, a: float, b: float) -> float:
        if b == 0.0:
            raise Err("division by zero")
        return a / b

    def area(self, shape: v.Shape) -> float:
        if isinstance(shape, v.Shape_Circle):
            return math.pi * shape.value * shape.value
        if isinstance(shape, v.Shape_Rectangle):
            width, height = shape.value
            return width * height
        return 0.0

    def check(self, at: v.Point) -> v.Point:
        if 0 <= at.x < 100 and 0 <= at.y < 100:
            return at
        raise Err(v.ErrorInfo(code=422, message="the point lies outside the square"))

    def nothing(self) -> None:
        return None

    def calls(self) -> int:
        global CALLS
        CALLS += 1
        return CALLS

    def make_counter(self, start: int) -> "Counter":
        return Counter(start)


class Counter:
    """The counter resource (componentize-py finds it in the module named
    after its interface: values.py re-exports this class)."""

    def __init__(self, start: int) -> None:
        self.n = start

    def next(self) -> int:
        n = self.n
        self.n = (n + 1) % 2**32
        return n
