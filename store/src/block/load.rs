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
        loads: Vec<(usize, BlockId, LoadGuard<'p>)>,
    ) -> Vec<(usize, Filled<'p>)> {
        let mut out = Vec::with_capacity(loads.len());
        let mut loads = loads.into_iter().peekable();
        while loads.peek().is_some() {
            let chunk = loads.by_ref().take(IO_BATCH_BLOCKS).collect();
            let filling = self.start_fill(session, shard, chunk);
            let arrived = self.arrive_fill(session, filling);
            out.extend(self.finish_fill(session, arrived));
        }
        out
    }

    /// Hands the disk reads of `loads` (at most [`IO_BATCH_BLOCKS`]) to the
    /// engine without waiting.
    fn start_fill<'p>(
        &'p self,
        session: &mut ReadSession,
        shard: u32,
        mut loads: Vec<(usize, BlockId, LoadGuard<'p>)>,
    ) -> Filling<'p> {
        let reads = match &self.disk {
            Some(d) if !loads.is_empty() => {
                let reqs = loads
                    .iter_mut()
                    .map(|(_, block, g)| (*block, vec![(shard, g.io_buf())]))
                    .collect();
                Some(d.submit_reads(session, reqs))
            }
            _ => None,
        };
        Filling {
            reads,
            shard,
            loads,
        }
    }

    /// Waits for the reads of `f` (their headers checked and remembered).
    fn arrive_fill<'p>(&self, session: &mut ReadSession, f: Filling<'p>) -> Arrived<'p> {
        let Filling {
            reads,
            shard,
            loads,
        } = f;
        let reads = match (&self.disk, reads) {
            (Some(d), Some(r)) => Some(d.arrive_reads(session, r)),
            _ => None,
        };
        Arrived {
            reads,
            shard,
            loads,
        }
    }

    /// Checks the reads of `a`, asks the tiers below for the disk's misses,
    /// and publishes each slot.
    fn finish_fill<'p>(
        &'p self,
        session: &mut ReadSession,
        a: Arrived<'p>,
    ) -> Vec<(usize, Filled<'p>)> {
        let Arrived {
            reads,
            shard,
            loads,
        } = a;
        let reads: Vec<Result<Option<Vec<IoBuf>>>> = match (&self.disk, reads) {
            (Some(d), Some(r)) => d.check_reads(session, r),
            _ => loads.iter().map(|_| Ok(None)).collect(),
        };
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

    /// Loads the task part's groups (one shard index each) in order, in
    /// units of at most [`IO_BATCH_BLOCKS`] items: the next unit's disk
    /// reads are handed to the engine before this unit's shards are
    /// checked, published and copied to the device, so the disk works
    /// while the CPU checks and copies.
    pub(super) fn run_load(
        &self,
        stream: &D::Stream,
        groups: &[(u32, Vec<TaskItem>)],
        t: &Part<'_>,
    ) {
        // Each file is opened and its header read once per task part.
        let mut session = ReadSession::default();
        let units: Vec<(usize, std::ops::Range<usize>)> = groups
            .iter()
            .enumerate()
            .flat_map(|(g, (_, items))| {
                (0..items.len())
                    .step_by(IO_BATCH_BLOCKS)
                    .map(move |a| (g, a..items.len().min(a + IO_BATCH_BLOCKS)))
            })
            .collect();
        let mut outcomes: Vec<(BlockId, ItemOutcome)> = Vec::new();
        let mut next = units
            .first()
            .map(|(g, r)| self.start_unit(&mut session, &groups[*g], r.clone()));
        for (u, (g, _)) in units.iter().enumerate() {
            let Some(cur) = next.take() else { break };
            let cur = self.arrive_unit(&mut session, cur);
            next = units
                .get(u + 1)
                .map(|(g, r)| self.start_unit(&mut session, &groups[*g], r.clone()));
            let (shard, group) = (groups[*g].0, &groups[*g].1);
            outcomes.extend(self.finish_unit(stream, &mut session, group, cur));
            if units.get(u + 1).is_none_or(|(h, _)| h != g) {
                t.shard(shard, std::mem::take(&mut outcomes));
            }
        }
        t.done();
    }

    /// Pins the unit's shards the pool holds, takes the load of the others
    /// and hands their disk reads to the engine.
    fn start_unit<'p>(
        &'p self,
        session: &mut ReadSession,
        (shard, group): &(u32, Vec<TaskItem>),
        range: std::ops::Range<usize>,
    ) -> Unit<'p, Filling<'p>> {
        let first = range.start;
        let (mut pins, mut runs, mut outcomes, mut loads) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for i in range {
            let it = &group[i];
            let outcome = match self.pool.acquire((it.block, *shard)) {
                Ok(Some(Acquire::Hit(r))) => {
                    self.stats.pool_hits.fetch_add(1, Ordering::Relaxed);
                    runs.push((i, r.slot()));
                    pins.push(r);
                    ItemOutcome::Ok
                }
                Ok(Some(Acquire::Load(g))) => {
                    loads.push((i, it.block, g));
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
        Unit {
            // Every missing shard of this unit from disk, read straight
            // into the slots being loaded.
            fill: self.start_fill(session, *shard, loads),
            first,
            pins,
            runs,
            outcomes,
        }
    }

    fn arrive_unit<'p>(
        &'p self,
        session: &mut ReadSession,
        u: Unit<'p, Filling<'p>>,
    ) -> Unit<'p, Arrived<'p>> {
        let Unit {
            fill,
            first,
            pins,
            runs,
            outcomes,
        } = u;
        Unit {
            fill: self.arrive_fill(session, fill),
            first,
            pins,
            runs,
            outcomes,
        }
    }

    /// Publishes the unit's reads, copies its shards to the device and
    /// gives back its outcomes.
    fn finish_unit<'p>(
        &'p self,
        stream: &D::Stream,
        session: &mut ReadSession,
        group: &[TaskItem],
        u: Unit<'p, Arrived<'p>>,
    ) -> Vec<(BlockId, ItemOutcome)> {
        let Unit {
            fill,
            first,
            mut pins,
            mut runs,
            mut outcomes,
        } = u;
        for (i, f) in self.finish_fill(session, fill) {
            outcomes[i - first].1 = match f {
                Filled::Slot(r) => {
                    runs.push((i, r.slot()));
                    pins.push(r);
                    ItemOutcome::Ok
                }
                Filled::Miss => ItemOutcome::Miss,
                Filled::Failed(e) => self.fail_item(Failure::from_store(&e, "disk read")),
            };
        }
        let shard_bytes = self.geo.shard_bytes;
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
                outcomes[i - first].1 = self.fail_item(Failure::from_device(&e, "H2D copy"));
            }
        }
        outcomes
    }
}

/// One shard group's disk reads in flight (see [`Inner::start_fill`]).
/// The reads come first: dropping it waits for them before the guards give
/// their slots back.
struct Filling<'p> {
    reads: Option<SubmittedReads>,
    shard: u32,
    loads: Vec<(usize, BlockId, LoadGuard<'p>)>,
}

/// A [`Filling`] whose reads completed, their shards not yet checked.
struct Arrived<'p> {
    reads: Option<ArrivedReads>,
    shard: u32,
    loads: Vec<(usize, BlockId, LoadGuard<'p>)>,
}

/// Up to [`IO_BATCH_BLOCKS`] consecutive items of one group on their way
/// to the device: the fill (reads in flight, or arrived) comes first, so
/// dropping a unit waits for its reads before its pins and guards go.
struct Unit<'p, F> {
    fill: F,
    /// The group index of the unit's first item.
    first: usize,
    pins: Vec<SlotRef<'p>>,
    /// (item index in the group, slot) of each shard to copy.
    runs: Vec<(usize, usize)>,
    /// One per item of the unit, in order.
    outcomes: Vec<(BlockId, ItemOutcome)>,
}
