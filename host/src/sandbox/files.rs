//! What a call finds in its granted directories: recorded as it first
//! finds each path (`record = true`), or played back from a scratch copy
//! made of what its recorded call found.
//!
//! Invariants:
//!
//! - Only a call whose tool is granted directories has a watch, and only
//!   a recording or replayed one: any other call's filesystem calls go
//!   straight to wasmtime's, past one branch.
//! - Recording never changes what the guest gets. Each path is looked at
//!   once, before the call's own operation on it, through the directory
//!   the guest named (so no further than the guest can reach); a file it
//!   opens is read whole then, within the tape's byte bound shared with
//!   HTTP. A listing is kept as the guest reads it.
//! - Played back, the guest's directories are scratch directories holding
//!   exactly the recorded paths (files with their bytes, or as many zero
//!   bytes as they had when only looked at, and their modification times),
//!   with the grant's permissions, so its writes change nothing outside
//!   the call; listings are given back as recorded. A path the recorded
//!   call did not touch, or a listing read further, is noted on the tape:
//!   the call is not a reproduction.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use cap_primitives::fs::{FollowSymlinks, OpenOptions};
use wasmtime_wasi::p2::bindings::filesystem::types::{DescriptorType, DirectoryEntry};
use wasmtime_wasi::{FsPerms, WasiCtxBuilder};

use super::Reel;
use crate::policy::grants::{DirGrant, DirMode};
use crate::spec::{FileSeen, Listing, SeenKind, Tape};

/// A path in a granted directory: the directory by its guest name, and a
/// normalized `/`-separated path in it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Place {
    dir: String,
    path: String,
}

impl std::fmt::Display for Place {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.dir.trim_end_matches('/'), self.path.as_str()) {
            (dir, "") => write!(f, "{dir}"),
            ("", path) => write!(f, "/{path}"),
            (dir, path) => write!(f, "{dir}/{path}"),
        }
    }
}

/// What a recording or replayed call's filesystem calls go through.
#[derive(Debug)]
pub(crate) struct FileWatch {
    reel: Reel,
    /// Replaying: the recorded tape, and the scratch directories the
    /// call's grants are served from.
    played: Option<(Arc<Tape>, tempfile::TempDir)>,
    /// Every open descriptor the guest holds on a granted directory (by
    /// its resource's rep), and where it is.
    descriptors: HashMap<u32, Place>,
    /// Every listing the guest is reading (by its stream's rep): which
    /// one of `listings` (recording) or of the tape's (replaying), and how
    /// many of its entries were given back.
    streams: HashMap<u32, (usize, usize)>,
    /// Recording: where each path's first look is in `files`.
    seen: HashMap<Place, usize>,
    /// Replaying: the paths the recorded call touched.
    recorded: HashSet<Place>,
    /// Replaying: the next of the tape's listings to play.
    next_listing: usize,
    files: Vec<FileSeen>,
    listings: Vec<Listing>,
    /// Paths and listing entries kept so far.
    kept: usize,
}

/// What a first look at a path needs: the directory it was named from
/// (a handle of the guest's own), and what to keep.
pub(crate) struct Look {
    from: Arc<std::fs::File>,
    place: Place,
    relative: PathBuf,
    follow: bool,
    body: bool,
}

impl FileWatch {
    /// A watch for a new call granted `dirs`: recording (`played` is
    /// `None`, and the policy says `record = true`), or replaying, which
    /// makes the scratch directories and preopens them on `wasi` in the
    /// grants' place. `None` when neither.
    pub(crate) fn arm(
        wasi: &mut WasiCtxBuilder,
        dirs: &[DirGrant],
        record: bool,
        reel: Option<&Reel>,
        played: Option<&Arc<Tape>>,
    ) -> std::io::Result<Option<Self>> {
        let Some(reel) = reel.filter(|_| !dirs.is_empty()) else {
            return Ok(None);
        };
        let played = match played {
            Some(tape) => Some((Arc::clone(tape), scratch(wasi, dirs, tape)?)),
            None if record => None,
            None => return Ok(None),
        };
        let recorded = played
            .as_ref()
            .map(|(tape, _)| {
                tape.files
                    .iter()
                    .map(|seen| Place {
                        dir: seen.dir.clone(),
                        path: seen.path.clone(),
                    })
                    .collect()
            })
            .unwrap_or_default();
        Ok(Some(Self {
            reel: reel.clone(),
            played,
            descriptors: HashMap::new(),
            streams: HashMap::new(),
            seen: HashMap::new(),
            recorded,
            next_listing: 0,
            files: Vec::new(),
            listings: Vec::new(),
            kept: 0,
        }))
    }

