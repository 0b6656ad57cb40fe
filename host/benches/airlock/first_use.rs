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
         interpreter each) with an empty compile cache, wall-clock time of the whole command: \
         its first use runs on code of Winch, the baseline compiler (in a bounded child process, \
         on both cores), while a child at the lowest priority compiles Cranelift's optimised \
         code into the cache; then, from the command's start, the time until that code is in the \
         cache (the next command's start is a cache hit, §2). The binary the README names \
         (`target/debug/airlock`) beside the release build, runs alternating, each on an idle \
         machine (the previous run's filler done), median of {}.\n",
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
        "| component | README's binary (debug) | release | target (README's) | | optimised code cached after (debug, release) |\n|---|---|---|---|---|---|"
    )
    .unwrap();
    for (name, file) in [
        ("Python (`python-stateful.wasm`)", "python-stateful.wasm"),
        ("JavaScript (`js-stateful.wasm`)", "js-stateful.wasm"),
    ] {
        let wasm = component(file);
        let (mut debug, mut fast) = (Vec::new(), Vec::new());
        let (mut debug_filled, mut fast_filled) = (Vec::new(), Vec::new());
        for _ in 0..runs(b) {
            let (used, filled) = first_use(&readme, &wasm);
            debug.push(used);
            debug_filled.push(filled);
            let (used, filled) = first_use(&release, &wasm);
            fast.push(used);
            fast_filled.push(filled);
        }
        let (debug, fast) = (median(debug), median(fast));
        writeln!(
            out,
            "| {name} | {:.1} s | {:.1} s | ≤ {TARGET_S:.0} s | {} | {:.1} s, {:.1} s |",
            debug.as_secs_f64(),
            fast.as_secs_f64(),
            crate::harness::verdict(debug.as_secs_f64() <= TARGET_S),
            median(debug_filled).as_secs_f64(),
            median(fast_filled).as_secs_f64(),
        )
        .unwrap();
    }
    writeln!(
        out,
        "\nNearly all of a first use is Winch compiling the interpreter's functions, and \
         Cranelift compiling a trampoline for each function a table holds (wasmtime makes \
         those with Cranelift whichever compiler compiles the functions). The dev profile \
         builds Winch, Cranelift and the crates they spend their time in (wasmparser, \
         wasmtime-environ, the x64 assembler) at opt-level 2 (Cargo.toml). With \
         `AIRLOCK_BASELINE_FIRST=off` the README's binary waits for Cranelift instead, more than \
         three times as long. A terminal shows the compile's elapsed time after a second; later runs load the optimised code \
         from the cache in milliseconds (§2).\n"
    )
    .unwrap();
}

fn runs(b: &Bench) -> usize {
    if b.quick { 1 } else { 3 }
}

/// How long `binary` takes to inspect `wasm` with an empty cache, and how
/// long from its start until the optimised code is in the cache (waited
/// for, so that the next run starts on an idle machine).
fn first_use(binary: &std::path::Path, wasm: &std::path::Path) -> (Duration, Duration) {
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
    let used = started.elapsed();
    // Waited on the cache itself: an entry and no filler's lock.
    loop {
        let names: Vec<String> = std::fs::read_dir(cache.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        if names.iter().any(|n| n.ends_with(".cwasm"))
            && !names.iter().any(|n| n.ends_with(".lock"))
        {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "{} never filled the cache for {}",
            binary.display(),
            wasm.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    (used, started.elapsed())
}

fn median(mut values: Vec<Duration>) -> Duration {
    values.sort();
    values[values.len() / 2]
}
