//! The raw BlockStore of the drop-in surfaces, on host memory: round trips
//! with every shard of a block in one task (read back by a fresh store from
//! disk), lookups, misses and failures reported per item, durable waits
//! with an injected write fault, prefetch, task bookkeeping and bad input.

use ucm_device::io::faults::{self, FaultOp, FaultRule};
use ucm_device::io::IoDir;
use ucm_ffi::coordinator::store::{Geometry, SyncMode};
use ucm_ffi::{ArgProblem, FfiError, ItemProblem, RawItem, RawStore, RawStoreOptions};

const GEO: Geometry = Geometry {
    shard_bytes: 8192,
    shards_per_block: 4,
};

fn id(n: u8) -> [u8; 16] {
    [n; 16]
}

/// Host buffers: one per (block, shard), filled with a pattern of both.
fn buffers(blocks: &[u8], fill: bool) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for &b in blocks {
        for s in 0..GEO.shards_per_block {
            let v = if fill {
                (0..GEO.shard_bytes)
                    .map(|i| (i as u32 ^ (b as u32 * 31 + s * 7)) as u8)
                    .collect()
            } else {
                vec![0u8; GEO.shard_bytes]
            };
            out.push(v);
        }
    }
    out
}

fn items(blocks: &[u8], bufs: &mut [Vec<u8>]) -> Vec<RawItem> {
    let spb = GEO.shards_per_block as usize;
    let mut out = Vec::new();
    for (bi, &b) in blocks.iter().enumerate() {
        for s in 0..spb {
            out.push(RawItem {
                block: id(b),
                shard: s as u32,
                addr: bufs[bi * spb + s].as_mut_ptr() as u64,
            });
        }
    }
    out
}

fn open(dir: &std::path::Path) -> RawStore {
    RawStore::open(RawStoreOptions::new(dir, GEO)).unwrap()
}

#[test]
fn the_sync_mode_chooses_how_dumps_are_made_durable() {
    let blocks: Vec<u8> = (1..=8).collect();
    for mode in [SyncMode::Files, SyncMode::Auto] {
        let dir = tempfile::tempdir().unwrap();
        let mut o = RawStoreOptions::new(dir.path(), GEO);
        o.sync = mode;
        let st = RawStore::open(o).unwrap();
        let mut src = buffers(&blocks, true);
        // SAFETY: the buffers outlive the task (waited for below).
        let t = unsafe { st.dump(&items(&blocks, &mut src), 0) }.unwrap();
        assert_eq!(st.wait(t, true).unwrap(), [], "{mode}");
        let c = st.counters();
        assert_eq!(c[4], 8, "{mode}: every block written");
        let by_fs = IoDir::open(dir.path()).unwrap().syncfs_reports_all();
        match mode {
            SyncMode::Files => assert_eq!(c[6], 0, "files: no syncfs"),
            SyncMode::Auto => {
                assert_eq!(c[6] > 0, by_fs, "auto: syncfs where it stands for fsyncs")
            }
        }
    }
}

#[test]
fn one_task_with_every_shard_of_every_block_loses_no_shard() {
    let dir = tempfile::tempdir().unwrap();
    let blocks: Vec<u8> = (1..=32).collect();
    let mut src = buffers(&blocks, true);
    {
        let st = open(dir.path());
        // SAFETY: the buffers outlive the task (waited for below).
        let t = unsafe { st.dump(&items(&blocks, &mut src), 0) }.unwrap();
        assert_eq!(st.wait(t, true).unwrap(), []);
        let ids: Vec<_> = blocks.iter().map(|&b| id(b)).collect();
        assert!(st.lookup(&ids).iter().all(|&p| p));
        assert_eq!(st.counters()[4], 32, "32 block files written");
    }
    // A fresh store (empty pool): every shard from disk, byte for byte.
    let st = open(dir.path());
    let mut dst = buffers(&blocks, false);
    // SAFETY: as above.
    let t = unsafe { st.load(&items(&blocks, &mut dst)) }.unwrap();
    assert_eq!(st.wait(t, false).unwrap(), []);
    assert_eq!(dst, src);
    assert_eq!(st.counters()[1], 32 * 4, "every shard read from disk");
}

#[test]
fn lookups_misses_and_partial_blocks_are_reported_per_item() {
    let dir = tempfile::tempdir().unwrap();
    let st = open(dir.path());
    let mut src = buffers(&[1, 2], true);
    let mut all = items(&[1, 2], &mut src);
    // Block 2: only shards 0 and 1 (another rank holds the rest).
    all.truncate(6);
    // SAFETY: buffers outlive the task.
    let t = unsafe { st.dump(&all, 0) }.unwrap();
    assert_eq!(
        st.wait(t, true).unwrap(),
        [],
        "an incomplete block is no failure"
    );
    assert_eq!(st.lookup(&[id(1), id(2), id(3)]), [true, false, false]);
    assert_eq!(st.lookup_on_prefix(&[id(1), id(2), id(1)]), 1);
    assert_eq!(st.lookup_on_prefix(&[id(3), id(1)]), 0);
    // Loading blocks 1 and 3: block 3's four shards are misses.
    let mut dst = buffers(&[1, 3], false);
    // SAFETY: buffers outlive the task.
    let t = unsafe { st.load(&items(&[1, 3], &mut dst)) }.unwrap();
    let report = st.wait(t, false).unwrap();
    assert_eq!(report.len(), 4);
    assert!(report
        .iter()
        .all(|r| r.block == id(3) && r.problem == ItemProblem::Miss));
    assert_eq!(dst[..4], src[..4]);
}

