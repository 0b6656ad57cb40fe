//! Where components are compiled.
//!
//! Compiling is running untrusted input through Cranelift: a small hostile
//! component can take minutes and gigabytes, and a compiler bug on hostile
//! input would take the process down with it. With [`Compiler::Child`] the
//! host compiles each component (on a cache miss) in a child process of its
//! own executable, under a wall-clock deadline (the child is killed when it
//! passes), a data-memory limit (`RLIMIT_DATA`) and a CPU-time limit; the
//! host process never runs the compiler and keeps serving meanwhile.
//!
//! The child protocol: the executable is started with [`CHILD_ENV`] set and
//! `INPUT OUTPUT FUEL CEILING` as arguments; it must call
//! [`compile_child_main`] before anything else (the `airlock` binary does).
//! It builds an engine with the same code-generation settings as the host's
//! (fuel, memory ceiling; the pool's size does not affect code, and a pool
//! of one keeps the child's own reservations small), compiles INPUT and
//! writes OUTPUT. wasmtime checks on load that the result fits the host's
//! engine.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::{Sandbox, SandboxConfig};

/// Set (to `1`) in the environment of a compile child.
pub const CHILD_ENV: &str = "AIRLOCK_COMPILE_CHILD";

/// How components are compiled.
#[derive(Debug, Clone, Default)]
pub enum Compiler {
    /// In this process, on a blocking thread, with no bound (the library's
    /// default: an embedder's executable may have no child entry point).
    #[default]
    InProcess,
    /// In a child process running `exe`, which calls
    /// [`compile_child_main`] first thing, within `limits`.
    Child {
        /// The executable to start.
        exe: PathBuf,
        /// Its deadline and memory.
        limits: CompileLimits,
    },
}

/// Bounds on compiling one component in a child process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompileLimits {
    /// Wall-clock time; the child is killed past it. Default 120 s.
    pub timeout: Duration,
    /// Data memory of the child (`RLIMIT_DATA`). Default 4 GiB.
    pub max_memory_bytes: u64,
}

impl Default for CompileLimits {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(120),
            max_memory_bytes: 4 << 30,
        }
    }
}

/// A compile that ran past its limits or crashed.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct CompileFailure(pub String);

/// Compiles `bytes` as `config`'s engine would, under `compiler`.
pub(crate) fn precompile(
    compiler: &Compiler,
    config: &SandboxConfig,
    engine: &wasmtime::Engine,
    bytes: &[u8],
) -> wasmtime::Result<Vec<u8>> {
    match compiler {
        Compiler::InProcess => engine.precompile_component(bytes),
        Compiler::Child { exe, limits } => {
            Ok(in_child(exe, limits, config, bytes).map_err(wasmtime::Error::new)?)
        }
    }
}

fn in_child(
    exe: &Path,
    limits: &CompileLimits,
    config: &SandboxConfig,
    bytes: &[u8],
) -> Result<Vec<u8>, CompileFailure> {
    let fail = |what: &str, e: std::io::Error| CompileFailure(format!("{what}: {e}"));
    let dir = tempfile::tempdir().map_err(|e| fail("cannot make a work directory", e))?;
    let (input, output) = (dir.path().join("in.wasm"), dir.path().join("out.cwasm"));
    std::fs::write(&input, bytes).map_err(|e| fail("cannot write the component", e))?;
    let mut child = Command::new(exe)
        .env(CHILD_ENV, "1")
        .env(
            "AIRLOCK_COMPILE_MEMORY",
            limits.max_memory_bytes.to_string(),
        )
        .env(
            "AIRLOCK_COMPILE_CPU_SECS",
            (limits.timeout.as_secs() + 1).to_string(),
        )
        .arg(&input)
        .arg(&output)
        .arg(if config.fuel_metering { "1" } else { "0" })
        .arg(config.max_memory_ceiling.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| fail(&format!("cannot start the compiler ({})", exe.display()), e))?;
    let deadline = Instant::now() + limits.timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(CompileFailure(format!(
                    "compiling took longer than {} ms; it was stopped",
                    limits.timeout.as_millis()
                )));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => return Err(fail("cannot wait for the compiler", e)),
        }
    };
    if !status.success() {
        use std::os::unix::process::ExitStatusExt;
        let how = match (status.code(), status.signal()) {
            (Some(code), _) => format!("exited with status {code}"),
            (None, Some(signal)) => format!("was killed by signal {signal}"),
            _ => "failed".to_owned(),
        };
        return Err(CompileFailure(format!(
            "the compiler {how}: the component is invalid, or needs more than the {} MiB of \
             memory or the CPU time compiling may use",
            limits.max_memory_bytes >> 20
        )));
    }
    std::fs::read(&output).map_err(|e| fail("cannot read the compiled code", e))
}

/// The compile child's whole life, when this process is one (see the module
/// documentation): `Some(exit code)` if it was, `None` otherwise. Call it
/// first thing in `main`.
pub fn compile_child_main() -> Option<i32> {
    std::env::var_os(CHILD_ENV)?;
    Some(match child() {
        Ok(()) => 0,
        Err(_) => 1,
    })
}

fn child() -> Result<(), Box<dyn std::error::Error>> {
    use rustix::process::{Resource, Rlimit, setrlimit};
    let limit = |name: &str| -> Option<u64> { std::env::var(name).ok()?.parse().ok() };
    if let Some(bytes) = limit("AIRLOCK_COMPILE_MEMORY") {
        let cap = Rlimit {
            current: Some(bytes),
            maximum: Some(bytes),
        };
        setrlimit(Resource::Data, cap)?;
    }
    if let Some(secs) = limit("AIRLOCK_COMPILE_CPU_SECS") {
        let cap = Rlimit {
            current: Some(secs),
            maximum: Some(secs),
        };
        setrlimit(Resource::Cpu, cap)?;
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [input, output, fuel, ceiling] = args.as_slice() else {
        return Err("usage: INPUT OUTPUT FUEL CEILING".into());
    };
    let sandbox = Sandbox::new(SandboxConfig {
        cache: super::CompileCache::disabled(),
        max_concurrent_instances: 1,
        max_memory_ceiling: ceiling.parse()?,
        fuel_metering: fuel == "1",
        compiler: Compiler::InProcess,
    })
    .map_err(|e| e.to_string())?;
    let bytes = std::fs::read(input)?;
    let compiled = sandbox
        .engine()
        .precompile_component(&bytes)
        .map_err(|e| e.to_string())?;
    crate::fs::write_atomic(Path::new(output), &compiled)?;
    Ok(())
}
