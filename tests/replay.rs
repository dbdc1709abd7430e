//! `ucm replay` end to end: every mode on a short chat workload, with
//! TP = 2, PP = 2 and speculative decoding, no wrong hits, the report's
//! shape, and clear errors for bad options.

use std::process::Command;

fn ucm() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ucm"));
    c.current_dir(env!("CARGO_MANIFEST_DIR"));
    c
}

/// Runs `cmd`, checks that it succeeded, and parses its JSON report. Its
/// progress, captured (not a terminal), is whole lines, never a line
/// rewritten with carriage returns.
fn report(cmd: &mut Command) -> serde_json::Value {
    let out = cmd.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(!err.contains('\r'), "progress rewritten in a log: {err:?}");
    assert!(!err.trim().is_empty(), "no progress shown");
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn a_short_replay_reports_every_mode_with_no_wrong_hits() {
    let dir = tempfile::tempdir().unwrap();
    let plot = dir.path().join("r.svg");
    let v = report(
        ucm()
            .args([
                "replay",
                "--runs",
                "1",
                "--sessions",
                "2",
                "--turns",
                "2",
                "--tp",
                "2",
                "--pp",
                "2",
            ])
            .args(["--spec-decode", "--json", "--dir"])
            .arg(dir.path())
            .arg("--plot")
            .arg(&plot),
    );
    for mode in ["ucm", "recompute", "fold"] {
        let m = &v["modes"][mode];
        assert_eq!(m["requests"], 4, "{mode}");
        assert_eq!(m["wrong_hits"], 0, "{mode}");
        for k in [
            "prompt_tokens",
            "cached_tokens",
            "hit_rate",
            "state_hit_rate",
            "injected_faults",
            "reported_faults",
        ] {
            assert!(m.get(k).is_some(), "{mode}: {k}");
        }
    }
    let ucm_mode = &v["modes"]["ucm"];
    assert!(
        ucm_mode["cached_tokens"].as_u64().unwrap() > 0,
        "the second turns hit"
    );
    assert_eq!(v["modes"]["recompute"]["cached_tokens"], 0);
    // Per turn: the second turn is served from cache (a hit rate, not a
    // time: timings belong in benchmarks, not in tests).
    let hit = |m: &str| v["modes"][m]["per_turn"][1][0].as_f64().unwrap();
    assert!(hit("ucm") > 0.5, "{}", hit("ucm"));
    assert_eq!(hit("recompute"), 0.0);
    assert!(v["modes"]["ucm"]["checked_items"].as_u64().unwrap() > 0);
    assert!(std::fs::read_to_string(&plot).unwrap().starts_with("<svg"));
}

/// `--sync-mode files`: every save made durable by fsyncs alone still
/// serves the second turns, with no wrong hit.
#[test]
fn a_replay_whose_disk_tiers_fsync_each_file_serves_the_same_hits() {
    let dir = tempfile::tempdir().unwrap();
    let v = report(
        ucm()
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
            .args(["--sync-mode", "files", "--json", "--dir"])
            .arg(dir.path()),
    );
    let m = &v["modes"]["ucm"];
    assert_eq!(m["wrong_hits"], 0);
    assert!(m["cached_tokens"].as_u64().unwrap() > 0, "{m}");
}

#[test]
fn bad_replay_options_are_errors() {
    let mut cases = vec![
        (vec!["--tp", "0"], "--tp 0: expected positive"),
        (vec!["--turns", "0"], "--turns 0: expected positive"),
        (
            vec!["--faults", "1.5"],
            "--faults 1.5: expected a probability",
        ),
        (vec!["--spec", "nope.toml"], "nope.toml"),
        (vec!["--workload", "poetry"], "poetry"),
        (vec!["--pp", "1000"], "1000 for a model of 96 layers"),
        (vec!["--tp", "100000"], "--tp 100000: expected at most 64"),
        (vec!["--compute-us-per-token", "NaN"], "expected a finite"),
        (vec!["--compute-us-per-token", "inf"], "expected a finite"),
        (vec!["--sync-mode", "fsync"], "expected auto or files"),
        (
            vec![
                "--trace",
                "tests/data/mooncake/synthetic_trace.jsonl",
                "--sync-mode",
                "files",
            ],
            "--sync-mode, --runs, --device and --requests apply to workload replays",
        ),
    ];
    if !cfg!(feature = "failpoints") {
        // A binary built without fail points refuses faults up front.
        cases.push((
            vec!["--faults", "0.2"],
            "needs a build with the `failpoints` feature",
        ));
    }
    for (args, want) in cases {
        let out = ucm().arg("replay").args(&args).output().unwrap();
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{args:?}: {err}");
    }
}

/// The oracle can fail: one corrupted loaded byte is reported as a wrong
/// hit, with its request, group, layer and block, and the run fails.
#[test]
fn a_corrupted_load_is_reported_as_a_wrong_hit() {
    let dir = tempfile::tempdir().unwrap();
    let out = ucm()
        .args([
            "replay",
            "--runs",
            "1",
            "--sessions",
            "2",
            "--turns",
            "2",
            "--modes",
            "ucm",
            "--sabotage",
            "--dir",
        ])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("wrong hit") && err.contains("request ucm-"),
        "{err}"
    );
    assert!(err.contains("layer") && err.contains("block"), "{err}");
    assert!(err.contains("1 wrong hits"), "{err}");
}

