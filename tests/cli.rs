//! End-to-end checks of the `ucm` binary: `info --json`, `bench io --json`,
//! `bench device` and `bench store --sync-mode`.

use std::process::{Command, Output};

fn ucm() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ucm"))
}

/// Runs `cmd` and checks that it succeeded.
fn run_ok(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Runs `cmd`, checks that it failed and that its stderr holds `want`.
fn run_err(cmd: &mut Command, want: &str) {
    let out = cmd.output().unwrap();
    assert!(!out.status.success(), "{cmd:?} succeeded");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(want), "{cmd:?}: {err}");
}

/// Parses stdout as JSON lines.
fn json_lines(out: &Output) -> Vec<serde_json::Value> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The `name` fields of a JSON array.
fn names(v: &serde_json::Value) -> Vec<&str> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap())
        .collect()
}

#[test]
fn info_json_lists_every_device_and_engine() {
    let dir = tempfile::tempdir().unwrap();
    let out = run_ok(ucm().args(["info", "--json", "--dir"]).arg(dir.path()));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(names(&v["devices"]), ["host", "cuda", "ascend"]);
    let devices = v["devices"].as_array().unwrap();
    for d in devices {
        assert!(d["available"].is_boolean() && d["reason"].is_string());
    }
    assert_eq!(devices[0]["available"], true);
    assert_eq!(names(&v["io_engines"]), ["io_uring", "libaio", "posix"]);
    let engines = v["io_engines"].as_array().unwrap();
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
    run_err(
        ucm().args(["info", "--dir", "/nonexistent/ucm-dir"]),
        "not a directory",
    );
}

#[test]
fn bench_io_json_prints_one_record_per_case() {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = ucm();
    cmd.args([
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
    .arg(dir.path());
    let out = run_ok(&mut cmd);
    let recs = json_lines(&out);
    assert_eq!(recs.len(), 2 * 2 * 2 * 2);
    for r in &recs {
        for k in [
            "engine",
            "op",
            "block_bytes",
            "depth",
            "gib_s",
            "fio_gib_s",
            "fio_own_gib_s",
            "ratio",
            "loop_gib_s",
            "loop_ratio",
            "loop_spread",
        ] {
            assert!(r.get(k).is_some(), "missing {k} in {r}");
        }
        assert!(r["gib_s"].as_f64().unwrap() > 0.0);
        assert!(r["loop_gib_s"].as_f64().unwrap() > 0.0);
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
    run_err(
        ucm().args([
            "bench", "io", "--blocks", "3000", "--size", "1M", "--no-fio",
        ]),
        "multiple of 4096",
    );
}

#[cfg(feature = "ascend")]
#[test]
fn info_reports_ascend_through_the_library_it_finds() {
    let report = |lib: &std::path::Path| -> serde_json::Value {
        let out = run_ok(ucm().args(["info", "--json"]).env("UCM_ACL_LIB", lib));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["devices"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["name"] == "ascend")
            .unwrap()
            .clone()
    };
    let absent = report(std::path::Path::new("/nonexistent/libascendcl.so"));
    assert_eq!(absent["available"], false);
    assert!(absent["reason"]
        .as_str()
        .unwrap()
        .contains("/nonexistent/libascendcl.so"));
    let double = ucm::device::accel::ascend::double_path().expect("the ACL double was built");
    let present = report(&double);
    assert_eq!(present["available"], true, "{present}");
}

#[cfg(feature = "ascend")]
#[test]
fn bench_device_runs_through_the_acl_double() {
    let double = ucm::device::accel::ascend::double_path().expect("the ACL double was built");
    let out = run_ok(
        ucm()
            .args(["bench", "device", "--json", "--device", "ascend"])
            .args(["--size", "4M", "--chunk", "1M", "--reps", "1"])
            .env("UCM_ACL_LIB", &double),
    );
    let recs = json_lines(&out);
    let cases: Vec<_> = recs.iter().map(|r| r["case"].as_str().unwrap()).collect();
    assert_eq!(cases, ["h2d_pinned", "d2h_pinned", "scatter_64k"]);
}

#[test]
fn bench_device_on_the_host_prints_one_record_per_case() {
    let out = run_ok(ucm().args([
        "bench",
        "device",
        "--json",
        "--size",
        "4M",
        "--chunk",
        "1M",
        "--reps",
        "1",
        "--layers",
        "4",
        "--layer-size",
        "1M",
    ]));
    let recs = json_lines(&out);
    let cases: Vec<_> = recs.iter().map(|r| r["case"].as_str().unwrap()).collect();
    assert_eq!(
        cases,
        ["h2d_pinned", "d2h_pinned", "scatter_64k", "layerwise"]
    );
    for r in &recs {
        for k in ["case", "gib_s", "limit_gib_s", "ratio"] {
            assert!(r.get(k).is_some(), "missing {k} in {r}");
        }
    }
    let hidden = recs[3]["hidden_io_fraction"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&hidden));
    run_err(
        ucm().args(["bench", "device", "--device", "tpu"]),
        "`tpu`: unknown kind",
    );
    if !cfg!(feature = "ascend") {
        run_err(
            ucm().args(["bench", "device", "--device", "npu:1"]),
            "device `npu:1` is not available in this build",
        );
    }
}

#[cfg(feature = "cuda")]
#[test]
fn bench_device_on_cuda_without_a_driver_says_why() {
    if ucm::device::accel::cuda::driver_present() {
        return;
    }
    run_err(
        ucm().args(["bench", "device", "--device", "cuda"]),
        "libcuda",
    );
}

/// `bench store --device cuda` through the libcuda double: every path, the
/// pool paths against the pinned-to-device copy, every load's destination
/// checked byte for byte (the run fails on a wrong byte).
#[cfg(feature = "cuda")]
#[test]
fn bench_store_runs_on_the_cuda_double() {
    let double = ucm::device::accel::cuda::double_path().expect("the CUDA double was built");
    let dir = tempfile::tempdir().unwrap();
    let out = run_ok(
        ucm()
            .args(["bench", "store", "--json", "--device", "cuda", "--no-fio"])
            .args(["--size", "4M", "--shard-sizes", "16K,64K", "--shards", "4"])
            .args(["--reps", "1", "--dir"])
            .arg(dir.path())
            .env("UCM_CUDA_LIB", &double),
    );
    let recs = json_lines(&out);
    let paths: Vec<_> = recs.iter().map(|r| r["path"].as_str().unwrap()).collect();
    assert_eq!(paths.iter().filter(|p| **p == "load_warm").count(), 2);
    assert!(paths.contains(&"lookup_disk"));
    for r in recs.iter().filter(|r| r["path"] == "load_warm") {
        assert!(r["limit"].as_f64().unwrap() > 0.0, "{r}");
    }
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("batched copies: kernel"), "{err}");
}

/// `bench layerwise --device cuda` through the libcuda double: the KV
/// regions in device memory, every ratio reported, and the first load of
/// each layer checked byte for byte against what it stored (the run fails
/// on a wrong byte).
#[cfg(feature = "cuda")]
#[test]
fn bench_layerwise_runs_on_the_cuda_double() {
    let double = ucm::device::accel::cuda::double_path().expect("the CUDA double was built");
    let dir = tempfile::tempdir().unwrap();
    let out = run_ok(
        ucm()
            .args(["bench", "layerwise", "--json", "--device", "cuda"])
            .args([
                "--units", "4", "--blocks", "8", "--reps", "1", "--ratios", "1,2",
            ])
            .arg("--dir")
            .arg(dir.path())
            .env("UCM_CUDA_LIB", &double),
    );
    let recs = json_lines(&out);
    assert_eq!(recs.len(), 2);
    for r in &recs {
        assert!(r["io_per_unit_ms"].as_f64().unwrap() > 0.0, "{r}");
    }
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("batched copies: kernel"), "{err}");
}

