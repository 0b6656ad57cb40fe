//! Serving the directory grant: the granted directory, as checked when
//! the policy was read, preopened for each call; and, for a call that
//! records or replays what it finds there
//! ([`FileWatch`](crate::sandbox::FileWatch)), the
//! filesystem functions that name a path, shadowed to look first.
//!
//! Every call's writes into its directories are counted against its
//! [`WriteBudget`] before they are made: the bytes of each write (through
//! `write` or a file's output stream, which is wrapped as it is opened),
//! what `set-size` grows a file by, and a disk block for each file,
//! directory or link it may make. A call granted no writable directory
//! has no budget, and pays nothing for one.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use wasmtime::StoreContextMut;
use wasmtime::component::{Linker, Resource};
use wasmtime_wasi::FsPerms;
use wasmtime_wasi::filesystem::{Descriptor, WasiFilesystemCtxView, WasiFilesystemView as _};
use wasmtime_wasi::p2::bindings::filesystem::preopens::Host as _;
use wasmtime_wasi::p2::bindings::filesystem::types::{
    self, DescriptorFlags, DirectoryEntry, DirectoryEntryStream, ErrorCode, HostDescriptor,
    HostDirectoryEntryStream, MetadataHashValue, NewTimestamp, OpenFlags, PathFlags,
};
use wasmtime_wasi::p2::{
    DynOutputStream, FsResult, OutputStream, Pollable, StreamError, StreamResult,
};

use super::{CallSetup, Capability, DirGrant, DirMode, GrantError};
use crate::policy::limits::ENTRY_BYTES;
use crate::sandbox::files::{Found, Place};
use crate::sandbox::{CallState, Refusals};

/// The WASI version wasmtime-wasi links its filesystem interfaces under.
const TYPES: &str = "wasi:filesystem/types@0.2.12";
const PREOPENS: &str = "wasi:filesystem/preopens@0.2.12";

impl Capability for DirGrant {
    /// `wasi:filesystem` is part of the WASI base the host links once; a
    /// call sees only the directories `prepare` preopened for it. The
    /// functions that name a path are linked again over it, to look at
    /// the path first when the call records or replays what it finds in
    /// its directories (one branch otherwise).
    fn link(linker: &mut Linker<CallState>) -> wasmtime::Result<()> {
        linker.allow_shadowing(true);
        let linked = shadow(linker);
        linker.allow_shadowing(false);
        linked
    }

    fn prepare(&self, call: &mut CallSetup<'_>) -> Result<(), GrantError> {
        let perms = match self.mode {
            DirMode::Ro => FsPerms::ReadOnly,
            DirMode::Rw => FsPerms::ReadWrite,
        };
        let unavailable = |source: std::io::Error| GrantError::DirUnavailable {
            path: self.host.display().to_string(),
            source: Arc::new(source),
        };
        let path = self.handle.path_for_call(&self.host).map_err(unavailable)?;
        call.wasi
            .preopened_dir(&path, &self.guest, perms)
            .map(|_| ())
            .map_err(|e| unavailable(std::io::Error::other(e.to_string())))
    }
}

/// What a call may still write into its granted directories
/// ([`Limits::max_write_bytes`](crate::Limits::max_write_bytes)), shared by
/// the call's state and the file streams it opens. Each write takes its
/// bytes before it is made; one that does not fit is refused whole.
#[derive(Debug, Clone)]
pub(crate) struct WriteBudget(Arc<Budget>);

#[derive(Debug)]
struct Budget {
    left: AtomicU64,
    limit: u64,
    refusals: Refusals,
}

impl WriteBudget {
    /// `limit` bytes, a refused write noted in `refusals`.
    pub(crate) fn new(limit: u64, refusals: Refusals) -> Self {
        Self(Arc::new(Budget {
            left: AtomicU64::new(limit),
            limit,
            refusals,
        }))
    }

    /// Takes `bytes`, or refuses them all with the error a full disk
    /// gives (`ENOSPC`), noted among the call's refusals.
    fn take(&self, bytes: u64) -> std::io::Result<()> {
        let left = &self.0.left;
        if left
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| {
                left.checked_sub(bytes)
            })
            .is_ok()
        {
            return Ok(());
        }
        self.0.refusals.note(format!(
            "write refused: a call may write at most {} bytes into its directories \
             (limits max_write_bytes)",
            self.0.limit
        ));
        Err(std::io::Error::from_raw_os_error(
            rustix::io::Errno::NOSPC.raw_os_error(),
        ))
    }

    /// [`take`](Self::take) as a stream's error.
    fn take_for_stream(&self, bytes: usize) -> StreamResult<()> {
        self.take(bytes as u64)
            .map_err(|e| StreamError::LastOperationFailed(e.into()))
    }

    /// [`take`](Self::take) as a filesystem function's error.
    fn take_for_fs(&self, bytes: u64) -> FsResult<()> {
        self.take(bytes)
            .map_err(|_| ErrorCode::InsufficientSpace.into())
    }
}

