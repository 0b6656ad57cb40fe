//! A plain component: it exports `example:typed/values` and a world-level
//! `version`, knows nothing of Airlock, and every one of its functions that
//! passes plain values is a tool (see `../../typed/wit/typed.wit`).

use std::cell::Cell;
use std::sync::atomic::{AtomicU32, Ordering};

wit_bindgen::generate!({ path: "../../typed/wit", world: "typed" });

use exports::example::typed::values::{
    Counter, ErrorInfo, Everything, Guest as Values, GuestCounter, Point, Shape,
};

struct Typed;

impl Guest for Typed {
    fn version() -> String {
        "0.1.0".into()
    }
}

impl Values for Typed {
    type Counter = Next;

    fn echo(value: Everything) -> Everything {
        value
    }

    fn add(a: i64, b: i64) -> i64 {
        a.wrapping_add(b)
    }

    fn divide(a: f64, b: f64) -> Result<f64, String> {
        if b == 0.0 {
            Err("division by zero".into())
        } else {
            Ok(a / b)
        }
    }

    fn area(shape: Shape) -> f64 {
        match shape {
            Shape::Circle(r) => std::f64::consts::PI * r * r,
            Shape::Rectangle((w, h)) => w * h,
            Shape::Dot => 0.0,
        }
    }

    fn check(at: Point) -> Result<Point, ErrorInfo> {
        if (0..100).contains(&at.x) && (0..100).contains(&at.y) {
            Ok(at)
        } else {
            Err(ErrorInfo {
                code: 422,
                message: "the point lies outside the square".into(),
            })
        }
    }

    fn nothing() {}

    fn calls() -> u32 {
        static CALLS: AtomicU32 = AtomicU32::new(0);
        CALLS.fetch_add(1, Ordering::Relaxed) + 1
    }

    fn make_counter(start: u32) -> Counter {
        Counter::new(Next(Cell::new(start)))
    }
}

/// The counter resource.
pub struct Next(Cell<u32>);

impl GuestCounter for Next {
    fn new(start: u32) -> Self {
        Next(Cell::new(start))
    }

    fn next(&self) -> u32 {
        let n = self.0.get();
        self.0.set(n.wrapping_add(1));
        n
    }
}

export!(Typed);
