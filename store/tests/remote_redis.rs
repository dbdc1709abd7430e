//! The remote tier on a Redis cluster of 3 masters on loopback: two
//! instances share blocks through it; a damaged or incomplete block is a
//! miss and is deleted; keys evicted by the server's own `maxmemory`
//! policy are misses only; a master killed mid-dump gives reported
//! failures and misses, never wrong bytes; a cluster that is down misses
//! and fails within the timeout. Skips without `redis-server` unless
//! `UCM_REQUIRE_REDIS=1`.

mod common;
mod redis_cluster;

use std::time::{Duration, Instant};

use common::remote::{hex, id, read_checked, shard, write, GEO};
use redis_cluster::Cluster;
use ucm_store::{BlockId, Geometry, RemoteConfig, RemoteTier, StoreError};

fn tier(url: &str, ns: &str) -> RemoteTier {
    let mut cfg = RemoteConfig::from_url(url, ns, GEO).unwrap();
    cfg.timeout = Duration::from_millis(800);
    RemoteTier::new(cfg).unwrap()
}

#[test]
fn two_instances_share_blocks_through_the_cluster() {
    let Some(c) = Cluster::start(3) else { return };
    let a = tier(&c.url(), "share");
    let b = tier(&c.url(), "share");
    assert!(write(&a, 0..64).iter().all(Result::is_ok));
    let ids: Vec<BlockId> = (0..70).map(id).collect();
    let seen = b.lookup(&ids);
    assert!(seen[..64].iter().all(|&x| x) && !seen[64..].iter().any(|&x| x));
    assert_eq!(b.lookup_on_prefix(&ids), 64);
    for n in 0..64 {
        assert_eq!(read_checked(&b, n).unwrap(), Some(()), "block {n}");
    }
    // Some shards only, in any order.
    let got = b.read_shards(&id(5), &[3, 1]).unwrap().unwrap();
    assert_eq!(got, vec![shard(5, 3), shard(5, 1)]);
    // Blocks spread over every master (the hash tag keeps a block on one).
    for i in 0..3 {
        let keys = c.cli(i, &["dbsize"]);
        assert!(
            keys.trim().parse::<u64>().unwrap() > 0,
            "master {i} holds nothing"
        );
    }
    // Another namespace, or another geometry, sees none of them.
    assert!(!tier(&c.url(), "other").lookup(&ids).iter().any(|&x| x));
    let mut cfg = RemoteConfig::from_url(
        &c.url(),
        "share",
        Geometry {
            shard_bytes: 8192,
            shards_per_block: 4,
        },
    )
    .unwrap();
    cfg.timeout = Duration::from_millis(800);
    assert!(!RemoteTier::new(cfg)
        .unwrap()
        .lookup(&ids)
        .iter()
        .any(|&x| x));
}

#[test]
fn a_damaged_or_incomplete_block_is_a_miss_and_is_deleted() {
    let Some(c) = Cluster::start(3) else { return };
    let t = tier(&c.url(), "damage");
    assert!(write(&t, 0..3).iter().all(Result::is_ok));
    let key = |n: u64, part: &str| format!("ucm:damage:4096x4:{{{}}}:{part}", hex(&id(n)));
    // Block 0: a shard overwritten in place (another length, then the same
    // length with other bytes).
    c.cli(0, &["set", &key(0, "2"), "junk"]);
    assert_eq!(read_checked(&t, 0).unwrap(), None);
    assert!(!t.lookup(&[id(0)])[0], "the damaged block was deleted");
    assert_eq!(c.cli(0, &["exists", &key(0, "1")]).trim(), "0");
    // Block 1: a shard gone (as the server's eviction would leave it).
    c.cli(0, &["del", &key(1, "3")]);
    assert_eq!(read_checked(&t, 1).unwrap(), None);
    assert!(!t.lookup(&[id(1)])[0]);
    // Block 2: the header damaged.
    c.cli(0, &["setrange", &key(2, "pub"), "30", "X"]);
    assert_eq!(read_checked(&t, 2).unwrap(), None);
    assert!(!t.lookup(&[id(2)])[0]);
    assert_eq!(
        t.stats().damaged.load(std::sync::atomic::Ordering::Relaxed),
        3
    );
    // A same-length shard of other bytes.
    assert!(write(&t, [7]).iter().all(Result::is_ok));
    let other = "z".repeat(GEO.shard_bytes);
    c.cli(0, &["set", &key(7, "0"), &other]);
    assert_eq!(read_checked(&t, 7).unwrap(), None);
}

