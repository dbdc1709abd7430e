//! One byte budget for the disk tiers of several instances (a deployment's
//! groups: K/V blocks of each chain group, states of each snapshot group),
//! collected as one: GC takes the oldest files of all of them (speculative
//! files by [`low_order`](super::gc::low_order)) until their bytes are at the low watermark, so
//! the room each group gets follows what is used, not a fixed count per
//! group (D84).

use super::gc::{count_due, gather_in, pick_victims, release_lease_in, share_of, take_lease_in};
use super::*;

/// What the budget's GC needs of a member tier.
struct Member {
    dir: PathBuf,
    /// Members of one link hold the parts of one block under one id
    /// ([`DiskTier::join_budget_linked`]).
    link: Option<u64>,
    lease: Duration,
    /// The presence summaries of the tiers over the directory (one, or
    /// more where a store was opened again; a dropped tier's goes).
    known: Vec<std::sync::Weak<std::sync::RwLock<std::collections::HashSet<BlockId>>>>,
    stats: Arc<DiskStats>,
}

/// A byte capacity shared by the disk tiers that join it
/// ([`DiskTier::join_budget`]). A joined tier's own watermarks are then
/// unused: its writes count towards the budget, and its GC is the
/// budget's.
pub struct DiskBudget {
    /// The capacity (the high watermark); GC deletes down to 90% of it
    /// and counts again after every sixteenth of it written.
    high_bytes: AtomicU64,
    /// Whether each member brings its own capacity ([`DiskBudget::summed`]).
    summed: bool,
    members: Mutex<Vec<Member>>,
    gc_lock: Mutex<()>,
    /// Bytes found by the last walk, and the members' writes since.
    last_found: AtomicU64,
    written_since: AtomicU64,
    share_ppm: AtomicU32,
    next_link: AtomicU64,
}

impl std::fmt::Debug for DiskBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskBudget")
            .field("high_bytes", &self.high_bytes())
            .field("summed", &self.summed)
            .finish_non_exhaustive()
    }
}

impl DiskBudget {
    /// A budget of `high_bytes` (at least 1): GC starts above it and
    /// deletes down to 90% of it; the members' files are counted again
    /// after every sixteenth of it written, as one tier's are.
    pub fn new(high_bytes: u64) -> Arc<Self> {
        Self::with(high_bytes.max(1), false)
    }

    /// A budget of the bytes its members bring: each tier that joins adds
    /// its own capacity (its high watermark times its file size), so the
    /// members keep the bytes they had alone, collected as one. Members
    /// may join one at a time (a deployment's groups, an engine's host
    /// pools registered in turn).
    pub fn summed() -> Arc<Self> {
        Self::with(0, true)
    }

    fn with(high_bytes: u64, summed: bool) -> Arc<Self> {
        Arc::new(DiskBudget {
            high_bytes: AtomicU64::new(high_bytes),
            summed,
            members: Mutex::new(Vec::new()),
            gc_lock: Mutex::new(()),
            last_found: AtomicU64::new(0),
            written_since: AtomicU64::new(0),
            share_ppm: AtomicU32::new(0),
            next_link: AtomicU64::new(0),
        })
    }

    /// The capacity in bytes (the high watermark).
    pub fn high_bytes(&self) -> u64 {
        self.high_bytes.load(Ordering::Relaxed)
    }

    /// A link number not given before, for the tiers that hold the
    /// parts of one set of blocks ([`DiskTier::join_budget_linked`]).
    pub fn new_link(&self) -> u64 {
        self.next_link.fetch_add(1, Ordering::Relaxed)
    }

    /// The speculative share of the budget (as
    /// [`DiskTier::set_speculative_share`], of the bytes); a member's
    /// setting sets it.
    pub fn set_speculative_share(&self, share: f64) {
        let ppm = (share.clamp(0.0, 1.0) * 1e6).round() as u32;
        self.share_ppm.store(ppm, Ordering::Relaxed);
    }

