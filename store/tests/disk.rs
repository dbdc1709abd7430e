//! The disk tier: round trips, the 512 x 32 durability case, corruption as
//! a miss, geometry and temporary files, GC order, injected faults, GC under
//! concurrent reads, and SIGKILL crashes.

use std::fs;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use ucm_device::conformance::pattern;
use ucm_device::io::faults::{self, FaultOp, FaultRule};
use ucm_device::io::IoDir;
use ucm_device::{IoBuf, IoEngine, IoEngineConfig, IoEngineKind};
use ucm_store::{BlockId, DiskConfig, DiskTier, Geometry, StoreError, SyncMode};

const GEO: Geometry = Geometry {
    shard_bytes: 4096,
    shards_per_block: 8,
};

fn engine() -> Arc<dyn IoEngine> {
    Arc::from(IoEngineConfig::new(IoEngineKind::Auto).build().unwrap())
}

fn id(n: u64) -> BlockId {
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&n.to_le_bytes());
    b[8..].copy_from_slice(&(n.wrapping_mul(0x9e37_79b9_7f4a_7c15)).to_le_bytes());
    b
}

/// Deterministic content of shard `s` of block `n`.
fn shard_bytes(g: Geometry, n: u64, s: u32) -> Vec<u8> {
    pattern(n * 1000 + u64::from(s), g.shard_bytes)
}

fn shards(g: Geometry, n: u64) -> Vec<IoBuf> {
    (0..g.shards_per_block)
        .map(|s| IoBuf::from_slice(&shard_bytes(g, n, s)))
        .collect()
}

fn open(dir: &Path, g: Geometry, capacity: u64) -> DiskTier {
    DiskTier::open(DiskConfig::new(dir, g, capacity), engine()).unwrap()
}

/// A tier writing unnamed temporary files (`O_TMPFILE`) or named ones.
fn open_with(dir: &Path, g: Geometry, capacity: u64, unnamed: bool) -> DiskTier {
    open_sync(dir, g, capacity, unnamed, SyncMode::Auto)
}

/// As [`open_with`], making its writes durable as `sync` says.
fn open_sync(dir: &Path, g: Geometry, capacity: u64, unnamed: bool, sync: SyncMode) -> DiskTier {
    let mut cfg = DiskConfig::new(dir, g, capacity);
    cfg.unnamed_tmp = unnamed;
    cfg.sync = sync;
    DiskTier::open(cfg, engine()).unwrap()
}

/// Whether `SyncMode::Auto` gives one `syncfs` per batch in `dir`'s store
/// (ext4, XFS, btrfs or tmpfs on Linux 5.8+); says so when it does not.
fn fs_sync_here(dir: &Path) -> bool {
    fs::create_dir_all(dir.join("tmp")).unwrap();
    let yes = IoDir::open(dir.join("tmp")).unwrap().syncfs_reports_all();
    if !yes {
        eprintln!(
            "syncfs is not trusted on {}: Auto is Files here",
            dir.display()
        );
    }
    yes
}

/// The bytes of every shard of block `n`, read from its file.
fn read_all(t: &DiskTier, g: Geometry, n: u64) -> Option<Vec<Vec<u8>>> {
    let all: Vec<u32> = (0..g.shards_per_block).collect();
    let bufs = t.read_shards(&id(n), &all).unwrap()?;
    Some(bufs.iter().map(|b| b.as_slice().to_vec()).collect())
}

fn check_block(t: &DiskTier, g: Geometry, n: u64) -> bool {
    let all: Vec<u32> = (0..g.shards_per_block).collect();
    match t.read_shards(&id(n), &all).unwrap() {
        None => false,
        Some(bufs) => {
            for (s, b) in bufs.iter().enumerate() {
                assert_eq!(
                    b.as_slice(),
                    shard_bytes(g, n, s as u32),
                    "block {n} shard {s}"
                );
            }
            true
        }
    }
}

#[test]
fn blocks_round_trip_and_lookups_follow_the_file_system() {
    let dir = tempfile::tempdir().unwrap();
    let t = open(dir.path(), GEO, 100);
    for n in [1, 2, 4] {
        t.write_block(&id(n), shards(GEO, n)).unwrap();
    }
    for n in [1, 2, 4] {
        assert!(check_block(&t, GEO, n));
    }
    // A subset of shards, out of order.
    let got = t.read_shards(&id(2), &[5, 0]).unwrap().unwrap();
    assert_eq!(got[0].as_slice(), shard_bytes(GEO, 2, 5));
    assert_eq!(got[1].as_slice(), shard_bytes(GEO, 2, 0));
    assert!(t.read_shards(&id(3), &[0]).unwrap().is_none());
    assert!(matches!(
        t.read_shards(&id(1), &[8]),
        Err(StoreError::ShardOutOfRange {
            shard: 8,
            shards: 8
        })
    ));
    let ids: Vec<_> = (1..=4).map(id).collect();
    assert_eq!(t.lookup(&ids), [true, true, false, true]);
    assert_eq!(t.lookup_on_prefix(&ids), 2);
    // A file removed behind our back (another process's GC): this tier may
    // still believe it present (its summary), but the read is a miss, never
    // data, and forgets it; a tier opened afresh asks the file system.
    fs::remove_file(t.path_of(&id(1))).unwrap();
    assert!(t.read_shards(&id(1), &[0]).unwrap().is_none());
    assert_eq!(t.lookup_on_prefix(&ids), 0);
    fs::remove_file(t.path_of(&id(2))).unwrap();
    let fresh = open(dir.path(), GEO, 100);
    assert_eq!(fresh.lookup(&ids), [false, false, false, true]);
    t.write_block(&id(1), shards(GEO, 1)).unwrap();
    t.write_block(&id(2), shards(GEO, 2)).unwrap();
    // Files are 0600 in 0700 directories.
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&t.path_of(&id(2))), 0o600);
    assert_eq!(mode(dir.path()), 0o700);
    assert_eq!(mode(t.path_of(&id(2)).parent().unwrap()), 0o700);
    // A block with the wrong shard count is refused.
    assert!(t
        .write_block(&id(9), shards(GEO, 9).into_iter().take(3).collect())
        .is_err());
}

