//! The remote tier on S3-compatible object storage (the cold tier), against
//! a local `moto` server: two instances share blocks through a bucket (one
//! object per block); a damaged or truncated block is a miss (and is
//! deleted), an expired one a plain miss; a
//! server that goes away mid-dump fails the writes and misses the reads
//! within the timeout, never serving wrong bytes; below a Redis cluster,
//! the bucket serves what the cluster lost. Skips without `moto_server`
//! unless `UCM_REQUIRE_S3=1`.

mod common;
mod redis_cluster;
mod s3_server;

use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use common::remote::{hex, id, read_checked, shard, write, GEO};
use s3_server::S3Server;
use ucm_store::{BlockId, Endpoint, Geometry, RemoteConfig, RemoteTier, S3Location, StoreError};

fn tier_at(url: &str, ns: &str, geo: Geometry) -> RemoteTier {
    s3_server::credentials();
    let mut cfg = RemoteConfig::from_url(url, ns, geo).unwrap();
    cfg.timeout = Duration::from_millis(1500);
    RemoteTier::new(cfg).unwrap()
}

fn tier(url: &str, ns: &str) -> RemoteTier {
    tier_at(url, ns, GEO)
}

#[test]
fn two_instances_share_blocks_through_the_bucket() {
    let Some(srv) = S3Server::start() else { return };
    let a = tier(&srv.url("share"), "g");
    let b = tier(&srv.url("share"), "g");
    let w = write(&a, 0..40);
    assert!(w.iter().all(Result::is_ok), "{:?}", w[0]);
    assert_eq!(a.stats().written.load(Relaxed), 40);
    let ids: Vec<BlockId> = (0..45).map(id).collect();
    let seen = b.lookup(&ids);
    assert!(seen[..40].iter().all(|&x| x) && !seen[40..].iter().any(|&x| x));
    assert_eq!(b.lookup_on_prefix(&ids), 40);
    for n in 0..40 {
        assert_eq!(read_checked(&b, n).unwrap(), Some(()), "block {n}");
    }
    let got = b.read_shards(&id(5), &[3, 1]).unwrap().unwrap();
    assert_eq!(got, vec![shard(5, 3), shard(5, 1)]);
    // The layout: one object per block, under the URL's prefix, the
    // namespace and the geometry.
    let keys = srv.keys("share/ucm/g/4096x4/");
    assert_eq!(keys.len(), 40, "{:?}", &keys[..keys.len().min(5)]);
    assert!(keys.contains(&format!("share/ucm/g/4096x4/{}/block", hex(&id(0)))));
    // Another prefix, namespace or geometry sees none of them.
    let other_geo = Geometry {
        shard_bytes: 8192,
        shards_per_block: 4,
    };
    for t in [
        tier(&srv.url("other"), "g"),
        tier(&srv.url("share"), "h"),
        tier_at(&srv.url("share"), "g", other_geo),
    ] {
        assert!(!t.lookup(&ids).iter().any(|&x| x), "{t:?}");
    }
}

#[test]
fn a_damaged_truncated_or_expired_block_is_a_miss_and_is_deleted() {
    let Some(srv) = S3Server::start() else { return };
    let t = tier(&srv.url("damage"), "g");
    assert!(write(&t, 0..4).iter().all(Result::is_ok));
    let key = |n: u64| format!("damage/ucm/g/4096x4/{}/block", hex(&id(n)));
    let hl = srv.get(&key(0)).unwrap().len() - 4 * GEO.shard_bytes;
    // Block 0: one byte of shard 2 changed in place.
    let mut o = srv.get(&key(0)).unwrap();
    o[hl + 2 * GEO.shard_bytes + 100] ^= 1;
    srv.put(&key(0), &o);
    assert_eq!(read_checked(&t, 0).unwrap(), None);
    assert!(!t.lookup(&[id(0)])[0], "the damaged block was deleted");
    assert!(srv.get(&key(0)).is_none());
    // Block 1: truncated (a shard's range does not fit).
    let o = srv.get(&key(1)).unwrap();
    srv.put(&key(1), &o[..o.len() - 10]);
    assert_eq!(read_checked(&t, 1).unwrap(), None);
    assert!(
        srv.get(&key(1)).is_none(),
        "the truncated block was deleted"
    );
    // Block 2: the header damaged.
    let mut o = srv.get(&key(2)).unwrap();
    o[30] ^= 0xff;
    srv.put(&key(2), &o);
    assert_eq!(read_checked(&t, 2).unwrap(), None);
    assert!(!t.lookup(&[id(2)])[0]);
    assert_eq!(t.stats().damaged.load(Relaxed), 3);
    // Block 3: expired by a lifecycle rule: a plain miss.
    srv.delete(&key(3));
    assert!(!t.lookup(&[id(3)])[0]);
    assert_eq!(read_checked(&t, 3).unwrap(), None);
    assert_eq!(t.stats().damaged.load(Relaxed), 3);
}

