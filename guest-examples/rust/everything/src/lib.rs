//! The tools the official MCP conformance suite calls (its server
//! scenarios name them), as far as Airlock's contract lets a tool answer
//! them; `make test` runs the suite against `airlock mcp` serving this
//! component (tests/all/mcp_conformance.rs).
//!
//! - `test_simple_text {}`: a text result.
//! - `test_error_handling {}`: a failed call.
//! - `test_tool_with_logging {}`: three log records as it runs (a client
//!   that set a log level hears them as they are made).
//! - `test_tool_with_progress {}`: progress 0, 50 and 100 of 100 (a
//!   client that sent a progress token hears them as they are made).

use std::time::Duration;

use airlock_guest::{Context, LogLevel, Output, Spec, Tool, ToolError, Value, json};

/// How long the logging and progress tools wait between reports, so that
/// a client sees them arrive while the call runs.
const PAUSE: Duration = Duration::from_millis(50);

struct Everything;

fn no_arguments() -> Value {
    json!({"type": "object", "properties": {}, "additionalProperties": false})
}

impl Tool for Everything {
    fn describe() -> Vec<Spec> {
        vec![
            Spec::new(
                "test_simple_text",
                "Returns a simple text response.",
                no_arguments(),
            ),
            Spec::new(
                "test_error_handling",
                "Always fails, with a message saying so.",
                no_arguments(),
            ),
            Spec::new(
                "test_tool_with_logging",
                "Logs three messages while it runs.",
                no_arguments(),
            ),
            Spec::new(
                "test_tool_with_progress",
                "Reports progress 0, 50 and 100 of 100 while it runs.",
                no_arguments(),
            ),
        ]
    }

    fn call(_ctx: &Context, name: &str, _args: &Value) -> Result<Output, ToolError> {
        match name {
            "test_simple_text" => Ok(Output::new(json!(
                "This is a simple text response for testing."
            ))),
            "test_error_handling" => Err(ToolError::Failed(
                "This tool intentionally returns an error for testing".into(),
            )),
            "test_tool_with_logging" => {
                let steps = [
                    "Tool execution started",
                    "Tool processing data",
                    "Tool execution completed",
                ];
                for (i, step) in steps.into_iter().enumerate() {
                    if i > 0 {
                        std::thread::sleep(PAUSE);
                    }
                    airlock_guest::log(LogLevel::Info, step);
                }
                Ok(Output::new(json!("Logged three messages.")))
            }
            "test_tool_with_progress" => {
                for (i, done) in [0.0, 50.0, 100.0].into_iter().enumerate() {
                    if i > 0 {
                        std::thread::sleep(PAUSE);
                    }
                    airlock_guest::progress(done, Some(100.0), Some(&format!("{done} of 100")));
                }
                Ok(Output::new(json!("Progress reported.")))
            }
            other => Err(ToolError::InvalidArgs(format!("no tool {other}"))),
        }
    }
}

airlock_guest::export_tool!(Everything);