#[test]
fn five_hundred_twelve_blocks_of_thirty_two_shards_read_back_exactly() {
    let g = Geometry {
        shard_bytes: 4096,
        shards_per_block: 32,
    };
    let dir = tempfile::tempdir().unwrap();
    let t = open(dir.path(), g, 10_000);
    std::thread::scope(|s| {
        for part in 0..4u64 {
            let t = &t;
            s.spawn(move || {
                for n in (part * 128)..(part + 1) * 128 {
                    t.write_block(&id(n), shards(g, n)).unwrap();
                }
            });
        }
    });
    // Reopened (nothing cached), every byte of every shard comes back.
    drop(t);
    let t = open(dir.path(), g, 10_000);
    let missing: Vec<u64> = (0..512).filter(|&n| !check_block(&t, g, n)).collect();
    assert!(missing.is_empty(), "lost blocks: {missing:?}");
}

#[test]
fn write_blocks_over_many_batches_reports_every_block_in_order() {
    // Unnamed temporary files (the default) and named ones (the fallback
    // where a file system has no O_TMPFILE).
    // Either way of making them durable: one syncfs per batch, or an
    // fsync per file and directory.
    for unnamed in [true, false] {
        for sync in [SyncMode::Auto, SyncMode::Files] {
            many_batches(unnamed, sync);
        }
    }
}

fn many_batches(unnamed: bool, sync: SyncMode) {
    // Five full batches and a partial one go through the overlapped
    // pipeline (fsync, naming and directory fsync of different batches at
    // once); one block of the third batch is refused.
    let n = 5 * ucm_store::disk::WRITE_BATCH_BLOCKS as u64 + 7;
    let bad = 2 * ucm_store::disk::WRITE_BATCH_BLOCKS as u64 + 5;
    let dir = tempfile::tempdir().unwrap();
    let fs_sync = sync == SyncMode::Auto && fs_sync_here(dir.path());
    let t = open_sync(dir.path(), GEO, 10_000, unnamed, sync);
    assert_eq!(t.syncs_filesystem(), fs_sync);
    let blocks = (0..n)
        .map(|b| {
            let mut s = shards(GEO, b);
            if b == bad {
                s.pop();
            }
            (id(b), s)
        })
        .collect();
    let out = t.write_blocks(blocks);
    let ids: Vec<_> = out.iter().map(|(i, _)| *i).collect();
    assert_eq!(
        ids,
        (0..n).map(id).collect::<Vec<_>>(),
        "one result per block, in order"
    );
    for (b, (_, r)) in (0..n).zip(&out) {
        assert_eq!(r.is_ok(), b != bad, "block {b}: {r:?}");
    }
    assert_eq!(fs::read_dir(dir.path().join("tmp")).unwrap().count(), 0);
    // One syncfs per batch, and one more for the last batch's names.
    let syncs = t
        .stats()
        .fs_syncs
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(syncs, if fs_sync { 6 + 1 } else { 0 }, "{sync:?}");
    drop(t);
    let t = open(dir.path(), GEO, 10_000);
    let found: Vec<u64> = (0..n).filter(|&b| check_block(&t, GEO, b)).collect();
    assert_eq!(found, (0..n).filter(|&b| b != bad).collect::<Vec<_>>());
}

