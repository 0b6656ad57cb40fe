//! The on-disk cache of compiled components.
//!
//! An entry is keyed by the SHA-256 of the component's bytes and a hash of
//! everything in the engine that affects code generation (wasmtime's version,
//! target and settings), so a change on either side misses the cache instead
//! of loading code compiled for something else.
//!
//! Invariant: the cache directory must be writable by the user only. Loading
//! an entry maps native code into the process; anyone who can write the
//! directory can run code as the host. The directory is created mode 0700,
//! and a directory or entry that is not owned by this user, or that its
//! group or others may write (or an entry that is not a regular file), is
//! refused with [`UnsafeCache`] before anything in it is loaded.

use std::fs;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;

/// A cache directory or entry that someone other than this user could
/// have written, or that is not what it should be (a directory that is
/// a file). Nothing from it is loaded.
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "compile cache {}: {problem}; code cached there runs as this user. Fix: {fix}, or set \
     AIRLOCK_CACHE_DIR to a private directory",
    .path.display()
)]
pub struct UnsafeCache {
    /// The directory or entry.
    pub path: PathBuf,
    /// What is wrong with it.
    pub problem: String,
    /// What would mend it, for this problem.
    pub fix: &'static str,
}

/// Refuses `path` unless this user owns it and only this user may write
/// it (and, for an entry, it is a regular file, not a link; otherwise a
/// directory).
pub(crate) fn check_private(path: &Path, entry: bool) -> Result<(), UnsafeCache> {
    use std::os::unix::fs::MetadataExt;
    /// The fix for any entry at fault: it can be made again.
    const REMOVE: &str = "remove it (Airlock makes or fetches it again)";
    let unsafe_because = |problem: String, fix: &'static str| UnsafeCache {
        path: path.to_path_buf(),
        problem,
        fix,
    };
    // For an entry, [`REMOVE`]; for a directory, `fix`.
    let mend = |fix| if entry { REMOVE } else { fix };
    let meta = match fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => {
            return Err(unsafe_because(
                format!("cannot be checked: {e}"),
                "let this user reach it",
            ));
        }
    };
    if entry && !meta.file_type().is_file() {
        return Err(unsafe_because("is not a regular file".into(), REMOVE));
    }
    if !entry && !meta.file_type().is_dir() {
        return Err(unsafe_because(
            "is not a directory".into(),
            "move what is there away (a directory is made in its place)",
        ));
    }
    let me = rustix::process::geteuid().as_raw();
    if meta.uid() != me {
        return Err(unsafe_because(
            format!("is owned by user {}, not by this user ({me})", meta.uid()),
            mend("use a directory this user owns"),
        ));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(unsafe_because(
            format!(
                "is writable by its group or others (mode {:o})",
                meta.mode() & 0o777
            ),
            mend(
                "make it a directory only you can write (`chmod 700`) and remove entries you \
                 did not write",
            ),
        ));
    }
    Ok(())
}

/// Where compiled components are kept between runs.
#[derive(Debug, Clone)]
pub struct CompileCache {
    dir: Option<PathBuf>,
}

/// Where the compiled code for a component came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheOutcome {
    /// Loaded from the cache: no compilation.
    Hit,
    /// Compiled now, and stored for next time.
    Compiled,
    /// Compiled now; the cache is off or could not be written.
    CompiledUncached,
    /// Compiled now by the baseline compiler (not cached); the optimised
    /// code is being compiled into the cache for the next load
    /// ([`crate::sandbox::SandboxConfig::baseline_first`]).
    Baseline,
}

impl CompileCache {
    /// The environment variable that overrides the cache directory.
    pub const DIR_ENV: &'static str = "AIRLOCK_CACHE_DIR";