    /// Puts what was recorded on `tape` (nothing, played back).
    pub(crate) fn record_on(&mut self, tape: &mut Tape) {
        tape.files.append(&mut self.files);
        tape.listings.append(&mut self.listings);
    }

    /// Notes that `descriptor` is the granted directory `dir` itself.
    pub(crate) fn preopened(&mut self, descriptor: u32, dir: &str) {
        self.descriptors.insert(
            descriptor,
            Place {
                dir: dir.to_owned(),
                path: String::new(),
            },
        );
    }

    /// Notes that `descriptor` was opened at `place`.
    pub(crate) fn opened(&mut self, descriptor: u32, place: Option<Place>) {
        match place {
            Some(place) => self.descriptors.insert(descriptor, place),
            None => self.descriptors.remove(&descriptor),
        };
    }

    /// Where `path`, named from the directory `descriptor`, is; `None`
    /// for a descriptor not on a granted directory, and a path that would
    /// leave its directory (refused by wasmtime whoever asks) or is
    /// absolute.
    pub(crate) fn place(&self, descriptor: u32, path: &str) -> Option<Place> {
        let from = self.descriptors.get(&descriptor)?;
        if path.starts_with('/') {
            return None;
        }
        let mut parts: Vec<&str> = from.path.split('/').filter(|p| !p.is_empty()).collect();
        for part in path.split('/') {
            match part {
                "" | "." => {}
                ".." => {
                    parts.pop()?;
                }
                part => parts.push(part),
            }
        }
        Some(Place {
            dir: from.dir.clone(),
            path: parts.join("/"),
        })
    }

    /// The look a guest's touch of `place` (named as `relative` from
    /// `from`) needs before it goes on, if any: recording, its first touch
    /// (or its first open, when it was only looked at). Replaying, notes
    /// on the tape a path the recorded call did not touch.
    pub(crate) fn touch(
        &mut self,
        place: &Place,
        from: impl FnOnce() -> Option<Arc<std::fs::File>>,
        relative: &str,
        follow: bool,
        opens: bool,
    ) -> Option<Look> {
        if self.played.is_some() {
            if !self.recorded.contains(place) {
                let why = if self.recorded.is_empty() {
                    "reads its granted directories, whose files are not recorded".to_owned()
                } else {
                    format!("touches {place}, which its recorded call did not")
                };
                self.reel.short(&why);
            }
            return None;
        }
        let body = match self.seen.get(place) {
            None => opens,
            Some(&at) => {
                let seen = &self.files[at];
                if !(opens && seen.kind == SeenKind::File && seen.body.is_none()) {
                    return None;
                }
                true
            }
        };
        Some(Look {
            from: from()?,
            place: place.clone(),
            relative: PathBuf::from(relative),
            follow,
            body,
        })
    }

    /// Keeps what `look` found (see [`Look::run`]).
    pub(crate) fn keep(&mut self, place: Place, found: Found) {
        let seen = match found {
            Found::Seen(seen) => seen,
            Found::Unrecordable(why) => return self.reel.short(&why),
            Found::Full => return,
        };
        if let Some(&at) = self.seen.get(&place) {
            self.files[at].body = seen.body;
            return;
        }
        if !self.room(place.path.len()) {
            return;
        }
        self.seen.insert(place, self.files.len());
        self.files.push(seen);
    }

    /// Whether the tape has room for one more path or listing entry, of
    /// `bytes` (counted with the files' and HTTP bodies' bytes: a call
    /// cannot grow its tape with long names either), noting on it when it
    /// has not.
    fn room(&mut self, bytes: usize) -> bool {
        if self.kept >= Tape::MAX_PATHS {
            self.reel.short(&format!(
                "touched more than {} paths and listing entries to record",
                Tape::MAX_PATHS
            ));
            return false;
        }
        if !self.reel.room_for(bytes) {
            return false;
        }
        self.kept += 1;
        true
    }