#[test]
fn a_failed_syncfs_fails_its_whole_batch_and_names_none_of_it() {
    let dir = tempfile::tempdir().unwrap();
    if !fs_sync_here(dir.path()) {
        return;
    }
    let per = ucm_store::disk::WRITE_BATCH_BLOCKS as u64;
    let n = 2 * per + 3;
    let t = open(dir.path(), GEO, 10_000);
    assert!(t.syncs_filesystem());
    let blocks = |r: std::ops::Range<u64>| r.map(|b| (id(b), shards(GEO, b))).collect();
    // The first syncfs (the first batch's files) fails with EIO: that
    // batch is refused, none of its files gets a name; the others are
    // written.
    let out = {
        let _eio = faults::inject(
            FaultRule::errno(dir.path().join("tmp"), FaultOp::Fsync, libc::EIO).times(1),
        );
        t.write_blocks(blocks(0..n))
    };
    for (b, (_, r)) in (0..n).zip(&out) {
        if b < per {
            assert!(
                matches!(r, Err(StoreError::Device(e)) if e.raw_os_error() == Some(libc::EIO)),
                "block {b}: {r:?}"
            );
            assert!(!t.exists(&id(b)), "block {b} is named");
        } else {
            assert!(r.is_ok(), "block {b}: {r:?}");
            assert!(check_block(&t, GEO, b), "block {b}");
        }
    }
    assert_eq!(fs::read_dir(dir.path().join("tmp")).unwrap().count(), 0);
    // One batch whose second syncfs (the one after its names were given)
    // fails with ENOSPC: every block of it is reported failed, though its
    // files are complete and named (a later lookup may find them: whole
    // blocks, never torn ones).
    let last = 3 * per..3 * per + 2;
    let out = {
        let _nospc = faults::inject(
            FaultRule::errno(dir.path().join("tmp"), FaultOp::Fsync, libc::ENOSPC)
                .after(1)
                .times(1),
        );
        t.write_blocks(blocks(last.clone()))
    };
    for (b, (_, r)) in last.clone().zip(&out) {
        assert!(
            matches!(r, Err(StoreError::Device(e)) if e.raw_os_error() == Some(libc::ENOSPC)),
            "block {b}: {r:?}"
        );
    }
    assert!(last.clone().all(|b| check_block(&t, GEO, b)));
    // An empty call syncs nothing.
    let syncs = t
        .stats()
        .fs_syncs
        .load(std::sync::atomic::Ordering::Relaxed);
    assert!(t.write_blocks(Vec::new()).is_empty());
    assert_eq!(
        t.stats()
            .fs_syncs
            .load(std::sync::atomic::Ordering::Relaxed),
        syncs
    );
}

#[test]
fn rewriting_a_block_replaces_it() {
    // A link never replaces a file: the unnamed path names the new file in
    // tmp/ and renames it over the old one, as the named path does.
    for unnamed in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let t = open_with(dir.path(), GEO, 100, unnamed);
        t.write_block(&id(1), shards(GEO, 1)).unwrap();
        t.write_block(&id(1), shards(GEO, 2)).unwrap();
        let want: Vec<Vec<u8>> = shards(GEO, 2)
            .iter()
            .map(|b| b.as_slice().to_vec())
            .collect();
        // Compared whole, reported short (a block is 32 KiB of bytes).
        assert!(
            read_all(&t, GEO, 1) == Some(want),
            "unnamed={unnamed}: the old block is still there"
        );
        assert_eq!(fs::read_dir(dir.path().join("tmp")).unwrap().count(), 0);
    }
}

#[test]
fn a_failed_link_leaves_nothing_visible() {
    let dir = tempfile::tempdir().unwrap();
    let t = open(dir.path(), GEO, 100);
    {
        let _g = faults::inject(FaultRule::errno(
            dir.path().join("blocks"),
            FaultOp::Link,
            libc::EIO,
        ));
        let err = t.write_block(&id(1), shards(GEO, 1)).unwrap_err();
        assert!(
            matches!(&err, StoreError::Device(e) if e.raw_os_error() == Some(libc::EIO)),
            "{err}"
        );
    }
    assert!(!t.exists(&id(1)));
    assert_eq!(fs::read_dir(dir.path().join("tmp")).unwrap().count(), 0);
    t.write_block(&id(1), shards(GEO, 1)).unwrap();
    assert!(check_block(&t, GEO, 1));
}

#[test]
fn a_flipped_byte_is_a_miss_never_data() {
    let dir = tempfile::tempdir().unwrap();
    let t = open(dir.path(), GEO, 100);
    t.write_block(&id(7), shards(GEO, 7)).unwrap();
    t.write_block(&id(8), shards(GEO, 8)).unwrap();
    for (n, offset) in [(7u64, 4096 + 3 * 4096 + 17), (8, 30)] {
        // One byte of shard 3 (block 7) and of the header (block 8).
        let p = t.path_of(&id(n));
        let mut bytes = fs::read(&p).unwrap();
        bytes[offset] ^= 0x40;
        fs::write(&p, bytes).unwrap();
        assert!(t.read_shards(&id(n), &[3]).unwrap().is_none());
        assert!(!t.exists(&id(n)), "the corrupt file is removed");
    }
    assert_eq!(
        t.stats()
            .corrupt_shards
            .load(std::sync::atomic::Ordering::Relaxed),
        2
    );
}

#[test]
fn another_geometry_is_refused_and_temporary_files_are_cleared() {
    let dir = tempfile::tempdir().unwrap();
    let t = open(dir.path(), GEO, 100);
    t.write_block(&id(1), shards(GEO, 1)).unwrap();
    drop(t);
    let other = Geometry {
        shard_bytes: 8192,
        shards_per_block: 8,
    };
    match DiskTier::open(DiskConfig::new(dir.path(), other, 100), engine()) {
        Err(StoreError::GeometryMismatch { .. }) => {}
        Err(e) => panic!("unexpected {e}"),
        Ok(_) => panic!("another geometry was accepted"),
    }
    // A dead writer's leftover temporary file is never visible and is
    // cleared at open; a live writer's (this process's) stays.
    let tmp = dir.path().join("tmp");
    let leftover = tmp.join(format!(
        "{}.{}.0.tmp",
        "ab".repeat(16),
        ucm_store::paths::dead_writer()
    ));
    let live = tmp.join(format!(
        "{}.{}.7.tmp",
        "cd".repeat(16),
        ucm_store::paths::writer_id()
    ));
    fs::write(&leftover, b"partial").unwrap();
    fs::write(&live, b"in flight").unwrap();
    let t = open(dir.path(), GEO, 100);
    assert!(!leftover.exists());
    assert!(live.exists(), "a live writer's temporary file was removed");
    assert!(check_block(&t, GEO, 1));
    let bad = Geometry {
        shard_bytes: 1000,
        shards_per_block: 8,
    };
    assert!(DiskTier::open(DiskConfig::new(dir.path().join("x"), bad, 100), engine()).is_err());
}

