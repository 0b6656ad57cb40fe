//! Where components are compiled.
//!
//! Compiling is running untrusted input through Cranelift: a small hostile
//! component can take minutes and gigabytes, and a compiler bug on hostile
//! input would take the process down with it. With [`Compiler::Child`] the
//! host compiles each component (on a cache miss) in a child process of its
//! own executable, under a CPU-time limit (the CPU the child has used, all
//! its threads, read every 5 ms: it is killed past the limit, and
//! `RLIMIT_CPU` stands behind that) and a data-memory limit
//! (`RLIMIT_DATA`). CPU time, not wall-clock time, so that a good
//! component is not refused because the machine is busy: compiling it costs
//! the same CPU however long it waits for a core. A wall-clock deadline
//! far past the CPU limit catches only a child that stopped making
//! progress. The host process never runs the compiler and keeps serving
//! meanwhile. The child's own error (what the compiler said) comes back,
//! so an invalid component is told apart from one over the limits.
//!
//! The child protocol: the executable is started with [`CHILD_ENV`] set and
//! `INPUT OUTPUT FUEL CEILING TIER` as arguments; it must call
//! [`compile_child_main`] before anything else (the `airlock` binary does).
//! It builds an engine with the same code-generation settings as the host's
//! (fuel, memory ceiling, the [`Tier`]'s compiler; the pool's size does not
//! affect code, and a pool of one keeps the child's own reservations
//! small), compiles INPUT and writes OUTPUT. wasmtime checks on load that
//! the result fits the host's engine.
//!
//! A child that fills the cache in the background ([`fill_later`]) is
//! also given [`FILL_ENV`], the SHA-256 the component's content had when
//! its parent read it: it then writes OUTPUT (an entry of the cache) only
//! if INPUT still holds that content, runs at the lowest CPU priority,
//! holds a lock beside OUTPUT while it compiles (a second filler of the
//! same entry leaves at once), and is not waited for: its parent may have
//! exited before it ends. The kernel's CPU and memory limits bound it.

use std::os::unix::fs::OpenOptionsExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::{Sandbox, SandboxConfig, Tier};

/// Set (to `1`) in the environment of a compile child.
pub const CHILD_ENV: &str = "AIRLOCK_COMPILE_CHILD";

/// Set, in a compile child's environment, to the content hash its INPUT
/// must have: the child fills the cache entry OUTPUT (see the module
/// documentation).
const FILL_ENV: &str = "AIRLOCK_COMPILE_FILL";

/// How components are compiled. Whichever, a component whose functions
/// ask the compiler for too much is refused before it compiles
/// ([`super::complexity`]).
#[derive(Debug, Clone, Default)]
pub enum Compiler {
    /// In this process, on a blocking thread (the library's default: an
    /// embedder's executable may have no child entry point). Bounded by
    /// [`super::complexity`] only: no CPU or memory cap.
    #[default]
    InProcess,
    /// In a child process running `exe`, which calls
    /// [`compile_child_main`] first thing, within `limits`.
    Child {
        /// The executable to start.
        exe: PathBuf,
        /// Its CPU time and memory.
        limits: CompileLimits,
    },
}

/// Bounds on compiling one component in a child process. Unset, each is
/// scaled to the component ([`CompileLimits::for_size`]): a small
/// component gets a few seconds of CPU and a few hundred MiB, an
/// interpreter's more.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CompileLimits {
    /// CPU time (user and system, all the child's threads); the child is
    /// killed past it. Default: 10 s and 3 s per MiB.
    pub cpu_time: Option<Duration>,
    /// Data memory of the child (`RLIMIT_DATA`). Default: 256 MiB and 48
    /// bytes per byte of component.
    pub max_memory_bytes: Option<u64>,
}

/// Compile CPU time every component is given, whatever its size.
const BASE_CPU: Duration = Duration::from_secs(10);
/// Compile CPU time given per MiB of component. CPython (18 MB) takes
/// about 19 s of CPU in a release build, 25 s in a debug one, on 2 cores.
const CPU_PER_MIB: Duration = Duration::from_secs(3);
/// How much longer than its CPU limit a compile may take by the clock
/// before it is taken to be stuck (it would have to get a tenth of a core
/// all along), and at least [`MIN_WALL`].
const WALL_PER_CPU: u32 = 10;
/// The least time by the clock a compile is given before it is taken to
/// be stuck.
const MIN_WALL: Duration = Duration::from_secs(60);
/// How often the child's CPU time is read.
const POLL: Duration = Duration::from_millis(5);
/// Most of the child's error read back.
const MAX_CHILD_ERROR: u64 = 4 << 10;
/// Compile memory every component is given.
const BASE_MEMORY: u64 = 256 << 20;
/// Compile memory given per byte of component. CPython (18 MB) peaks at
/// 360 MB and SpiderMonkey (12 MB) at 390 MB, compiling on 2 cores.
const MEMORY_PER_BYTE: u64 = 48;