    /// Notes that `stream` lists the directory `descriptor`.
    pub(crate) fn listing(&mut self, stream: u32, descriptor: u32) {
        let Some(place) = self.descriptors.get(&descriptor).cloned() else {
            return;
        };
        match &self.played {
            Some((tape, _)) => {
                let next = tape.listings.get(self.next_listing);
                if next.is_some_and(|l| l.dir == place.dir && l.path == place.path) {
                    self.streams.insert(stream, (self.next_listing, 0));
                    self.next_listing += 1;
                } else {
                    self.streams.remove(&stream);
                    self.reel.short(&format!(
                        "lists {place}, which its recorded call did not list next"
                    ));
                }
            }
            None => {
                self.streams.insert(stream, (self.listings.len(), 0));
                self.listings.push(Listing {
                    dir: place.dir,
                    path: place.path,
                    entries: Vec::new(),
                    ended: false,
                });
            }
        }
    }

    /// Replaying, the entry `stream` gives next (`Some(None)`: its end), if
    /// it plays a recorded listing.
    pub(crate) fn played_entry(&mut self, stream: u32) -> Option<Option<DirectoryEntry>> {
        let (tape, _) = self.played.as_ref()?;
        let (listing, at) = self.streams.get_mut(&stream)?;
        let listing = tape.listings.get(*listing)?;
        match listing.entries.get(*at) {
            Some((name, kind)) => {
                *at += 1;
                Some(Some(DirectoryEntry {
                    type_: descriptor_type(kind),
                    name: name.clone(),
                }))
            }
            None => {
                if !listing.ended {
                    let place = Place {
                        dir: listing.dir.clone(),
                        path: listing.path.clone(),
                    };
                    self.reel.short(&format!(
                        "reads more of the listing of {place} than its recorded call"
                    ));
                }
                Some(None)
            }
        }
    }

    /// Recording, keeps the entry `stream` gave the guest (`None`: its
    /// end).
    pub(crate) fn listed(&mut self, stream: u32, entry: Option<&DirectoryEntry>) {
        if self.played.is_some() {
            return;
        }
        let Some(&(listing, _)) = self.streams.get(&stream) else {
            return;
        };
        match entry {
            Some(entry) => {
                if self.room(entry.name.len())
                    && let Some(listing) = self.listings.get_mut(listing)
                {
                    listing
                        .entries
                        .push((entry.name.clone(), type_name(entry.type_).to_owned()));
                }
            }
            None => {
                if let Some(listing) = self.listings.get_mut(listing) {
                    listing.ended = true;
                }
            }
        }
    }

    /// The reel whose byte bound a look's file counts against.
    pub(crate) fn reel(&self) -> &Reel {
        &self.reel
    }
}

/// What a look found: the path as it was, or why it cannot be recorded.
pub(crate) enum Found {
    Seen(FileSeen),
    Unrecordable(String),
    /// The file's bytes would take the tape past its bound (the reel
    /// already says so).
    Full,
}