#[test]
fn gc_deletes_the_oldest_blocks_down_to_the_low_watermark() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = DiskConfig::new(dir.path(), GEO, 10);
    cfg.low_watermark = 6;
    cfg.touch_interval = Duration::ZERO;
    cfg.gc_every = 0; // only the pass below
    let t = DiskTier::open(cfg, engine()).unwrap();
    let base = SystemTime::now() - Duration::from_secs(3600);
    for n in 0..12u64 {
        t.write_block(&id(n), shards(GEO, n)).unwrap();
        // Block n is n minutes newer than block 0.
        let f = fs::File::open(t.path_of(&id(n))).unwrap();
        f.set_modified(base + Duration::from_secs(60 * n)).unwrap();
    }
    // A touch makes the oldest block the newest.
    t.touch(&[id(0)]);
    let r = t.gc();
    assert_eq!((r.found, r.deleted), (12, 6));
    let present: Vec<u64> = (0..12).filter(|&n| t.exists(&id(n))).collect();
    assert_eq!(present, [0, 7, 8, 9, 10, 11]);
    // Under the high watermark, GC does nothing.
    assert_eq!(t.gc().deleted, 0);
}

/// Block `n` of `t` written with an mtime `minutes` after `base`.
fn write_at(t: &DiskTier, g: Geometry, n: u64, base: SystemTime, minutes: u64) {
    t.write_block(&id(n), shards(g, n)).unwrap();
    let f = fs::File::open(t.path_of(&id(n))).unwrap();
    f.set_modified(base + Duration::from_secs(60 * minutes))
        .unwrap();
}

/// One 4 KiB shard per block: the small group of the budget tests.
const SMALL: Geometry = Geometry {
    shard_bytes: 4096,
    shards_per_block: 1,
};

/// A tier of `capacity` files under `dir` whose GC runs only when called
/// (or by its budget).
fn gc_tier(dir: &Path, g: Geometry, capacity: u64) -> DiskTier {
    let mut cfg = DiskConfig::new(dir, g, capacity);
    cfg.gc_every = 0;
    DiskTier::open(cfg, engine()).unwrap()
}

/// A small tier (`SMALL`) and a big one (`GEO`) in two directories, each
/// of 10 files on its own (never collected alone), joined to one budget
/// of `big` big files and `small` small ones. Bind `_dirs`: the
/// directories are removed when it is dropped.
struct BudgetPair {
    a: DiskTier,
    b: DiskTier,
    budget: Arc<ucm_store::DiskBudget>,
    _dirs: (tempfile::TempDir, tempfile::TempDir),
}

fn budget_pair(big: u64, small: u64) -> BudgetPair {
    let dirs = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (a, b) = (
        gc_tier(dirs.0.path(), SMALL, 10),
        gc_tier(dirs.1.path(), GEO, 10),
    );
    let budget = ucm_store::DiskBudget::new(big * b.file_bytes() + small * a.file_bytes());
    assert!(a.join_budget(&budget) && b.join_budget(&budget));
    BudgetPair {
        a,
        b,
        budget,
        _dirs: dirs,
    }
}