impl CompileLimits {
    /// The CPU time and memory for a component of `bytes` bytes: what is
    /// set, else scaled to its size. Python's 18 MB get 64 s and 1.1 GiB;
    /// a 100 KB component 10 s and 261 MiB.
    pub fn for_size(&self, bytes: usize) -> (Duration, u64) {
        let mib = u32::try_from(bytes >> 20).unwrap_or(u32::MAX);
        let cpu = self
            .cpu_time
            .unwrap_or_else(|| BASE_CPU.saturating_add(CPU_PER_MIB.saturating_mul(mib)));
        let memory = self.max_memory_bytes.unwrap_or_else(|| {
            BASE_MEMORY.saturating_add(MEMORY_PER_BYTE.saturating_mul(bytes as u64))
        });
        (cpu, memory)
    }
}

/// Why a component was not compiled: over a limit, invalid, or the
/// compiler failed. One outcome, one message.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum CompileFailure {
    /// It asks the compiler for too much ([`super::complexity`]): refused
    /// before compiling.
    #[error(transparent)]
    TooComplex(#[from] super::complexity::TooComplex),
    /// Compiling used more than its CPU time.
    #[error(
        "compiling used more than {} ms of CPU time, the limit for it; it was stopped (AIRLOCK_COMPILE_CPU_MS sets the limit)",
        .limit.as_millis()
    )]
    Cpu {
        /// The limit.
        limit: Duration,
    },
    /// Compiling needed more memory than it may use.
    #[error(
        "compiling needed more than the {} MiB of memory it may use; it was stopped (AIRLOCK_COMPILE_MEMORY_MB sets the limit)",
        .limit >> 20
    )]
    Memory {
        /// The limit, in bytes.
        limit: u64,
    },
    /// The compiler stopped making progress (it had the CPU it needed for
    /// far longer than its CPU limit, and did not finish).
    #[error(
        "compiling made no progress for {} s (it used {} ms of CPU); it was stopped",
        .wall.as_secs(),
        .used.as_millis()
    )]
    Stalled {
        /// How long it was given.
        wall: Duration,
        /// The CPU it had used.
        used: Duration,
    },
    /// The compiler refused the component: what it said.
    #[error("{0}")]
    Invalid(String),
    /// The compiler could not run, or crashed.
    #[error("{0}")]
    Failed(String),
}

/// Compiles `bytes` as `config`'s engine of `tier` (`engine`) would,
/// under `compiler`.
pub(crate) fn precompile(
    compiler: &Compiler,
    config: &SandboxConfig,
    engine: &wasmtime::Engine,
    bytes: &[u8],
    tier: Tier,
) -> wasmtime::Result<Vec<u8>> {
    // WAT text is weighed (and compiled) as the binary it stands for.
    let bytes = &*wat::parse_bytes(bytes)?;
    super::complexity::check(bytes).map_err(|e| wasmtime::Error::new(CompileFailure::from(e)))?;
    match compiler {
        Compiler::InProcess => engine.precompile_component(bytes),
        Compiler::Child { exe, limits } => {
            Ok(in_child(exe, limits, config, bytes, tier).map_err(wasmtime::Error::new)?)
        }
    }
}

