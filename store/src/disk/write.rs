//! The disk tier's write path: checksummed blocks written to temporary
//! files through the I/O engine, made durable (one `syncfs` per batch or
//! an fsync per file), then named in `blocks/`.

use super::*;

/// A block on its way to disk.
pub(super) struct Pending {
    id: BlockId,
    /// The temporary file's name in `tmp/`; `None` for an unnamed file
    /// (`O_TMPFILE`), which is linked into `blocks/` instead of renamed.
    tmp: Option<PathBuf>,
    file: Option<Arc<IoFile>>,
    err: Option<StoreError>,
}

/// A batch whose writes are in flight: the blocks, and each write's
/// ticket with the index of its block.
pub(super) struct Writing {
    pending: Vec<Pending>,
    writes: Vec<(IoTicket, usize)>,
}

/// A batch whose files are fsynced and renamed into `blocks/`, waiting on
/// the fsyncs of the directories it touched (`dirs`) to be durable.
pub(super) struct Renamed {
    pending: Vec<Pending>,
    pub(super) dirs: Vec<PathBuf>,
}

/// Fails each block of `pending` not failed yet: the `syncfs` through
/// `dir` meant to make it durable failed with `errno`.
pub(super) fn fail_unsynced(pending: &mut [Pending], dir: &IoDir, errno: i32) {
    for p in pending.iter_mut().filter(|p| p.err.is_none()) {
        p.err = Some(StoreError::Device(ucm_device::DeviceError::os(
            "syncfs",
            Some(dir.path().to_path_buf()),
            errno,
        )));
    }
}

/// Adds `d` to the directories a batch fsyncs, once.
pub(super) fn add_dir(dirs: &mut Vec<PathBuf>, d: &Path) {
    if !dirs.iter().any(|x| x == d) {
        dirs.push(d.to_path_buf());
    }
}

impl DiskTier {
    pub(super) fn header(&self, id: &BlockId, shards: &[IoBuf]) -> IoBuf {
        let mut h = IoBuf::new(self.header_bytes);
        let crcs: Vec<u32> = shards
            .iter()
            .map(|s| crc32c::crc32c(s.as_slice()))
            .collect();
        header::write_header(self.cfg.geometry, id, &crcs, h.as_mut_slice());
        h
    }

    /// Writes block `id` with all its shards (in shard order), crash-safely:
    /// temporary file, fsync, link or rename, directory fsync. On any failure
    /// nothing becomes visible and the error says why.
    pub fn write_block(&self, id: &BlockId, shards: Vec<IoBuf>) -> Result<()> {
        let mut r = self.write_blocks(vec![(*id, shards)]);
        match r.pop() {
            Some((_, r)) => r,
            // One outcome per block is the contract; none is never success.
            None => Err(StoreError::fs("write block", self.path_of(id))(
                std::io::Error::other("no outcome was reported for the block"),
            )),
        }
    }

    /// Writes many blocks at once, in batches of [`WRITE_BATCH_BLOCKS`]
    /// (bounding the temporary files open at once): each block's write goes
    /// to the engine as soon as its file is open and its header made, then
    /// the batch's fsyncs go in one submission, then the files are named
    /// (linked or renamed), then one fsync per directory touched.
    /// Batches overlap: batch N's file fsyncs are in flight with batch
    /// N-1's directory fsyncs (one journal commit serves both) and batch
    /// N+1's writes, and batch N+2's writes are handed to the engine before
    /// batch N is named. A batch is reported only after its directory
    /// fsyncs. Each block succeeds or fails alone, with the guarantees of
    /// [`DiskTier::write_block`].
    pub fn write_blocks(&self, blocks: Vec<(BlockId, Vec<IoBuf>)>) -> Vec<(BlockId, Result<()>)> {
        let mut out = Vec::with_capacity(blocks.len());
        let mut blocks = blocks.into_iter().peekable();
        let mut next = || {
            blocks.peek().is_some().then(|| {
                let batch: Vec<_> = blocks.by_ref().take(WRITE_BATCH_BLOCKS).collect();
                self.start_writes(batch)
            })
        };
        let (mut current, mut ahead) = (next(), next());
        let mut renamed: Option<Renamed> = None;
        while let Some(w) = current {
            let (synced, done) = self.sync(w, renamed.take());
            out.extend(done);
            let after = next();
            renamed = Some(self.rename(synced));
            (current, ahead) = (ahead, after);
        }
        if let Some(r) = renamed {
            out.extend(self.publish(r, None));
        }
        out
    }

