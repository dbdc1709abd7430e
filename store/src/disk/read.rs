//! The disk tier's read path: presence (the file system, remembered),
//! reads of a block's shards checked against its header, and the sessions
//! that keep files open across one task's reads.

use super::*;

/// One block's reads as they completed: (bytes, buffer), header first.
pub(super) type Parts = Vec<(usize, Option<IoBuf>)>;

/// Block `id`'s file name relative to `blocks/` (`ab/cd/<hex>.blk`),
/// NUL-terminated, built on the stack.
pub(super) fn rel_name(id: &BlockId) -> [u8; 43] {
    let hex = hex_digits(id);
    let mut n = [0u8; 43];
    n[0..2].copy_from_slice(&hex[0..2]);
    n[2] = b'/';
    n[3..5].copy_from_slice(&hex[2..4]);
    n[5] = b'/';
    n[6..38].copy_from_slice(&hex);
    n[38..42].copy_from_slice(b".blk");
    n
}

/// Open files and verified headers kept across the reads of one task (see
/// [`DiskTier::read_many_in`]). Bounded; dropping it closes the files.
#[derive(Default)]
pub struct ReadSession {
    files: HashMap<BlockId, (Arc<IoFile>, Arc<Vec<u32>>)>,
    order: std::collections::VecDeque<BlockId>,
}

/// Files a [`ReadSession`] keeps open at most.
pub(super) const SESSION_FILES: usize = 256;

impl ReadSession {
    pub(super) fn remember(&mut self, id: BlockId, f: Arc<IoFile>, crcs: Arc<Vec<u32>>) {
        if self.files.insert(id, (f, crcs)).is_none() {
            self.order.push_back(id);
            while self.order.len() > SESSION_FILES {
                if let Some(old) = self.order.pop_front() {
                    self.files.remove(&old);
                }
            }
        }
    }
}

/// One request of a read batch.
struct Asked {
    id: BlockId,
    shards: Vec<u32>,
    /// The checksums of its header, once verified (before the batch, or
    /// when the batch arrives).
    crcs: Option<Arc<Vec<u32>>>,
    /// The file opened for this batch, whose header is read with it.
    opened: Option<Arc<IoFile>>,
}

/// Reads handed to the engine by [`DiskTier::submit_reads`], not yet
/// waited for. Dropping it waits for them: the engine never writes into a
/// buffer its owner has given back.
pub struct SubmittedReads {
    /// Each read's ticket and the request it belongs to.
    tickets: Vec<(IoTicket, usize)>,
    /// Per request: its outcome when known without reading (a bad shard or
    /// buffer, an absent file, a file that would not open).
    early: Vec<Option<Result<Option<Vec<IoBuf>>>>>,
    /// Per request: what it asks.
    lists: Vec<Asked>,
}

impl Drop for SubmittedReads {
    fn drop(&mut self) {
        for (t, _) in self.tickets.drain(..) {
            drop(t.wait_blocking());
        }
    }
}

/// Reads of one batch that completed, their headers checked, their shards
/// not yet (see [`DiskTier::check_reads`]).
pub struct ArrivedReads {
    early: Vec<Option<Result<Option<Vec<IoBuf>>>>>,
    lists: Vec<Asked>,
    got: Vec<Result<Parts>>,
}

impl DiskTier {
    pub(super) fn is_known(&self, id: &BlockId) -> bool {
        self.known
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .contains(id)
    }

    /// `blocks/`, opened for lookups by relative name (`None` when it is
    /// missing or not a directory: then nothing is present). Opened per
    /// batch, so a directory removed and made again is never a stale
    /// handle.
    pub(super) fn blocks_dir(&self) -> Option<IoDir> {
        IoDir::open(self.cfg.dir.join("blocks")).ok()
    }

    /// Presence of `id` beneath `blocks`: a regular file (its last
    /// component not a link) of the full block length.
    pub(super) fn stat_in(&self, blocks: &IoDir, id: &BlockId) -> bool {
        let name = rel_name(id);
        CStr::from_bytes_with_nul(&name)
            .ok()
            .and_then(|n| blocks.stat(n))
            .is_some_and(|e| e.regular && e.len == self.file_bytes())
    }

    pub(super) fn remember(&self, ids: impl IntoIterator<Item = BlockId>) {
        let mut k = self.known.write().unwrap_or_else(|e| e.into_inner());
        // Bounded: past twice the capacity the summary starts over.
        if k.len() as u64 > self.cfg.high_watermark.saturating_mul(2) {
            k.clear();
        }
        k.extend(ids);
    }

    pub(super) fn forget(&self, id: &BlockId) {
        self.known
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(id);
    }

    pub(super) fn forget_all(&self) {
        self.known
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }

    /// Presence of each id: known ids at once, the others asked of the
    /// file system (on two threads for a large batch).
    pub fn lookup(&self, ids: &[BlockId]) -> Vec<bool> {
        let mut out: Vec<bool> = {
            let k = self.known.read().unwrap_or_else(|e| e.into_inner());
            ids.iter().map(|id| k.contains(id)).collect()
        };
        let unknown: Vec<usize> = (0..ids.len()).filter(|&i| !out[i]).collect();
        if unknown.is_empty() {
            return out;
        }
        let Some(blocks) = self.blocks_dir() else {
            return out;
        };
        let stat_all = |part: &[usize]| -> Vec<(usize, bool)> {
            part.iter()
                .map(|&i| (i, self.stat_in(&blocks, &ids[i])))
                .collect()
        };
        let found: Vec<(usize, bool)> = if unknown.len() < PARALLEL_LOOKUP {
            stat_all(&unknown)
        } else {
            let (a, b) = unknown.split_at(unknown.len() / 2);
            std::thread::scope(|s| {
                let other = s.spawn(|| stat_all(b));
                let mut mine = stat_all(a);
                mine.extend(other.join().unwrap_or_default());
                mine
            })
        };
        // One write for every id found.
        self.remember(found.iter().filter(|(_, h)| *h).map(|&(i, _)| ids[i]));
        for (i, here) in found {
            out[i] = here;
        }
        out
    }

    /// Number of leading ids present (stops at the first miss).
    pub fn lookup_on_prefix(&self, ids: &[BlockId]) -> usize {
        let mut blocks = None;
        let mut n = 0;
        for id in ids {
            let here = self.is_known(id)
                || blocks
                    .get_or_insert_with(|| self.blocks_dir())
                    .as_ref()
                    .is_some_and(|d| self.stat_in(d, id));
            if !here {
                break;
            }
            n += 1;
        }
        // What the file system was asked and found is remembered (one
        // write).
        if n > 0 && blocks.is_some() {
            self.remember(ids[..n].iter().copied());
        }
        n
    }

    /// Parses and checks a header; returns the shard checksums.
    pub(super) fn parse_header(&self, id: &BlockId, b: &[u8]) -> Option<Vec<u32>> {
        header::parse_header(self.cfg.geometry, id, b)
    }

    /// Reads `shards` of block `id`. `Ok(None)` is a miss: the block is
    /// absent, or a checksum failed (then its file is removed). An I/O
    /// error is an error: the caller reports the block as failed.
    pub fn read_shards(&self, id: &BlockId, shards: &[u32]) -> Result<Option<Vec<IoBuf>>> {
        let sb = self.cfg.geometry.shard_bytes;
        let bufs = shards.iter().map(|&s| (s, IoBuf::new(sb))).collect();
        let mut r = self.read_many(vec![(*id, bufs)]);
        r.pop().unwrap_or(Ok(None))
    }

    /// Reads the given shards of many blocks in one engine batch, into the
    /// buffers given with them (of one shard each; e.g. pool slots); one
    /// outcome per request, as [`DiskTier::read_shards`].
    pub fn read_many(
        &self,
        reqs: Vec<(BlockId, Vec<(u32, IoBuf)>)>,
    ) -> Vec<Result<Option<Vec<IoBuf>>>> {
        self.read_many_in(&mut ReadSession::default(), reqs)
    }

    /// As [`DiskTier::read_many`], reusing the open files and verified
    /// headers that `session` remembers from earlier calls (a task that
    /// reads one shard index at a time opens each file and reads its header
    /// once). A remembered file stays readable even if GC unlinks it
    /// meanwhile, and its bytes are the block's: blocks are content-addressed.
    pub fn read_many_in(
        &self,
        session: &mut ReadSession,
        reqs: Vec<(BlockId, Vec<(u32, IoBuf)>)>,
    ) -> Vec<Result<Option<Vec<IoBuf>>>> {
        let submitted = self.submit_reads(session, reqs);
        let arrived = self.arrive_reads(session, submitted);
        self.check_reads(session, arrived)
    }