/// Starts filling the cache with the optimised code of the component at
/// `path`, whose content `bytes` are, for `engine` (the sandbox's own),
/// and does not wait (see [`Sandbox::fill_cache_later`]).
pub(crate) fn fill_later(
    config: &SandboxConfig,
    engine: &wasmtime::Engine,
    path: &Path,
    bytes: &[u8],
) {
    let Some(dir) = config.cache.dir() else {
        return;
    };
    let entry = super::cache::entry_path(dir, engine, bytes);
    // Made here, once: a filler never makes the directory, so that one
    // whose cache was removed meanwhile leaves nothing behind.
    if entry.is_file() || super::cache::create_private_dir(dir).is_err() {
        return;
    }
    let content = super::cache::content_hash(bytes);
    match &config.compiler {
        Compiler::InProcess => {
            let (engine, bytes, config) = (engine.clone(), bytes.to_vec(), config.clone());
            let spawned = std::thread::Builder::new()
                .name("airlock-fill-cache".into())
                .spawn(move || {
                    let compile = |bytes: &[u8]| {
                        precompile(
                            &Compiler::InProcess,
                            &config,
                            &engine,
                            bytes,
                            Tier::Optimized,
                        )
                    };
                    if let Err(e) = fill(&entry, &bytes, &content, compile) {
                        tracing::debug!(error = %e, "filling the compile cache failed");
                    }
                });
            if let Err(e) = spawned {
                tracing::debug!(error = %e, "cannot start filling the compile cache");
            }
        }
        Compiler::Child { exe, limits } => {
            let Ok(input) = path.canonicalize() else {
                return;
            };
            let mut command = child_command(exe, limits, bytes.len());
            command
                .env(FILL_ENV, &content)
                .arg(&input)
                .arg(&entry)
                .args(child_settings(config, Tier::Optimized))
                // Not stopped by the terminal's ^C to this command: its
                // work is for the next one.
                .process_group(0)
                .stderr(Stdio::null());
            match command.spawn() {
                // Reaped by a thread, so that a long-lived parent leaves
                // no zombie; the thread does not hold the process open.
                Ok(mut child) => {
                    let _ = std::thread::Builder::new()
                        .name("airlock-fill-cache".into())
                        .spawn(move || {
                            if let Ok(status) = child.wait()
                                && !status.success()
                            {
                                tracing::debug!(%status, "filling the compile cache failed");
                            }
                        });
                }
                Err(e) => tracing::debug!(error = %e, "cannot start filling the compile cache"),
            }
        }
    }
}

/// Compiles `bytes`, whose content hash is `content`, with `compile` and
/// files the result as the cache entry `entry`, unless the entry is there
/// already or another filler holds its lock (or the cache directory is
/// gone). The lock file is removed after.
fn fill(
    entry: &Path,
    bytes: &[u8],
    content: &str,
    compile: impl FnOnce(&[u8]) -> wasmtime::Result<Vec<u8>>,
) -> Result<(), String> {
    let lock_path = entry.with_extension("lock");
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(&lock_path)
        .map_err(|e| format!("cannot make {}: {e}", lock_path.display()))?;
    if lock.try_lock().is_err() {
        return Ok(());
    }
    let filled = if entry.is_file() {
        Ok(())
    } else if super::cache::content_hash(bytes) != content {
        Err("the component changed since it was loaded".to_owned())
    } else {
        compile(bytes)
            .map_err(|e| format!("{e:#}"))
            .and_then(|compiled| {
                crate::fs::write_atomic(entry, &compiled)
                    .map_err(|e| format!("cannot write {}: {e}", entry.display()))
            })
    };
    let _ = std::fs::remove_file(&lock_path);
    filled
}

/// The CPU time process `pid` has used, all its threads (`/proc`, in the
/// kernel's `USER_HZ` ticks: 100 a second on every Linux ABI).
fn cpu_used(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command name, which is in parentheses and may hold spaces.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    // utime and stime: fields 14 and 15 of the whole line.
    let ticks = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(Duration::from_millis(ticks.saturating_mul(10)))
}

/// The compile child's command for a component of `size` bytes, its
/// limits in its environment, before its arguments.
fn child_command(exe: &Path, limits: &CompileLimits, size: usize) -> Command {
    let (cpu, max_memory) = limits.for_size(size);
    let mut command = Command::new(exe);
    command
        .env(CHILD_ENV, "1")
        .env("AIRLOCK_COMPILE_MEMORY", max_memory.to_string())
        // The kernel's limit stands behind the parent's reading, a second
        // later (whole seconds: the parent's is the precise one).
        .env(
            "AIRLOCK_COMPILE_CPU_SECS",
            (cpu.as_secs().saturating_add(2)).to_string(),
        )
        .env_remove(FILL_ENV)
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    command
}

/// The arguments after INPUT and OUTPUT: `FUEL CEILING TIER`.
fn child_settings(config: &SandboxConfig, tier: Tier) -> [String; 3] {
    [
        if config.fuel_metering { "1" } else { "0" }.to_owned(),
        config.max_memory_ceiling.to_string(),
        tier.as_str().to_owned(),
    ]
}

