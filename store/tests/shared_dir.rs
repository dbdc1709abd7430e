//! Several instances on one disk-tier directory (a shared file system):
//! separate processes with separate memory pools, one capacity for the
//! directory enforced through the GC lease, SIGKILL of one instance while
//! it dumps, and two writers of the same block at once.
//!
//! Block contents are a pure function of the block id, so every load is
//! checked byte for byte: a wrong byte is a wrong hit and fails the test.

mod common;

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use ucm_device::conformance::pattern;
use ucm_device::{Device, HostDevice, IoEngineConfig, IoEngineKind, Memory};
use ucm_store::pool::PoolMode;
use ucm_store::{
    BlockId, BlockStore, BlockStoreConfig, ClockPool, DiskConfig, DiskTier, Geometry, ItemOutcome,
    PoolConfig, TaskItem, TieredBlockStore,
};

const GEO: Geometry = Geometry {
    shard_bytes: 4096,
    shards_per_block: 2,
};

fn id(n: u64) -> BlockId {
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&n.to_le_bytes());
    b[8] = 0x5d;
    b
}

fn engine() -> Arc<dyn ucm_device::IoEngine> {
    Arc::from(IoEngineConfig::new(IoEngineKind::Auto).build().unwrap())
}

fn tier(dir: &std::path::Path, capacity: u64, gc_every: u64) -> DiskTier {
    let mut cfg = DiskConfig::new(dir, GEO, capacity);
    cfg.gc_every = gc_every;
    DiskTier::open(cfg, engine()).unwrap()
}

fn shards(n: u64) -> Vec<ucm_device::IoBuf> {
    (0..GEO.shards_per_block as u64)
        .map(|s| {
            let mut b = ucm_device::IoBuf::new(GEO.shard_bytes);
            b.as_mut_slice()
                .copy_from_slice(&pattern(n * 10 + s, GEO.shard_bytes));
            b
        })
        .collect()
}

fn files(dir: &std::path::Path) -> (usize, usize) {
    let blocks = walk(&dir.join("blocks"));
    let tmp = std::fs::read_dir(dir.join("tmp")).unwrap().count();
    (blocks, tmp)
}

fn walk(p: &std::path::Path) -> usize {
    std::fs::read_dir(p)
        .map(|d| {
            d.flatten()
                .map(|e| {
                    if e.file_type().unwrap().is_dir() {
                        walk(&e.path())
                    } else {
                        1
                    }
                })
                .sum()
        })
        .unwrap_or(0)
}

#[test]
fn the_gc_lease_lets_one_tier_collect_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = DiskConfig::new(dir.path(), GEO, 10);
    cfg.low_watermark = 6;
    cfg.gc_every = 0;
    let t = DiskTier::open(cfg, engine()).unwrap();
    for n in 0..12 {
        t.write_block(&id(n), shards(n)).unwrap();
    }
    let lease = dir.path().join("gc.lease");
    let far = 4_000_000_000_000u64; // ms since the epoch: year 2096
                                    // A live holder (this process, another tier) with time left: no pass.
    std::fs::write(&lease, format!("{} {far} 7", ucm_store::paths::writer_id())).unwrap();
    let r = t.gc();
    assert_eq!((r.found, r.deleted, r.leased_elsewhere), (12, 0, true));
    assert_eq!(
        files(dir.path()),
        (12, 0),
        "nothing deleted, no temporary left"
    );
    // A holder that is dead, a lease that expired, a damaged lease: taken
    // over, collected, given back.
    for text in [
        format!("{} {far} 1", ucm_store::paths::dead_writer()),
        format!("{} 1000 1", ucm_store::paths::writer_id()),
        "garbage".to_string(),
    ] {
        for n in 0..12 {
            t.write_block(&id(n), shards(n)).unwrap();
        }
        std::fs::write(&lease, &text).unwrap();
        let r = t.gc();
        assert_eq!((r.deleted, r.leased_elsewhere), (6, false), "{text}");
        assert!(!lease.exists(), "the lease is given back ({text})");
    }
    // A lease that is a link is replaced, never followed.
    let outside = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(outside.path(), "keep").unwrap();
    for n in 0..12 {
        t.write_block(&id(n), shards(n)).unwrap();
    }
    std::os::unix::fs::symlink(outside.path(), &lease).unwrap();
    assert_eq!(t.gc().deleted, 6);
    assert_eq!(std::fs::read_to_string(outside.path()).unwrap(), "keep");
    assert_eq!(files(dir.path()).1, 0);
}