    /// The first step of [`DiskTier::read_many_in`]: opens the files the
    /// session does not hold and hands every read (and the headers not yet
    /// verified) to the engine, without waiting. The buffers are the
    /// engine's until [`DiskTier::arrive_reads`] returns (dropping the batch
    /// waits for them too).
    pub fn submit_reads(
        &self,
        session: &mut ReadSession,
        reqs: Vec<(BlockId, Vec<(u32, IoBuf)>)>,
    ) -> SubmittedReads {
        let sb = self.cfg.geometry.shard_bytes;
        let mut early = Vec::with_capacity(reqs.len());
        let mut ios = Vec::new();
        let mut owner = Vec::new();
        let mut lists = Vec::with_capacity(reqs.len());
        for (i, (id, shards)) in reqs.into_iter().enumerate() {
            let known = session.files.get(&id).cloned();
            lists.push(Asked {
                id,
                shards: shards.iter().map(|(s, _)| *s).collect(),
                crcs: known.as_ref().map(|(_, c)| Arc::clone(c)),
                opened: None,
            });
            let bad = shards.iter().find_map(|(s, b)| {
                self.cfg.geometry.check_shard(*s).err().or_else(|| {
                    (b.len() != sb).then(|| {
                        StoreError::Config(ConfigError::BufferSize {
                            what: "a shard buffer",
                            len: b.len(),
                            needed: sb,
                        })
                    })
                })
            });
            if let Some(bad) = bad {
                early.push(Some(Err(bad)));
                continue;
            }
            let f = match known {
                Some((f, _)) => f,
                None => {
                    let path = self.path_of(&id);
                    match IoFile::open(&path, OpenOptions::read_only()) {
                        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                            self.forget(&id);
                            early.push(Some(Ok(None)));
                            continue;
                        }
                        Err(e) => {
                            early.push(Some(Err(e.into())));
                            continue;
                        }
                        Ok(f) => {
                            let f = Arc::new(f);
                            ios.push(IoRequest::read(
                                Arc::clone(&f),
                                0,
                                IoBuf::new(self.header_bytes),
                            ));
                            owner.push(i);
                            lists[i].opened = Some(Arc::clone(&f));
                            f
                        }
                    }
                }
            };
            for (s, buf) in shards {
                ios.push(IoRequest::read(
                    Arc::clone(&f),
                    self.header_bytes as u64 + u64::from(s) * sb as u64,
                    buf,
                ));
                owner.push(i);
            }
            early.push(None);
        }
        let tickets = self.engine.submit(ios).into_iter().zip(owner).collect();
        SubmittedReads {
            tickets,
            early,
            lists,
        }
    }

    /// The second step: waits for every read of `batch`, and checks the
    /// headers read with it; a good header is remembered by `session` at
    /// once, so a batch submitted next reads no header again.
    pub fn arrive_reads(
        &self,
        session: &mut ReadSession,
        mut batch: SubmittedReads,
    ) -> ArrivedReads {
        // Outcomes per request: (bytes, buffer) in submission order, or the error.
        let mut got: Vec<Result<Parts>> = (0..batch.lists.len()).map(|_| Ok(Vec::new())).collect();
        for (t, i) in std::mem::take(&mut batch.tickets) {
            let o = t.wait_blocking();
            if let Ok(v) = &mut got[i] {
                match o.result {
                    Ok(n) => v.push((n, o.buf)),
                    Err(e) => got[i] = Err(e.into()),
                }
            }
        }
        let mut lists = std::mem::take(&mut batch.lists);
        let early = std::mem::take(&mut batch.early);
        for (a, parts) in lists.iter_mut().zip(got.iter_mut()) {
            // A header read with this batch is the request's first part.
            let (Some(f), Ok(parts)) = (&a.opened, parts) else {
                continue;
            };
            if parts.is_empty() {
                continue;
            }
            let (n, b) = parts.remove(0);
            let c = b.and_then(|b| {
                (n == self.header_bytes).then(|| self.parse_header(&a.id, b.as_slice()))?
            });
            if let Some(c) = c {
                let c = Arc::new(c);
                session.remember(a.id, Arc::clone(f), Arc::clone(&c));
                a.crcs = Some(c);
            }
        }
        ArrivedReads { early, lists, got }
    }

    /// The last step: each request's shards checked against its header's
    /// checksums; one outcome per request, as [`DiskTier::read_shards`]. A
    /// block that failed is forgotten by `session`.
    pub fn check_reads(
        &self,
        session: &mut ReadSession,
        arrived: ArrivedReads,
    ) -> Vec<Result<Option<Vec<IoBuf>>>> {
        arrived
            .early
            .into_iter()
            .zip(arrived.got)
            .zip(arrived.lists)
            .map(|((done, got), a)| match done {
                Some(r) => r,
                None => {
                    let r = got.and_then(|parts| {
                        self.verify(
                            &a.id,
                            &a.shards,
                            a.crcs.as_deref().map(Vec::as_slice),
                            parts,
                        )
                    });
                    if !matches!(r, Ok(Some(_))) {
                        session.files.remove(&a.id);
                    }
                    r
                }
            })
            .collect()
    }

    /// Checks one block's shards as read against its header's checksums
    /// (`None`: the header failed its own check).
    pub(super) fn verify(
        &self,
        id: &BlockId,
        shards: &[u32],
        crcs: Option<&[u32]>,
        parts: Parts,
    ) -> Result<Option<Vec<IoBuf>>> {
        let sb = self.cfg.geometry.shard_bytes;
        let path = self.path_of(id);
        let Some(crcs) = crcs else {
            return self.corrupt(id, &path, "header");
        };
        let mut bufs = Vec::with_capacity(shards.len());
        for (&s, (n, b)) in shards.iter().zip(parts) {
            let Some(b) = b else {
                return self.corrupt(id, &path, "missing buffer");
            };
            if n != sb || crc32c::crc32c(b.as_slice()) != crcs[s as usize] {
                return self.corrupt(id, &path, "shard checksum");
            }
            bufs.push(b);
        }
        Ok(Some(bufs))
    }

    pub(super) fn corrupt(
        &self,
        id: &BlockId,
        path: &Path,
        what: &str,
    ) -> Result<Option<Vec<IoBuf>>> {
        self.forget(id);
        self.stats.corrupt_shards.fetch_add(1, Ordering::Relaxed);
        log::warn!(
            "block {} failed its {what} check: treated as a miss and removed",
            hex(id)
        );
        let _ = iofs::remove_file(path);
        Ok(None)
    }
}