impl Look {
    /// Looks (blocking: call it off the async threads), reading a file's
    /// bytes when the touch opens it and `room` grants them (it counts
    /// them against the tape's bound).
    pub(crate) fn run(self, room: impl FnOnce(usize) -> bool) -> Found {
        let follow = FollowSymlinks::follow(self.follow);
        let place = &self.place;
        let unrecordable = |e: std::io::Error| {
            Found::Unrecordable(format!("could not look at {place} to record it: {e}"))
        };
        let seen = |kind, size, modified, body| {
            Found::Seen(FileSeen {
                dir: place.dir.clone(),
                path: place.path.clone(),
                kind,
                size,
                modified,
                body,
            })
        };
        let metadata = match cap_primitives::fs::stat(&self.from, &self.relative, follow) {
            Ok(metadata) => metadata,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return seen(SeenKind::Absent, None, None, None);
            }
            Err(e) => return unrecordable(e),
        };
        if metadata.is_dir() {
            return seen(SeenKind::Directory, None, None, None);
        }
        if !metadata.is_file() {
            return Found::Unrecordable(format!(
                "finds something other than a file or a directory at {place}, which is not recorded"
            ));
        }
        let modified = metadata
            .modified()
            .ok()
            .and_then(|t| t.into_std().duration_since(UNIX_EPOCH).ok())
            .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
        let size = metadata.len();
        if !self.body {
            return seen(SeenKind::File, Some(size), modified, None);
        }
        let bytes = usize::try_from(size).unwrap_or(usize::MAX);
        if !room(bytes) {
            return Found::Full;
        }
        let mut options = OpenOptions::new();
        options.read(true);
        let read =
            cap_primitives::fs::open(&self.from, &self.relative, &options).and_then(|file| {
                use std::io::Read as _;
                let mut body = Vec::with_capacity(bytes);
                file.take(size).read_to_end(&mut body)?;
                Ok(body)
            });
        match read {
            Ok(body) => seen(
                SeenKind::File,
                Some(body.len() as u64),
                modified,
                Some(STANDARD.encode(body)),
            ),
            Err(e) => unrecordable(e),
        }
    }
}

/// Makes the scratch directories a replayed call of a tool granted `dirs`
/// is served from, holding what `tape` says its recorded call found, and
/// preopens them on `wasi` as the grants would be.
fn scratch(
    wasi: &mut WasiCtxBuilder,
    dirs: &[DirGrant],
    tape: &Tape,
) -> std::io::Result<tempfile::TempDir> {
    let root = tempfile::Builder::new()
        .prefix("airlock-replay-")
        .tempdir()?;
    for (n, grant) in dirs.iter().enumerate() {
        let dir = root.path().join(n.to_string());
        std::fs::create_dir(&dir)?;
        for seen in tape.files.iter().filter(|seen| seen.dir == grant.guest()) {
            put(&dir, seen)?;
        }
        let perms = match grant.mode() {
            DirMode::Ro => FsPerms::ReadOnly,
            DirMode::Rw => FsPerms::ReadWrite,
        };
        wasi.preopened_dir(&dir, grant.guest(), perms)
            .map_err(|e| std::io::Error::other(e.to_string()))?;
    }
    Ok(root)
}

/// Puts what `seen` says was at its path under `root`. A path that is not
/// a plain relative one (a journal edited by hand) is skipped: the call
/// then does not find it.
fn put(root: &Path, seen: &FileSeen) -> std::io::Result<()> {
    let parts: Vec<&str> = seen.path.split('/').collect();
    let plain = |p: &&str| !p.is_empty() && *p != "." && *p != ".." && !p.contains('\\');
    if seen.path.is_empty() || !parts.iter().all(plain) {
        return Ok(());
    }
    let path = parts
        .iter()
        .fold(root.to_path_buf(), |path, p| path.join(p));
    match seen.kind {
        SeenKind::Absent => Ok(()),
        SeenKind::Directory => std::fs::create_dir_all(&path),
        SeenKind::File => {
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent)?;
            }
            let file = std::fs::File::create(&path)?;
            match seen.body.as_deref().map(|b| STANDARD.decode(b)) {
                Some(Ok(body)) => {
                    use std::io::Write as _;
                    (&file).write_all(&body)?;
                }
                _ => file.set_len(seen.size.unwrap_or(0))?,
            }
            if let Some(nanos) = seen.modified {
                file.set_modified(UNIX_EPOCH + Duration::from_nanos(nanos))?;
            }
            Ok(())
        }
    }
}

/// WASI's name of a descriptor type, as a listing keeps it.
fn type_name(kind: DescriptorType) -> &'static str {
    match kind {
        DescriptorType::Unknown => "unknown",
        DescriptorType::BlockDevice => "block-device",
        DescriptorType::CharacterDevice => "character-device",
        DescriptorType::Directory => "directory",
        DescriptorType::Fifo => "fifo",
        DescriptorType::SymbolicLink => "symbolic-link",
        DescriptorType::RegularFile => "regular-file",
        DescriptorType::Socket => "socket",
    }
}