    pub(super) fn join(&self, tier: &DiskTier, link: Option<u64>) {
        let mut members = self.members.lock().unwrap_or_else(|e| e.into_inner());
        // A second tier over a member's directory (a store opened again)
        // brings no bytes: its files are the member's, counted once; its
        // presence summary is cleared with the member's.
        if let Some(m) = members.iter_mut().find(|m| m.dir == tier.cfg.dir) {
            m.known.retain(|k| k.strong_count() > 0);
            m.known.push(Arc::downgrade(&tier.known));
            return;
        }
        if self.summed {
            let own = tier.cfg.high_watermark.saturating_mul(tier.file_bytes());
            let _ = self
                .high_bytes
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |h| {
                    Some(h.saturating_add(own))
                });
        }
        members.push(Member {
            dir: tier.cfg.dir.clone(),
            link,
            lease: tier.cfg.gc_lease,
            known: vec![Arc::downgrade(&tier.known)],
            stats: Arc::clone(&tier.stats),
        });
    }

    /// A member wrote `bytes`: counts the files again (and collects) once
    /// a sixteenth of the budget was written, or as soon as the bytes
    /// last found plus those written since exceed it.
    pub(super) fn after_writes(&self, bytes: u64) {
        let high = self.high_bytes();
        if !count_due(
            &self.last_found,
            &self.written_since,
            bytes,
            (high / 16).max(1),
            high,
        ) {
            return;
        }
        let r = self.gc();
        if r.deleted > 0 || r.leased_elsewhere {
            log::debug!(
                "disk budget of {} bytes: {} block files, {} deleted{}",
                high,
                r.found,
                r.deleted,
                if r.leased_elsewhere {
                    " (another budget holds a member's GC lease)"
                } else {
                    ""
                }
            );
        }
    }

    /// One GC pass over every member's directory: when their files hold
    /// more than the budget, deletes the oldest until the low watermark
    /// remains. While speculative (low) files hold more than the share of
    /// the budget, they go first, in [`low_order`](super::gc::low_order);
    /// otherwise the oldest normal file, whichever member it belongs to
    /// (as one tier's GC picks them, [`pick_victims`], each file weighing
    /// its bytes). The files of one block in linked members go together,
    /// as one item of their bytes and their newest mtime. Every member's GC
    /// lease is taken first (all or none, in the members' order, so two
    /// budgets over the same directories never both collect).
    pub fn gc(&self) -> GcReport {
        let _one = self.gc_lock.lock().unwrap_or_else(|e| e.into_inner());
        let members = self.members.lock().unwrap_or_else(|e| e.into_inner());
        // (mtime, path, bytes, member)
        let mut files: Vec<(SystemTime, PathBuf, u64, usize)> = Vec::new();
        for (i, m) in members.iter().enumerate() {
            files.extend(gather_in(&m.dir).into_iter().map(|(t, p, b)| (t, p, b, i)));
        }
        let found_bytes: u64 = files.iter().map(|f| f.2).sum();
        let found = files.len() as u64;
        self.last_found.store(found_bytes, Ordering::Relaxed);
        self.written_since.store(0, Ordering::Relaxed);
        // One reading of the capacity (a member may join meanwhile); GC
        // deletes down to 90% of it.
        let high = self.high_bytes();
        let low = high - high / 10;
        if found_bytes <= high {
            return GcReport {
                found,
                ..GcReport::default()
            };
        }
        let mut leases = Vec::new();
        for m in members.iter() {
            match take_lease_in(&m.dir, m.lease) {
                Some(l) => leases.push((&m.dir, l)),
                None => break,
            }
        }
        if leases.len() < members.len() {
            for (dir, l) in &leases {
                release_lease_in(dir, l);
            }
            self.last_found.store(low, Ordering::Relaxed);
            return GcReport {
                found,
                deleted: 0,
                leased_elsewhere: true,
            };
        }
        for k in members
            .iter()
            .flat_map(|m| &m.known)
            .filter_map(|k| k.upgrade())
        {
            k.write().unwrap_or_else(|e| e.into_inner()).clear();
        }
        let need = found_bytes - low;
        let keep = share_of(high, &self.share_ppm);
        let units = units_of(&files, &members);
        let each: Vec<(SystemTime, u64)> = units.iter().map(|u| (u.0, u.1)).collect();
        let victims = pick_victims(&each, need, keep, SystemTime::now());
        let (mut deleted, mut freed) = (0, 0);
        for &i in victims.iter().flat_map(|&u| &units[u].2) {
            let (_, p, b, m) = &files[i];
            // A file already gone (another GC, another machine) is fine.
            if iofs::remove_file(p).is_ok() {
                deleted += 1;
                freed += b;
                members[*m].stats.gc_deleted.fetch_add(1, Ordering::Relaxed);
            }
        }
        for (dir, l) in &leases {
            release_lease_in(dir, l);
        }
        self.last_found
            .store(found_bytes - freed, Ordering::Relaxed);
        GcReport {
            found,
            deleted,
            leased_elsewhere: false,
        }
    }
}

/// What GC picks from: `(mtime, bytes, files)`, one per file of an
/// unlinked member and one per block id of each link (its files in the
/// link's members, aged by the newest: the block was whole once its last
/// part was written).
fn units_of(
    files: &[(SystemTime, PathBuf, u64, usize)],
    members: &[Member],
) -> Vec<(SystemTime, u64, Vec<usize>)> {
    let mut units: Vec<(SystemTime, u64, Vec<usize>)> = Vec::with_capacity(files.len());
    let mut linked: HashMap<(u64, &Path), usize> = HashMap::new();
    for (i, (t, p, b, m)) in files.iter().enumerate() {
        let member = &members[*m];
        let key = member
            .link
            .and_then(|l| Some((l, p.strip_prefix(&member.dir).ok()?)));
        match key.and_then(|k| linked.get(&k).copied()) {
            Some(u) => {
                let unit = &mut units[u];
                unit.0 = unit.0.max(*t);
                unit.1 += b;
                unit.2.push(i);
            }
            None => {
                if let Some(k) = key {
                    linked.insert(k, units.len());
                }
                units.push((*t, *b, vec![i]));
            }
        }
    }
    units
}