#[test]
fn writes_beyond_the_capacity_collect_by_themselves() {
    let dir = tempfile::tempdir().unwrap();
    let t = tier(dir.path(), 40, 4);
    for n in 0..400 {
        t.write_block(&id(n), shards(n)).unwrap();
    }
    let (blocks, tmp) = files(dir.path());
    assert!(blocks <= 44, "{blocks} block files for a capacity of 40");
    assert_eq!(tmp, 0);
    assert!(
        t.stats()
            .gc_deleted
            .load(std::sync::atomic::Ordering::Relaxed)
            >= 356
    );
    // The newest survive.
    assert!(t.exists(&id(399)));
}

#[test]
fn two_tiers_of_one_process_writing_the_same_blocks_at_once_leave_whole_copies() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (tier(dir.path(), 1 << 20, 0), tier(dir.path(), 1 << 20, 0));
    let bar = Barrier::new(2);
    let failed = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for t in [&a, &b] {
            let (bar, failed) = (&bar, &failed);
            s.spawn(move || {
                for n in 0..200 {
                    bar.wait();
                    if let Err(e) = t.write_block(&id(n), shards(n)) {
                        failed.lock().unwrap().push(format!("block {n}: {e}"));
                    }
                }
            });
        }
    });
    let failed = failed.into_inner().unwrap();
    assert!(
        failed.is_empty(),
        "both writes must succeed: {} failed, first {:?}",
        failed.len(),
        failed.first()
    );
    assert_eq!(files(dir.path()), (200, 0));
    let fresh = tier(dir.path(), 1 << 20, 0);
    for n in 0..200 {
        let got = fresh.read_shards(&id(n), &[0, 1]).unwrap().expect("whole");
        for (s, buf) in got.iter().enumerate() {
            assert_eq!(
                buf.as_slice(),
                &pattern(n * 10 + s as u64, GEO.shard_bytes)[..]
            );
        }
    }
}

/// One instance: a private pool, the shared directory, capacity `cap`.
fn instance(
    dev: &Arc<HostDevice>,
    dir: &std::path::Path,
    cap: u64,
) -> TieredBlockStore<HostDevice> {
    let pool = ClockPool::open(PoolConfig {
        shard_bytes: GEO.shard_bytes,
        slots: 16,
        ways: 16,
        mode: PoolMode::Private,
        load_timeout: Duration::from_secs(1),
        dirty_timeout: Duration::from_secs(60),
    })
    .unwrap();
    let mut cfg = DiskConfig::new(dir, GEO, cap);
    cfg.gc_every = 8;
    let disk = DiskTier::open(cfg, engine()).unwrap();
    TieredBlockStore::new(Arc::clone(dev), pool, disk, BlockStoreConfig::default()).unwrap()
}

fn device_block(dev: &HostDevice, n: u64) -> Memory {
    common::device_block(dev, GEO, |s| {
        pattern(n * 10 + u64::from(s), GEO.shard_bytes)
    })
}

fn items(n: u64, mem: &Memory) -> Vec<TaskItem> {
    common::items(id(n), GEO, mem)
}