fn in_child(
    exe: &Path,
    limits: &CompileLimits,
    config: &SandboxConfig,
    bytes: &[u8],
    tier: Tier,
) -> Result<Vec<u8>, CompileFailure> {
    let fail = |what: &str, e: std::io::Error| CompileFailure::Failed(format!("{what}: {e}"));
    let (cpu, max_memory) = limits.for_size(bytes.len());
    let dir = tempfile::tempdir().map_err(|e| fail("cannot make a work directory", e))?;
    let (input, output) = (dir.path().join("in.wasm"), dir.path().join("out.cwasm"));
    let said = dir.path().join("error");
    std::fs::write(&input, bytes).map_err(|e| fail("cannot write the component", e))?;
    let stderr = std::fs::File::create(&said).map_err(|e| fail("cannot make a work file", e))?;
    let mut child = child_command(exe, limits, bytes.len())
        .arg(&input)
        .arg(&output)
        .args(child_settings(config, tier))
        .stderr(stderr)
        .spawn()
        .map_err(|e| fail(&format!("cannot start the compiler ({})", exe.display()), e))?;
    let wall = cpu.saturating_mul(WALL_PER_CPU).max(MIN_WALL);
    let deadline = Instant::now() + wall;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) => {}
            Err(e) => return Err(fail("cannot wait for the compiler", e)),
        }
        let used = cpu_used(child.id()).unwrap_or_default();
        let over = if used > cpu {
            Some(CompileFailure::Cpu { limit: cpu })
        } else if Instant::now() >= deadline {
            Some(CompileFailure::Stalled { wall, used })
        } else {
            None
        };
        if let Some(over) = over {
            let _ = child.kill();
            let _ = child.wait();
            return Err(over);
        }
        std::thread::sleep(POLL);
    };
    if status.success() {
        return std::fs::read(&output).map_err(|e| fail("cannot read the compiled code", e));
    }
    let said = {
        use std::io::Read as _;
        let mut text = String::new();
        let _ =
            std::fs::File::open(&said).map(|f| f.take(MAX_CHILD_ERROR).read_to_string(&mut text));
        text.trim().to_owned()
    };
    Err(classify(status, &said, cpu, max_memory))
}

/// What a failed child's end says: over its CPU (the kernel's signal),
/// out of memory (an allocation failed, however it surfaced), the
/// component refused (its own error, exit status 1), or a crash.
fn classify(
    status: std::process::ExitStatus,
    said: &str,
    cpu: Duration,
    max_memory: u64,
) -> CompileFailure {
    use std::os::unix::process::ExitStatusExt;
    let out_of_memory = [
        "memory allocation of",
        "Cannot allocate memory",
        "out of memory",
    ]
    .iter()
    .any(|sign| said.contains(sign));
    match (status.code(), status.signal()) {
        (_, Some(signal)) if signal == rustix::process::Signal::XCPU.as_raw() => {
            CompileFailure::Cpu { limit: cpu }
        }
        _ if out_of_memory => CompileFailure::Memory { limit: max_memory },
        (Some(CHILD_REFUSED), _) if !said.is_empty() => {
            CompileFailure::Invalid(crate::text::truncate(said, 2000))
        }
        (code, signal) => {
            let how = match (code, signal) {
                (Some(code), _) => format!("exited with status {code}"),
                (None, Some(signal)) => format!("was killed by signal {signal}"),
                _ => "failed".to_owned(),
            };
            let said = if said.is_empty() {
                String::new()
            } else {
                format!(": {}", crate::text::truncate(said, 2000))
            };
            CompileFailure::Failed(format!("the compiler {how}{said}"))
        }
    }
}

/// The compile child's whole life, when this process is one (see the module
/// documentation): `Some(exit code)` if it was, `None` otherwise. Call it
/// first thing in `main`.
pub fn compile_child_main() -> Option<i32> {
    std::env::var_os(CHILD_ENV)?;
    Some(match child() {
        Ok(()) => 0,
        Err((code, said)) => {
            // The parent reads this back.
            use std::io::Write as _;
            let _ = writeln!(std::io::stderr(), "{said}");
            code
        }
    })
}

/// The child's exit status when the compiler refused the component (its
/// words on stderr); any other failure exits with [`CHILD_FAILED`].
const CHILD_REFUSED: i32 = 1;
/// The child's exit status when it could not compile for another reason.
const CHILD_FAILED: i32 = 2;