#[test]
fn bench_layerwise_refuses_a_device_it_cannot_run_on() {
    run_err(
        ucm().args(["bench", "layerwise", "--reps", "1", "--device", "npu"]),
        "ascend is unsupported here",
    );
    run_err(
        ucm().args(["bench", "layerwise", "--reps", "1", "--device", "tpu"]),
        "--device",
    );
}

#[test]
fn bench_store_refuses_a_device_it_cannot_run_on() {
    for (args, want) in [
        (vec!["--device", "npu"], "the store bench runs on host"),
        (vec!["--device", "tpu"], "--device"),
        (
            vec!["--device", "cuda", "--remote", "redis://127.0.0.1:1"],
            "host device only",
        ),
    ] {
        run_err(
            ucm()
                .args(["bench", "store", "--size", "1M", "--reps", "1"])
                .args(&args),
            want,
        );
    }
}

/// `bench store --sync-mode`: `files` makes each dump durable with fsyncs
/// only (no `syncfs`), `auto` with one `syncfs` per batch where the file
/// system's `syncfs` stands for them; the record says which, and names
/// the disk tier's engine. A bad mode is refused.
#[test]
fn bench_store_dumps_in_the_sync_mode_asked_for() {
    let dir = tempfile::tempdir().unwrap();
    let by_fs = ucm::device::io::IoDir::open(dir.path())
        .unwrap()
        .syncfs_reports_all();
    for mode in ["files", "auto"] {
        let out = run_ok(
            ucm()
                .args(["bench", "store", "--json", "--size", "4M"])
                .args(["--shard-sizes", "64K", "--reps", "1", "--no-fio"])
                .args(["--sync-mode", mode, "--dir"])
                .arg(dir.path()),
        );
        let recs = json_lines(&out);
        let dump = recs
            .iter()
            .find(|r| r["path"] == "dump_cold")
            .expect("a dump_cold record");
        assert_eq!(dump["sync_mode"], mode);
        let syncs = dump["fs_syncs"].as_u64().expect("fs_syncs");
        assert_eq!(syncs > 0, mode == "auto" && by_fs, "{mode}: {syncs}");
    }
    // The disk records name the engine `auto` resolved to: POSIX on
    // tmpfs (D88), a named engine as asked.
    let shm = std::path::Path::new("/dev/shm");
    let shm_is_tmpfs = std::process::Command::new("df")
        .args(["--output=fstype"])
        .arg(shm)
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).lines().nth(1) == Some("tmpfs"));
    let cases: &[(&std::path::Path, &str, Option<&str>)] = &[
        (dir.path(), "posix", Some("posix")),
        (shm, "auto", shm_is_tmpfs.then_some("posix")),
    ];
    for &(at, engine, want) in cases {
        let out = run_ok(
            ucm()
                .args(["bench", "store", "--json", "--size", "4M"])
                .args(["--shard-sizes", "64K", "--reps", "1", "--no-fio"])
                .args(["--engine", engine, "--dir"])
                .arg(at),
        );
        let recs = json_lines(&out);
        for path in ["dump_cold", "load_cold"] {
            let r = recs.iter().find(|r| r["path"] == path).expect(path);
            let got = r["engine"].as_str().expect("an engine");
            if let Some(w) = want {
                assert_eq!(got, w, "{path} at {}", at.display());
            }
        }
    }
    run_err(
        ucm()
            .args(["bench", "store", "--sync-mode", "fsync", "--dir"])
            .arg(dir.path()),
        "expected auto or files",
    );
}
