//! The disk tier's GC and ageing: mtimes as recency (touch, cool), the
//! global oldest-first collection under a lease, enumeration and eviction.

use super::*;

/// Whether a lease's text (`<writer> <until, ms since the epoch> <n>`)
/// no longer holds at `now`: past its time, its writer (of this host)
/// dead, or not a lease at all (a damaged file must not block GC).
pub(super) fn lease_expired(text: &str, now: Duration) -> bool {
    let mut parts = text.split_whitespace();
    let (Some(writer), Some(until)) = (parts.next(), parts.next()) else {
        return true;
    };
    let Ok(until) = until.parse::<u128>() else {
        return true;
    };
    until <= now.as_millis() || paths::writer_alive(writer) == Some(false)
}

pub(super) fn parse_hex(s: &str) -> Option<BlockId> {
    if s.len() != 32 {
        return None;
    }
    let mut id = [0u8; 16];
    for (i, b) in id.iter_mut().enumerate() {
        *b = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(id)
}

impl DiskTier {
    /// A hotness pulse: refreshes the mtime of the blocks present, at most
    /// once per `touch_interval` each. Never a pin.
    pub fn touch(&self, ids: &[BlockId]) {
        let now = Instant::now();
        let mut seen = self.touched.lock().unwrap_or_else(|e| e.into_inner());
        if seen.len() > 1 << 16 {
            seen.retain(|_, t| now.duration_since(*t) < self.cfg.touch_interval);
        }
        for id in ids {
            if seen
                .get(id)
                .is_some_and(|t| now.duration_since(*t) < self.cfg.touch_interval)
            {
                continue;
            }
            let path = self.path_of(id);
            if iofs::set_modified(&path, SystemTime::now()).is_ok() {
                seen.insert(*id, now);
            }
        }
    }

    /// The opposite of [`DiskTier::touch`]: sets the mtime of the blocks
    /// present into the past, [`COLD_BACKDATE`] for `level` 0 and one
    /// sixteenth less per level above (levels above 15 count as 15), so
    /// that GC counts them as low (see [`DiskTier::victims`]: their order
    /// is their write time plus their level times the span of the normal
    /// blocks, both read back from the mtime). A later `touch` (a hit)
    /// makes a block current again.
    pub fn cool(&self, ids: &[BlockId], level: u8) {
        let back = COLD_BACKDATE / 16 * (16 - u32::from(level.min(15)));
        let when = SystemTime::now()
            .checked_sub(back)
            .unwrap_or(SystemTime::UNIX_EPOCH);
        let mut seen = self.touched.lock().unwrap_or_else(|e| e.into_inner());
        for id in ids {
            let _ = iofs::set_modified(&self.path_of(id), when);
            seen.remove(id);
        }
    }

    /// The fan-out directories `blocks/ab/cd` of `parent`, made 0700 and
    /// never through a link. Adds to `dirs` each directory whose entries
    /// this call changed (the parent of a directory it created).
    pub(super) fn fanout(&self, parent: &Path, dirs: &mut Vec<PathBuf>) -> Result<()> {
        for d in [parent.parent(), Some(parent)].into_iter().flatten() {
            if paths::ensure_dir(d)? {
                if let Some(above) = d.parent() {
                    add_dir(dirs, above);
                }
            }
        }
        Ok(())
    }

    /// Every block file with its mtime and length (a global walk of
    /// `blocks/`). Only what the store names is seen: real directories of
    /// two hex digits, regular files `<32 hex>.blk` in the directory their
    /// name belongs in; links are never followed.
    pub(super) fn gather(&self) -> Vec<(SystemTime, PathBuf, u64)> {
        gather_in(&self.cfg.dir)
    }

    /// Every block id on disk, from the file names (for warm restarts).
    /// Files whose names are not block ids are skipped.
    pub fn enumerate(&self) -> Vec<BlockId> {
        let full = self.file_bytes();
        self.gather()
            .into_iter()
            .filter(|(_, _, len)| *len == full)
            .filter_map(|(_, p, _)| {
                let stem = p.file_stem()?.to_str()?;
                parse_hex(stem)
            })
            .collect()
    }

    /// Deletes every block file (an eviction storm: another machine's GC,
    /// an operator clearing the tier). Returns how many files it removed;
    /// a file already gone is not counted. Readers then miss, never read a
    /// partial block.
    pub fn evict_all(&self) -> u64 {
        let _one = self.gc_lock.lock().unwrap_or_else(|e| e.into_inner());
        self.forget_all();
        let mut deleted = 0;
        for (_, p, _) in self.gather() {
            if iofs::remove_file(&p).is_ok() {
                deleted += 1;
            }
        }
        self.stats.gc_deleted.fetch_add(deleted, Ordering::Relaxed);
        deleted
    }

    /// Counts the directory's files after enough writes (see
    /// [`DiskConfig::gc_every`]) and collects when they are too many. Runs
    /// on the writing thread (a store worker), never on the engine's.
    pub(super) fn after_writes(&self, n: u64) {
        if let Some(b) = self.budget.get() {
            b.after_writes(n.saturating_mul(self.file_bytes()));
            return;
        }
        if self.cfg.gc_every == 0
            || !count_due(
                &self.last_found,
                &self.writes_since,
                n,
                self.cfg.gc_every,
                self.cfg.high_watermark,
            )
        {
            return;
        }
        let r = self.gc();
        if r.deleted > 0 || r.leased_elsewhere {
            log::debug!(
                "disk tier {}: {} block files, {} deleted{}",
                self.cfg.dir.display(),
                r.found,
                r.deleted,
                if r.leased_elsewhere {
                    " (another tier holds the GC lease)"
                } else {
                    ""
                }
            );
        }
    }

    /// One GC pass over the directory (every tier that shares it, of this
    /// process or others): when more than the high watermark of blocks
    /// exist, deletes the oldest (by mtime) until the low watermark remains.
    ///
    /// Tiers sharing a directory (instances on a shared file system) enforce
    /// its one capacity without a server: a pass that finds too many files
    /// first takes the lease `gc.lease` in the directory (created by a hard
    /// link, so one tier gets it; another may take it over only once it has
    /// expired, [`DiskConfig::gc_lease`], or its writer on this host is
    /// dead). A pass that cannot get it deletes nothing
    /// ([`GcReport::leased_elsewhere`]): the holder collects. Readers never
    /// lock: a file unlinked under a reader stays readable to it (and is
    /// the block's bytes: blocks are content-addressed); a later open misses.
    ///
    /// A tier that joined a budget ([`DiskTier::join_budget`]) runs the
    /// budget's pass instead ([`DiskBudget::gc`]).
    pub fn gc(&self) -> GcReport {
        if let Some(b) = self.budget.get() {
            return b.gc();
        }
        let _one = self.gc_lock.lock().unwrap_or_else(|e| e.into_inner());
        let files = self.gather();
        let found = files.len() as u64;
        self.last_found.store(found, Ordering::Relaxed);
        self.writes_since.store(0, Ordering::Relaxed);
        if found <= self.cfg.high_watermark {
            return GcReport {
                found,
                ..GcReport::default()
            };
        }
        let Some(lease) = self.take_lease() else {
            // The holder collects down to the low watermark: count again
            // only after this tier's next writes.
            self.last_found
                .store(self.cfg.low_watermark, Ordering::Relaxed);
            return GcReport {
                found,
                deleted: 0,
                leased_elsewhere: true,
            };
        };
        self.forget_all();
        let k = (found - self.cfg.low_watermark) as usize;
        let victims = self.victims(&files, k, SystemTime::now());
        let mut deleted = 0;
        for p in victims {
            // A file already gone (another GC, another machine) is fine.
            if iofs::remove_file(&p).is_ok() {
                deleted += 1;
            }
        }
        self.release_lease(&lease);
        self.stats.gc_deleted.fetch_add(deleted, Ordering::Relaxed);
        self.last_found.store(found - deleted, Ordering::Relaxed);
        GcReport {
            found,
            deleted,
            leased_elsewhere: false,
        }
    }

    /// Sets the speculative share: the fraction of the high watermark
    /// that blocks held at low priority ([`DiskTier::cool`]) may fill
    /// before GC takes them first. Within it, GC deletes the oldest normal
    /// blocks and keeps the low ones (unless nothing else is left); beyond
    /// it, low blocks go first (by write time and level, [`low_order`]). 0 (the
    /// default): low blocks always go first. Clamped to 0-1; this tier's
    /// own setting (a tier sharing the directory collects by its own).
    pub fn set_speculative_share(&self, share: f64) {
        let ppm = (share.clamp(0.0, 1.0) * 1e6).round() as u32;
        self.share_ppm.store(ppm, Ordering::Relaxed);
        if let Some(b) = self.budget.get() {
            b.set_speculative_share(share);
        }
    }

    /// The speculative share ([`DiskTier::set_speculative_share`]).
    pub fn speculative_share(&self) -> f64 {
        f64::from(self.share_ppm.load(Ordering::Relaxed)) / 1e6
    }

    /// The `k` files GC deletes out of `files` at `now`
    /// ([`pick_victims`], each file counting 1): low files first while they
    /// number more than the share of the high watermark.
    pub(super) fn victims(
        &self,
        files: &[(SystemTime, PathBuf, u64)],
        k: usize,
        now: SystemTime,
    ) -> Vec<PathBuf> {
        let keep = share_of(self.cfg.high_watermark, &self.share_ppm);
        let each: Vec<(SystemTime, u64)> = files.iter().map(|f| (f.0, 1)).collect();
        pick_victims(&each, k as u64, keep, now)
            .into_iter()
            .map(|i| files[i].1.clone())
            .collect()
    }

    /// Takes the GC lease of the directory; returns its text (ours) or
    /// `None` when another live, unexpired holder has it.
    pub(super) fn take_lease(&self) -> Option<String> {
        take_lease_in(&self.cfg.dir, self.cfg.gc_lease)
    }

    /// Gives the lease back if it is still ours.
    pub(super) fn release_lease(&self, text: &str) {
        release_lease_in(&self.cfg.dir, text)
    }
}

/// Takes the GC lease of `dir` for `lease` ([`DiskTier::take_lease`]).
pub(super) fn take_lease_in(dir: &Path, lease: Duration) -> Option<String> {
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    let until = now + lease;
    let text = format!(
        "{} {} {}",
        paths::writer_id(),
        until.as_millis(),
        paths::next_nonce()
    );
    let (path, tmp) = (dir.join("gc.lease"), dir.join("tmp"));
    let held = match paths::create_marker(&path, &tmp, &text) {
        Ok(true) => true,
        // Held: taken over only when expired or its writer is dead, by
        // an atomic replace; re-read, since a racing taker may have
        // replaced it after us.
        Ok(false) => {
            let theirs = paths::read_marker(&path).ok().flatten().unwrap_or_default();
            lease_expired(&theirs, now)
                && paths::replace_marker(&path, &tmp, &text).is_ok()
                && paths::read_marker(&path).ok().flatten().as_deref() == Some(text.as_str())
        }
        Err(_) => false,
    };
    held.then_some(text)
}

/// Gives `dir`'s GC lease back if it is still `text` (ours).
pub(super) fn release_lease_in(dir: &Path, text: &str) {
    let path = dir.join("gc.lease");
    if paths::read_marker(&path).ok().flatten().as_deref() == Some(text) {
        let _ = iofs::remove_file(&path);
    }
}

/// `share` (in millionths) of `total`.
pub(super) fn share_of(total: u64, share_ppm: &AtomicU32) -> u64 {
    let ppm = u128::from(share_ppm.load(Ordering::Relaxed));
    (u128::from(total) * ppm / 1_000_000) as u64
}

/// Adds `n` written to `since`; whether the files are due to be counted
/// again: `every` written since the last count, or the last count
/// (`last`) plus those written since above `high`.
pub(super) fn count_due(
    last: &AtomicU64,
    since: &AtomicU64,
    n: u64,
    every: u64,
    high: u64,
) -> bool {
    if n == 0 {
        return false;
    }
    let s = since.fetch_add(n, Ordering::Relaxed) + n;
    s >= every || last.load(Ordering::Relaxed).saturating_add(s) > high
}

/// The files GC deletes, as indices into `files` (each its mtime and its
/// weight: 1 for a count, its bytes for a byte budget), until `need` is
/// freed at `now`. A file is low when its mtime lies further back than
/// half the least backdate [`DiskTier::cool`] gives (a block written or
/// touched since is younger; a normal block that old has not been used
/// for years). While low files weigh more than `keep`, a low file goes,
/// in [`low_order`] (the span is the oldest normal file's age);
/// otherwise the oldest normal file, and a low one only when no normal
/// file is left.
pub(super) fn pick_victims(
    files: &[(SystemTime, u64)],
    need: u64,
    keep: u64,
    now: SystemTime,
) -> Vec<usize> {
    let cold = now
        .checked_sub(COLD_BACKDATE / 32)
        .unwrap_or(SystemTime::UNIX_EPOCH);
    let mut by_age: Vec<usize> = (0..files.len()).collect();
    by_age.sort_unstable_by_key(|&i| files[i].0);
    let (low, normal) = by_age.split_at(by_age.partition_point(|&i| files[i].0 < cold));
    let span = normal.first().map_or(Duration::ZERO, |&i| {
        now.duration_since(files[i].0).unwrap_or_default()
    });
    let times: Vec<SystemTime> = low.iter().map(|&i| files[i].0).collect();
    let low: Vec<usize> = low_order(&times, span, now)
        .into_iter()
        .map(|j| low[j])
        .collect();
    let mut low_left: u64 = low.iter().map(|&i| files[i].1).sum();
    let (mut l, mut n, mut freed) = (0usize, 0usize, 0u64);
    let mut out = Vec::new();
    while freed < need && l + n < files.len() {
        let take_low = l < low.len() && (low_left > keep || n == normal.len());
        let i = if take_low {
            l += 1;
            low_left -= files[low[l - 1]].1;
            low[l - 1]
        } else {
            n += 1;
            normal[n - 1]
        };
        freed += files[i].1;
        out.push(i);
    }
    out
}

/// The order GC takes low files in (D83), as indices into `low` (their
/// mtimes). [`DiskTier::cool`] backdated
/// each by a sixteenth of [`COLD_BACKDATE`] per level below 16, so its
/// mtime gives both its level and when it was cooled (its write). Each
/// goes in the order of that write time plus its level times `span` (the
/// age of the oldest normal file: the time the tier's sure data covers):
/// among files written together the lowest level goes first, while a file
/// that has outlived the sure data (the K/V its state resumes over) by
/// more than its level's credit goes before younger ones of lower levels.
pub(super) fn low_order(low: &[SystemTime], span: Duration, now: SystemTime) -> Vec<usize> {
    let step = COLD_BACKDATE / 16;
    let mut keyed: Vec<(Duration, u32, usize)> = low
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let age = now.duration_since(*t).unwrap_or_default();
            // Sixteenths of the backdate in its age: 16 - level (a write
            // younger than a sixteenth, about two years, decodes exactly).
            let n = (age.as_nanos() / step.as_nanos()).clamp(1, 16) as u32;
            let level = 16 - n;
            let written = t
                .checked_add(step * n)
                .unwrap_or(*t)
                .duration_since(SystemTime::UNIX_EPOCH)
                .unwrap_or_default();
            (written.saturating_add(span.saturating_mul(level)), level, i)
        })
        .collect();
    // Ties: the lower level first.
    keyed.sort_by_key(|(k, level, _)| (*k, *level));
    keyed.into_iter().map(|(_, _, i)| i).collect()
}