fn child() -> Result<(), (i32, String)> {
    use rustix::process::{Resource, Rlimit, setrlimit};
    // The whole chain of causes: an allocation that failed is named at its
    // end.
    let failed = |e: &dyn std::error::Error| (CHILD_FAILED, crate::text::error_chain(e));
    let limit = |name: &str| -> Option<u64> { std::env::var(name).ok()?.parse().ok() };
    for (name, resource) in [
        ("AIRLOCK_COMPILE_MEMORY", Resource::Data),
        ("AIRLOCK_COMPILE_CPU_SECS", Resource::Cpu),
    ] {
        if let Some(value) = limit(name) {
            let cap = Rlimit {
                current: Some(value),
                maximum: Some(value),
            };
            setrlimit(resource, cap).map_err(|e| failed(&e))?;
        }
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = || {
        (
            CHILD_FAILED,
            "usage: INPUT OUTPUT FUEL CEILING TIER".to_owned(),
        )
    };
    let [input, output, fuel, ceiling, tier] = args.as_slice() else {
        return Err(usage());
    };
    let tier = Tier::parse(tier).ok_or_else(usage)?;
    let ceiling = ceiling.parse().map_err(|e| failed(&e))?;
    let config = SandboxConfig {
        cache: super::CompileCache::disabled(),
        max_concurrent_instances: 1,
        max_memory_ceiling: ceiling,
        fuel_metering: fuel == "1",
        compiler: Compiler::InProcess,
        baseline_first: (tier == Tier::Baseline).then_some(0),
    };
    let sandbox = Sandbox::new(config.clone()).map_err(|e| (CHILD_FAILED, format!("{e:#}")))?;
    let engine = sandbox.engine_for(tier).unwrap_or(sandbox.engine());
    let bytes = std::fs::read(input).map_err(|e| failed(&e))?;
    let output = Path::new(output);
    if let Some(content) = std::env::var_os(FILL_ENV) {
        // Work for a later run: after whatever the machine is doing now.
        let _ = rustix::process::nice(19);
        let compile = |bytes: &[u8]| precompile(&Compiler::InProcess, &config, engine, bytes, tier);
        return fill(output, &bytes, &content.to_string_lossy(), compile)
            .map_err(|e| (CHILD_FAILED, e));
    }
    let compiled = engine
        .precompile_component(&bytes)
        .map_err(|e| (CHILD_REFUSED, format!("{e:#}")))?;
    // A work file the parent reads back at once: not worth a sync (46 MB
    // of a Python component's baseline code took a noticeable part of a
    // second to reach the disk).
    std::fs::write(output, &compiled).map_err(|e| failed(&e))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small component, compiled for real by the default engine.
    fn compile(bytes: &[u8]) -> wasmtime::Result<Vec<u8>> {
        let mut config = wasmtime::Config::new();
        config.wasm_component_model(true);
        wasmtime::Engine::new(&config)?.precompile_component(&wat::parse_bytes(bytes)?)
    }

    const COMPONENT: &[u8] = b"(component)";

    #[test]
    fn a_filler_files_only_what_it_was_sent_for_and_only_once() {
        let dir = tempfile::tempdir().unwrap();
        let entry = dir.path().join("key.cwasm");
        let lock = entry.with_extension("lock");
        let content = super::super::cache::content_hash(COMPONENT);
        let compiled = std::cell::Cell::new(0);
        let counted = |bytes: &[u8]| {
            compiled.set(compiled.get() + 1);
            compile(bytes)
        };

        // The content changed since its parent read it: nothing filed.
        let other = super::super::cache::content_hash(b"(component (core module))");
        let refused = fill(&entry, COMPONENT, &other, counted);
        assert!(refused.unwrap_err().contains("changed"));
        assert!(!entry.exists() && !lock.exists());

        // Another filler holds the lock: this one leaves at once.
        let held = std::fs::File::create(&lock).unwrap();
        held.lock().unwrap();
        fill(&entry, COMPONENT, &content, counted).unwrap();
        assert!(!entry.exists());
        assert_eq!(compiled.get(), 0);
        drop(held);

        // Filled: the entry is the compiled code, private, the lock gone.
        fill(&entry, COMPONENT, &content, counted).unwrap();
        assert_eq!(compiled.get(), 1);
        assert_eq!(std::fs::read(&entry).unwrap(), compile(COMPONENT).unwrap());
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&entry).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "{mode:o}");
        assert!(!lock.exists());

        // Filled already: not compiled again.
        fill(&entry, COMPONENT, &content, counted).unwrap();
        assert_eq!(compiled.get(), 1);

        // A cache removed meanwhile is not made again.
        let gone = dir.path().join("gone");
        let entry = gone.join("key.cwasm");
        assert!(fill(&entry, COMPONENT, &content, counted).is_err());
        assert!(!gone.exists());
    }
}
