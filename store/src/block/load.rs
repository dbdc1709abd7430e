//! The BlockStore's load path: pool hits copied to the device, misses
//! filled from the disk or remote tiers into the pool by one owner, and
//! prefetches.

use super::*;

impl<D: Device> Inner<D> {
    /// Every shard of `id` in the pool.
    pub(super) fn in_pool(&self, id: &BlockId) -> bool {
        (0..self.geo.shards_per_block).all(|s| self.pool.contains(&(*id, s)))
    }

    /// Queues `runs` on `stream` as one batch and waits for them.
    pub(super) fn copy_and_wait(
        &self,
        stream: &D::Stream,
        runs: &[CopyRun<'_>],
    ) -> ucm_device::Result<()> {
        self.dev.copy_batch_sync(stream, runs)
    }

    pub(super) fn fail_item(&self, why: Failure) -> ItemOutcome {
        self.stats.failed_items.fetch_add(1, Ordering::Relaxed);
        ItemOutcome::Failed(why)
    }

    /// Items ordered by shard, shards in this rank's rotation.
    pub(super) fn by_shard(&self, items: Vec<TaskItem>) -> Vec<(u32, Vec<TaskItem>)> {
        let mut groups: HashMap<u32, Vec<TaskItem>> = HashMap::new();
        for it in items {
            groups.entry(it.shard).or_default().push(it);
        }
        rank_order(
            self.cfg.device_id,
            self.cfg.ranks,
            self.geo.shards_per_block as usize,
        )
        .into_iter()
        .filter_map(|s| groups.remove(&(s as u32)).map(|v| (s as u32, v)))
        .collect()
    }

    /// Reads shard `shard` of each block of `loads` from disk, in batches,
    /// straight into the slots being loaded, and publishes each slot: filled
    /// (kept pinned for the caller), a miss, or failed (its waiters see the
    /// errno). Counts disk reads and misses.
    pub(super) fn fill_from_disk<'p>(
        &'p self,
        session: &mut ReadSession,
        shard: u32,
        mut loads: Vec<(usize, BlockId, LoadGuard<'p>)>,
    ) -> Vec<(usize, Filled<'p>)> {
        let mut reads = Vec::with_capacity(loads.len());
        for chunk in loads.chunks_mut(IO_BATCH_BLOCKS) {
            let reqs = chunk
                .iter_mut()
                .map(|(_, block, g)| (*block, vec![(shard, g.io_buf())]))
                .collect();
            match &self.disk {
                Some(d) => reads.extend(d.read_many_in(session, reqs)),
                None => reads.extend(chunk.iter().map(|_| Ok(None))),
            }
        }
        // The disk's misses, from the tiers below in turn, one batch each.
        let mut remote: Vec<Option<RemoteRead>> = (0..loads.len()).map(|_| None).collect();
        for r in &self.remotes {
            let idx: Vec<usize> = (0..loads.len())
                .filter(|&i| {
                    matches!(reads[i], Ok(None)) && !matches!(remote[i], Some(Ok(Some(_))))
                })
                .collect();
            if idx.is_empty() {
                break;
            }
            let asked: Vec<(BlockId, Vec<u32>)> =
                idx.iter().map(|&i| (loads[i].1, vec![shard])).collect();
            for (i, got) in idx.into_iter().zip(r.read_many(&asked)) {
                // An upper tier's failure is kept unless a lower one has it.
                if !(matches!(remote[i], Some(Err(_))) && matches!(got, Ok(None))) {
                    remote[i] = Some(got);
                }
            }
        }
        let mut out = Vec::with_capacity(loads.len());
        for (((i, _, mut g), read), from_remote) in loads.into_iter().zip(reads).zip(remote) {
            let f = match read {
                Ok(Some(bufs)) => {
                    self.stats.disk_reads.fetch_add(1, Ordering::Relaxed);
                    // Read in place; a buffer elsewhere is copied in.
                    if let Some(b) = bufs.first().filter(|b| b.as_ptr() != g.data_mut().as_ptr()) {
                        g.data_mut().copy_from_slice(b.as_slice());
                    }
                    Filled::Slot(g.complete())
                }
                Ok(None) => match from_remote {
                    Some(Ok(Some(mut v))) if v.len() == 1 => {
                        self.stats.remote_reads.fetch_add(1, Ordering::Relaxed);
                        g.data_mut().copy_from_slice(&v.remove(0));
                        Filled::Slot(g.complete())
                    }
                    other => {
                        if let Some(Err(e)) = other {
                            // The remote tier could not answer: a miss for
                            // the engine (it recomputes), counted there.
                            log::debug!("remote read: {e}");
                        }
                        g.fail(libc::ENOENT);
                        self.stats.misses.fetch_add(1, Ordering::Relaxed);
                        Filled::Miss
                    }
                },
                Err(e) => {
                    g.fail(libc::EIO);
                    Filled::Failed(e)
                }
            };
            out.push((i, f));
        }
        out
    }

    /// Brings every shard of `ids` that only the disk holds into the pool,
    /// without a device copy. Shards already in the pool are touched; a
    /// shard another thread is loading, a full bucket, a miss or a failed
    /// read is skipped (a prefetch is a hint: the load that follows reads
    /// or reports it).
    pub(super) fn run_prefetch(&self, ids: &[BlockId]) {
        let mut session = ReadSession::default();
        for shard in 0..self.geo.shards_per_block {
            let mut loads = Vec::new();
            for (i, id) in ids.iter().enumerate() {
                if let Ok(Some(Acquire::Load(g))) = self.pool.acquire((*id, shard)) {
                    loads.push((i, *id, g));
                }
            }
            drop(self.fill_from_disk(&mut session, shard, loads));
        }
    }

    pub(super) fn run_load(
        &self,
        stream: &D::Stream,
        groups: &[(u32, Vec<TaskItem>)],
        t: &Part<'_>,
    ) {
        let shard_bytes = self.geo.shard_bytes;
        // Each file is opened and its header read once per task part.
        let mut session = ReadSession::default();
        for &(shard, ref group) in groups {
            let mut pins: Vec<SlotRef<'_>> = Vec::new();
            let mut outcomes: Vec<(BlockId, ItemOutcome)> = Vec::new();
            let mut runs: Vec<(usize, usize)> = Vec::new(); // (item index, slot)
                                                            // Pins for hits; load guards for the shards this rank reads.
            let mut loads = Vec::new();
            for (i, it) in group.iter().enumerate() {
                let key = (it.block, shard);
                let outcome = match self.pool.acquire(key) {
                    Ok(Some(Acquire::Hit(r))) => {
                        self.stats.pool_hits.fetch_add(1, Ordering::Relaxed);
                        runs.push((i, r.slot()));
                        pins.push(r);
                        ItemOutcome::Ok
                    }
                    Ok(Some(Acquire::Load(g))) => {
                        loads.push((i, g));
                        ItemOutcome::Ok
                    }
                    Ok(Some(Acquire::Failed(code))) => {
                        if code == libc::ENOENT {
                            self.stats.misses.fetch_add(1, Ordering::Relaxed);
                            ItemOutcome::Miss
                        } else {
                            self.fail_item(Failure {
                                kind: FailureKind::OtherRank,
                                errno: Some(code),
                                detail: format!("load by another rank failed (errno {code})"),
                            })
                        }
                    }
                    Ok(None) => self.fail_item(Failure::new(
                        FailureKind::PoolFull,
                        "pool bucket full of pinned slots",
                    )),
                    Err(e) => self.fail_item(Failure::from_store(&e, "pool")),
                };
                outcomes.push((it.block, outcome));
            }
            // Every missing shard of this group from disk, read straight
            // into the slots being loaded.
            let filled = self.fill_from_disk(
                &mut session,
                shard,
                loads
                    .into_iter()
                    .map(|(i, g)| (i, group[i].block, g))
                    .collect(),
            );
            for (i, f) in filled {
                outcomes[i].1 = match f {
                    Filled::Slot(r) => {
                        runs.push((i, r.slot()));
                        pins.push(r);
                        ItemOutcome::Ok
                    }
                    Filled::Miss => ItemOutcome::Miss,
                    Filled::Failed(e) => self.fail_item(Failure::from_store(&e, "disk read")),
                };
            }
            let copy: Vec<CopyRun<'_>> = runs
                .iter()
                .map(|&(i, slot)| {
                    CopyRun::new(
                        &group[i].memory,
                        group[i].offset,
                        &self.pool_mem,
                        self.pool.data_at(slot),
                        shard_bytes,
                    )
                })
                .collect();
            let copied = self.copy_and_wait(stream, &copy);
            drop(pins);
            if let Err(e) = copied {
                for &(i, _) in &runs {
                    outcomes[i].1 = self.fail_item(Failure::from_device(&e, "H2D copy"));
                }
            }
            t.shard(shard, outcomes);
        }
        t.done();
    }
}
