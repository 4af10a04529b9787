//! A FUSE filesystem that forgets, on "power loss", everything not synced,
//! in the spirit of Jepsen's LazyFS: the disk of the power-loss tests.
//!
//! Everything lives in this process's memory. Each file has the bytes that
//! reads see and the bytes as of its last `fsync`/`fdatasync`; each directory
//! has its entries and its entries as of its last `fsync`. A write, a create,
//! a rename or an unlink changes only the first; a sync copies the first into
//! the second. [`LazyFs::power_loss`] throws the unsynced state away: every
//! file goes back to its synced bytes, every directory to its synced entries.
//! That is the pessimistic reading of POSIX that a real disk after a power
//! cut may show: `sync_file_range`, a `write` or a `rename` alone promise
//! nothing, a file is found again only through directory entries that were
//! synced. The kernel's caches are dropped by unmounting (a "reboot"):
//! [`LazyFs::mount`] again to see what survived.
//!
//! A slow disk ([`LazyFs::with_sync_delay`]) takes that long over every
//! sync, which is durable only when the call returns; [`LazyFs::cut_power`]
//! (at the kill of the process using the disk) makes the syncs still in
//! flight fail, so their bytes are lost with the power. That widens the
//! moment between "written" and "synced" from microseconds to most of a
//! commit, so a node that answered an add before its sync returned loses
//! that add in nearly every kill.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use fuser::{
    BackgroundSession, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation,
    INodeNo, LockOwner, MountOption, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyWrite, Request, WriteFlags,
};

const TTL: Duration = Duration::from_secs(1);
const ROOT: u64 = 1;

enum Body {
    File {
        data: Vec<u8>,
        synced: Vec<u8>,
    },
    Dir {
        entries: BTreeMap<OsString, u64>,
        synced: BTreeMap<OsString, u64>,
    },
}

struct Inode {
    body: Body,
    perm: u16,
}

/// What the filesystem has seen, for a test to show that it did its job.
#[derive(Clone, Copy, Debug, Default)]
pub struct Counts {
    /// `fsync`/`fdatasync` calls on files.
    pub file_syncs: u64,
    /// `fsync` calls on directories.
    pub dir_syncs: u64,
    /// Files whose content a power loss rolled back.
    pub files_rolled_back: u64,
    /// Directories whose entries a power loss rolled back.
    pub dirs_rolled_back: u64,
}

struct State {
    inodes: BTreeMap<u64, Inode>,
    next_ino: u64,
    counts: Counts,
    /// False from [`LazyFs::cut_power`] to the next [`LazyFs::mount`]: a
    /// sync that completes then fails and keeps nothing.
    powered: bool,
}

/// The shared state of the filesystem; it outlives each mount.
#[derive(Clone)]
pub struct LazyFs {
    state: Arc<Mutex<State>>,
    /// How long each sync takes.
    sync_delay: Duration,
}

/// What a sync makes durable: the bytes or entries as of the call. The
/// session runs one thread (fuser's default), so syncs complete in order.
enum Snapshot {
    File(Vec<u8>),
    Dir(BTreeMap<OsString, u64>),
}

/// A mount of a [`LazyFs`]; dropping it unmounts.
pub struct Mounted {
    session: Option<BackgroundSession>,
}

impl Mounted {
    /// Unmounts (every process using the mount must be gone). The session
    /// may end with `ECONNABORTED` when the kernel drops the connection at
    /// the unmount itself (seen once in a CI rehearsal): the mount is gone
    /// then too, and the state lives on in the [`LazyFs`].
    pub fn unmount(mut self) {
        if let Some(session) = self.session.take() {
            match session.umount_and_join() {
                Ok(()) => {}
                Err(error) if error.kind() == std::io::ErrorKind::ConnectionAborted => {}
                Err(error) => panic!("unmounting the lazy filesystem: {error:?}"),
            }
        }
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if let Some(session) = self.session.take() {
            let _ = session.umount_and_join();
        }
    }
}