/// The descriptor type `name` is ([`type_name`]'s inverse; `unknown` for
/// any other).
fn descriptor_type(name: &str) -> DescriptorType {
    [
        DescriptorType::BlockDevice,
        DescriptorType::CharacterDevice,
        DescriptorType::Directory,
        DescriptorType::Fifo,
        DescriptorType::SymbolicLink,
        DescriptorType::RegularFile,
        DescriptorType::Socket,
    ]
    .into_iter()
    .find(|kind| type_name(*kind) == name)
    .unwrap_or(DescriptorType::Unknown)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn watch(played: bool) -> FileWatch {
        let reel = Reel::arm(&mut WasiCtxBuilder::new(), Default::default(), true, None);
        let dirs = [];
        let mut watch = FileWatch {
            reel: reel.expect("a recording reel"),
            played: None,
            descriptors: HashMap::new(),
            streams: HashMap::new(),
            seen: HashMap::new(),
            recorded: HashSet::new(),
            next_listing: 0,
            files: Vec::new(),
            listings: Vec::new(),
            kept: 0,
        };
        if played {
            let tape = Arc::new(Tape::default());
            let scratch = scratch(&mut WasiCtxBuilder::new(), &dirs, &tape).unwrap();
            watch.played = Some((tape, scratch));
        }
        watch.preopened(3, "/data");
        watch
    }

    #[test]
    fn a_path_is_placed_in_its_directory_or_nowhere() {
        let mut watch = watch(false);
        let place = |watch: &FileWatch, fd, path| watch.place(fd, path).map(|p| p.to_string());
        assert_eq!(place(&watch, 3, "a.txt").as_deref(), Some("/data/a.txt"));
        assert_eq!(
            place(&watch, 3, "./a//b/../c").as_deref(),
            Some("/data/a/c")
        );
        assert_eq!(place(&watch, 3, ".").as_deref(), Some("/data"));
        watch.opened(4, watch.place(3, "sub"));
        assert_eq!(place(&watch, 4, "../a.txt").as_deref(), Some("/data/a.txt"));
        // Out of the directory, absolute, or from a descriptor not on it.
        assert_eq!(place(&watch, 4, "../../etc/passwd"), None);
        assert_eq!(place(&watch, 3, "/etc/passwd"), None);
        assert_eq!(place(&watch, 9, "a.txt"), None);
        // A descriptor reopened where no granted directory is forgets it.
        watch.opened(4, None);
        assert_eq!(place(&watch, 4, "a.txt"), None);
    }

    #[test]
    fn a_tape_keeps_what_was_first_found_within_its_bounds() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.txt"), "abc").unwrap();
        let from = Arc::new(std::fs::File::open(dir.path()).unwrap());
        let mut watch = watch(false);
        let look = |watch: &mut FileWatch, path: &str, opens| {
            let place = watch.place(3, path).unwrap();
            let look = watch.touch(&place, || Some(from.clone()), path, true, opens);
            if let Some(look) = look {
                let reel = watch.reel().clone();
                let found = look.run(|bytes| reel.room_for(bytes));
                watch.keep(place, found);
            }
        };
        // Looked at, then opened: its bytes are kept once it is opened.
        look(&mut watch, "a.txt", false);
        assert_eq!(watch.files[0].body, None);
        assert_eq!(watch.files[0].size, Some(3));
        look(&mut watch, "a.txt", true);
        assert_eq!(watch.files[0].body.as_deref(), Some("YWJj"));
        // A later touch keeps nothing more: what the call itself wrote
        // is the replay's to write again.
        std::fs::write(dir.path().join("a.txt"), "changed").unwrap();
        look(&mut watch, "a.txt", true);
        assert_eq!(watch.files.len(), 1);
        assert_eq!(watch.files[0].body.as_deref(), Some("YWJj"));
        look(&mut watch, "none.txt", true);
        assert_eq!(watch.files[1].kind, SeenKind::Absent);
        // A path cap-std refuses (through a symbolic link out) is not
        // recorded, and says so.
        std::os::unix::fs::symlink("/etc", dir.path().join("out")).unwrap();
        look(&mut watch, "out/hostname", true);
        assert_eq!(watch.files.len(), 2);
        let mut tape = watch.reel().take();
        let past = tape.past.take().unwrap_or_default();
        assert!(
            past.starts_with("could not look at /data/out/hostname"),
            "{past}"
        );
        // Past the paths a tape keeps: noted, not kept.
        watch.kept = Tape::MAX_PATHS;
        look(&mut watch, "other.txt", false);
        assert_eq!(watch.files.len(), 2);
        let past = watch.reel().take().past.unwrap_or_default();
        assert!(past.contains("more than 4096 paths"), "{past}");
        // A path's name counts against the tape's bytes too.
        let mut watch = self::watch(false);
        assert!(watch.reel().room_for(Tape::MAX_RECORDED_BYTES - 4));
        look(&mut watch, "none.txt", false);
        assert!(watch.files.is_empty());
        let past = watch.reel().take().past.unwrap_or_default();
        assert!(past.contains("more than 1048576 bytes"), "{past}");
    }

    #[test]
    fn a_scratch_copy_holds_only_plain_paths_under_it() {
        let root = tempfile::tempdir().unwrap();
        let inside = root.path().join("0");
        std::fs::create_dir(&inside).unwrap();
        let seen = |path: &str, kind, body: Option<&str>| FileSeen {
            dir: "/data".into(),
            path: path.into(),
            kind,
            size: Some(4),
            modified: Some(1_000_000_000),
            body: body.map(str::to_owned),
        };
        for hostile in ["../x", "a/../../x", "", "/abs", "a/./b", "a\\..\\x"] {
            put(&inside, &seen(hostile, SeenKind::File, Some("YWJj"))).unwrap();
        }
        assert_eq!(std::fs::read_dir(root.path()).unwrap().count(), 1);
        assert_eq!(std::fs::read_dir(&inside).unwrap().count(), 0);

        put(&inside, &seen("d/a.txt", SeenKind::File, Some("YWJj"))).unwrap();
        put(&inside, &seen("d/sized", SeenKind::File, None)).unwrap();
        put(&inside, &seen("d/bad", SeenKind::File, Some("not base64!"))).unwrap();
        put(&inside, &seen("e", SeenKind::Directory, None)).unwrap();
        put(&inside, &seen("gone", SeenKind::Absent, None)).unwrap();
        assert_eq!(std::fs::read(inside.join("d/a.txt")).unwrap(), b"abc");
        assert_eq!(std::fs::read(inside.join("d/sized")).unwrap(), [0; 4]);
        assert_eq!(std::fs::read(inside.join("d/bad")).unwrap(), [0; 4]);
        assert!(inside.join("e").is_dir());
        assert!(!inside.join("gone").exists());
        let modified = std::fs::metadata(inside.join("d/a.txt"))
            .unwrap()
            .modified()
            .unwrap();
        assert_eq!(modified, UNIX_EPOCH + Duration::from_secs(1));
    }

    #[test]
    fn a_replayed_listing_plays_back_and_says_when_it_runs_short() {
        let mut watch = watch(true);
        let listing = |ended| Listing {
            dir: "/data".into(),
            path: String::new(),
            entries: vec![("a.txt".into(), "regular-file".into())],
            ended,
        };
        let tape = Tape {
            listings: vec![listing(true), listing(false)],
            ..Tape::default()
        };
        let scratch = watch.played.take().unwrap().1;
        watch.played = Some((Arc::new(tape), scratch));
        for stream in [10, 11] {
            watch.listing(stream, 3);
            let entry = watch.played_entry(stream).unwrap().unwrap();
            assert_eq!(
                (entry.name.as_str(), entry.type_),
                ("a.txt", DescriptorType::RegularFile)
            );
            assert!(watch.played_entry(stream).unwrap().is_none());
        }
        let past = watch.reel().take().past.unwrap_or_default();
        assert_eq!(
            past,
            "reads more of the listing of /data than its recorded call"
        );
        watch.listing(12, 3);
        let past = watch.reel().take().past.unwrap_or_default();
        assert_eq!(
            past,
            "lists /data, which its recorded call did not list next"
        );
        for name in ["regular-file", "directory", "symbolic-link", "socket"] {
            assert_eq!(type_name(descriptor_type(name)), name);
        }
        assert_eq!(descriptor_type("what"), DescriptorType::Unknown);
    }
}
