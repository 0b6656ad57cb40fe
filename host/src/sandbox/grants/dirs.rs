//! Serving the directory grant: the granted directory, as checked when
//! the policy was read, preopened for each call; and, for a call that
//! records or replays what it finds there
//! ([`FileWatch`](crate::sandbox::FileWatch)), the
//! filesystem functions that name a path, shadowed to look first.

use std::sync::Arc;

use wasmtime::StoreContextMut;
use wasmtime::component::{Linker, Resource};
use wasmtime_wasi::FsPerms;
use wasmtime_wasi::filesystem::{Descriptor, WasiFilesystemCtxView, WasiFilesystemView as _};
use wasmtime_wasi::p2::FsResult;
use wasmtime_wasi::p2::bindings::filesystem::preopens::Host as _;
use wasmtime_wasi::p2::bindings::filesystem::types::{
    self, DescriptorFlags, DirectoryEntry, DirectoryEntryStream, ErrorCode, HostDescriptor,
    HostDirectoryEntryStream, MetadataHashValue, NewTimestamp, OpenFlags, PathFlags,
};

use super::{CallSetup, Capability, DirGrant, DirMode, GrantError};
use crate::sandbox::CallState;
use crate::sandbox::files::{Found, Place};

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
    path_first!(
        "[method]descriptor.create-directory-at",
        create_directory_at
    );
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
                let mut view = store.data_mut().filesystem();
                let done = view.symlink_at(fd, target, path).await;
                settle(&mut view, done)
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
                let mut view = store.data_mut().filesystem();
                let done = view.link_at(fd, flags, old, new_fd, new).await;
                settle(&mut view, done)
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
    Ok(())
}