/// Why the power-loss tests cannot run here, if they cannot: they need
/// root, `/dev/fuse` and `fusermount3`.
pub fn unavailable() -> Option<String> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let effective_uid = status
        .lines()
        .find_map(|line| line.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1))
        .unwrap_or("unknown");
    if effective_uid != "0" {
        return Some("not running as root (mounting a FUSE filesystem needs it)".into());
    }
    if !Path::new("/dev/fuse").exists() {
        return Some(
            "/dev/fuse does not exist (no FUSE support in this kernel or container)".into(),
        );
    }
    let found = std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).any(|dir| dir.join("fusermount3").exists()))
        .unwrap_or(false);
    if !found {
        return Some("fusermount3 is not installed (apt-get install fuse3)".into());
    }
    None
}

impl LazyFs {
    /// An empty filesystem whose syncs take `delay` each (see the module
    /// documentation).
    pub fn with_sync_delay(delay: Duration) -> LazyFs {
        LazyFs {
            sync_delay: delay,
            ..LazyFs::new()
        }
    }

    /// An empty filesystem.
    pub fn new() -> LazyFs {
        let root = Inode {
            body: Body::Dir {
                entries: BTreeMap::new(),
                synced: BTreeMap::new(),
            },
            perm: 0o755,
        };
        LazyFs {
            state: Arc::new(Mutex::new(State {
                inodes: BTreeMap::from([(ROOT, root)]),
                next_ino: ROOT + 1,
                counts: Counts::default(),
                powered: true,
            })),
            sync_delay: Duration::ZERO,
        }
    }

    /// Mounts the filesystem on `mountpoint` (an existing, empty directory).
    pub fn mount(&self, mountpoint: &Path) -> Mounted {
        self.lock().powered = true;
        let mut config = fuser::Config::default();
        config.mount_options = vec![
            MountOption::FSName("tally-lazyfs".into()),
            MountOption::DefaultPermissions,
        ];
        let session = fuser::spawn_mount(self.clone(), mountpoint, &config).unwrap_or_else(|e| {
            panic!(
                "mounting the lazy filesystem on {}: {e}",
                mountpoint.display()
            )
        });
        Mounted {
            session: Some(session),
        }
    }

    /// The power goes out now (call it just before killing the process
    /// that uses the disk): syncs still in flight, and any called until the
    /// next mount, fail and keep nothing. Then unmount and
    /// [`LazyFs::power_loss`].
    pub fn cut_power(&self) {
        self.lock().powered = false;
    }

    /// The power goes out: everything not synced is gone. Unmount first.
    pub fn power_loss(&self) {
        let mut state = self.lock();
        let mut counts = state.counts;
        for inode in state.inodes.values_mut() {
            match &mut inode.body {
                Body::File { data, synced } => {
                    if data != synced {
                        counts.files_rolled_back += 1;
                        data.clone_from(synced);
                    }
                }
                Body::Dir { entries, synced } => {
                    if entries != synced {
                        counts.dirs_rolled_back += 1;
                        entries.clone_from(synced);
                    }
                }
            }
        }
        state.counts = counts;
    }

