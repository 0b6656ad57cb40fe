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

/// How components are compiled. Whichever, a component whose functions
/// ask the compiler for too much is refused before it compiles
/// ([`super::complexity`]).
#[derive(Debug, Clone, Default)]
pub enum Compiler {
    /// In this process, on a blocking thread (the library's default: an
    /// embedder's executable may have no child entry point). Bounded by
    /// [`super::complexity`] only: no deadline and no memory cap.
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

/// Bounds on compiling one component in a child process. Unset, each is
/// scaled to the component ([`CompileLimits::for_size`]): a small
/// component gets a few seconds and a few hundred MiB, an interpreter's
/// more.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CompileLimits {
    /// Wall-clock time; the child is killed past it (and its CPU time is
    /// capped at as much per core). Default: 5 s and 1 s per MiB.
    pub timeout: Option<Duration>,
    /// Data memory of the child (`RLIMIT_DATA`). Default: 256 MiB and 48
    /// bytes per byte of component.
    pub max_memory_bytes: Option<u64>,
}

/// Compile time every component is given, whatever its size.
const BASE_TIMEOUT: Duration = Duration::from_secs(5);
/// Compile time given per MiB of component.
const TIMEOUT_PER_MIB: Duration = Duration::from_secs(1);
/// Compile memory every component is given.
const BASE_MEMORY: u64 = 256 << 20;
/// Compile memory given per byte of component. CPython (18 MB) peaks at
/// 360 MB and SpiderMonkey (12 MB) at 390 MB, compiling on 2 cores.
const MEMORY_PER_BYTE: u64 = 48;

impl CompileLimits {
    /// The deadline and memory for a component of `bytes` bytes: what is
    /// set, else scaled to its size. Python's 18 MB get 23 s and 1.1 GiB;
    /// a 100 KB component 5 s and 261 MiB.
    pub fn for_size(&self, bytes: usize) -> (Duration, u64) {
        let mib = u32::try_from(bytes >> 20).unwrap_or(u32::MAX);
        let timeout = self
            .timeout
            .unwrap_or_else(|| BASE_TIMEOUT.saturating_add(TIMEOUT_PER_MIB.saturating_mul(mib)));
        let memory = self.max_memory_bytes.unwrap_or_else(|| {
            BASE_MEMORY.saturating_add(MEMORY_PER_BYTE.saturating_mul(bytes as u64))
        });
        (timeout, memory)
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
    // WAT text is weighed (and compiled) as the binary it stands for.
    let bytes = &*wat::parse_bytes(bytes)?;
    super::complexity::check(bytes)
        .map_err(|e| wasmtime::Error::new(CompileFailure(e.to_string())))?;
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
    let (timeout, max_memory) = limits.for_size(bytes.len());
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    let dir = tempfile::tempdir().map_err(|e| fail("cannot make a work directory", e))?;
    let (input, output) = (dir.path().join("in.wasm"), dir.path().join("out.cwasm"));
    std::fs::write(&input, bytes).map_err(|e| fail("cannot write the component", e))?;
    let mut child = Command::new(exe)
        .env(CHILD_ENV, "1")
        .env("AIRLOCK_COMPILE_MEMORY", max_memory.to_string())
        .env(
            "AIRLOCK_COMPILE_CPU_SECS",
            (timeout.as_secs().saturating_mul(cores as u64) + 1).to_string(),
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
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(CompileFailure(format!(
                    "compiling took longer than {} ms; it was stopped",
                    timeout.as_millis()
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
            max_memory >> 20
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
