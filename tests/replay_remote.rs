//! `ucm replay --remote` / `--cold`: the workload replay with a 3-master Redis
//! cluster below every store's disk tier (started on loopback by the
//! test): no wrong hit, and the blocks reach the cluster. Skips without
//! `redis-server` unless `UCM_REQUIRE_REDIS=1`.

#[path = "../store/tests/redis_cluster/mod.rs"]
mod redis_cluster;

use std::process::Command;

use redis_cluster::Cluster;

#[test]
fn a_replay_with_the_remote_tier_writes_through_it_with_no_wrong_hit() {
    let Some(c) = Cluster::start(3) else { return };
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_ucm"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args([
            "replay",
            "--runs",
            "1",
            "--modes",
            "ucm",
            "--sessions",
            "2",
            "--turns",
            "2",
        ])
        .args(["--json", "--remote", &c.url(), "--dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let m = &v["modes"]["ucm"];
    assert_eq!(m["wrong_hits"], 0, "{m}");
    assert!(m["cached_tokens"].as_u64().unwrap() > 0, "{m}");
    let keys: u64 = (0..3)
        .map(|i| c.cli(i, &["dbsize"]).trim().parse::<u64>().unwrap_or(0))
        .sum();
    assert!(keys > 100, "{keys} keys on the cluster");
    // Not with a trace.
    let out = Command::new(env!("CARGO_BIN_EXE_ucm"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args([
            "replay",
            "--trace",
            "tests/data/mooncake/synthetic_trace.jsonl",
        ])
        .args(["--remote", &c.url()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains("--remote, --cold, --no-disk, --sync-mode, --runs, --device and --requests apply to workload replays"));
}

/// `ucm replay --instances 2 --json` with `args` (the tiers), in a fresh
/// directory: the report, after checking that it succeeded, shared through
/// the tiers, served no wrong byte and hit another instance's work.
fn instances_through(args: &[&str]) -> serde_json::Value {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_ucm"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("AWS_ACCESS_KEY_ID", "ucm-test")
        .env("AWS_SECRET_ACCESS_KEY", "ucm-test")
        .args([
            "replay",
            "--runs",
            "1",
            "--instances",
            "2",
            "--json",
            "--turns",
            "3",
        ])
        .args(args)
        .arg("--dir")
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["sharing"], "remote");
    assert_eq!(v["wrong_hits"], 0, "{v}");
    // Disks are per instance (or absent): what one serves from the other's
    // work came through the tiers, states included (a hit needs one on
    // this model).
    assert!(v["from_other_instances"].as_u64().unwrap() > 0, "{v}");
    v
}

#[test]
fn instances_with_their_own_disks_share_through_the_cluster() {
    let Some(c) = Cluster::start(3) else { return };
    instances_through(&["--sessions", "4", "--remote", &c.url()]);
}

#[path = "../store/tests/s3_server/mod.rs"]
mod s3_server;

#[test]
fn instances_with_their_own_disks_share_through_a_cold_bucket() {
    let Some(srv) = s3_server::S3Server::start() else {
        return;
    };
    instances_through(&["--sessions", "2", "--cold", &srv.url("replay")]);
    assert!(!srv.keys("replay/ucm/").is_empty());
}

#[test]
fn diskless_instances_share_through_the_cluster_alone() {
    let Some(c) = Cluster::start(3) else { return };
    instances_through(&["--sessions", "4", "--no-disk", "--remote", &c.url()]);
    // Without a tier, --no-disk is refused.
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_ucm"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["replay", "--runs", "1", "--no-disk", "--dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("needs a remote or a cold tier"));
}
