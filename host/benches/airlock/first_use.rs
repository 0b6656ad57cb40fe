//! §21 A first use: compiling the Python and JavaScript examples from an
//! empty cache, in the binary the README puts on `PATH` (the debug build,
//! `target/debug/airlock`) beside the release build.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use crate::harness::{Bench, component, root};

/// Seconds the README's binary may take (issue "Performance IV").
const TARGET_S: f64 = 5.0;

pub(crate) async fn run(b: &Bench, out: &mut String) {
    writeln!(
        out,
        "## 21. First use: compiling an interpreter's component\n\n\
         `airlock inspect` of the Python and JavaScript `stateful` examples (18 and 12 MB: an \
         interpreter each) with an empty compile cache, wall-clock time of the whole command \
         (its compile runs in a bounded child process, Cranelift on both cores); the binary the \
         README names (`target/debug/airlock`) beside the release build, runs alternating, \
         median of {}.\n",
        runs(b)
    )
    .unwrap();
    let readme = root().join("target/debug/airlock");
    if !readme.is_file() {
        writeln!(out, "Not measured: {} is not built.\n", readme.display()).unwrap();
        return;
    }
    let release = std::path::PathBuf::from(env!("CARGO_BIN_EXE_airlock"));
    writeln!(
        out,
        "| component | README's binary (debug) | release | target (README's) | |\n|---|---|---|---|---|"
    )
    .unwrap();
    for (name, file) in [
        ("Python (`python-stateful.wasm`)", "python-stateful.wasm"),
        ("JavaScript (`js-stateful.wasm`)", "js-stateful.wasm"),
    ] {
        let wasm = component(file);
        let (mut debug, mut fast) = (Vec::new(), Vec::new());
        for _ in 0..runs(b) {
            debug.push(first_use(&readme, &wasm));
            fast.push(first_use(&release, &wasm));
        }
        let (debug, fast) = (median(debug), median(fast));
        writeln!(
            out,
            "| {name} | {:.1} s | {:.1} s | ≤ {TARGET_S:.0} s | {} |",
            debug.as_secs_f64(),
            fast.as_secs_f64(),
            crate::harness::verdict(debug.as_secs_f64() <= TARGET_S)
        )
        .unwrap();
    }
    writeln!(
        out,
        "\nNearly all of it is Cranelift compiling the interpreter's functions (register \
         allocation about a quarter of it). The dev profile builds Cranelift's own crates at \
         opt-level 2 (Cargo.toml); the rest of the debug binary's gap to the release build is \
         the code around them at opt-level 0. A terminal shows the compile's elapsed time after \
         a second; later runs load it from the cache in milliseconds (§2).\n"
    )
    .unwrap();
}

fn runs(b: &Bench) -> usize {
    if b.quick { 1 } else { 3 }
}

/// How long `binary` takes to inspect `wasm` with an empty cache.
fn first_use(binary: &std::path::Path, wasm: &std::path::Path) -> Duration {
    let cache = tempfile::tempdir_in(root().join("target")).unwrap();
    let started = Instant::now();
    let status = std::process::Command::new(binary)
        .arg("inspect")
        .arg(wasm)
        .env("AIRLOCK_CACHE_DIR", cache.path())
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(
        status.success(),
        "{} inspect {}",
        binary.display(),
        wasm.display()
    );
    started.elapsed()
}

fn median(mut values: Vec<Duration>) -> Duration {
    values.sort();
    values[values.len() / 2]
}