/// Every block file beneath `dir/blocks` with its mtime and length (see
/// [`DiskTier::gather`]).
pub(super) fn gather_in(dir: &Path) -> Vec<(SystemTime, PathBuf, u64)> {
    let mut out = Vec::new();
    let dirs = |p: &Path| {
        iofs::read_dir(p)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .filter_map(|e| {
                let n = e.file_name().to_str()?.to_string();
                (n.len() == 2 && n.bytes().all(|b| b.is_ascii_hexdigit())).then_some((n, e.path()))
            })
            .collect::<Vec<_>>()
    };
    for (a, ap) in dirs(&dir.join("blocks")) {
        for (b, bp) in dirs(&ap) {
            for f in iofs::read_dir(&bp).into_iter().flatten().flatten() {
                let Some(name) = f.file_name().to_str().map(String::from) else {
                    continue;
                };
                let well_named = name.len() == 36
                    && name.ends_with(".blk")
                    && name[..4] == format!("{a}{b}")
                    && parse_hex(&name[..32]).is_some();
                if !well_named {
                    continue;
                }
                if let Ok(m) = iofs::symlink_metadata(&f.path()) {
                    if m.file_type().is_file() {
                        if let Ok(t) = m.modified() {
                            out.push((t, f.path(), m.len()));
                        }
                    }
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A low file of `level` cooled `ago` before `now`, as
    /// [`DiskTier::cool`] backdates it.
    fn cooled(
        name: &str,
        level: u32,
        ago: Duration,
        now: SystemTime,
    ) -> (SystemTime, PathBuf, u64) {
        let back = COLD_BACKDATE / 16 * (16 - level);
        (now - ago - back, PathBuf::from(name), 0)
    }

    #[test]
    fn low_files_go_by_write_time_plus_their_levels_credit() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1 << 32);
        let hour = Duration::from_secs(3600);
        let low = [
            // Cooled together: level 0 before level 2.
            cooled("fresh-2", 2, Duration::ZERO, now),
            cooled("fresh-0", 0, Duration::ZERO, now),
            // Level 3, cooled 10 spans ago: its credit (3 spans) is spent.
            cooled("stale-3", 3, hour * 10, now),
            // Level 1, cooled half a span ago: credit left.
            cooled("recent-1", 1, hour / 2, now),
        ];
        let times: Vec<SystemTime> = low.iter().map(|f| f.0).collect();
        let order = low_order(&times, hour, now);
        let names: Vec<_> = order.iter().map(|&i| low[i].1.to_str().unwrap()).collect();
        assert_eq!(names, ["stale-3", "fresh-0", "recent-1", "fresh-2"]);
        // With no span (no normal file), the oldest write goes first.
        let order = low_order(&times, Duration::ZERO, now);
        let names: Vec<_> = order.iter().map(|&i| low[i].1.to_str().unwrap()).collect();
        assert_eq!(names, ["stale-3", "recent-1", "fresh-0", "fresh-2"]);
    }
}
