//! Runs the increment plugin on Extism, as `make bench` asks: one command a
//! line on stdin, one answer a line on stdout.
//!
//! - `reused N`: N calls on one plugin instance; prints the nanoseconds.
//! - `fresh N`: N calls, each on a new instance of the plugin compiled
//!   once (`Plugin::new_from_compiled`); prints the nanoseconds.
//! - `bytes N`: N calls, each on a plugin made from the wasm bytes
//!   (`Plugin::new`: compiled each time); prints the nanoseconds.
//! - `check`: one call; prints its output (the bench compares it with
//!   Airlock's).
//!
//! The counters carry over from call to call, as deps do in Airlock.

use std::io::{BufRead, Write};
use std::time::Instant;

use extism::{CompiledPlugin, Manifest, Plugin, PluginBuilder, Wasm};

fn main() -> Result<(), extism::Error> {
    let path = std::env::args()
        .nth(1)
        .ok_or_else(|| extism::Error::msg("usage: peers-harness PLUGIN.wasm"))?;
    let wasm = std::fs::read(&path)?;
    let manifest = || Manifest::new([Wasm::data(wasm.clone())]);
    let compiled = CompiledPlugin::new(PluginBuilder::new(manifest()).with_wasi(false))?;
    let mut reused = Plugin::new_from_compiled(&compiled)?;
    let mut counters = String::from("null");
    let call = |plugin: &mut Plugin, counters: &mut String| -> Result<String, extism::Error> {
        let input = format!(r#"{{"counters":{counters},"args":{{"name":"n"}}}}"#);
        let output: String = plugin.call("increment", input)?;
        // The next call sees the counters this one set (as the host would
        // apply the op); found by position, as cheaply as the tool's own
        // host would take its op's value.
        if let Some(start) = output.find(r#""value":{"#) {
            let value = &output[start + r#""value":"#.len()..];
            if let Some(end) = value.rfind("}]") {
                *counters = value[..end].to_owned();
            }
        }
        Ok(output)
    };
    let stdin = std::io::stdin();
    let mut stdout = std::io::stdout().lock();
    for line in stdin.lock().lines() {
        let line = line?;
        let mut words = line.split_whitespace();
        let command = words.next().unwrap_or_default();
        let n: u64 = words.next().and_then(|w| w.parse().ok()).unwrap_or(1);
        let started = Instant::now();
        let answer = match command {
            "reused" => {
                for _ in 0..n {
                    call(&mut reused, &mut counters)?;
                }
                started.elapsed().as_nanos().to_string()
            }
            "fresh" => {
                for _ in 0..n {
                    let mut plugin = Plugin::new_from_compiled(&compiled)?;
                    call(&mut plugin, &mut counters)?;
                }
                started.elapsed().as_nanos().to_string()
            }
            "bytes" => {
                for _ in 0..n {
                    let mut plugin = Plugin::new(manifest(), [], false)?;
                    call(&mut plugin, &mut counters)?;
                }
                started.elapsed().as_nanos().to_string()
            }
            "check" => call(&mut reused, &mut counters)?,
            other => format!("error: unknown command {other:?}"),
        };
        writeln!(stdout, "{answer}")?;
        stdout.flush()?;
    }
    Ok(())
}
