//! Crash-safe file writes.

use std::io::Write;
use std::path::Path;

/// Writes `bytes` to `path` so that a reader, or the file after a crash at
/// any point, holds either the old content or all of the new: write to a
/// temporary file in the same directory, fsync it, rename it over `path`.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    tmp.write_all(bytes)?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}