    /// Opens each block's temporary file and hands its writes to the
    /// engine; a block refused here carries its error.
    pub(super) fn start_writes(&self, blocks: Vec<(BlockId, Vec<IoBuf>)>) -> Writing {
        let g = self.cfg.geometry;
        let mut pending: Vec<Pending> = Vec::with_capacity(blocks.len());
        // One vectored write per block (header, then its shards in order):
        // a block costs one operation however many shards it has.
        let mut writes: Vec<(IoTicket, usize)> = Vec::new();
        for (id, shards) in blocks {
            let mut p = Pending {
                id,
                tmp: None,
                file: None,
                err: None,
            };
            if shards.len() != g.shards_per_block as usize
                || shards.iter().any(|s| s.len() != g.shard_bytes)
            {
                p.err = Some(StoreError::Config(ConfigError::BlockShape {
                    shards: g.shards_per_block,
                    shard_bytes: g.shard_bytes,
                }));
                pending.push(p);
                continue;
            }
            match self.create_tmp(&id) {
                Err(e) => p.err = Some(e),
                Ok((f, tmp)) => {
                    p.tmp = tmp;
                    let f = Arc::new(f);
                    let mut bufs = Vec::with_capacity(1 + shards.len());
                    bufs.push(self.header(&id, &shards));
                    bufs.extend(shards);
                    // Submitted at once: the disk starts on this block
                    // while the next ones are opened and checksummed.
                    let reqs = IoRequest::writes_vectored(&f, 0, bufs);
                    let i = pending.len();
                    writes.extend(self.engine.submit(reqs).into_iter().map(|t| (t, i)));
                    p.file = Some(f);
                }
            }
            pending.push(p);
        }
        Writing { pending, writes }
    }