    /// What the filesystem has seen so far.
    pub fn counts(&self) -> Counts {
        self.lock().counts
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl State {
    fn attr(&self, ino: u64) -> Option<FileAttr> {
        let inode = self.inodes.get(&ino)?;
        let (kind, size, nlink) = match &inode.body {
            Body::File { data, .. } => (FileType::RegularFile, data.len() as u64, 1),
            Body::Dir { .. } => (FileType::Directory, 0, 2),
        };
        let time = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        Some(FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime: time,
            mtime: time,
            ctime: time,
            crtime: time,
            kind,
            perm: inode.perm,
            nlink,
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        })
    }

    fn entries(&mut self, ino: u64) -> Result<&mut BTreeMap<OsString, u64>, Errno> {
        match self.inodes.get_mut(&ino).map(|inode| &mut inode.body) {
            Some(Body::Dir { entries, .. }) => Ok(entries),
            Some(Body::File { .. }) => Err(Errno::ENOTDIR),
            None => Err(Errno::ENOENT),
        }
    }

    fn data(&mut self, ino: u64) -> Result<&mut Vec<u8>, Errno> {
        match self.inodes.get_mut(&ino).map(|inode| &mut inode.body) {
            Some(Body::File { data, .. }) => Ok(data),
            Some(Body::Dir { .. }) => Err(Errno::EISDIR),
            None => Err(Errno::ENOENT),
        }
    }

    fn lookup(&mut self, parent: u64, name: &OsStr) -> Result<u64, Errno> {
        self.entries(parent)?
            .get(name)
            .copied()
            .ok_or(Errno::ENOENT)
    }

    /// Adds a new inode named `name` in `parent`.
    fn make(&mut self, parent: u64, name: &OsStr, body: Body, mode: u32) -> Result<u64, Errno> {
        if self.entries(parent)?.contains_key(name) {
            return Err(Errno::EEXIST);
        }
        let ino = self.next_ino;
        self.next_ino += 1;
        self.inodes.insert(
            ino,
            Inode {
                body,
                perm: (mode & 0o7777) as u16,
            },
        );
        self.entries(parent)?.insert(name.to_owned(), ino);
        Ok(ino)
    }

    /// What a sync of `ino` called now makes durable.
    fn snapshot(&self, ino: u64) -> Result<Snapshot, Errno> {
        match self.inodes.get(&ino).map(|inode| &inode.body) {
            Some(Body::File { data, .. }) => Ok(Snapshot::File(data.clone())),
            Some(Body::Dir { entries, .. }) => Ok(Snapshot::Dir(entries.clone())),
            None => Err(Errno::ENOENT),
        }
    }

    /// The sync that took `snapshot` returns: durable, unless the power
    /// was cut meanwhile.
    fn complete_sync(&mut self, ino: u64, snapshot: Snapshot) -> Result<(), Errno> {
        if !self.powered {
            return Err(Errno::EIO);
        }
        match (
            self.inodes.get_mut(&ino).map(|inode| &mut inode.body),
            snapshot,
        ) {
            (Some(Body::File { synced, .. }), Snapshot::File(data)) => {
                *synced = data;
                self.counts.file_syncs += 1;
            }
            (Some(Body::Dir { synced, .. }), Snapshot::Dir(entries)) => {
                *synced = entries;
                self.counts.dir_syncs += 1;
            }
            _ => return Err(Errno::ENOENT),
        }
        Ok(())
    }
}

impl LazyFs {
    /// A sync of `ino`: the bytes as of the call become durable once it
    /// returns, the filesystem's sync delay later.
    fn sync(&self, ino: u64) -> Result<(), Errno> {
        let snapshot = self.lock().snapshot(ino)?;
        if !self.sync_delay.is_zero() {
            std::thread::sleep(self.sync_delay);
        }
        self.lock().complete_sync(ino, snapshot)
    }
}

fn new_file() -> Body {
    Body::File {
        data: Vec::new(),
        synced: Vec::new(),
    }
}

fn new_dir() -> Body {
    Body::Dir {
        entries: BTreeMap::new(),
        synced: BTreeMap::new(),
    }
}

impl Filesystem for LazyFs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let mut state = self.lock();
        match state.lookup(parent.0, name) {
            Ok(ino) => reply.entry(&TTL, &state.attr(ino).unwrap(), Generation(0)),
            Err(errno) => reply.error(errno),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.lock().attr(ino.0) {
            Some(attr) => reply.attr(&TTL, &attr),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<fuser::TimeOrNow>,
        _mtime: Option<fuser::TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let mut state = self.lock();
        if let Some(size) = size {
            match state.data(ino.0) {
                Ok(data) => data.resize(size as usize, 0),
                Err(errno) => return reply.error(errno),
            }
        }
        if let (Some(mode), Some(inode)) = (mode, state.inodes.get_mut(&ino.0)) {
            inode.perm = (mode & 0o7777) as u16;
        }
        match state.attr(ino.0) {
            Some(attr) => reply.attr(&TTL, &attr),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let mut state = self.lock();
        match state.make(parent.0, name, new_dir(), mode & !umask) {
            Ok(ino) => reply.entry(&TTL, &state.attr(ino).unwrap(), Generation(0)),
            Err(errno) => reply.error(errno),
        }
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let mut state = self.lock();
        match state.make(parent.0, name, new_file(), mode & !umask) {
            Ok(ino) => reply.created(
                &TTL,
                &state.attr(ino).unwrap(),
                Generation(0),
                FileHandle(0),
                FopenFlags::empty(),
            ),
            Err(errno) => reply.error(errno),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let mut state = self.lock();
        match state.entries(parent.0).map(|entries| entries.remove(name)) {
            Ok(Some(_)) => reply.ok(),
            Ok(None) => reply.error(Errno::ENOENT),
            Err(errno) => reply.error(errno),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let mut state = self.lock();
        let ino = match state.lookup(parent.0, name) {
            Ok(ino) => ino,
            Err(errno) => return reply.error(errno),
        };
        match state.entries(ino) {
            Ok(entries) if !entries.is_empty() => return reply.error(Errno::ENOTEMPTY),
            Ok(_) => {}
            Err(errno) => return reply.error(errno),
        }
        state.entries(parent.0).unwrap().remove(name);
        reply.ok();
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        _flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let mut state = self.lock();
        let ino = match state.lookup(parent.0, name) {
            Ok(ino) => ino,
            Err(errno) => return reply.error(errno),
        };
        if let Err(errno) = state.entries(newparent.0) {
            return reply.error(errno);
        }
        state.entries(parent.0).unwrap().remove(name);
        state
            .entries(newparent.0)
            .unwrap()
            .insert(newname.to_owned(), ino);
        reply.ok();
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let mut state = self.lock();
        match state.data(ino.0) {
            Ok(data) => {
                let start = (offset as usize).min(data.len());
                let end = (start + size as usize).min(data.len());
                reply.data(&data[start..end]);
            }
            Err(errno) => reply.error(errno),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        bytes: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let mut state = self.lock();
        match state.data(ino.0) {
            Ok(data) => {
                let end = offset as usize + bytes.len();
                if data.len() < end {
                    data.resize(end, 0);
                }
                data[offset as usize..end].copy_from_slice(bytes);
                reply.written(bytes.len() as u32);
            }
            Err(errno) => reply.error(errno),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // close(2) promises nothing about durability.
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        match self.sync(ino.0) {
            Ok(()) => reply.ok(),
            Err(errno) => reply.error(errno),
        }
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        match self.sync(ino.0) {
            Ok(()) => reply.ok(),
            Err(errno) => reply.error(errno),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let mut state = self.lock();
        let entries: Vec<(OsString, u64)> = match state.entries(ino.0) {
            Ok(entries) => entries.iter().map(|(n, i)| (n.clone(), *i)).collect(),
            Err(errno) => return reply.error(errno),
        };
        let listing = [(OsString::from("."), ino.0), (OsString::from(".."), ino.0)]
            .into_iter()
            .chain(entries);
        for (index, (name, child)) in listing.enumerate().skip(offset as usize) {
            let kind = match state.inodes.get(&child).map(|inode| &inode.body) {
                Some(Body::Dir { .. }) => FileType::Directory,
                _ => FileType::RegularFile,
            };
            if reply.add(INodeNo(child), index as u64 + 1, kind, &name) {
                break;
            }
        }
        reply.ok();
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        reply.ok();
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        if mode != 0 {
            return reply.error(Errno::EOPNOTSUPP);
        }
        let mut state = self.lock();
        match state.data(ino.0) {
            Ok(data) => {
                let end = (offset + length) as usize;
                if data.len() < end {
                    data.resize(end, 0);
                }
                reply.ok();
            }
            Err(errno) => reply.error(errno),
        }
    }
}
