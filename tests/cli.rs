//! End-to-end checks of the `ucm` binary: `info --json` and `bench io --json`.

use std::process::Command;

fn ucm() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ucm"))
}

#[test]
fn info_json_lists_every_device_and_engine() {
    let dir = tempfile::tempdir().unwrap();
    let out = ucm()
        .args(["info", "--json", "--dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let devices = v["devices"].as_array().unwrap();
    let names: Vec<_> = devices
        .iter()
        .map(|d| d["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["host", "cuda", "ascend"]);
    for d in devices {
        assert!(d["available"].is_boolean() && d["reason"].is_string());
    }
    assert_eq!(devices[0]["available"], true);
    let engines = v["io_engines"].as_array().unwrap();
    let names: Vec<_> = engines
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["io_uring", "libaio", "posix"]);
    for e in engines {
        assert!(e["available"].is_boolean() && e["o_direct"].is_boolean());
        assert!(!e["reason"].as_str().unwrap().is_empty());
    }
    assert_eq!(engines[2]["available"], true, "posix always works");
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "probe files removed"
    );
}

#[test]
fn info_refuses_a_missing_directory() {
    let out = ucm()
        .args(["info", "--dir", "/nonexistent/ucm-dir"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a directory"));
}

#[test]
fn bench_io_json_prints_one_record_per_case() {
    let dir = tempfile::tempdir().unwrap();
    let out = ucm()
        .args([
            "bench",
            "io",
            "--json",
            "--engines",
            "posix,libaio",
            "--ops",
            "seq_write,rand_read",
            "--blocks",
            "64K,128K",
            "--depths",
            "1,4",
            "--size",
            "2M",
            "--reps",
            "1",
        ])
        .arg("--dir")
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let recs: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(recs.len(), 2 * 2 * 2 * 2);
    for r in &recs {
        for k in [
            "engine",
            "op",
            "block_bytes",
            "depth",
            "gib_s",
            "fio_gib_s",
            "ratio",
        ] {
            assert!(r.get(k).is_some(), "missing {k} in {r}");
        }
        assert!(r["gib_s"].as_f64().unwrap() > 0.0);
        match r["fio_gib_s"].as_f64() {
            Some(f) => assert!(f > 0.0 && r["ratio"].as_f64().is_some()),
            None => assert!(r["ratio"].is_null()),
        }
    }
    // Progress goes to stderr, so stdout stays machine-readable.
    assert!(String::from_utf8_lossy(&out.stderr).contains("[16/16]"));
}

#[test]
fn bench_io_rejects_bad_sizes() {
    let out = ucm()
        .args([
            "bench", "io", "--blocks", "3000", "--size", "1M", "--no-fio",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("multiple of 4096"));
}