    /// Creates block `id`'s temporary file in `tmp/`: unnamed where the
    /// file system can (nothing to clean up after a crash, and one link
    /// instead of a create and a rename), else named with the writer's
    /// identity. Returns the file and, when named, its path.
    pub(super) fn create_tmp(&self, id: &BlockId) -> Result<(IoFile, Option<PathBuf>)> {
        let dir = self.cfg.dir.join("tmp");
        if self.unnamed.load(Ordering::Relaxed) {
            match IoFile::create_unnamed(&dir, true) {
                Ok(f) => return Ok((f, None)),
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::EOPNOTSUPP | libc::EISDIR | libc::EINVAL)
                    ) =>
                {
                    if self.unnamed.swap(false, Ordering::Relaxed) {
                        log::info!(
                            "disk tier {}: unnamed temporary files refused ({e}); \
                             writing named ones",
                            self.cfg.dir.display()
                        );
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
        // The writer's identity is in the name: another process opening
        // this store removes it only once this writer is dead.
        let tmp = paths::tmp_path(&dir, &hex(id));
        let opts = OpenOptions {
            write: true,
            create: true,
            truncate: true,
            direct: true,
        };
        let f = IoFile::open(&tmp, opts)?;
        Ok((f, Some(tmp)))
    }

    /// Gives a synced block file its name in `blocks/`: a link of an
    /// unnamed file, a rename of a named one. A link never replaces a file;
    /// where one is there already (a rewrite), the file is linked to a
    /// fresh name in `tmp/` and renamed over it, which replaces it
    /// atomically as a rename does.
    pub(super) fn place(&self, p: &mut Pending, dst: &Path) -> Result<()> {
        let file = match (&p.tmp, &p.file) {
            (Some(tmp), _) => {
                return iofs::rename(tmp, dst).map_err(StoreError::fs("rename", dst));
            }
            (None, Some(f)) => f,
            (None, None) => {
                return Err(StoreError::fs("link", dst)(std::io::Error::other(
                    "the unnamed file was closed before it was named",
                )))
            }
        };
        match file.link_as(dst) {
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                let tmp = paths::tmp_path(&self.cfg.dir.join("tmp"), &hex(&p.id));
                file.link_as(&tmp)?;
                p.tmp = Some(tmp.clone());
                iofs::rename(&tmp, dst).map_err(StoreError::fs("rename", dst))
            }
            r => r.map_err(Into::into),
        }
    }

    /// Waits for a batch's writes and fsyncs its files (closing them). The
    /// batch before it (`before`, renamed) has its directories fsynced
    /// while these fsyncs are in flight, and its results are returned.
    pub(super) fn sync(
        &self,
        w: Writing,
        before: Option<Renamed>,
    ) -> (Vec<Pending>, Vec<(BlockId, Result<()>)>) {
        let Writing {
            mut pending,
            writes,
        } = w;
        // Every write must succeed; the first error of a block wins.
        for (t, i) in writes {
            if let Err(e) = t.wait_blocking().result {
                pending[i].err.get_or_insert(e.into());
            }
        }
        let done = match &self.fs_sync {
            Some(dir) => self.sync_by_fs(dir, &mut pending, before),
            None => self.sync_by_files(&mut pending, before),
        };
        // Named files are closed; unnamed ones stay open until linked.
        for p in pending.iter_mut().filter(|p| p.tmp.is_some()) {
            p.file = None;
        }
        (pending, done)
    }

    /// One syncfs: this batch's files, and the names the batch before was
    /// given (linked before this call), are durable once it returns; then
    /// the batch before is reported.
    pub(super) fn sync_by_fs(
        &self,
        dir: &IoDir,
        pending: &mut [Pending],
        before: Option<Renamed>,
    ) -> Vec<(BlockId, Result<()>)> {
        let wanted = pending.iter().any(|p| p.err.is_none())
            || before
                .as_ref()
                .is_some_and(|r| r.pending.iter().any(|p| p.err.is_none()));
        let synced = if wanted { self.sync_fs(dir) } else { Ok(()) };
        if let Err(errno) = synced {
            fail_unsynced(pending, dir, errno);
        }
        before
            .map(|r| self.publish(r, Some(synced)))
            .unwrap_or_default()
    }

    /// An fsync of each of this batch's files, with the batch before's
    /// directory fsyncs (and its report) while they are in flight.
    pub(super) fn sync_by_files(
        &self,
        pending: &mut [Pending],
        before: Option<Renamed>,
    ) -> Vec<(BlockId, Result<()>)> {
        let syncs: Vec<(usize, IoRequest)> = pending
            .iter()
            .enumerate()
            .filter(|(_, p)| p.err.is_none())
            .filter_map(|(i, p)| {
                p.file
                    .as_ref()
                    .map(|f| (i, IoRequest::fsync(Arc::clone(f))))
            })
            .collect();
        let (idx, reqs): (Vec<usize>, Vec<IoRequest>) = syncs.into_iter().unzip();
        let tickets = self.engine.submit(reqs);
        let done = before.map(|r| self.publish(r, None)).unwrap_or_default();
        for (t, i) in tickets.into_iter().zip(idx) {
            if let Err(e) = t.wait_blocking().result {
                pending[i].err.get_or_insert(e.into());
            }
        }
        done
    }

    /// One `syncfs` through `dir`, counted: `Err(errno)` when it failed
    /// (EIO where the error carries none).
    pub(super) fn sync_fs(&self, dir: &IoDir) -> std::result::Result<(), i32> {
        self.stats.fs_syncs.fetch_add(1, Ordering::Relaxed);
        dir.sync_filesystem()
            .map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))
    }

    /// Names a synced batch's files in `blocks/` (making the fan-out
    /// directories they need); their directories are not yet fsynced.
    pub(super) fn rename(&self, mut pending: Vec<Pending>) -> Renamed {
        let mut dirs: Vec<PathBuf> = Vec::new();
        for p in pending.iter_mut().filter(|p| p.err.is_none()) {
            let dst = self.path_of(&p.id);
            let parent = dst.parent().unwrap_or(&self.cfg.dir).to_path_buf();
            let moved = self
                .fanout(&parent, &mut dirs)
                .and_then(|_| self.place(p, &dst));
            // Closing an unnamed file that was not linked frees it.
            p.file = None;
            match moved {
                Ok(()) => add_dir(&mut dirs, &parent),
                Err(e) => p.err = Some(e),
            }
        }
        Renamed { pending, dirs }
    }

    /// Makes a renamed batch's names durable (one fsync per directory it
    /// touched, or a `syncfs`) and reports each block: written, or failed
    /// with its error (its temporary file removed). `covered`: the outcome of a `syncfs` made after the batch's names
    /// were given (by the next batch's [`DiskTier::sync`]), which stands
    /// for its directories' fsyncs; `None`: this call makes them durable
    /// itself (a `syncfs`, or an fsync per directory).
    pub(super) fn publish(
        &self,
        r: Renamed,
        covered: Option<std::result::Result<(), i32>>,
    ) -> Vec<(BlockId, Result<()>)> {
        let Renamed { mut pending, dirs } = r;
        let synced = match (covered, &self.fs_sync) {
            (Some(synced), _) => Some(synced),
            (None, Some(dir)) if pending.iter().any(|p| p.err.is_none()) => Some(self.sync_fs(dir)),
            (None, Some(_)) => Some(Ok(())),
            (None, None) => None,
        };
        if let (Some(Err(errno)), Some(dir)) = (synced, &self.fs_sync) {
            fail_unsynced(&mut pending, dir, errno);
        }
        for d in dirs.iter().filter(|_| synced.is_none()) {
            if let Err(e) = paths::sync_dir(d) {
                // The files are complete and valid; their durability is not
                // (a directory above theirs holds a new fan-out entry).
                for p in pending.iter_mut().filter(|p| p.err.is_none()) {
                    if self.path_of(&p.id).starts_with(d) {
                        p.err = Some(StoreError::fs("fsync directory", d)(std::io::Error::new(
                            e.kind(),
                            e.to_string(),
                        )));
                    }
                }
            }
        }
        let written: Vec<BlockId> = pending
            .iter()
            .filter(|p| p.err.is_none())
            .map(|p| p.id)
            .collect();
        let n = written.len() as u64;
        self.remember(written);
        self.after_writes(n);
        pending
            .into_iter()
            .map(|p| {
                let r = match p.err {
                    None => {
                        self.stats.blocks_written.fetch_add(1, Ordering::Relaxed);
                        Ok(())
                    }
                    Some(e) => {
                        if let Some(tmp) = &p.tmp {
                            let _ = iofs::remove_file(tmp);
                        }
                        self.stats.write_failures.fetch_add(1, Ordering::Relaxed);
                        let _ = crate::failure::warn_limited(
                            &format!("block {} not written", hex(&p.id)),
                            &crate::failure::Failure::from_store(&e, "disk write"),
                        );
                        Err(e)
                    }
                };
                (p.id, r)
            })
            .collect()
    }
}
