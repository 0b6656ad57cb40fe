//! Crash-safe file writes, bounded reads of the files a user names, and
//! paths as a reader wants them.

use std::io::{Read, Write};
use std::path::Path;

/// The most bytes a component file may hold: far more than any component
/// compiles within the compile bounds, and a bound on what reading one
/// can take.
pub const MAX_COMPONENT_FILE: u64 = 1 << 30;

/// The most bytes a policy, a lock file, a key or a script may hold.
pub const MAX_SETTINGS_FILE: u64 = 16 << 20;

/// All of the file at `path`, at most `most` bytes of it: a larger one
/// is refused. A regular file is refused by its size before any of it is
/// read (a sparse file reports terabytes it can give); anything else that
/// reads (a pipe, as `<(command)` gives, or a device) is read as far as
/// one byte past `most`, so one that never ends (`/dev/zero`) is refused
/// there too. A directory is refused by the read. The error (an
/// [`std::io::Error`]) says which, for a message that names the file.
/// Memory: at most `most` bytes.
pub fn read_bounded(path: &Path, most: u64) -> std::io::Result<Vec<u8>> {
    let file = std::fs::File::open(path)?;
    let size = file.metadata()?;
    let too_large = |size: Option<u64>| {
        let size = size.map_or_else(String::new, |size| format!("{size} bytes, "));
        std::io::Error::new(
            std::io::ErrorKind::FileTooLarge,
            format!("{size}more than the {most} bytes this reads"),
        )
    };
    let mut bytes = Vec::new();
    if size.is_file() {
        if size.len() > most {
            return Err(too_large(Some(size.len())));
        }
        bytes.reserve_exact(usize::try_from(size.len()).unwrap_or(0));
    }
    file.take(most + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > most {
        return Err(too_large(None));
    }
    Ok(bytes)
}

/// [`read_bounded`], as UTF-8 text.
pub fn read_text_bounded(path: &Path, most: u64) -> std::io::Result<String> {
    String::from_utf8(read_bounded(path, most)?)
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidData, "not UTF-8 text"))
}

/// A component file, at most [`MAX_COMPONENT_FILE`] bytes
/// ([`read_bounded`]).
pub fn read_component(path: &Path) -> std::io::Result<Vec<u8>> {
    read_bounded(path, MAX_COMPONENT_FILE)
}

/// A file of settings a user names (a policy, a lock, a key, a script, a
/// certificate), at most [`MAX_SETTINGS_FILE`] bytes ([`read_bounded`]).
pub fn read_settings(path: &Path) -> std::io::Result<Vec<u8>> {
    read_bounded(path, MAX_SETTINGS_FILE)
}

/// [`read_settings`], as UTF-8 text.
pub fn read_settings_text(path: &Path) -> std::io::Result<String> {
    read_text_bounded(path, MAX_SETTINGS_FILE)
}

/// Writes `bytes` to `path` so that a reader, or the file after a crash at
/// any point, holds either the old content or all of the new: write to a
/// temporary file in the same directory, fsync it, rename it over `path`
/// ([`Destination`] has how a symbolic link, a device or a pipe is
/// written).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut destination = Destination::open(path)?;
    destination.write_all(bytes)?;
    destination.commit()
}

/// A file a command writes, as [`write_atomic`] writes it but a piece at
/// a time: [`Destination::commit`] once it is whole.
///
/// - A regular file, or none yet, is replaced whole or not at all: the
///   bytes go to a temporary file beside it, synced and renamed over it
///   at the commit (dropped before, it is removed and the file stays as
///   it was).
/// - A symbolic link is followed: what it points at is replaced, and the
///   link stays a link.
/// - A device or a pipe (`/dev/stdout`, `>(command)`, a FIFO) is
///   written into as it is: it cannot be replaced, and a rename over it
///   would put a regular file where the device or the link to it was.
#[derive(Debug)]
pub enum Destination {
    /// A temporary file, renamed over the path at the commit.
    Replace(tempfile::NamedTempFile, std::path::PathBuf),
    /// The device or pipe itself.
    Into(std::fs::File),
}

impl Destination {
    /// Where `path`'s bytes go: refused when `path` names a directory
    /// ([`names_a_file`]).
    pub fn open(path: &Path) -> std::io::Result<Self> {
        names_a_file(path)?;
        let target = match std::fs::symlink_metadata(path) {
            Ok(link) if link.file_type().is_symlink() => followed(path)?,
            _ => path.to_path_buf(),
        };
        match std::fs::metadata(&target) {
            Ok(there) if !there.is_file() => {
                let file = std::fs::OpenOptions::new().write(true).open(&target)?;
                Ok(Self::Into(file))
            }
            _ => {
                let dir = match target.parent() {
                    Some(dir) if !dir.as_os_str().is_empty() => dir,
                    _ => Path::new("."),
                };
                Ok(Self::Replace(tempfile::NamedTempFile::new_in(dir)?, target))
            }
        }
    }

    /// The file written to.
    pub fn file(&self) -> &std::fs::File {
        match self {
            Self::Replace(temporary, _) => temporary.as_file(),
            Self::Into(file) => file,
        }
    }

    /// Ends the write: the temporary file synced and renamed into place.
    pub fn commit(self) -> std::io::Result<()> {
        match self {
            Self::Replace(temporary, path) => {
                temporary.as_file().sync_all()?;
                temporary.persist(path).map(drop).map_err(|e| e.error)
            }
            Self::Into(mut file) => file.flush(),
        }
    }
}

impl Write for Destination {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Self::Replace(temporary, _) => temporary.write(buf),
            Self::Into(file) => file.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Self::Replace(temporary, _) => temporary.flush(),
            Self::Into(file) => file.flush(),
        }
    }
}

/// What the symbolic link `path` points at, through any links after it;
/// for a link to nothing yet, its target as written (relative to the
/// link's directory).
fn followed(path: &Path) -> std::io::Result<std::path::PathBuf> {
    match std::fs::canonicalize(path) {
        Ok(target) => Ok(target),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let target = std::fs::read_link(path)?;
            Ok(match path.parent() {
                Some(dir) if target.is_relative() => dir.join(target),
                _ => target,
            })
        }
        Err(e) => Err(e),
    }
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

/// What `meta` describes when it is not a regular file, in words (`a
/// directory`, `a character device`, `a named pipe`, ...); `None` for a
/// regular file. `meta` is what [`std::fs::metadata`] says: a symbolic
/// link is described by what it names.
pub fn not_a_file(meta: &std::fs::Metadata) -> Option<&'static str> {
    use std::os::unix::fs::FileTypeExt;
    let kind = meta.file_type();
    if kind.is_file() {
        return None;
    }
    Some(if kind.is_dir() {
        "a directory"
    } else if kind.is_char_device() {
        "a character device"
    } else if kind.is_block_device() {
        "a block device"
    } else if kind.is_fifo() {
        "a named pipe"
    } else if kind.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    })
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