/// A file's output stream whose writes are taken from the call's
/// [`WriteBudget`] first.
struct Budgeted {
    file: DynOutputStream,
    budget: WriteBudget,
}

#[wasmtime_wasi::async_trait]
impl Pollable for Budgeted {
    async fn ready(&mut self) {
        self.file.ready().await;
    }
}

#[wasmtime_wasi::async_trait]
impl OutputStream for Budgeted {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.budget.take_for_stream(bytes.len())?;
        self.file.write(bytes)
    }

    fn flush(&mut self) -> StreamResult<()> {
        self.file.flush()
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        self.file.check_write()
    }

    async fn blocking_write_and_flush(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.budget.take_for_stream(bytes.len())?;
        self.file.blocking_write_and_flush(bytes).await
    }

    fn write_zeroes(&mut self, count: usize) -> StreamResult<()> {
        self.budget.take_for_stream(count)?;
        self.file.write_zeroes(count)
    }

    async fn cancel(&mut self) {
        self.file.cancel().await;
    }
}

/// `opened`, a file's output stream in the call's table, replaced by one
/// that takes its writes from the call's budget first.
fn budgeted(
    state: &mut CallState,
    opened: FsResult<Resource<DynOutputStream>>,
) -> FsResult<Resource<DynOutputStream>> {
    let Some(budget) = state.writes.clone() else {
        return opened;
    };
    let file = state.table.delete(opened?)?;
    let stream: DynOutputStream = Box::new(Budgeted { file, budget });
    Ok(state.table.push(stream)?)
}

/// Takes `bytes` from the call's budget, if it has one (a call granted
/// no writable directory writes nothing).
fn take(state: &CallState, bytes: u64) -> FsResult<()> {
    state
        .writes
        .as_ref()
        .map_or(Ok(()), |b| b.take_for_fs(bytes))
}

type Store<'a> = StoreContextMut<'a, CallState>;
type Answer<T> = wasmtime::Result<(Result<T, ErrorCode>,)>;
/// The granted directories as `get-directories` gives them.
type Preopens = Vec<(Resource<Descriptor>, String)>;

/// What a shadowed function answers for `result` (as wasmtime-wasi's own
/// binding would).
fn settle<T>(view: &mut WasiFilesystemCtxView<'_>, result: FsResult<T>) -> Answer<T> {
    match result {
        Ok(value) => Ok((Ok(value),)),
        Err(e) => Ok((Err(types::Host::convert_error_code(view, e)?),)),
    }
}

