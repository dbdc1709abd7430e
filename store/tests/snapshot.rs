//! The SnapshotStore on the host device: round trip, copy-on-write `get`
//! (a mutated copy never reaches the stored checkpoint or another reader),
//! zero-copy `donate`, `exists`/`enumerate` across a reopen (warm restart),
//! and clear errors.

use std::sync::Arc;
use std::time::Duration;

use ucm_device::conformance::pattern;
use ucm_device::{Device, HostDevice, IoEngineConfig, IoEngineKind, Memory};
use ucm_store::pool::PoolMode;
use ucm_store::{
    BlockStoreConfig, ClockPool, DiskConfig, DiskTier, Durability, Geometry, ItemOutcome,
    PoolConfig, SnapshotKey, SnapshotStore, StateItem, StoreError, TieredBlockStore,
    TieredSnapshotStore,
};

const GEO: Geometry = Geometry {
    shard_bytes: 8192,
    shards_per_block: 3,
};
const GROUP: u32 = 4;

fn open(dev: &Arc<HostDevice>, dir: &std::path::Path) -> TieredSnapshotStore<HostDevice> {
    let pool = ClockPool::open(PoolConfig {
        shard_bytes: GEO.shard_bytes,
        slots: 64,
        ways: 64,
        mode: PoolMode::Private,
        load_timeout: Duration::from_secs(1),
        dirty_timeout: Duration::from_secs(60),
    })
    .unwrap();
    let engine = Arc::from(IoEngineConfig::new(IoEngineKind::Auto).build().unwrap());
    let disk = DiskTier::open(DiskConfig::new(dir, GEO, 10_000), engine).unwrap();
    let blocks =
        TieredBlockStore::new(Arc::clone(dev), pool, disk, BlockStoreConfig::default()).unwrap();
    TieredSnapshotStore::new(GROUP, blocks)
}

fn key(p: u64) -> SnapshotKey {
    let mut hash = [0u8; 16];
    hash[..8].copy_from_slice(&p.to_le_bytes());
    hash[15] = 0x5a;
    SnapshotKey {
        group: GROUP,
        position: p,
        hash,
    }
}

/// Copies `host` bytes into device region `d` at `at`.
fn upload(dev: &HostDevice, d: &Memory, at: usize, bytes: &[u8]) {
    ucm_device::conformance::upload(dev, d, at, bytes).unwrap();
}

/// A device state buffer of all layers, layer `s` holding
/// `pattern(seed + s)`.
fn state(dev: &HostDevice, seed: u64) -> Memory {
    let m = empty(dev);
    for s in 0..3u64 {
        upload(
            dev,
            &m,
            s as usize * GEO.shard_bytes,
            &pattern(seed + s, GEO.shard_bytes),
        );
    }
    m
}

fn empty(dev: &HostDevice) -> Memory {
    dev.alloc_device(GEO.shard_bytes * 3).unwrap()
}

fn items(m: &Memory) -> Vec<StateItem> {
    (0..3)
        .map(|s| StateItem {
            shard: s,
            memory: m.clone(),
            offset: s as usize * GEO.shard_bytes,
        })
        .collect()
}

fn layer(dev: &HostDevice, m: &Memory, s: usize) -> Vec<u8> {
    ucm_device::conformance::download(dev, m, s * GEO.shard_bytes, GEO.shard_bytes).unwrap()
}

fn all_ok(v: &[(ucm_store::BlockId, u32, ItemOutcome)]) -> bool {
    v.iter().all(|(_, _, o)| *o == ItemOutcome::Ok)
}

#[test]
fn put_get_round_trip_and_copy_on_write() {
    let dir = tempfile::tempdir().unwrap();
    let dev = Arc::new(HostDevice::new());
    let st = open(&dev, dir.path());
    let src = state(&dev, 1000);
    let t = st.put(&key(2304), items(&src), None).unwrap();
    let w = t.wait();
    assert!(all_ok(&w), "{w:?}");
    assert!(t
        .wait_durable()
        .iter()
        .all(|(_, d)| *d == Durability::Durable));
    assert!(st.exists(&key(2304)));
    assert!(!st.exists(&key(2368)));

    // Two readers get private copies.
    let a = empty(&dev);
    let b = empty(&dev);
    assert!(all_ok(&st.get(&key(2304), items(&a)).unwrap().wait()));
    assert!(all_ok(&st.get(&key(2304), items(&b)).unwrap().wait()));
    // Reader A mutates its copy (as a resumed request advances its state).
    for s in 0..3 {
        upload(&dev, &a, s * GEO.shard_bytes, &vec![0xee; GEO.shard_bytes]);
    }
    // Reader B, the pool copy, a fresh reader and the disk copy are intact.
    let c = empty(&dev);
    assert!(all_ok(&st.get(&key(2304), items(&c)).unwrap().wait()));
    let disk = st
        .blocks()
        .disk()
        .unwrap()
        .read_shards(&key(2304).hash, &[0, 1, 2])
        .unwrap()
        .expect("on disk");
    for (s, on_disk) in disk.iter().enumerate() {
        let want = pattern(1000 + s as u64, GEO.shard_bytes);
        assert_eq!(layer(&dev, &b, s), want, "reader B saw reader A's write");
        assert_eq!(layer(&dev, &c, s), want, "the stored checkpoint changed");
        assert_eq!(on_disk.as_slice(), &want[..], "the disk copy changed");
    }
}