#[test]
fn tiers_sharing_a_budget_give_up_their_oldest_bytes_whatever_the_tier() {
    // Two groups: small blocks (one 4 KiB shard) and big ones (eight).
    // Per tier, the big tier's 3 blocks fit its own 10; with one budget,
    // the small tier's writes push the big tier's old blocks out.
    // Room for the big tier's 3 blocks and 6 small ones.
    let BudgetPair {
        a,
        b,
        budget,
        _dirs,
    } = budget_pair(3, 6);
    let small = SMALL;
    let (fa, fb) = (a.file_bytes(), b.file_bytes());
    assert!(fb > fa);
    assert!(!a.join_budget(&budget), "a tier joins one budget once");
    let base = SystemTime::now() - Duration::from_secs(3600);
    // Big blocks 100-102 at minutes 0, 1 and 20; small blocks 0-7 at
    // minutes 2-9. The 7th small block passes the budget: its GC (run by
    // the write, down to 90%) takes the oldest file, big block 100.
    for (n, m) in [(100, 0), (101, 1), (102, 20)] {
        write_at(&b, GEO, n, base, m);
    }
    for n in 0..8 {
        write_at(&a, small, n, base, n + 2);
    }
    let present = |t: &DiskTier, ns: std::ops::Range<u64>| -> Vec<u64> {
        ns.filter(|&n| t.exists(&id(n))).collect()
    };
    assert_eq!(present(&b, 100..103), [101, 102]);
    assert_eq!(present(&a, 0..8), (0..8).collect::<Vec<_>>());
    let deleted = |t: &DiskTier| {
        t.stats()
            .gc_deleted
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    assert_eq!((deleted(&a), deleted(&b)), (0, 1));
    assert_eq!(a.gc().deleted, 0, "within the budget");
    // Eight more small blocks (minutes 40-47): the passes take big block
    // 101, then the three oldest small blocks (minutes 2-4), never big
    // block 102 (minute 20), though the small tier alone holds 13 blocks.
    for n in 8..16 {
        write_at(&a, small, n, base, 32 + n);
    }
    assert_eq!(present(&b, 100..103), [102]);
    assert_eq!(present(&a, 0..16), (3..16).collect::<Vec<_>>());
    assert_eq!((deleted(&a), deleted(&b)), (3, 2));
    let held = 13 * fa + fb;
    assert!(held <= budget.high_bytes(), "{held} bytes held");
}

#[test]
fn a_summed_budget_holds_what_its_members_bring_and_collects_them_as_one() {
    // Two tiers of 4 files each (small blocks and big ones), joining one
    // at a time: the budget is the bytes of their own capacities.
    let dirs = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (a, b) = (
        gc_tier(dirs.0.path(), SMALL, 4),
        gc_tier(dirs.1.path(), GEO, 4),
    );
    let (fa, fb) = (a.file_bytes(), b.file_bytes());
    let budget = ucm_store::DiskBudget::summed();
    assert!(a.join_budget(&budget));
    assert_eq!(budget.high_bytes(), 4 * fa);
    assert!(b.join_budget(&budget));
    assert_eq!(budget.high_bytes(), 4 * fa + 4 * fb);
    // Four big blocks (minutes 0-3), then eight small ones (10-17): the
    // small tier holds twice its own 4 files, paid for by the oldest big
    // block; the newer big ones stay.
    let base = SystemTime::now() - Duration::from_secs(3600);
    for n in 0..4 {
        write_at(&b, GEO, 100 + n, base, n);
    }
    for n in 0..8 {
        write_at(&a, SMALL, n, base, 10 + n);
    }
    let present = |t: &DiskTier, ns: std::ops::Range<u64>| -> Vec<u64> {
        ns.filter(|&n| t.exists(&id(n))).collect()
    };
    assert_eq!(present(&a, 0..8), (0..8).collect::<Vec<_>>());
    assert_eq!(present(&b, 100..104), [101, 102, 103]);
    assert!(8 * fa + 3 * fb <= budget.high_bytes());
}

#[test]
fn a_store_opened_again_under_a_budget_brings_no_bytes_and_forgets_what_it_collects() {
    let dir = tempfile::tempdir().unwrap();
    let (a, again) = (gc_tier(dir.path(), SMALL, 4), gc_tier(dir.path(), SMALL, 4));
    let budget = ucm_store::DiskBudget::summed();
    assert!(a.join_budget(&budget) && again.join_budget(&budget));
    assert_eq!(
        budget.high_bytes(),
        4 * a.file_bytes(),
        "one directory, counted once"
    );
    // The second store writes four blocks and looks them up (it knows
    // them); the first writes four more: the budget's GC takes the oldest,
    // and the second store no longer finds them.
    let base = SystemTime::now() - Duration::from_secs(3600);
    for n in 0..4 {
        write_at(&again, SMALL, n, base, n);
    }
    assert_eq!(
        again.lookup_on_prefix(&(0..4).map(id).collect::<Vec<_>>()),
        4
    );
    for n in 4..8 {
        write_at(&a, SMALL, n, base, 10 + n);
    }
    assert!(!again.exists(&id(0)) && !a.exists(&id(0)));
    let held = (0..8).filter(|&n| a.exists(&id(n))).count() as u64;
    assert!((3..=4).contains(&held), "{held} files held");
}

#[test]
fn linked_tiers_lose_a_block_whole_never_one_part() {
    // A block of two parts (one 4 KiB shard here, eight there), one tier
    // per part, linked; each tier's parts written in a batch of its own,
    // as a block of components of two sizes is. Room for 4 blocks.
    let dirs = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (a, b) = (
        gc_tier(dirs.0.path(), SMALL, 4),
        gc_tier(dirs.1.path(), GEO, 4),
    );
    let budget = ucm_store::DiskBudget::summed();
    let link = budget.new_link();
    assert_ne!(budget.new_link(), link);
    assert!(a.join_budget_linked(&budget, link) && b.join_budget_linked(&budget, link));
    let base = SystemTime::now() - Duration::from_secs(3600);
    // Blocks 0-3 (small parts at minutes 0-3, big ones at 10-13), then
    // 4-5 (small at 20-21, big at 30-31).
    for (from, to, at) in [(0, 4, 0), (4, 6, 16)] {
        for n in from..to {
            write_at(&a, SMALL, n, base, at + n);
        }
        for n in from..to {
            write_at(&b, GEO, n, base, at + 10 + n);
        }
    }
    let whole: Vec<u64> = (0..6)
        .filter(|&n| a.exists(&id(n)) && b.exists(&id(n)))
        .collect();
    let parts = (0..6)
        .filter(|&n| a.exists(&id(n)) || b.exists(&id(n)))
        .count();
    assert_eq!(parts, whole.len(), "no part outlives its block: {whole:?}");
    assert_eq!(
        whole.first(),
        Some(&2),
        "the oldest blocks went whole: {whole:?}"
    );
    assert_eq!(whole.last(), Some(&5));
}

#[test]
fn a_budget_keeps_low_files_within_its_share_and_takes_them_first_beyond_it() {
    let BudgetPair { a, b, _dirs, .. } = budget_pair(2, 6);
    let small = SMALL;
    // The share set on any member is the budget's: all of it.
    a.set_speculative_share(1.0);
    // Two big blocks held at low priority (speculative checkpoints).
    for n in [100, 101] {
        b.write_block(&id(n), shards(GEO, n)).unwrap();
    }
    b.cool(&[id(100), id(101)], 0);
    let base = SystemTime::now() - Duration::from_secs(3600);
    for n in 0..8 {
        write_at(&a, small, n, base, n);
    }
    // Within the share the low files stay; the oldest normal ones go
    // (the 7th small block passed the budget: three went, to 90%).
    let present = |t: &DiskTier, ns: std::ops::Range<u64>| -> Vec<u64> {
        ns.filter(|&n| t.exists(&id(n))).collect()
    };
    assert_eq!(present(&b, 100..102), [100, 101]);
    assert_eq!(present(&a, 0..8), [3, 4, 5, 6, 7]);
    // Share 0: beyond it, low files go first, though the small tier's
    // files are older.
    b.set_speculative_share(0.0);
    for n in 8..10 {
        write_at(&a, small, n, base, n);
    }
    assert_eq!(present(&b, 100..102).len(), 1, "one low file went");
    assert_eq!(present(&a, 0..10), (3..10).collect::<Vec<_>>());
}

#[test]
fn injected_write_faults_leave_nothing_visible_and_reads_report_errors() {
    let dir = tempfile::tempdir().unwrap();
    let t = open(dir.path(), GEO, 100);
    let tmp = dir.path().join("tmp");
    // EIO on one shard's write of the temporary file.
    let eio = faults::inject(
        FaultRule::errno(&tmp, FaultOp::Write, libc::EIO).at_offset(4096 + 3 * 4096),
    );
    let err = t.write_block(&id(1), shards(GEO, 1)).unwrap_err();
    assert!(
        matches!(&err, StoreError::Device(e) if e.raw_os_error() == Some(libc::EIO)),
        "{err}"
    );
    drop(eio);
    // ENOSPC on the fsync.
    let nospc = faults::inject(FaultRule::errno(&tmp, FaultOp::Fsync, libc::ENOSPC));
    let err = t.write_block(&id(2), shards(GEO, 2)).unwrap_err();
    assert!(
        matches!(&err, StoreError::Device(e) if e.raw_os_error() == Some(libc::ENOSPC)),
        "{err}"
    );
    drop(nospc);
    assert!(!t.exists(&id(1)) && !t.exists(&id(2)));
    assert_eq!(
        fs::read_dir(&tmp).unwrap().count(),
        0,
        "no temporary file left"
    );
    assert_eq!(
        t.stats()
            .write_failures
            .load(std::sync::atomic::Ordering::Relaxed),
        2
    );
    // Other blocks are unaffected.
    t.write_block(&id(3), shards(GEO, 3)).unwrap();
    t.write_block(&id(4), shards(GEO, 4)).unwrap();
    // EIO on reading block 3: an error for block 3 only.
    let bad = faults::inject(FaultRule::errno(
        t.path_of(&id(3)),
        FaultOp::Read,
        libc::EIO,
    ));
    let err = t.read_shards(&id(3), &[0, 1]).unwrap_err();
    assert!(
        matches!(&err, StoreError::Device(e) if e.raw_os_error() == Some(libc::EIO)),
        "{err}"
    );
    assert!(check_block(&t, GEO, 4));
    drop(bad);
    assert!(
        check_block(&t, GEO, 3),
        "an I/O error does not destroy the block"
    );
}

#[test]
fn gc_under_concurrent_reads_corrupts_no_read() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = DiskConfig::new(dir.path(), GEO, 20);
    cfg.low_watermark = 5;
    let t = DiskTier::open(cfg, engine()).unwrap();
    std::thread::scope(|s| {
        let t = &t;
        s.spawn(move || {
            for round in 0..10u64 {
                for n in 0..30u64 {
                    t.write_block(&id(round * 100 + n), shards(GEO, round * 100 + n))
                        .unwrap();
                }
                t.gc();
            }
        });
        for _ in 0..2 {
            s.spawn(move || {
                let mut hits = 0;
                for i in 0..3000u64 {
                    let n = (i % 10) * 100 + i % 30;
                    // Either exact data (checked inside) or a miss.
                    if check_block(t, GEO, n) {
                        hits += 1;
                    }
                }
                hits
            });
        }
    });
}

