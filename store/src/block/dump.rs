//! The BlockStore's dump path: device to pool after the task's
//! prerequisite, then written behind to the disk and remote tiers, retried
//! a bounded number of times.

use super::*;

impl<D: Device> Inner<D> {
    pub(super) fn run_dump(
        &self,
        stream: &D::Stream,
        groups: &[(u32, Vec<TaskItem>)],
        after: Option<&D::Event>,
        retain: Retain,
        t: &Part<'_>,
    ) {
        let shard_bytes = self.geo.shard_bytes;
        if let Some(ev) = after {
            if let Err(e) = self.dev.stream_wait_event(stream, ev) {
                let why = Failure::from_device(&e, "waiting for the prerequisite event");
                t.fail_rest(groups, &why, true);
                return;
            }
        }
        let mut blocks: Vec<BlockId> = Vec::new();
        // Dumped shards stay pinned until the task's write-behind is done,
        // and dirty after that until their block is on disk.
        let mut dumped: Vec<SlotRef<'_>> = Vec::new();
        for &(shard, ref group) in groups {
            let mut guards = Vec::new();
            let mut outcomes: Vec<(BlockId, ItemOutcome)> = Vec::new();
            for it in group {
                if !blocks.contains(&it.block) {
                    blocks.push(it.block);
                }
                let key = (it.block, shard);
                let mut outcome = None;
                for _attempt in 0..2 {
                    match self.pool.acquire(key) {
                        // Already in the pool (another rank wrote it): dedup.
                        Ok(Some(Acquire::Hit(_))) => outcome = Some(ItemOutcome::Ok),
                        Ok(Some(Acquire::Load(g))) => {
                            guards.push((outcomes.len(), g));
                            outcome = Some(ItemOutcome::Ok);
                        }
                        // A failed load of this key: claim afresh.
                        Ok(Some(Acquire::Failed(_))) => continue,
                        Ok(None) => {
                            outcome = Some(self.fail_item(Failure::new(
                                FailureKind::PoolFull,
                                "pool bucket full of pinned slots",
                            )))
                        }
                        Err(e) => outcome = Some(self.fail_item(Failure::from_store(&e, "pool"))),
                    }
                    break;
                }
                outcomes.push((
                    it.block,
                    outcome.unwrap_or_else(|| {
                        self.fail_item(Failure::new(FailureKind::PoolFull, "slot kept failing"))
                    }),
                ));
            }
            let copy: Vec<CopyRun<'_>> = guards
                .iter()
                .map(|(i, g)| {
                    let it = &group[*i];
                    CopyRun::new(
                        &self.pool_mem,
                        self.pool.data_at(g.slot()),
                        &it.memory,
                        it.offset,
                        shard_bytes,
                    )
                })
                .collect();
            let copied = self.copy_and_wait(stream, &copy);
            for (i, g) in guards {
                match &copied {
                    Ok(()) => {
                        let r = g.complete();
                        r.set_dirty(true);
                        dumped.push(r);
                    }
                    Err(e) => {
                        g.fail(libc::EIO);
                        outcomes[i].1 = self.fail_item(Failure::from_device(e, "D2H copy"));
                    }
                }
            }
            t.shard(shard, outcomes);
        }
        t.done();
        // Write-behind: every block whose shards are all in the pool.
        let durable = self.write_behind(&blocks);
        if let Retain::Low(level) = retain {
            for r in &dumped {
                r.cool();
            }
            if let Some(disk) = &self.disk {
                let written: Vec<BlockId> = durable
                    .iter()
                    .filter(|(_, d)| *d == Durability::Durable)
                    .map(|(b, _)| *b)
                    .collect();
                disk.cool(&written, level);
            }
        }
        drop(dumped);
        t.durable(durable);
    }