/// `write`, made once the call's budget has taken `bytes` for it, and
/// answered as wasmtime-wasi's own binding would.
async fn within_budget<T>(
    state: &mut CallState,
    bytes: u64,
    write: impl AsyncFnOnce(&mut WasiFilesystemCtxView<'_>) -> FsResult<T>,
) -> Answer<T> {
    let taken = take(state, bytes);
    let mut view = state.filesystem();
    let done = match taken {
        Ok(()) => write(&mut view).await,
        Err(e) => Err(e),
    };
    settle(&mut view, done)
}

/// A borrow of the descriptor `rep`, to hand on.
fn borrow(rep: u32) -> Resource<Descriptor> {
    Resource::new_borrow(rep)
}

fn follows(flags: PathFlags) -> bool {
    flags.contains(PathFlags::SYMLINK_FOLLOW)
}

/// Before a call's operation on `path`, named from the directory `fd`:
/// what its watch (if any) needs to look at, looked at off the async
/// threads, and kept. Gives back the path's place when the call is
/// watched and the path lies inside a granted directory.
async fn touch(
    store: &mut Store<'_>,
    fd: u32,
    path: &str,
    follow: bool,
    opens: bool,
) -> Option<Place> {
    let state = store.data_mut();
    let watch = state.files.as_mut()?;
    let place = watch.place(fd, path)?;
    let table = &state.table;
    let from = || match table.get(&borrow(fd)) {
        Ok(Descriptor::Dir(dir)) => Some(Arc::clone(&dir.dir)),
        _ => None,
    };
    let Some(look) = watch.touch(&place, from, path, follow, opens) else {
        return Some(place);
    };
    let reel = watch.reel().clone();
    let found = tokio::task::spawn_blocking(move || look.run(|bytes| reel.room_for(bytes)))
        .await
        .unwrap_or_else(|e| Found::Unrecordable(format!("could not look at {place}: {e}")));
    if let Some(watch) = store.data_mut().files.as_mut() {
        watch.keep(place.clone(), found);
    }
    Some(place)
}

/// Links the shadowing functions over wasmtime-wasi's.
fn shadow(linker: &mut Linker<CallState>) -> wasmtime::Result<()> {
    linker.instance(PREOPENS)?.func_wrap(
        "get-directories",
        |mut store: Store<'_>, (): ()| -> wasmtime::Result<(Preopens,)> {
            let state = store.data_mut();
            let preopens = state.filesystem().get_directories()?;
            if let Some(watch) = state.files.as_mut() {
                for (descriptor, name) in &preopens {
                    watch.preopened(descriptor.rep(), name);
                }
            }
            Ok((preopens,))
        },
    )?;
    let mut types = linker.instance(TYPES)?;
    types.func_wrap_async(
        "[method]descriptor.open-at",
        |mut store: Store<'_>,
         (fd, path_flags, path, oflags, flags): (
            Resource<Descriptor>,
            PathFlags,
            String,
            OpenFlags,
            DescriptorFlags,
        )| {
            Box::new(async move {
                let rep = fd.rep();
                let place = touch(&mut store, rep, &path, follows(path_flags), true).await;
                let state = store.data_mut();
                if oflags.contains(OpenFlags::CREATE)
                    && let Err(e) = take(state, ENTRY_BYTES)
                {
                    return settle(&mut state.filesystem(), Err(e));
                }
                let mut view = state.filesystem();
                let opened = view.open_at(fd, path_flags, path, oflags, flags).await;
                if let (Ok(new), Some(watch)) = (&opened, state.files.as_mut()) {
                    watch.opened(new.rep(), place);
                }
                settle(&mut state.filesystem(), opened)
            })
        },
    )?;
    types.func_wrap_async(
        "[method]descriptor.stat-at",
        |mut store: Store<'_>,
         (fd, path_flags, path): (Resource<Descriptor>, PathFlags, String)| {
            Box::new(async move {
                touch(&mut store, fd.rep(), &path, follows(path_flags), false).await;
                let mut view = store.data_mut().filesystem();
                let stat = view.stat_at(fd, path_flags, path).await;
                settle(&mut view, stat)
            })
        },
    )?;
    types.func_wrap_async(
        "[method]descriptor.read-directory",
        |mut store: Store<'_>, (fd,): (Resource<Descriptor>,)| {
            Box::new(async move {
                let rep = fd.rep();
                let state = store.data_mut();
                let mut view = state.filesystem();
                let stream = view.read_directory(fd).await;
                if let (Ok(stream), Some(watch)) = (&stream, state.files.as_mut()) {
                    watch.listing(stream.rep(), rep);
                }
                settle(&mut state.filesystem(), stream)
            })
        },
    )?;
    types.func_wrap_async(
        "[method]directory-entry-stream.read-directory-entry",
        |mut store: Store<'_>, (stream,): (Resource<DirectoryEntryStream>,)| {
            Box::new(async move {
                let rep = stream.rep();
                let state = store.data_mut();
                if let Some(played) = state.files.as_mut().and_then(|w| w.played_entry(rep)) {
                    return Ok((Ok::<Option<DirectoryEntry>, ErrorCode>(played),));
                }
                let mut view = state.filesystem();
                let entry = view.read_directory_entry(stream).await;
                if let (Ok(entry), Some(watch)) = (&entry, state.files.as_mut()) {
                    watch.listed(rep, entry.as_ref());
                }
                settle(&mut state.filesystem(), entry)
            })
        },
    )?;
    // The functions that change or read a path without opening it: each
    // path it names is looked at first (not following a last symbolic
    // link, as they do not, unless their flags say so).
    macro_rules! path_first {
        ($name:literal, $method:ident) => {
            types.func_wrap_async(
                $name,
                |mut store: Store<'_>, (fd, path): (Resource<Descriptor>, String)| {
                    Box::new(async move {
                        touch(&mut store, fd.rep(), &path, false, false).await;
                        let mut view = store.data_mut().filesystem();
                        let done = view.$method(fd, path).await;
                        settle(&mut view, done)
                    })
                },
            )?
        };
    }
    types.func_wrap_async(
        "[method]descriptor.create-directory-at",
        |mut store: Store<'_>, (fd, path): (Resource<Descriptor>, String)| {
            Box::new(async move {
                touch(&mut store, fd.rep(), &path, false, false).await;
                within_budget(store.data_mut(), ENTRY_BYTES, async |view| {
                    view.create_directory_at(fd, path).await
                })
                .await
            })
        },
    )?;
    path_first!("[method]descriptor.unlink-file-at", unlink_file_at);
    path_first!(
        "[method]descriptor.remove-directory-at",
        remove_directory_at
    );
    path_first!("[method]descriptor.readlink-at", readlink_at);
    types.func_wrap_async(
        "[method]descriptor.symlink-at",
        |mut store: Store<'_>, (fd, target, path): (Resource<Descriptor>, String, String)| {
            Box::new(async move {
                touch(&mut store, fd.rep(), &path, false, false).await;
                within_budget(store.data_mut(), ENTRY_BYTES, async |view| {
                    view.symlink_at(fd, target, path).await
                })
                .await
            })
        },
    )?;
    types.func_wrap_async(
        "[method]descriptor.rename-at",
        |mut store: Store<'_>,
         (fd, old, new_fd, new): (Resource<Descriptor>, String, Resource<Descriptor>, String)| {
            Box::new(async move {
                touch(&mut store, fd.rep(), &old, false, false).await;
                touch(&mut store, new_fd.rep(), &new, false, false).await;
                let mut view = store.data_mut().filesystem();
                let done = view.rename_at(fd, old, new_fd, new).await;
                settle(&mut view, done)
            })
        },
    )?;
    types.func_wrap_async(
        "[method]descriptor.link-at",
        |mut store: Store<'_>,
         (fd, flags, old, new_fd, new): (
            Resource<Descriptor>,
            PathFlags,
            String,
            Resource<Descriptor>,
            String,
        )| {
            Box::new(async move {
                touch(&mut store, fd.rep(), &old, follows(flags), false).await;
                touch(&mut store, new_fd.rep(), &new, false, false).await;
                within_budget(store.data_mut(), ENTRY_BYTES, async |view| {
                    view.link_at(fd, flags, old, new_fd, new).await
                })
                .await
            })
        },
    )?;
    types.func_wrap_async(
        "[method]descriptor.set-times-at",
        |mut store: Store<'_>,
         (fd, flags, path, atim, mtim): (
            Resource<Descriptor>,
            PathFlags,
            String,
            NewTimestamp,
            NewTimestamp,
        )| {
            Box::new(async move {
                touch(&mut store, fd.rep(), &path, follows(flags), false).await;
                let mut view = store.data_mut().filesystem();
                let done = view.set_times_at(fd, flags, path, atim, mtim).await;
                settle(&mut view, done)
            })
        },
    )?;
    types.func_wrap_async(
        "[method]descriptor.metadata-hash-at",
        |mut store: Store<'_>, (fd, flags, path): (Resource<Descriptor>, PathFlags, String)| {
            Box::new(async move {
                touch(&mut store, fd.rep(), &path, follows(flags), false).await;
                let mut view = store.data_mut().filesystem();
                let hash: FsResult<MetadataHashValue> =
                    view.metadata_hash_at(fd, flags, path).await;
                settle(&mut view, hash)
            })
        },
    )?;
    // What writes a file: counted against the call's budget first.
    types.func_wrap_async(
        "[method]descriptor.write",
        |mut store: Store<'_>, (fd, bytes, offset): (Resource<Descriptor>, Vec<u8>, u64)| {
            Box::new(async move {
                let len = bytes.len() as u64;
                within_budget(store.data_mut(), len, async |view| {
                    view.write(fd, bytes, offset).await
                })
                .await
            })
        },
    )?;
    types.func_wrap_async(
        "[method]descriptor.set-size",
        |mut store: Store<'_>, (fd, size): (Resource<Descriptor>, u64)| {
            Box::new(async move {
                // What it grows the file by (a sparse file takes no disk
                // on most file systems, but it does on some).
                let now = store.data_mut().filesystem().stat(borrow(fd.rep())).await;
                let grows = now.map_or(0, |stat| size.saturating_sub(stat.size));
                within_budget(store.data_mut(), grows, async |view| {
                    view.set_size(fd, size).await
                })
                .await
            })
        },
    )?;
    types.func_wrap(
        "[method]descriptor.write-via-stream",
        |mut store: Store<'_>, (fd, offset): (Resource<Descriptor>, u64)| {
            let state = store.data_mut();
            let opened = state.filesystem().write_via_stream(fd, offset);
            let stream = budgeted(state, opened);
            settle(&mut state.filesystem(), stream)
        },
    )?;
    types.func_wrap(
        "[method]descriptor.append-via-stream",
        |mut store: Store<'_>, (fd,): (Resource<Descriptor>,)| {
            let state = store.data_mut();
            let opened = state.filesystem().append_via_stream(fd);
            let stream = budgeted(state, opened);
            settle(&mut state.filesystem(), stream)
        },
    )?;
    Ok(())
}