#[test]
fn a_failed_disk_write_is_reported_by_the_durable_wait_only() {
    let dir = tempfile::tempdir().unwrap();
    let st = open(dir.path());
    let mut src = buffers(&[5], true);
    let its = items(&[5], &mut src);
    {
        let _eio = faults::inject(FaultRule::errno(
            dir.path().join("tmp"),
            FaultOp::Write,
            libc::EIO,
        ));
        // SAFETY: buffers outlive the tasks.
        let t = unsafe { st.dump(&its, 0) }.unwrap();
        let report = st.wait(t, true).unwrap();
        assert_eq!(report.len(), 4, "{report:?}");
        assert!(report.iter().all(
            |r| matches!(&r.problem, ItemProblem::NotDurable(d) if d.contains("Input/output"))
        ));
    }
    assert_eq!(st.counters()[5], 1, "one block whose write failed");
}

#[test]
fn prefetch_fills_the_pool_from_disk() {
    let dir = tempfile::tempdir().unwrap();
    let mut src = buffers(&[1, 2], true);
    {
        let st = open(dir.path());
        // SAFETY: buffers outlive the task.
        let t = unsafe { st.dump(&items(&[1, 2], &mut src), 0) }.unwrap();
        assert_eq!(st.wait(t, true).unwrap(), []);
    }
    let st = open(dir.path());
    st.prefetch(&[id(1), id(2), id(9)]).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while st.counters()[1] < 8 {
        assert!(
            std::time::Instant::now() < deadline,
            "prefetch read nothing"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let mut dst = buffers(&[1, 2], false);
    // SAFETY: buffers outlive the task.
    let t = unsafe { st.load(&items(&[1, 2], &mut dst)) }.unwrap();
    assert_eq!(st.wait(t, false).unwrap(), []);
    assert_eq!(dst, src);
    assert_eq!(st.counters()[0], 8, "the load was served by the pool");
    assert_eq!(st.counters()[1], 8, "and read nothing more from disk");
}

#[test]
fn tasks_are_checked_waited_once_and_bad_input_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let st = open(dir.path());
    let mut src = buffers(&[1], true);
    let its = items(&[1], &mut src);
    // SAFETY: buffers outlive the task.
    let t = unsafe { st.dump(&its, 0) }.unwrap();
    while !st.check(t).unwrap() {
        std::thread::yield_now();
    }
    assert_eq!(st.wait(t, false).unwrap(), []);
    assert!(matches!(st.wait(t, false), Err(FfiError::UnknownTask { task }) if task == t));
    assert!(matches!(st.check(t), Err(FfiError::UnknownTask { .. })));
    assert!(matches!(
        st.check(999),
        Err(FfiError::UnknownTask { task: 999 })
    ));
    // A NULL address, a shard outside the geometry, an event on host memory.
    let mut bad = its.clone();
    bad[0].addr = 0;
    // SAFETY: refused before any copy.
    assert!(matches!(
        unsafe { st.load(&bad) },
        Err(FfiError::Argument {
            problem: ArgProblem::Null,
            ..
        })
    ));
    let mut bad = its.clone();
    bad[0].shard = 4;
    // SAFETY: refused before any copy.
    assert!(unsafe { st.load(&bad) }.is_err());
    // SAFETY: refused before any copy.
    assert!(matches!(
        unsafe { st.dump(&its, 0x1234) },
        Err(FfiError::Argument { ref name, .. }) if name == "after_event"
    ));
    // Another geometry over the same directory, a bad geometry, no directory.
    let other = Geometry {
        shard_bytes: 4096,
        shards_per_block: 4,
    };
    assert!(RawStore::open(RawStoreOptions::new(dir.path(), other)).is_err());
    let odd = Geometry {
        shard_bytes: 1000,
        shards_per_block: 4,
    };
    let d2 = tempfile::tempdir().unwrap();
    assert!(RawStore::open(RawStoreOptions::new(d2.path(), odd)).is_err());
    assert!(matches!(
        RawStore::open(RawStoreOptions::new("", GEO)),
        Err(FfiError::Argument { ref name, problem: ArgProblem::Empty }) if name == "dir"
    ));
    let mut none = RawStoreOptions::new(d2.path(), GEO);
    none.disk_blocks = 0;
    assert!(matches!(
        RawStore::open(none),
        Err(FfiError::Argument { ref name, .. }) if name == "disk_blocks"
    ));
    assert!(st.counters()[3] == 0 && st.counters()[2] == 0);
}