    /// A cache in `dir`.
    pub fn in_dir(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: Some(dir.into()),
        }
    }

    /// No cache: every load compiles.
    pub fn disabled() -> Self {
        Self { dir: None }
    }

    /// `$AIRLOCK_CACHE_DIR` if set, else `airlock/` under the user's cache
    /// directory (`$XDG_CACHE_HOME` or `~/.cache` on Linux); disabled if
    /// neither is known.
    pub fn from_env() -> Self {
        match std::env::var_os(Self::DIR_ENV) {
            Some(dir) if !dir.is_empty() => Self::in_dir(PathBuf::from(dir)),
            _ => match dirs::cache_dir() {
                Some(base) => Self::in_dir(base.join("airlock")),
                None => Self::disabled(),
            },
        }
    }

    /// Checks that the cache directory (and its file index) can be trusted:
    /// owned by this user and writable by no one else. A directory that
    /// does not exist yet passes (it will be created private). One `stat`
    /// each.
    pub fn verify(&self) -> Result<(), UnsafeCache> {
        let Some(dir) = &self.dir else {
            return Ok(());
        };
        check_private(dir, false)?;
        check_private(&dir.join("files"), false)
    }

    /// The cache directory (`None` when caching is off).
    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    /// How close to a file's own timestamps an index entry may be written
    /// and still be trusted. An entry written within this window of the
    /// file's last change is racy (the file may change again within the
    /// timestamps' granularity without either changing): it is re-checked
    /// by content until an entry is written later than that.
    pub const RACY_WINDOW: std::time::Duration = std::time::Duration::from_secs(1);

    /// The compiled code for the component file at `path`, if this cache
    /// saw the same file before: the same canonical path, device, inode,
    /// size, modification and status-change times (to the nanosecond), and
    /// an entry not racy ([`CompileCache::RACY_WINDOW`]); `None` otherwise,
    /// or on any problem. A hit reads no byte of the component, so a large
    /// (Python, JavaScript) component starts in about the time of a memory
    /// map instead of a hash of the whole file.
    ///
    /// Invariant: the index maps a file to the content key it had. A writer
    /// can keep a file's size and modification time (`cp -p`, `rsync -a`,
    /// tar, fixed `SOURCE_DATE_EPOCH`), but not its status-change time and
    /// inode: any write or replacement changes one of them, so this misses
    /// and the caller loads by content ([`CompileCache::load`]), as git's
    /// index does.
    pub fn lookup_file(&self, engine: &Engine, path: &Path) -> Option<Component> {
        let dir = self.dir.as_ref()?;
        let index = self.index_path(dir, engine, path)?;
        let entry = fs::read_to_string(index).ok()?;
        let (stamp, recorded, key) = parse_entry(&entry)?;
        if FileStamp::of(path)? != stamp || stamp.is_racy(recorded) {
            return None;
        }
        let entry = dir.join(format!("{key}.cwasm"));
        // An unsafe entry is not loaded here; `load` then refuses it.
        check_private(&entry, true).ok()?;
        deserialize(engine, &entry).ok()
    }

    /// Records that the file at `path`, whose identity was `before` when
    /// `bytes` were read from it, holds `bytes`. Nothing is recorded if the
    /// file's identity changed since (it was written during the compile):
    /// the compile result is never filed under a file that changed. Errors
    /// are logged, never returned: the index is only a shortcut.
    pub fn remember_file(&self, engine: &Engine, path: &Path, before: FileStamp, bytes: &[u8]) {
        let Some(dir) = self.dir.as_ref() else {
            return;
        };
        if FileStamp::of(path) != Some(before) {
            tracing::debug!(path = %path.display(), "component changed while loading; not indexed");
            return;
        }
        let Some(index) = self.index_path(dir, engine, path) else {
            return;
        };
        let recorded = now_ns();
        let entry = format!(
            "{} {recorded} {}\n",
            before.fields(),
            cache_key(engine, bytes)
        );
        let written = index
            .parent()
            .map_or(Ok(()), create_private_dir)
            .and_then(|()| crate::fs::write_atomic(&index, entry.as_bytes()));
        if let Err(e) = written {
            tracing::debug!(error = %e, "cannot write the compile cache's file index");
        }
    }

    fn index_path(&self, dir: &Path, engine: &Engine, path: &Path) -> Option<PathBuf> {
        let canonical = path.canonicalize().ok()?;
        let name = sha256_hex(canonical.as_os_str().as_encoded_bytes());
        Some(
            dir.join("files")
                .join(format!("{name}-{:016x}", engine_hash(engine))),
        )
    }

    /// The code of the component `bytes` compiled for `engine`, if the
    /// cache has it (`None` when it does not, or the cache is off).
    pub fn lookup(&self, engine: &Engine, bytes: &[u8]) -> Result<Option<Component>, UnsafeCache> {
        match &self.dir {
            Some(dir) => cached(engine, &entry_path(dir, engine, bytes)),
            None => Ok(None),
        }
    }

    /// Compiles `bytes` (a component binary, or WAT text), or loads the
    /// compiled code from the cache.
    ///
    /// May block for seconds on a miss: compiling an interpreter-based
    /// component (Python, JavaScript) is CPU-heavy. A cache entry that fails
    /// to load (corrupt, or written by another engine) is replaced.
    ///
    /// `on_compile` is called once, just before compiling, on a miss.
    pub fn load(
        &self,
        engine: &Engine,
        bytes: &[u8],
        on_compile: impl FnOnce(),
    ) -> wasmtime::Result<(Component, CacheOutcome)> {
        self.load_with(engine, bytes, on_compile, |bytes| {
            engine.precompile_component(bytes)
        })
    }

    /// [`CompileCache::load`], compiling with `precompile` (which must
    /// produce code for `engine`, as [`crate::sandbox::Sandbox::precompile`]
    /// does) on a miss.
    pub fn load_with(
        &self,
        engine: &Engine,
        bytes: &[u8],
        on_compile: impl FnOnce(),
        precompile: impl FnOnce(&[u8]) -> wasmtime::Result<Vec<u8>>,
    ) -> wasmtime::Result<(Component, CacheOutcome)> {
        let Some(dir) = &self.dir else {
            on_compile();
            let compiled = precompile(bytes)?;
            return Ok((
                deserialize_bytes(engine, &compiled)?,
                CacheOutcome::CompiledUncached,
            ));
        };
        let path = entry_path(dir, engine, bytes);
        if let Some(component) = cached(engine, &path)? {
            return Ok((component, CacheOutcome::Hit));
        }
        on_compile();
        let compiled = precompile(bytes)?;
        match store(dir, &path, &compiled) {
            Ok(()) => match deserialize(engine, &path) {
                Ok(component) => Ok((component, CacheOutcome::Compiled)),
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "cache entry unreadable after write");
                    Ok((
                        deserialize_bytes(engine, &compiled)?,
                        CacheOutcome::CompiledUncached,
                    ))
                }
            },
            Err(e) => {
                tracing::warn!(dir = %dir.display(), error = %e, "cannot write the compile cache");
                Ok((
                    deserialize_bytes(engine, &compiled)?,
                    CacheOutcome::CompiledUncached,
                ))
            }
        }
    }
}