/// The crash test's child: writes blocks until it is killed. Not a test of
/// its own: the parent runs it with `--ignored` and UCM_CRASH_DIR set.
#[test]
#[ignore = "child process of sigkill_mid_write_leaves_whole_blocks_or_misses"]
fn crash_child() {
    let dir = std::env::var("UCM_CRASH_DIR").expect("run by the crash test");
    let t = open(Path::new(&dir), GEO, 1_000_000);
    let start: u64 = std::env::var("UCM_CRASH_START").unwrap().parse().unwrap();
    for n in start.. {
        t.write_block(&id(n), shards(GEO, n)).unwrap();
    }
}

#[test]
fn sigkill_mid_write_leaves_whole_blocks_or_misses() {
    let dir = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    let mut x = 0x5eedu64;
    let mut total = 0;
    for trial in 0..20u64 {
        let mut child = Command::new(&exe)
            .args([
                "--exact",
                "crash_child",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("UCM_CRASH_DIR", dir.path())
            .env("UCM_CRASH_START", (trial * 100_000).to_string())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        std::thread::sleep(Duration::from_millis(30 + (x >> 33) % 120));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        // Unnamed files in flight died with the child: nothing to clear.
        assert_eq!(
            fs::read_dir(dir.path().join("tmp")).unwrap().count(),
            0,
            "a killed writer left a temporary file"
        );
        let t = open(dir.path(), GEO, 1_000_000);
        assert_eq!(fs::read_dir(dir.path().join("tmp")).unwrap().count(), 0);
        // Every block the child may have written reads back exactly or is a miss.
        let mut present = 0;
        for n in trial * 100_000.. {
            if !check_block(&t, GEO, n) {
                // The first miss ends the run: blocks are written in order,
                // and at most the one in flight can be missing.
                assert!(
                    !check_block(&t, GEO, n + 1),
                    "a hole before block {}",
                    n + 1
                );
                break;
            }
            present += 1;
        }
        total += present;
    }
    eprintln!("20 SIGKILL trials: {total} whole blocks survived, no partial one was read");
    assert!(total > 0, "the child never wrote a block");
}

/// A read session opens each file and checks its header once: later shard
/// reads of the same block reuse them, a shard that fails its checksum is
/// still a miss, and an unlinked file stays readable through the session
/// (its bytes are the block's) while a fresh read misses.
#[test]
fn a_read_session_reuses_files_and_headers() {
    use ucm_store::ReadSession;
    let dir = tempfile::tempdir().unwrap();
    let t = open(dir.path(), GEO, 1000);
    for n in 0..4 {
        t.write_block(&id(n), shards(GEO, n)).unwrap();
    }
    let mut session = ReadSession::default();
    let read = |t: &DiskTier, session: &mut ReadSession, n: u64, s: u32| {
        let mut r = t.read_many_in(
            session,
            vec![(id(n), vec![(s, IoBuf::new(GEO.shard_bytes))])],
        );
        r.pop().unwrap().unwrap()
    };
    for s in 0..GEO.shards_per_block {
        for n in 0..4 {
            let got = read(&t, &mut session, n, s).expect("present");
            assert_eq!(got[0].as_slice(), shard_bytes(GEO, n, s));
        }
    }
    // Corrupt shard 5 of block 1 on disk: still a miss through the session.
    let path = t.path_of(&id(1));
    let mut bytes = fs::read(&path).unwrap();
    let at = bytes.len() - 3 * GEO.shard_bytes + 7;
    bytes[at] ^= 0xff;
    fs::write(&path, &bytes).unwrap();
    assert!(
        read(&t, &mut session, 1, 5).is_none(),
        "a bad shard is a miss"
    );
    // Unlinked block 2: the session still reads it; a fresh read misses.
    fs::remove_file(t.path_of(&id(2))).unwrap();
    let got = read(&t, &mut session, 2, 3).expect("open file still readable");
    assert_eq!(got[0].as_slice(), shard_bytes(GEO, 2, 3));
    assert!(t.read_shards(&id(2), &[3]).unwrap().is_none());
}

/// Every file-system call of the disk tier goes through the HAL's seam, so
/// a fault reaches each: a failed rename (named temporary files) publishes
/// nothing and leaves no temporary file; a failed removal in GC deletes
/// nothing and GC goes on with the rest; a failed listing or directory
/// creation makes the open fail with the call named; a failed touch loses
/// only the touch.
#[test]
fn a_fault_at_each_file_system_call_is_reported_or_absorbed() {
    // Rename: the named-temporary-file path publishes by rename.
    let dir = tempfile::tempdir().unwrap();
    let t = open_with(dir.path(), GEO, 100, false);
    {
        let _g = faults::inject(FaultRule::errno(
            dir.path().join("blocks"),
            FaultOp::Rename,
            libc::EIO,
        ));
        let err = t.write_block(&id(1), shards(GEO, 1)).unwrap_err();
        assert!(matches!(&err, StoreError::Fs { op: "rename", .. }), "{err}");
    }
    assert!(!t.exists(&id(1)));
    assert_eq!(fs::read_dir(dir.path().join("tmp")).unwrap().count(), 0);
    t.write_block(&id(1), shards(GEO, 1)).unwrap();
    assert!(check_block(&t, GEO, 1));

    // Remove: GC keeps going past a file it cannot delete.
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = DiskConfig::new(dir.path(), GEO, 4);
    cfg.low_watermark = 1;
    cfg.gc_every = 0;
    let t = DiskTier::open(cfg, engine()).unwrap();
    for n in 0..6u64 {
        t.write_block(&id(n), shards(GEO, n)).unwrap();
    }
    let stuck = t.path_of(&id(0));
    {
        let _g = faults::inject(FaultRule::errno(&stuck, FaultOp::Remove, libc::EACCES));
        let r = t.gc();
        assert_eq!(r.found, 6);
        assert!(r.deleted >= 4, "{r:?}");
        assert!(
            t.exists(&id(0)),
            "the block whose removal failed stays whole"
        );
        assert!(check_block(&t, GEO, 0));
    }

    // List: clearing temporary files at open lists `tmp`.
    let dir = tempfile::tempdir().unwrap();
    drop(open(dir.path(), GEO, 10));
    {
        let _g = faults::inject(FaultRule::errno(
            dir.path().join("tmp"),
            FaultOp::List,
            libc::EIO,
        ));
        let Err(err) = DiskTier::open(DiskConfig::new(dir.path(), GEO, 10), engine()) else {
            panic!("opened over a failed listing");
        };
        assert!(matches!(&err, StoreError::Fs { op: "list", .. }), "{err}");
    }
    drop(open(dir.path(), GEO, 10));

    // Mkdir: a store that cannot make its directories does not open.
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("store");
    {
        let _g = faults::inject(FaultRule::errno(&root, FaultOp::Mkdir, libc::ENOSPC));
        let Err(err) = DiskTier::open(DiskConfig::new(&root, GEO, 10), engine()) else {
            panic!("opened without its directories");
        };
        assert!(
            matches!(
                &err,
                StoreError::Fs {
                    op: "create directory",
                    ..
                }
            ),
            "{err}"
        );
    }
    drop(open(&root, GEO, 10));

    // Touch: a failed touch leaves the block as it was.
    let mut cfg = DiskConfig::new(&root, GEO, 10);
    cfg.touch_interval = Duration::ZERO;
    let t = DiskTier::open(cfg, engine()).unwrap();
    t.write_block(&id(7), shards(GEO, 7)).unwrap();
    let old = SystemTime::now() - Duration::from_secs(3600);
    fs::File::open(t.path_of(&id(7)))
        .unwrap()
        .set_modified(old)
        .unwrap();
    let mtime = || fs::metadata(t.path_of(&id(7))).unwrap().modified().unwrap();
    {
        let _g = faults::inject(FaultRule::errno(
            t.path_of(&id(7)),
            FaultOp::Touch,
            libc::EROFS,
        ));
        t.touch(&[id(7)]);
        assert_eq!(mtime(), old);
    }
    t.touch(&[id(7)]);
    assert!(mtime() > old);
    assert!(check_block(&t, GEO, 7));
}

/// Opening a store reaches the file system only through the seam: a fault
/// at each of its calls (inspecting, making, opening, restricting and
/// syncing directories; opening, reading, writing, linking and syncing the
/// geometry marker) makes the open fail with that call named, leaves no
/// temporary file, and the next open succeeds.
#[test]
fn a_fault_at_each_call_of_opening_a_store_is_reported() {
    use std::os::unix::fs::PermissionsExt;
    // (path under the root, operation, the store's name for the call,
    // whether the root exists with a marker and mode 0755 beforehand)
    let cases: &[(&str, FaultOp, &str, bool)] = &[
        ("", FaultOp::Stat, "inspect", true),
        ("blocks", FaultOp::Mkdir, "create directory", false),
        ("", FaultOp::Open, "open directory", true),
        ("", FaultOp::Chmod, "restrict to 0700", true),
        ("", FaultOp::Fsync, "fsync directory", false),
        ("GEOMETRY", FaultOp::Open, "open", true),
        ("GEOMETRY", FaultOp::Read, "read", true),
        ("tmp", FaultOp::Write, "write", false),
        ("GEOMETRY", FaultOp::Link, "write", false),
    ];
    for &(under, op, name, existing) in cases {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("store");
        if existing {
            drop(open(&root, GEO, 10));
            fs::set_permissions(&root, fs::Permissions::from_mode(0o755)).unwrap();
        }
        let target = if under.is_empty() {
            root.clone()
        } else {
            root.join(under)
        };
        {
            let g = faults::inject(FaultRule::errno(&target, op, libc::EIO));
            let Err(err) = DiskTier::open(DiskConfig::new(&root, GEO, 10), engine()) else {
                panic!("{op:?} on {under:?}: opened");
            };
            assert!(
                matches!(&err, StoreError::Fs { op: o, .. } if *o == name),
                "{op:?} on {under:?}: {err}"
            );
            assert!(g.fired() > 0, "{op:?} on {under:?}: the rule never fired");
        }
        if root.join("tmp").exists() {
            assert_eq!(
                fs::read_dir(root.join("tmp")).unwrap().count(),
                0,
                "{op:?}: a temporary file left"
            );
        }
        let t = open(&root, GEO, 10);
        t.write_block(&id(3), shards(GEO, 3)).unwrap();
        assert!(check_block(&t, GEO, 3), "{op:?}");
    }
}