#[test]
fn keys_evicted_by_the_servers_maxmemory_policy_are_misses_only() {
    let Some(c) = Cluster::start(3) else { return };
    // Each master may hold 1 MiB more than it uses empty.
    for i in 0..3 {
        let info = c.cli(i, &["info", "memory"]);
        let used: u64 = info
            .lines()
            .find_map(|l| l.strip_prefix("used_memory:"))
            .and_then(|v| v.trim().parse().ok())
            .expect("used_memory");
        let limit = (used + (1 << 20)).to_string();
        c.cli(i, &["config", "set", "maxmemory", &limit]);
        c.cli(i, &["config", "set", "maxmemory-policy", "allkeys-lru"]);
    }
    let t = tier(&c.url(), "evict");
    // 400 blocks x 16 KiB: about 3x what the cluster may hold.
    let mut ok = Vec::new();
    for chunk in (0..400u64).collect::<Vec<_>>().chunks(20) {
        for (n, r) in chunk.iter().zip(write(&t, chunk.iter().copied())) {
            if r.is_ok() {
                ok.push(*n);
            }
        }
    }
    assert!(!ok.is_empty());
    let (mut hits, mut misses) = (0, 0);
    for &n in &ok {
        match read_checked(&t, n).unwrap() {
            Some(()) => hits += 1,
            None => misses += 1,
        }
    }
    let mem = c.cli(0, &["info", "memory"]);
    assert!(
        misses > 0,
        "the servers evicted nothing ({hits} hits of {} written): {mem}",
        ok.len()
    );
    assert!(hits > 0, "nothing survived");
}