/// A hash of everything in the engine that affects compiled code.
/// `DefaultHasher::new()` has fixed keys, so it is stable across processes
/// of one build; a different wasmtime build misses (and `deserialize` would
/// refuse its entries anyway).
fn engine_hash(engine: &Engine) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut hasher);
    hasher.finish()
}

/// The cache entry in `dir` of the component `bytes` compiled for
/// `engine` (it may not exist).
pub(crate) fn entry_path(dir: &Path, engine: &Engine, bytes: &[u8]) -> PathBuf {
    dir.join(format!("{}.cwasm", cache_key(engine, bytes)))
}

/// What names a component's content in the cache.
pub(crate) fn content_hash(bytes: &[u8]) -> String {
    sha256_hex(bytes)
}

fn sha256_hex(bytes: &[u8]) -> String {
    let mut hasher = Sha256::new();
    hasher.update(bytes);
    hex::encode(&hasher.finalize()[..16])
}

fn cache_key(engine: &Engine, bytes: &[u8]) -> String {
    format!("{}-{:016x}", sha256_hex(bytes), engine_hash(engine))
}

/// What the file-index entry remembers about a component file: the size
/// and modification time it had when its content key was computed.
/// What identifies a file's contents without reading them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileStamp {
    dev: u64,
    ino: u64,
    len: u64,
    mtime_ns: i128,
    ctime_ns: i128,
}