/// Child of the multi-instance test (run with `--ignored`): dumps its own
/// blocks and the common ones, loads every block anyone may have written,
/// checks each byte; prints its counts.
#[test]
#[ignore = "child process of the multi-instance test"]
fn shared_dir_child() {
    let dir = std::path::PathBuf::from(std::env::var("UCM_SHARED_DIR").expect("run by a parent"));
    let me: u64 = std::env::var("UCM_SHARED_ME").unwrap().parse().unwrap();
    let secs: u64 = std::env::var("UCM_SHARED_SECS").unwrap().parse().unwrap();
    let dev = Arc::new(HostDevice::new());
    let st = instance(&dev, &dir, 48);
    let dst = dev.alloc_device(GEO.shard_bytes * 2).unwrap();
    let (mut own, mut other, mut missed, mut round) = (0u64, 0u64, 0u64, 0u64);
    let end = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < end {
        // Common blocks 0..16 (every instance writes the same bytes), own
        // blocks 1000*me + round.
        for n in [round % 16, 1000 * (me + 1) + round] {
            let src = device_block(&dev, n);
            let t = st.dump(items(n, &src), None).unwrap();
            assert!(t.wait().iter().all(|(_, _, o)| *o == ItemOutcome::Ok));
            t.wait_durable();
        }
        // Loads: the common blocks and the other instances' recent ones.
        for i in 0..4u64 {
            let n = if i < 2 {
                (round + i * 5) % 16
            } else {
                let peer = (me + i) % 4;
                1000 * (peer + 1) + round.saturating_sub(i)
            };
            let outs = st.load(items(n, &dst)).unwrap().wait();
            // Another instance's GC may take one shard's file and not yet
            // the other's: a partial miss. Every shard served must still
            // hold its own bytes, and nothing may fail.
            assert!(
                outs.iter()
                    .all(|(_, _, o)| matches!(o, ItemOutcome::Ok | ItemOutcome::Miss)),
                "instance {me}: block {n}: {outs:?}"
            );
            // Device memory of the host device: read it back via a copy.
            let got = common::read_device(&dev, &dst, GEO.shard_bytes * 2);
            for (_, sh, o) in &outs {
                if *o != ItemOutcome::Ok {
                    continue;
                }
                let sh = *sh as usize;
                let want = pattern(n * 10 + sh as u64, GEO.shard_bytes);
                assert!(
                    got[sh * GEO.shard_bytes..(sh + 1) * GEO.shard_bytes] == want[..],
                    "WRONG HIT: block {n} shard {sh} in instance {me}"
                );
            }
            if outs.iter().all(|(_, _, o)| *o == ItemOutcome::Ok) {
                if n >= 1000 && n / 1000 != me + 1 {
                    other += 1;
                } else {
                    own += 1;
                }
            } else {
                missed += 1;
            }
        }
        round += 1;
    }
    let deleted = st
        .disk()
        .unwrap()
        .stats()
        .gc_deleted
        .load(std::sync::atomic::Ordering::Relaxed);
    println!("COUNTS own={own} other={other} missed={missed} rounds={round} gc_deleted={deleted}");
}

fn child(dir: &std::path::Path, me: u64, secs: u64) -> std::process::Child {
    std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "shared_dir_child",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("UCM_SHARED_DIR", dir)
        .env("UCM_SHARED_ME", me.to_string())
        .env("UCM_SHARED_SECS", secs.to_string())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

fn count(out: &str, key: &str) -> u64 {
    out.split(&format!("{key}="))
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key} in {out:?}"))
}

#[test]
fn four_instances_share_one_directory_under_gc_and_a_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let mut kids: Vec<_> = (0..4).map(|me| child(dir.path(), me, 4)).collect();
    // Instance 3 is killed while it dumps.
    std::thread::sleep(Duration::from_millis(1500));
    kids[3].kill().unwrap();
    kids[3].wait().unwrap();
    let (mut other, mut deleted) = (0, 0);
    for (me, k) in kids.into_iter().enumerate().take(3) {
        let o = k.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&o.stdout).to_string();
        assert!(
            o.status.success(),
            "instance {me} failed: {text}\n{}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(count(&text, "rounds") > 0, "instance {me} kept serving");
        other += count(&text, "other");
        deleted += count(&text, "gc_deleted");
    }
    assert!(other > 0, "instances hit blocks that others wrote");
    assert!(deleted > 0, "the capacity was enforced by GC");
    // The directory holds about its capacity (each instance may write
    // `gc_every` blocks past a count), and a new instance clears the
    // killed one's temporary files.
    let (blocks, _) = files(dir.path());
    assert!(
        blocks <= 48 + 4 * 8 + 8,
        "{blocks} block files for a capacity of 48"
    );
    drop(tier(dir.path(), 48, 0));
    assert_eq!(files(dir.path()).1, 0, "no temporary file left");
}