/// Each deliberate bug of the worker fails the replay, with the finding
/// named (the same mutations as `harness/tests/mutations.rs`, end to end).
#[test]
fn every_sabotage_fails_the_replay() {
    for (kind, want) in [
        ("skip-load", "never loaded (still poisoned)"),
        ("wrong-block", "wrong hit"),
        ("state-position", "state at"),
        ("stale-prefix", "never loaded (still poisoned)"),
        ("skip-save", "lost save"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let out = ucm()
            .args([
                "replay",
                "--runs",
                "1",
                "--sessions",
                "2",
                "--turns",
                "2",
                "--modes",
                "ucm",
            ])
            .args(["--sabotage", kind, "--dir"])
            .arg(dir.path())
            .output()
            .unwrap();
        assert!(!out.status.success(), "{kind}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{kind}: {err}");
        assert!(
            err.contains("request ucm-") && err.contains("layer"),
            "{kind}: {err}"
        );
    }
}

/// `--runs N`: each loading mode runs N times with the same hits; the TTFT
/// reductions are reported per run and as their median. Only the shape is
/// checked: timings belong in benchmarks.
#[test]
fn repeated_runs_report_each_runs_ttft_and_their_median() {
    let dir = tempfile::tempdir().unwrap();
    let v = report(
        ucm()
            .args(["replay", "--sessions", "2", "--turns", "4", "--runs", "2"])
            .args(["--modes", "ucm,recompute", "--json", "--dir"])
            .arg(dir.path()),
    );
    let m = &v["modes"]["ucm"];
    let runs: Vec<f64> = m["ttft_runs_vs_recompute"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect();
    assert_eq!(runs.len(), 2, "{m}");
    let med = m["ttft_reduction_vs_recompute"].as_f64().unwrap();
    let (lo, hi) = (runs[0].min(runs[1]), runs[0].max(runs[1]));
    assert!(
        lo - 1e-4 <= med && med <= hi + 1e-4,
        "{med} outside {runs:?}"
    );
    assert!(m["load_rate_gib_s"].as_f64().unwrap() > 0.0, "{m}");
    assert!(m["copy_rate_gib_s"].as_f64().unwrap() > 0.0, "{m}");
    // Recompute measures nothing: one run, no reduction against itself.
    assert_eq!(
        v["modes"]["recompute"]["ttft_runs_vs_recompute"],
        serde_json::json!([])
    );
    for bad in [
        &["--runs", "0"][..],
        &["--runs", "2", "--trace", "x.jsonl"][..],
    ] {
        let out = ucm().arg("replay").args(bad).output().unwrap();
        assert!(!out.status.success(), "{bad:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("--runs"),
            "{bad:?}"
        );
    }
}

/// Injected read and write faults hit the blocks' data path, loads fail and
/// are recomputed, and the run still ends: the replay's restart reopens
/// every store while a read fault is armed, and a fault aimed at the data
/// must not fail that open (it once read the GEOMETRY marker through it).
#[cfg(feature = "failpoints")]
#[test]
fn injected_faults_fail_loads_and_spare_the_restart() {
    let dir = tempfile::tempdir().unwrap();
    let v = report(
        ucm()
            .args(["replay", "--modes", "ucm", "--faults", "0.3", "--runs", "1"])
            .args(["--json", "--dir"])
            .arg(dir.path()),
    );
    let u = &v["modes"]["ucm"];
    assert_eq!(u["wrong_hits"], 0, "{u}");
    assert_eq!(u["unaccounted_faults"], 0, "{u}");
    assert!(u["injected_faults"].as_u64().unwrap() > 0, "{u}");
    assert!(
        u["faults"]["read_eio"]["failed_loads"].as_u64().unwrap() > 0,
        "{u}"
    );
    assert!(
        u["recomputed_after_failed_load"].as_u64().unwrap() > 0,
        "{u}"
    );
}

/// `replay --device cuda` through the libcuda double: the simulated
/// engine's KV caches and states in device memory, the pool registered
/// with the device; the content oracle checks every byte there, so a
/// flipped loaded byte still fails the run.
#[cfg(feature = "cuda")]
#[test]
fn the_replay_runs_on_the_cuda_double_and_its_oracle_still_fails_there() {
    let double = ucm::device::accel::cuda::double_path().expect("the CUDA double was built");
    let run = |extra: &[&str]| {
        let dir = tempfile::tempdir().unwrap();
        ucm()
            .args(["replay", "--device", "cuda", "--runs", "1"])
            .args(["--sessions", "2", "--turns", "2", "--modes", "ucm"])
            .args(extra)
            .arg("--dir")
            .arg(dir.path())
            .env("UCM_CUDA_LIB", &double)
            .output()
            .unwrap()
    };
    let out = run(&["--json"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("batched copies: kernel"), "{err}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let ucm = &v["modes"]["ucm"];
    assert_eq!(ucm["wrong_hits"], 0, "{ucm}");
    assert!(ucm["cached_tokens"].as_u64().unwrap() > 0, "{ucm}");
    let out = run(&["--sabotage"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("wrong hit"), "{err}");
}

#[test]
fn the_replay_refuses_a_device_it_cannot_run_on() {
    for (args, want) in [
        (vec!["--device", "npu"], "ascend is unsupported here"),
        (vec!["--device", "tpu"], "--device"),
        (
            vec!["--device", "cuda", "--instances", "2"],
            "--instances runs on the host device only",
        ),
        (
            vec![
                "--device",
                "cuda",
                "--trace",
                "tests/data/mooncake/synthetic_trace.jsonl",
            ],
            "--device and --requests apply to workload replays",
        ),
        (
            vec!["--requests", "r.jsonl", "--instances", "2"],
            "--requests replays in one instance",
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let out = ucm()
            .args(["replay", "--runs", "1", "--sessions", "1", "--turns", "1"])
            .args(&args)
            .arg("--dir")
            .arg(dir.path())
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{args:?}: {err}");
    }
}

/// `replay --requests FILE`: the requests an engine served, replayed with
/// the oracle; a second prompt that continues the first is served from
/// cache, and a bad file is refused with its line.
#[test]
fn a_request_file_is_replayed_as_given() {
    let dir = tempfile::tempdir().unwrap();
    let first: Vec<u32> = (0..4096).map(|i| (i * 7919) % 50_000).collect();
    let mut second = first.clone();
    second.extend(100..400);
    let line = |s: usize, t: usize, p: &[u32]| {
        serde_json::json!({"session": s, "turn": t, "prompt": p, "output": [1, 2, 3]}).to_string()
    };
    let file = dir.path().join("requests.jsonl");
    std::fs::write(
        &file,
        format!("{}\n{}\n", line(0, 0, &first), line(0, 1, &second)),
    )
    .unwrap();
    let v = report(
        ucm()
            .args([
                "replay",
                "--runs",
                "1",
                "--modes",
                "ucm",
                "--json",
                "--requests",
            ])
            .arg(&file)
            .arg("--dir")
            .arg(dir.path()),
    );
    let m = &v["modes"]["ucm"];
    assert_eq!(m["requests"], 2, "{m}");
    assert_eq!(
        m["prompt_tokens"],
        (first.len() + second.len()) as u64,
        "{m}"
    );
    assert!(m["cached_tokens"].as_u64().unwrap() >= 2048, "{m}");
    assert_eq!(m["wrong_hits"], 0, "{m}");
    std::fs::write(&file, "{\"session\":0,\"turn\":0,\"prompt\":[]}\n").unwrap();
    let out = ucm()
        .args(["replay", "--runs", "1", "--modes", "ucm", "--requests"])
        .arg(&file)
        .arg("--dir")
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("requests line 1: an empty prompt"), "{err}");
}