impl FileStamp {
    /// The identity of the file at `path` now (`None` if it cannot be
    /// read). Take it before reading the file's bytes, and pass it to
    /// [`CompileCache::remember_file`].
    pub fn of(path: &Path) -> Option<Self> {
        use std::os::unix::fs::MetadataExt;
        let meta = fs::metadata(path).ok()?;
        let ns = |secs: i64, nanos: i64| i128::from(secs) * 1_000_000_000 + i128::from(nanos);
        Some(Self {
            dev: meta.dev(),
            ino: meta.ino(),
            len: meta.len(),
            mtime_ns: ns(meta.mtime(), meta.mtime_nsec()),
            ctime_ns: ns(meta.ctime(), meta.ctime_nsec()),
        })
    }

    fn fields(&self) -> String {
        format!(
            "{} {} {} {} {}",
            self.dev, self.ino, self.len, self.mtime_ns, self.ctime_ns
        )
    }

    /// Whether an entry recorded at `recorded_ns` is too close to the
    /// file's own timestamps to be trusted.
    fn is_racy(&self, recorded_ns: i128) -> bool {
        let window = i128::try_from(CompileCache::RACY_WINDOW.as_nanos()).unwrap_or(i128::MAX);
        self.mtime_ns.max(self.ctime_ns).saturating_add(window) > recorded_ns
    }
}

/// `dev ino len mtime ctime recorded key`; `None` for anything else
/// (including entries in an older format, which then simply miss).
fn parse_entry(entry: &str) -> Option<(FileStamp, i128, &str)> {
    let mut fields = entry.split_whitespace();
    let mut next = || fields.next();
    let stamp = FileStamp {
        dev: next()?.parse().ok()?,
        ino: next()?.parse().ok()?,
        len: next()?.parse().ok()?,
        mtime_ns: next()?.parse().ok()?,
        ctime_ns: next()?.parse().ok()?,
    };
    let recorded = next()?.parse().ok()?;
    let key = next()?;
    if next().is_some() || !key.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-') {
        return None;
    }
    Some((stamp, recorded, key))
}

fn now_ns() -> i128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i128::try_from(d.as_nanos()).unwrap_or(i128::MAX))
}

fn store(dir: &Path, path: &Path, compiled: &[u8]) -> std::io::Result<()> {
    create_private_dir(dir)?;
    crate::fs::write_atomic(path, compiled)
}

/// The component compiled for `engine` in the cache entry `path`, if there
/// is a usable one; an entry anyone else could have written is refused.
fn cached(engine: &Engine, path: &Path) -> Result<Option<Component>, UnsafeCache> {
    if !path.is_file() {
        return Ok(None);
    }
    check_private(path, true)?;
    match deserialize(engine, path) {
        Ok(component) => Ok(Some(component)),
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "discarding unusable cache entry");
            Ok(None)
        }
    }
}

pub(crate) fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    let mut builder = fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir)
}

#[allow(unsafe_code)]
fn deserialize(engine: &Engine, path: &Path) -> wasmtime::Result<Component> {
    // SAFETY: the file was written by `precompile_component` of an engine
    // with the same compatibility hash (its name says so) into a directory
    // only this user can write (module invariant). wasmtime still checks the
    // header and engine settings and refuses a mismatch.
    unsafe { Component::deserialize_file(engine, path) }
}

/// The component whose code `compiled` is, just compiled for `engine`.
pub(crate) fn load_compiled(engine: &Engine, compiled: &[u8]) -> wasmtime::Result<Component> {
    deserialize_bytes(engine, compiled)
}

#[allow(unsafe_code)]
fn deserialize_bytes(engine: &Engine, compiled: &[u8]) -> wasmtime::Result<Component> {
    // SAFETY: `compiled` was produced a moment ago by `precompile_component`
    // on this engine, or on an engine built with the same settings in a
    // compile child of this process, which wrote it to a private temporary
    // directory; wasmtime checks the header and engine settings.
    unsafe { Component::deserialize(engine, compiled) }
}