#[test]
fn donate_hands_slots_over_without_a_copy() {
    let dir = tempfile::tempdir().unwrap();
    let dev = Arc::new(HostDevice::new());
    let st = open(&dev, dir.path());
    let k = key(9984);
    let mut leases = Vec::new();
    let mut slots = Vec::new();
    for s in 0..3u32 {
        let mut l = st.lease(&k, s).unwrap().expect("not stored yet");
        // The engine's live state is this slot: it computes into it.
        l.data_mut()
            .copy_from_slice(&pattern(77 + u64::from(s), GEO.shard_bytes));
        assert_eq!(
            l.memory().len(),
            st.blocks().pool().slots() * GEO.shard_bytes
        );
        assert_eq!(l.offset(), st.blocks().pool().data_at(l.slot()));
        slots.push(l.slot());
        leases.push(l);
    }
    assert!(!st.exists(&k), "nothing is visible before the donation");
    let durable = st.donate(leases);
    assert_eq!(durable, vec![(k.hash, Durability::Durable)]);
    assert_eq!(
        st.blocks()
            .stats()
            .donated
            .load(std::sync::atomic::Ordering::Relaxed),
        3
    );
    // The very slots now hold the checkpoint: no copy was made.
    for s in 0..3u32 {
        match st.blocks().pool().acquire((k.hash, s)).unwrap() {
            Some(ucm_store::Acquire::Hit(r)) => {
                assert_eq!(r.slot(), slots[s as usize]);
                assert_eq!(r.data(), &pattern(77 + u64::from(s), GEO.shard_bytes)[..]);
            }
            _ => panic!("donated shard {s} not in the pool"),
        }
    }
    let out = empty(&dev);
    assert!(all_ok(&st.get(&k, items(&out)).unwrap().wait()));
    assert_eq!(layer(&dev, &out, 2), pattern(79, GEO.shard_bytes));
    // Leasing a stored key has nothing to hand over.
    assert!(st.lease(&k, 0).unwrap().is_none());
}

#[test]
fn an_abandoned_lease_is_never_served() {
    let dir = tempfile::tempdir().unwrap();
    let dev = Arc::new(HostDevice::new());
    let st = open(&dev, dir.path());
    let k = key(64);
    {
        let mut l = st.lease(&k, 0).unwrap().unwrap();
        l.data_mut()[0] = 1; // half-written, then dropped
    }
    assert!(!st.exists(&k));
    let out = empty(&dev);
    let r = st.get(&k, items(&out)).unwrap().wait();
    assert!(r.iter().all(|(_, _, o)| *o != ItemOutcome::Ok), "{r:?}");
}

#[test]
fn enumerate_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let dev = Arc::new(HostDevice::new());
    let positions = [128u64, 1024, 2048, 2304];
    {
        let st = open(&dev, dir.path());
        for &p in &positions {
            let src = state(&dev, p);
            let t = st.put(&key(p), items(&src), None).unwrap();
            t.wait_durable();
        }
    }
    // A new process (fresh private pool) over the same directory.
    let st = open(&dev, dir.path());
    let mut got = st.enumerate();
    got.sort();
    let mut want: Vec<_> = positions.iter().map(|&p| key(p).hash).collect();
    want.sort();
    assert_eq!(got, want);
    for &p in &positions {
        assert!(st.exists(&key(p)));
        let out = empty(&dev);
        assert!(all_ok(&st.get(&key(p), items(&out)).unwrap().wait()));
        assert_eq!(layer(&dev, &out, 1), pattern(p + 1, GEO.shard_bytes));
    }
}

#[test]
fn a_key_of_another_group_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let dev = Arc::new(HostDevice::new());
    let st = open(&dev, dir.path());
    let mut k = key(64);
    k.group = GROUP + 1;
    let m = state(&dev, 1);
    assert!(matches!(
        st.put(&k, items(&m), None),
        Err(StoreError::WrongGroup {
            got: 5,
            expected: 4
        })
    ));
    assert!(matches!(
        st.get(&k, items(&m)),
        Err(StoreError::WrongGroup { .. })
    ));
    assert!(!st.exists(&k));
    assert!(matches!(
        st.lease(&key(64), 7),
        Err(StoreError::ShardOutOfRange { .. })
    ));
}
