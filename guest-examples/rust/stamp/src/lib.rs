//! `stamp {label}`: a stamp with the time it was made and a random id,
//! appended to deps' `stamps`. It reads the wall clock, the monotonic
//! clock and random bytes, so no two calls give the same result; the host
//! journals what each call read, and `airlock replay` gives a call the
//! very same values.
//!
//! Three builds of this one source, for the replay example:
//!
//! - `stamp` (v1): the label as given;
//! - `stamp-v2` (feature `v2`): the label trimmed and lowercased, so a
//!   replay of v1's sessions shows the calls whose label changes, and
//!   only those;
//! - `stamp-broken` (feature `broken`): every call traps.

use airlock_guest::{Context, Output, Spec, Tool, ToolError, Updates, Value, json, str_arg};
use wasip2::clocks::{monotonic_clock, wall_clock};
use wasip2::random::random;

struct Stamp;

impl Tool for Stamp {
    fn describe() -> Vec<Spec> {
        vec![Spec::new(
            "stamp",
            "Make a stamp: the label, a random id and the time, kept in the run's stamps.",
            json!({
                "type": "object",
                "properties": {"label": {"type": "string", "description": "What the stamp is for"}},
                "required": ["label"],
                "additionalProperties": false
            }),
        )]
    }

    fn call(_ctx: &Context, name: &str, args: &Value) -> Result<Output, ToolError> {
        if name != "stamp" {
            return Err(ToolError::Failed(format!("no tool named {name:?}")));
        }
        let started = monotonic_clock::now();
        let label = label(str_arg(args, "label")?);
        let id: String = random::get_random_bytes(8)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let now = wall_clock::now();
        let at_ms = now.seconds * 1000 + u64::from(now.nanoseconds / 1_000_000);
        let took_ns = monotonic_clock::now().saturating_sub(started);
        let stamp = json!({"label": label, "id": id, "at_ms": at_ms});
        Ok(Output::new(json!({"stamp": stamp, "took_ns": took_ns}))
            .with(Updates::new().append("stamps", stamp)))
    }
}

#[cfg(not(any(feature = "v2", feature = "broken")))]
fn label(given: &str) -> String {
    given.to_owned()
}

#[cfg(feature = "v2")]
fn label(given: &str) -> String {
    given.trim().to_lowercase()
}

#[cfg(all(feature = "broken", not(feature = "v2")))]
fn label(_given: &str) -> String {
    // A trap, as a bug in a new version would make one.
    std::process::abort()
}

airlock_guest::export_tool!(Stamp);
