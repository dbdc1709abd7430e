//! `ucm explain` end to end: fig 13 on X-Hybrid-96 through a real store, a
//! warm restart in a new process, lazy invalidation after eviction, and
//! clear errors for bad scenarios.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn explain(scenario: &Path, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ucm"))
        .arg("explain")
        .arg("--spec")
        .arg(root().join("specs/x-hybrid-96.toml"))
        .arg("--scenario")
        .arg(scenario)
        .arg("--json")
        .args(extra)
        .output()
        .unwrap()
}

fn answer(out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn l_p(v: &serde_json::Value) -> (u64, u64) {
    (v["l"].as_u64().unwrap(), v["p_star"].as_u64().unwrap())
}

#[test]
fn fig13_reproduces_l_and_p_star() {
    let v = answer(&explain(&root().join("examples/fig13.json"), &[]));
    assert_eq!(l_p(&v), (2432, 2304));
    assert_eq!(v["groups"]["mla"]["vote"], 2560);
    assert_eq!(v["groups"]["csa_c16"]["vote"], 2432);
    assert_eq!(v["groups"]["mamba2"]["vote"], 2304);
    assert_eq!(v["groups"]["dsa_indexer"]["vote"], serde_json::Value::Null);
    assert!(v["groups"]["cross"]["reason"]
        .as_str()
        .unwrap()
        .contains("never cached"));
}

#[test]
fn a_restarted_process_gets_the_same_hits_and_eviction_only_shrinks_them() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let store_arg = store.to_str().unwrap();
    let fig13 = root().join("examples/fig13.json");
    // Nothing stored yet: a warm restart over an empty store finds nothing.
    std::fs::create_dir_all(&store).unwrap();
    let empty = answer(&explain(&fig13, &["--store", store_arg, "--resolve-only"]));
    assert_eq!(l_p(&empty), (0, 0));
    let first = answer(&explain(&fig13, &["--store", store_arg]));
    assert_eq!(l_p(&first), (2432, 2304));
    // A new process: fresh pools, the directory rebuilt from enumerate.
    let again = answer(&explain(&fig13, &["--store", store_arg, "--resolve-only"]));
    assert_eq!(again, first);
    // Evict every csa_c16 block (as GC would): the checkpoints are still on
    // disk, but none is a candidate any more: a smaller hit, never a wrong one.
    std::fs::remove_dir_all(store.join("csa_c16").join("blocks")).unwrap();
    let evicted = answer(&explain(&fig13, &["--store", store_arg, "--resolve-only"]));
    assert_eq!(l_p(&evicted), (0, 0));
}

#[test]
fn bad_scenarios_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (r#"{"tokens": 0, "seed": 1}"#, "`tokens` must be positive"),
        (r#"{"tokens": 100, "seed": 1}"#, "shorter than one block"),
        (
            r#"{"tokens": 3000, "seed": 1, "held": {"mlx": [[0, 128]]}}"#,
            "unknown group `mlx`",
        ),
        (
            r#"{"tokens": 3000, "seed": 1, "held": {"mla": [[0, 4000]]}}"#,
            "outside the prompt",
        ),
        (
            r#"{"tokens": 3000, "seed": 1, "held": {"mamba2": [[0, 128]]}}"#,
            "only chain groups hold blocks",
        ),
        (
            r#"{"tokens": 3000, "seed": 1, "checkpoints": {"mamba2": [100]}}"#,
            "not on its grid of 64",
        ),
        (
            r#"{"tokens": 3000, "seed": 1, "checkpoints": {"mamba2": [3072]}}"#,
            "outside the prompt",
        ),
        (r#"{"tokens": 3000}"#, "missing field `seed`"),
        // Sizes that would exhaust memory are refused before allocation.
        (
            r#"{"tokens": 1000000000000, "seed": 1}"#,
            "exceeds 16777216",
        ),
        (
            r#"{"tokens": 3000, "seed": 1, "tp_size": 4000000000}"#,
            "`tp_size` must lie in 1..=1024",
        ),
    ];
    for (i, (json, want)) in cases.iter().enumerate() {
        let p = dir.path().join(format!("s{i}.json"));
        std::fs::write(&p, json).unwrap();
        let out = explain(&p, &[]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{json} should fail");
        assert!(out.stdout.is_empty(), "no answer on error: {json}");
        assert!(err.contains(want), "{json}: expected `{want}` in: {err}");
    }
}

#[test]
fn resolve_only_on_a_missing_store_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nothing-here");
    let out = explain(
        &root().join("examples/fig13.json"),
        &["--resolve-only", "--store", missing.to_str().unwrap()],
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no store at"), "{err}");
    assert!(!missing.exists(), "--resolve-only created a store");
}

#[test]
fn a_store_of_another_geometry_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let store_arg = store.to_str().unwrap();
    let fig13 = root().join("examples/fig13.json");
    answer(&explain(&fig13, &["--store", store_arg]));
    // The same store opened with a spec whose mla rows are bigger.
    let spec = std::fs::read_to_string(root().join("specs/x-hybrid-96.toml"))
        .unwrap()
        .replacen("bytes_per_token = 512", "bytes_per_token = 1024", 1);
    let other = dir.path().join("other.toml");
    std::fs::write(&other, spec).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_ucm"))
        .args(["explain", "--json", "--resolve-only", "--store", store_arg])
        .arg("--spec")
        .arg(&other)
        .arg("--scenario")
        .arg(&fig13)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("another geometry"), "{err}");
}
