//! Crash-safe file writes, and paths as a reader wants them.

use std::io::Write;
use std::path::Path;

/// Writes `bytes` to `path` so that a reader, or the file after a crash at
/// any point, holds either the old content or all of the new: write to a
/// temporary file in the same directory, fsync it, rename it over `path`.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    names_a_file(path)?;
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

/// Whether `path`'s text ends in a directory: `out/`, `out/.`, `..`
/// (whatever is there).
pub fn ends_in_a_directory(path: &Path) -> bool {
    let raw = path.as_os_str().as_encoded_bytes();
    let last = raw.rsplit(|b| *b == b'/').next().unwrap_or_default();
    matches!(last, b"" | b"." | b"..")
}

/// Whether `path` can name a file to write: not a directory there, nor a
/// path that ends in one ([`ends_in_a_directory`]), which the rename of an
/// atomic write would refuse with a misleading error ("Not a directory").
pub fn names_a_file(path: &Path) -> std::io::Result<()> {
    if ends_in_a_directory(path) || path.is_dir() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::IsADirectory,
            "names a directory, not a file",
        ));
    }
    Ok(())
}

/// `base` joined with `relative`, written without the `.` and `..` steps a
/// reader has to work out (`registry/../keys/a.pub` is `keys/a.pub`) when
/// that names the same file: a step back out of a symbolic link does not
/// go where the text says, so then the path is kept as joined. Costs two
/// `canonicalize` calls (a few system calls per component).
pub fn tidy_join(base: &Path, relative: &Path) -> std::path::PathBuf {
    use std::path::{Component, PathBuf};
    let joined = base.join(relative);
    let mut tidy = PathBuf::new();
    for component in joined.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir
                if matches!(tidy.components().next_back(), Some(Component::Normal(_))) =>
            {
                tidy.pop();
            }
            other => tidy.push(other),
        }
    }
    if tidy.as_os_str().is_empty() {
        tidy.push(".");
    }
    match (joined.canonicalize(), tidy.canonicalize()) {
        (Ok(a), Ok(b)) if a == b => tidy,
        (Err(_), Err(_)) => tidy,
        _ => joined,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tidy_join_drops_steps_that_name_the_same_file() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("a/b")).unwrap();
        std::fs::create_dir_all(root.join("keys")).unwrap();
        std::fs::write(root.join("keys/k.pub"), "k").unwrap();
        assert_eq!(
            tidy_join(&root.join("a/b"), Path::new("../../keys/./k.pub")),
            root.join("keys/k.pub")
        );
        // Through a symbolic link `..` is the link target's parent: kept.
        std::fs::create_dir_all(root.join("far/deep")).unwrap();
        std::fs::create_dir_all(root.join("far/keys")).unwrap();
        std::fs::write(root.join("far/keys/k.pub"), "far").unwrap();
        std::os::unix::fs::symlink(root.join("far/deep"), root.join("link")).unwrap();
        let joined = tidy_join(root, Path::new("link/../keys/k.pub"));
        assert_eq!(joined, root.join("link/../keys/k.pub"));
        assert_eq!(std::fs::read_to_string(&joined).unwrap(), "far");
    }
}