#[test]
fn a_master_killed_mid_dump_fails_writes_and_misses_reads_but_never_serves_wrong_bytes() {
    let Some(mut c) = Cluster::start(3) else {
        return;
    };
    let t = std::sync::Arc::new(tier(&c.url(), "kill"));
    let writer = {
        let t = std::sync::Arc::clone(&t);
        std::thread::spawn(move || {
            let (mut ok, mut failed) = (Vec::new(), 0);
            let mut slowest = Duration::ZERO;
            for round in 0..60u64 {
                let ns: Vec<u64> = (round * 8..round * 8 + 8).collect();
                let started = Instant::now();
                let r = write(&t, ns.iter().copied());
                slowest = slowest.max(started.elapsed());
                for (n, r) in ns.iter().zip(r) {
                    match r {
                        Ok(()) => ok.push(*n),
                        Err(StoreError::Remote { .. }) => failed += 1,
                        Err(e) => panic!("unexpected error {e}"),
                    }
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            (ok, failed, slowest)
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    c.kill(1);
    let (ok, failed, slowest) = writer.join().unwrap();
    assert!(failed > 0, "no write failed after a master died");
    assert!(!ok.is_empty());
    // Each call ends within a few timeouts (connect + response, a retry).
    assert!(slowest < Duration::from_secs(8), "a write took {slowest:?}");
    let (mut hits, mut lost) = (0, 0);
    for &n in &ok {
        match read_checked(&t, n) {
            Ok(Some(())) => hits += 1,
            Ok(None) | Err(StoreError::Remote { .. }) => lost += 1,
            Err(e) => panic!("unexpected error {e}"),
        }
    }
    assert!(hits > 0, "the surviving masters serve their blocks");
    assert!(lost > 0, "the dead master's blocks are misses");
    let started = Instant::now();
    let seen = t.lookup(&ok.iter().map(|&n| id(n)).collect::<Vec<_>>());
    assert!(started.elapsed() < Duration::from_secs(8));
    assert_eq!(seen.len(), ok.len());
}

#[test]
fn a_cluster_that_is_down_misses_and_fails_within_the_timeout() {
    // Nothing listens there (a port of a closed listener).
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let mut cfg =
        RemoteConfig::from_url(&format!("redis://127.0.0.1:{port}"), "down", GEO).unwrap();
    cfg.timeout = Duration::from_millis(300);
    let t = RemoteTier::new(cfg).unwrap();
    let started = Instant::now();
    assert_eq!(t.lookup(&[id(1), id(2)]), vec![false, false]);
    let w = write(&t, [1]);
    assert!(matches!(w[0], Err(StoreError::Remote { .. })), "{:?}", w[0]);
    assert!(matches!(
        read_checked(&t, 1),
        Err(StoreError::Remote { .. })
    ));
    assert!(
        started.elapsed() < Duration::from_secs(6),
        "{:?}",
        started.elapsed()
    );
    assert!(t.stats().errors.load(std::sync::atomic::Ordering::Relaxed) >= 3);
}

#[test]
fn bad_urls_namespaces_and_blocks_are_refused() {
    for url in [
        "http://h:1",
        "redis://",
        "redis://host",
        "redis://h:0",
        "redis://h:99999",
        "redis://a:1,",
    ] {
        assert!(
            matches!(
                RemoteConfig::from_url(url, "ns", GEO),
                Err(StoreError::Config(_))
            ),
            "{url}"
        );
    }
    for ns in ["", "a{b}", "a b", &"x".repeat(65)] {
        assert!(
            RemoteConfig::from_url("redis://h:1", ns, GEO).is_err(),
            "{ns:?}"
        );
    }
    let c = RemoteConfig::from_url("redis://a:1,valkey://b:2, c:3", "ns", GEO).unwrap();
    assert_eq!(
        c.endpoint,
        ucm_store::Endpoint::Redis(vec![
            "redis://a:1".into(),
            "redis://b:2".into(),
            "redis://c:3".into()
        ])
    );
    // A block of the wrong shape is refused before anything is sent.
    let t = RemoteTier::new(c).unwrap();
    let short = [0u8; 10];
    let r = t.write_blocks(&[(id(1), vec![&short[..]])]);
    assert!(matches!(r[0].1, Err(StoreError::Config(_))));
}

mod store {
    //! The remote tier below a TieredBlockStore's disk tier: instances with
    //! their own pools and disks share blocks through the cluster.

    use std::sync::Arc;
    use std::time::Duration;

    use super::{common, id, shard, Cluster, GEO};
    use ucm_device::{Device, HostDevice, IoEngineConfig, IoEngineKind};
    use ucm_store::{
        BlockStore, BlockStoreConfig, DiskConfig, DiskTier, ItemOutcome, RemoteConfig, RemoteTier,
        TieredBlockStore,
    };

    fn instance(
        dev: &Arc<HostDevice>,
        dir: &std::path::Path,
        url: &str,
    ) -> TieredBlockStore<HostDevice> {
        let pool = common::remote::pool(64);
        let engine = Arc::from(IoEngineConfig::new(IoEngineKind::Auto).build().unwrap());
        let disk = DiskTier::open(DiskConfig::new(dir, GEO, 1 << 16), engine).unwrap();
        let mut rc = RemoteConfig::from_url(url, "store", GEO).unwrap();
        rc.timeout = Duration::from_millis(800);
        let remote = RemoteTier::new(rc).unwrap();
        TieredBlockStore::with_remote(
            Arc::clone(dev),
            pool,
            disk,
            Some(remote),
            BlockStoreConfig::default(),
        )
        .unwrap()
    }

    #[test]
    fn an_instance_loads_what_another_dumped_through_the_cluster() {
        let Some(mut c) = Cluster::start(3) else {
            return;
        };
        let dev = Arc::new(HostDevice::new());
        let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let a = instance(&dev, da.path(), &c.url());
        let b = instance(&dev, db.path(), &c.url());
        let len = GEO.shard_bytes * GEO.shards_per_block as usize;
        for n in 0..8 {
            let d = common::device_block(&dev, GEO, |s| shard(n, s));
            let t = a.dump(common::items(id(n), GEO, &d), None).unwrap();
            assert!(t.wait().iter().all(|(_, _, o)| *o == ItemOutcome::Ok));
            t.wait_durable();
        }
        let ids: Vec<_> = (0..10).map(id).collect();
        // B's pool and disk are empty: the remote tier answers.
        assert_eq!(b.lookup(&ids), [vec![true; 8], vec![false; 2]].concat());
        assert_eq!(b.lookup_on_prefix(&ids), 8);
        let dst = dev.alloc_device(len).unwrap();
        for n in 0..8 {
            let outs = b.load(common::items(id(n), GEO, &dst)).unwrap().wait();
            assert!(
                outs.iter().all(|(_, _, o)| *o == ItemOutcome::Ok),
                "{outs:?}"
            );
            let got = common::read_device(&dev, &dst, len);
            for s in 0..GEO.shards_per_block {
                let at = s as usize * GEO.shard_bytes;
                assert!(
                    got[at..at + GEO.shard_bytes] == shard(n, s)[..],
                    "WRONG: {n}/{s}"
                );
            }
        }
        assert!(
            b.stats()
                .remote_reads
                .load(std::sync::atomic::Ordering::Relaxed)
                >= 8 * 4
        );
        // Block 9 was never dumped: a miss.
        let outs = b.load(common::items(id(9), GEO, &dst)).unwrap().wait();
        assert!(outs.iter().all(|(_, _, o)| *o == ItemOutcome::Miss));
        // The cluster gone: a third instance misses (within the timeout),
        // and A still serves from its own tiers.
        for i in 0..3 {
            c.kill(i);
        }
        let dc = tempfile::tempdir().unwrap();
        let cstore = instance(&dev, dc.path(), &c.url());
        let started = std::time::Instant::now();
        assert_eq!(cstore.lookup(&ids[..2]), vec![false, false]);
        let outs = cstore.load(common::items(id(0), GEO, &dst)).unwrap().wait();
        assert!(
            outs.iter().all(|(_, _, o)| *o == ItemOutcome::Miss),
            "{outs:?}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{:?}",
            started.elapsed()
        );
        let outs = a.load(common::items(id(0), GEO, &dst)).unwrap().wait();
        assert!(outs.iter().all(|(_, _, o)| *o == ItemOutcome::Ok));
    }
}

mod diskless {
    //! A store without a disk tier: the cluster is its persistent tier.

    use std::sync::Arc;
    use std::time::Duration;

    use super::{common, id, shard, Cluster, GEO};
    use ucm_device::{Device, HostDevice};
    use ucm_store::{
        BlockStore, BlockStoreConfig, Durability, ItemOutcome, RemoteConfig, RemoteTier,
        StoreError, TieredBlockStore,
    };

    fn instance(dev: &Arc<HostDevice>, url: &str) -> TieredBlockStore<HostDevice> {
        let pool = common::remote::pool(64);
        let mut rc = RemoteConfig::from_url(url, "diskless", GEO).unwrap();
        rc.timeout = Duration::from_millis(800);
        TieredBlockStore::without_disk(
            Arc::clone(dev),
            pool,
            vec![RemoteTier::new(rc).unwrap()],
            BlockStoreConfig {
                write_attempts: 2,
                ..BlockStoreConfig::default()
            },
        )
        .unwrap()
    }

    #[test]
    fn a_store_without_a_disk_is_durable_in_the_cluster_and_fails_without_it() {
        let Some(mut c) = Cluster::start(3) else {
            return;
        };
        let dev = Arc::new(HostDevice::new());
        let a = instance(&dev, &c.url());
        assert!(a.disk().is_none());
        for n in 0..4 {
            let d = common::device_block(&dev, GEO, |s| shard(n, s));
            let t = a.dump(common::items(id(n), GEO, &d), None).unwrap();
            assert!(t.wait().iter().all(|(_, _, o)| *o == ItemOutcome::Ok));
            assert!(t
                .wait_durable()
                .iter()
                .all(|(_, d)| *d == Durability::Durable));
        }
        // Another diskless instance loads every byte from the cluster.
        let b = instance(&dev, &c.url());
        let ids: Vec<_> = (0..5).map(id).collect();
        assert_eq!(b.lookup(&ids), vec![true, true, true, true, false]);
        let len = GEO.shard_bytes * GEO.shards_per_block as usize;
        let dst = dev.alloc_device(len).unwrap();
        for n in 0..4 {
            let outs = b.load(common::items(id(n), GEO, &dst)).unwrap().wait();
            assert!(
                outs.iter().all(|(_, _, o)| *o == ItemOutcome::Ok),
                "{outs:?}"
            );
            let got = common::read_device(&dev, &dst, len);
            for s in 0..GEO.shards_per_block {
                let at = s as usize * GEO.shard_bytes;
                assert!(
                    got[at..at + GEO.shard_bytes] == shard(n, s)[..],
                    "WRONG: {n}/{s}"
                );
            }
        }
        // The cluster gone: a dump is not durable, and says why.
        for i in 0..3 {
            c.kill(i);
        }
        let d = common::device_block(&dev, GEO, |s| shard(9, s));
        let t = a.dump(common::items(id(9), GEO, &d), None).unwrap();
        t.wait();
        let durability = t.wait_durable();
        assert!(
            durability.iter().all(|(_, d)| *d != Durability::Durable),
            "{durability:?}"
        );
        assert!(
            a.stats()
                .write_failures
                .load(std::sync::atomic::Ordering::Relaxed)
                >= 1
        );
        // No tier at all is refused.
        let pool = common::remote::pool(8);
        assert!(matches!(
            TieredBlockStore::without_disk(
                Arc::clone(&dev),
                pool,
                vec![],
                BlockStoreConfig::default()
            ),
            Err(StoreError::Config(_))
        ));
    }
}
