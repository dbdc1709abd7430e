//! `ucm replay --instances N`: engine instances as separate processes over
//! one store directory. Each turn of a session runs on another instance
//! than the turn before, so a hit through the session's history is
//! another instance's work; every loaded byte is checked by the loading
//! instance's oracle.

use std::process::Command;

fn replay(dir: &std::path::Path, extra: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_ucm"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["replay", "--sessions", "4", "--turns", "3"])
        .args(extra)
        .arg("--dir")
        .arg(dir)
        .output()
        .unwrap()
}

#[test]
fn instances_sharing_a_directory_hit_each_others_work_with_no_wrong_hit() {
    let dir = tempfile::tempdir().unwrap();
    let out = replay(dir.path(), &["--instances", "2", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["instances"], 2);
    assert_eq!(v["sharing"], "directory");
    assert_eq!(v["requests"], 12, "{v}");
    assert_eq!(v["wrong_hits"], 0, "{v}");
    assert_eq!(v["lost_saves"], 0, "{v}");
    assert!(v["checked_items"].as_u64().unwrap() > 0, "{v}");
    assert!(v["from_other_instances"].as_u64().unwrap() > 0, "{v}");
    let per = v["per_instance"].as_array().unwrap();
    assert_eq!(per.len(), 2);
    for i in per {
        assert_eq!(i["report"]["requests"], 6, "{i}");
    }
    // Progress names the instance; the run's directory is gone.
    assert!(String::from_utf8_lossy(&out.stderr).contains("instance 1: "));
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn a_wrong_byte_in_one_instance_fails_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let out = replay(dir.path(), &["--instances", "2", "--sabotage"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("wrong hits"), "{err}");
}

#[test]
fn bad_instance_counts_and_traces_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    for (args, msg) in [
        (&["--instances", "0"][..], "at least 1"),
        (&["--instances", "65"][..], "between 2 and 64"),
        (
            &[
                "--instances",
                "2",
                "--trace",
                "tests/data/mooncake/synthetic_trace.jsonl",
            ][..],
            "--instances applies to workload replays",
        ),
    ] {
        let out = replay(dir.path(), args);
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(msg), "{args:?}: {err}");
    }
}
