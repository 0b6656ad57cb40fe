//! Runs the increment work on the peers `make bench` measures Airlock
//! beside, as the bench asks: one command a line on stdin, one answer a
//! line on stdout.
//!
//! - `reused N`: N calls on one Extism plugin instance; prints the
//!   nanoseconds.
//! - `fresh N`: N calls, each on a new instance of the plugin compiled
//!   once (`Plugin::new_from_compiled`); prints the nanoseconds.
//! - `bytes N`: N calls, each on a plugin made from the wasm bytes
//!   (`Plugin::new`: compiled each time); prints the nanoseconds.
//! - `native N`: N calls of the same work as a native function, no
//!   sandbox at all; prints the nanoseconds.
//! - `spawn N`: N calls, each a new process (this binary with `--once`:
//!   the JSON in on stdin, out on stdout), as a host that isolates a tool
//!   in a process per call does; prints the nanoseconds.
//! - `check`: one call on the reused plugin; prints its output (the bench
//!   compares it with Airlock's).
//!
//! The counters carry over from call to call, as deps do in Airlock.

use std::io::{BufRead, Read, Write};
use std::process::{Command, Stdio};
use std::time::Instant;

use extism::{CompiledPlugin, Manifest, Plugin, PluginBuilder, Wasm};

#[path = "../../plugin/src/work.rs"]
mod work;

type Result<T> = std::result::Result<T, extism::Error>;

fn main() -> Result<()> {
    let arg = std::env::args().nth(1).ok_or_else(|| {
        extism::Error::msg("usage: peers-harness PLUGIN.wasm | peers-harness --once")
    })?;
    if arg == "--once" {
        return once();
    }
    let wasm = std::fs::read(&arg)?;
    let manifest = || Manifest::new([Wasm::data(wasm.clone())]);
    let compiled = CompiledPlugin::new(PluginBuilder::new(manifest()).with_wasi(false))?;
    let mut reused = Plugin::new_from_compiled(&compiled)?;
    let mut counters = String::from("null");
    let stdin = std::io::stdin();
    let mut stdout = std::io::stdout().lock();
    for line in stdin.lock().lines() {
        let line = line?;
        let mut words = line.split_whitespace();
        let command = words.next().unwrap_or_default();
        let n: u64 = words.next().and_then(|w| w.parse().ok()).unwrap_or(1);
        let c = &mut counters;
        let answer = match command {
            "reused" => timed(n, c, |c| step(c, on(&mut reused)))?,
            "fresh" => timed(n, c, |c| {
                let mut plugin = Plugin::new_from_compiled(&compiled)?;
                step(c, on(&mut plugin))
            })?,
            "bytes" => timed(n, c, |c| {
                let mut plugin = Plugin::new(manifest(), [], false)?;
                step(c, on(&mut plugin))
            })?,
            "native" => timed(n, c, |c| {
                step(c, |input| {
                    work::increment(&input).map_err(extism::Error::msg)
                })
            })?,
            "spawn" => timed(n, c, |c| step(c, spawn_once))?,
            "check" => step(c, on(&mut reused))?,
            other => format!("error: unknown command {other:?}"),
        };
        writeln!(stdout, "{answer}")?;
        stdout.flush()?;
    }
    Ok(())
}

/// `n` calls of `one`; the nanoseconds they took, as the answer.
fn timed(
    n: u64,
    counters: &mut String,
    mut one: impl FnMut(&mut String) -> Result<String>,
) -> Result<String> {
    let started = Instant::now();
    for _ in 0..n {
        one(counters)?;
    }
    Ok(started.elapsed().as_nanos().to_string())
}

/// A call of the plugin's `increment` on `plugin`.
fn on(plugin: &mut Plugin) -> impl FnOnce(String) -> Result<String> + '_ {
    move |input| plugin.call::<String, String>("increment", input)
}

/// One call: the input built from `counters`, run by `run`; `counters`
/// becomes what the call set (as the host would apply its op), found by
/// position, as cheaply as the tool's own host would take its op's value.
fn step(counters: &mut String, run: impl FnOnce(String) -> Result<String>) -> Result<String> {
    let input = format!(r#"{{"counters":{counters},"args":{{"name":"n"}}}}"#);
    let output = run(input)?;
    if let Some(start) = output.find(r#""value":{"#) {
        let value = &output[start + r#""value":"#.len()..];
        if let Some(end) = value.rfind("}]") {
            *counters = value[..end].to_owned();
        }
    }
    Ok(output)
}

/// One call in a new process: this binary with `--once`.
fn spawn_once(input: String) -> Result<String> {
    let mut child = Command::new(std::env::current_exe()?)
        .arg("--once")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(input.as_bytes())?;
    }
    let output = child.wait_with_output()?;
    if !output.status.success() {
        return Err(extism::Error::msg(format!("--once: {}", output.status)));
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// `--once`: one call's JSON in on stdin, its output on stdout.
fn once() -> Result<()> {
    let mut input = String::new();
    std::io::stdin().read_to_string(&mut input)?;
    let output = work::increment(&input).map_err(extism::Error::msg)?;
    std::io::stdout().write_all(output.as_bytes())?;
    Ok(())
}