    /// Writes to disk, in batches, the blocks of `blocks` whose shards are
    /// all in the pool; retries failures a bounded number of times.
    pub(super) fn write_behind(&self, blocks: &[BlockId]) -> Vec<(BlockId, Durability)> {
        let mut result: HashMap<BlockId, Durability> = HashMap::new();
        let mut todo: Vec<(BlockId, Vec<SlotRef<'_>>)> = Vec::new();
        'blocks: for b in blocks {
            let mut pins = Vec::new();
            for s in 0..self.geo.shards_per_block {
                match self.pool.acquire((*b, s)) {
                    Ok(Some(Acquire::Hit(r))) => pins.push(r),
                    Ok(Some(Acquire::Load(g))) => {
                        // Not dumped (or evicted): this block is incomplete.
                        g.fail(libc::ENOENT);
                        result.insert(*b, Durability::Incomplete);
                        continue 'blocks;
                    }
                    _ => {
                        result.insert(*b, Durability::Incomplete);
                        continue 'blocks;
                    }
                }
            }
            todo.push((*b, pins));
        }
        for attempt in 0..self.cfg.write_attempts {
            if todo.is_empty() {
                break;
            }
            if attempt > 0 {
                self.stats
                    .write_retries
                    .fetch_add(todo.len() as u64, Ordering::Relaxed);
            }
            let mut outcomes: HashMap<BlockId, Result<()>> = HashMap::new();
            match &self.disk {
                Some(disk) => {
                    // Written straight from the pinned slots (the disk
                    // tier bounds its batches and open files).
                    let blocks: Vec<(BlockId, Vec<IoBuf>)> = todo
                        .iter()
                        .map(|(b, pins)| (*b, pins.iter().map(SlotRef::io_buf).collect()))
                        .collect();
                    outcomes.extend(disk.write_blocks(blocks));
                }
                None => {
                    // No disk: the nearest tier is the durable write.
                    if let Some(r) = self.remotes.first() {
                        for chunk in todo.chunks(REMOTE_BATCH_BLOCKS) {
                            let blocks: Vec<(BlockId, Vec<&[u8]>)> = chunk
                                .iter()
                                .map(|(b, pins)| (*b, pins.iter().map(SlotRef::data).collect()))
                                .collect();
                            outcomes.extend(r.write_blocks(&blocks));
                        }
                    }
                }
            }
            let mut again = Vec::new();
            let mut written = Vec::new();
            for (b, pins) in todo {
                match outcomes.get(&b) {
                    Some(Ok(())) => {
                        self.stats.blocks_written.fetch_add(1, Ordering::Relaxed);
                        written.push((b, pins));
                    }
                    Some(Err(e)) if attempt + 1 == self.cfg.write_attempts => {
                        let what = if self.disk.is_some() {
                            "disk write"
                        } else {
                            "remote write"
                        };
                        self.give_up(&b, &pins, Failure::from_store(e, what), &mut result);
                    }
                    _ => again.push((b, pins)),
                }
            }
            // Durable on disk (or in the nearest tier, without a disk); then
            // each tier below, one batch per tier (a failure there is the
            // tier's, counted in its stats).
            let below = usize::from(self.disk.is_none());
            for r in self.remotes.iter().skip(below) {
                for chunk in written.chunks(REMOTE_BATCH_BLOCKS) {
                    let blocks: Vec<(BlockId, Vec<&[u8]>)> = chunk
                        .iter()
                        .map(|(b, pins)| (*b, pins.iter().map(SlotRef::data).collect()))
                        .collect();
                    if let Some((_, Err(e))) =
                        r.write_blocks(&blocks).into_iter().find(|x| x.1.is_err())
                    {
                        log::debug!("remote write: {e}");
                    }
                }
            }
            for (b, pins) in written {
                pins.iter().for_each(|r| r.set_dirty(false));
                result.insert(b, Durability::Durable);
            }
            todo = again;
        }
        blocks
            .iter()
            .map(|b| (*b, result.remove(b).unwrap_or(Durability::Incomplete)))
            .collect()
    }

    pub(super) fn give_up(
        &self,
        b: &BlockId,
        pins: &[SlotRef<'_>],
        why: Failure,
        result: &mut HashMap<BlockId, Durability>,
    ) {
        self.stats.write_failures.fetch_add(1, Ordering::Relaxed);
        // Given up: the shards stay servable from the pool but may be evicted.
        pins.iter().for_each(|r| r.set_dirty(false));
        let mut f = lock(&self.failures);
        if f.len() >= 1024 {
            f.pop_front();
        }
        f.push_back(DumpFailure {
            block: *b,
            error: why.clone(),
        });
        result.insert(*b, Durability::Failed(why));
    }
}