#[test]
fn a_server_gone_mid_dump_fails_writes_and_misses_reads_within_the_timeout() {
    let Some(mut srv) = S3Server::start() else {
        return;
    };
    let url = srv.url("gone");
    let t = std::sync::Arc::new(tier(&url, "g"));
    assert!(write(&t, 0..4).iter().all(Result::is_ok));
    // A dump in flight when the server goes.
    let w = {
        let t = std::sync::Arc::clone(&t);
        std::thread::spawn(move || {
            let mut results = Vec::new();
            for k in 0..40u64 {
                results.extend(write(&t, (100 + k * 4)..(104 + k * 4)));
            }
            results
        })
    };
    std::thread::sleep(Duration::from_millis(150));
    srv.kill();
    let results = w.join().unwrap();
    let failed = results.iter().filter(|r| r.is_err()).count();
    assert!(failed > 0, "every write succeeded after the server died");
    for r in results.iter().filter_map(|r| r.as_ref().err()) {
        assert!(
            matches!(
                r,
                StoreError::ObjectStore { .. } | StoreError::Timeout { .. }
            ),
            "{r}"
        );
    }
    assert!(t.stats().errors.load(Relaxed) > 0);
    // Lookups and reads miss (or report the failure), within the bound.
    let started = Instant::now();
    assert_eq!(t.lookup(&[id(0), id(1)]), vec![false, false]);
    assert!(!matches!(read_checked(&t, 0), Ok(Some(()))));
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn bad_s3_urls_are_refused() {
    for url in [
        "s3://",
        "s3://AB",
        "s3://bucket_with_underscore",
        "s3://bucket/../x",
        "s3://bucket/a//b",
        "s3://bucket?endpoint=ftp://x",
        "s3://bucket?region=",
        "s3://bucket?other=1",
    ] {
        assert!(
            matches!(
                RemoteConfig::from_url(url, "ns", GEO),
                Err(StoreError::Config(_))
            ),
            "{url}"
        );
    }
    let c = RemoteConfig::from_url(
        "s3://my-bucket/a/b/?endpoint=http://127.0.0.1:9000/&region=eu-west-1",
        "ns",
        GEO,
    )
    .unwrap();
    assert_eq!(
        c.endpoint,
        Endpoint::S3(S3Location {
            bucket: "my-bucket".into(),
            prefix: "a/b".into(),
            endpoint: Some("http://127.0.0.1:9000".into()),
            region: Some("eu-west-1".into()),
        })
    );
}

mod store {
    //! The bucket below a TieredBlockStore, alone and below a Redis
    //! cluster.

    use std::sync::Arc;
    use std::time::Duration;

    use super::redis_cluster::Cluster;
    use super::{common, id, s3_server, shard, S3Server, GEO};
    use ucm_device::{Device, HostDevice, IoEngineConfig, IoEngineKind};
    use ucm_store::{
        BlockStore, BlockStoreConfig, DiskConfig, DiskTier, ItemOutcome, RemoteConfig, RemoteTier,
        TieredBlockStore,
    };

    fn instance(
        dev: &Arc<HostDevice>,
        dir: &std::path::Path,
        urls: &[String],
    ) -> TieredBlockStore<HostDevice> {
        s3_server::credentials();
        let pool = common::remote::pool(64);
        let engine = Arc::from(IoEngineConfig::new(IoEngineKind::Auto).build().unwrap());
        let disk = DiskTier::open(DiskConfig::new(dir, GEO, 1 << 16), engine).unwrap();
        let tiers = urls
            .iter()
            .map(|u| {
                let mut rc = RemoteConfig::from_url(u, "store", GEO).unwrap();
                rc.timeout = Duration::from_millis(1500);
                RemoteTier::new(rc).unwrap()
            })
            .collect();
        TieredBlockStore::with_tiers(
            Arc::clone(dev),
            pool,
            disk,
            tiers,
            BlockStoreConfig::default(),
        )
        .unwrap()
    }

    fn check_load(b: &TieredBlockStore<HostDevice>, dev: &Arc<HostDevice>, n: u64) {
        let len = GEO.shard_bytes * GEO.shards_per_block as usize;
        let dst = dev.alloc_device(len).unwrap();
        let outs = b.load(common::items(id(n), GEO, &dst)).unwrap().wait();
        assert!(
            outs.iter().all(|(_, _, o)| *o == ItemOutcome::Ok),
            "block {n}: {outs:?}"
        );
        let got = common::read_device(dev, &dst, len);
        for s in 0..GEO.shards_per_block {
            let at = s as usize * GEO.shard_bytes;
            assert!(
                got[at..at + GEO.shard_bytes] == shard(n, s)[..],
                "WRONG: {n}/{s}"
            );
        }
    }

    fn dump(a: &TieredBlockStore<HostDevice>, dev: &Arc<HostDevice>, n: u64) {
        let d = common::device_block(dev, GEO, |s| shard(n, s));
        let t = a.dump(common::items(id(n), GEO, &d), None).unwrap();
        assert!(t.wait().iter().all(|(_, _, o)| *o == ItemOutcome::Ok));
        t.wait_durable();
    }

    #[test]
    fn an_instance_loads_what_another_dumped_through_the_bucket() {
        let Some(srv) = S3Server::start() else { return };
        let dev = Arc::new(HostDevice::new());
        let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let urls = [srv.url("tiered")];
        let a = instance(&dev, da.path(), &urls);
        let b = instance(&dev, db.path(), &urls);
        for n in 0..6 {
            dump(&a, &dev, n);
        }
        let ids: Vec<_> = (0..8).map(id).collect();
        assert_eq!(b.lookup(&ids), [vec![true; 6], vec![false; 2]].concat());
        assert_eq!(b.lookup_on_prefix(&ids), 6);
        for n in 0..6 {
            check_load(&b, &dev, n);
        }
        assert!(
            b.stats()
                .remote_reads
                .load(std::sync::atomic::Ordering::Relaxed)
                >= 6 * 4
        );
    }

    #[test]
    fn below_a_cluster_the_bucket_serves_what_the_cluster_lost() {
        let Some(srv) = S3Server::start() else { return };
        let Some(c) = Cluster::start(3) else { return };
        let dev = Arc::new(HostDevice::new());
        let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let urls = [c.url(), srv.url("cold")];
        let a = instance(&dev, da.path(), &urls);
        for n in 0..4 {
            dump(&a, &dev, n);
        }
        // Both tiers hold every block.
        assert!(a.remotes()[0].lookup(&[id(0), id(3)]).iter().all(|&x| x));
        assert!(a.remotes()[1].lookup(&[id(0), id(3)]).iter().all(|&x| x));
        // The cluster loses everything (a flush, a restart without
        // persistence): the cold tier still serves, byte-exact.
        c.each(&["flushall"]);
        assert!(!a.remotes()[0].lookup(&[id(0)])[0]);
        let b = instance(&dev, db.path(), &urls);
        let ids: Vec<_> = (0..5).map(id).collect();
        assert_eq!(b.lookup(&ids), vec![true, true, true, true, false]);
        for n in 0..4 {
            check_load(&b, &dev, n);
        }
        let served: u64 = b.remotes()[1]
            .stats()
            .read
            .load(std::sync::atomic::Ordering::Relaxed);
        assert!(served >= 4, "{served} blocks read from the bucket");
    }
}
