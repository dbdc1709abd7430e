//! The CLI under hostile or careless input: a spec whose group name is a
//! path, zero sizes, and the scratch stores of a killed run.

use std::path::Path;
use std::process::Command;

fn ucm() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ucm"));
    c.current_dir(env!("CARGO_MANIFEST_DIR"));
    c
}

#[test]
fn a_group_named_like_a_path_touches_nothing_outside() {
    let dir = tempfile::tempdir().unwrap();
    let victim = dir.path().join("victim");
    std::fs::create_dir_all(victim.join("tmp")).unwrap();
    std::fs::write(victim.join("tmp").join("precious"), b"keep").unwrap();
    let store = dir.path().join("store");
    for name in ["../victim", "/tmp", ".."] {
        let spec = dir.path().join("bad.toml");
        std::fs::write(
            &spec,
            format!(
                "model = \"m\"\n[[group]]\nname = {name:?}\nkind = \"chain\"\nblock_size = 16\n\
                 layers = \"0\"\nbytes_per_token = 8\n"
            ),
        )
        .unwrap();
        let sc = dir.path().join("sc.json");
        std::fs::write(&sc, r#"{"tokens": 64, "seed": 1}"#).unwrap();
        let out = ucm()
            .args(["explain", "--spec"])
            .arg(&spec)
            .arg("--scenario")
            .arg(&sc)
            .arg("--store")
            .arg(&store)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{name}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("not a plain name"), "{name}: {err}");
    }
    assert_eq!(
        std::fs::read(victim.join("tmp").join("precious")).unwrap(),
        b"keep"
    );
    assert!(!store.exists(), "a refused spec made a store");
}

#[test]
fn zero_sizes_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let out = ucm()
        .args(["bench", "store", "--size", "0", "--reps", "0", "--dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("must be positive"), "{err}");
}

fn scratch_dirs(p: &Path) -> Vec<String> {
    std::fs::read_dir(p)
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str().map(String::from))
        .filter(|n| n.starts_with("ucm-"))
        .collect()
}

#[test]
fn a_killed_runs_store_is_removed_by_the_next_run() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = ucm()
        .args(["replay", "--runs", "1", "--modes", "ucm", "--dir"])
        .arg(dir.path())
        .stderr(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let t = std::time::Instant::now();
    while scratch_dirs(dir.path()).is_empty() && t.elapsed().as_secs() < 60 {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(
        !scratch_dirs(dir.path()).is_empty(),
        "the replay made no store"
    );
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        !scratch_dirs(dir.path()).is_empty(),
        "SIGKILL left its store (as expected)"
    );
    // `ucm gc --stale` removes it; a live run's store is kept.
    let keep = dir.path().join(format!("ucm-replay.{}.0", live_writer()));
    std::fs::create_dir(&keep).unwrap();
    let out = ucm()
        .args(["gc", "--stale", "--dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("removed 1 "));
    assert_eq!(
        scratch_dirs(dir.path()),
        vec![keep.file_name().unwrap().to_str().unwrap()]
    );
    std::fs::remove_dir(&keep).unwrap();
    // The same store left again, removed by the next run this time.
    let mut child = ucm()
        .args(["replay", "--runs", "1", "--modes", "ucm", "--dir"])
        .arg(dir.path())
        .stderr(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let t = std::time::Instant::now();
    while scratch_dirs(dir.path()).is_empty() && t.elapsed().as_secs() < 60 {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    for mode in ["recompute", "ucm"] {
        let out = ucm()
            .args([
                "replay",
                "--runs",
                "1",
                "--modes",
                mode,
                "--sessions",
                "1",
                "--turns",
                "1",
                "--dir",
            ])
            .arg(dir.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert_eq!(scratch_dirs(dir.path()), Vec::<String>::new());
}

#[test]
fn a_device_a_fifo_or_a_huge_file_as_spec_or_scenario_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let big = dir.path().join("big.toml");
    {
        let f = std::fs::File::create(&big).unwrap();
        // Sparse: 17 MiB of holes, past the 16 MiB bound.
        f.set_len(17 << 20).unwrap();
    }
    let good_sc = dir.path().join("sc.json");
    std::fs::write(&good_sc, r#"{"tokens": 64, "seed": 1}"#).unwrap();
    let spec = "specs/x-hybrid-96.toml";
    let cases: Vec<(Vec<std::ffi::OsString>, &str)> = vec![
        (
            vec![
                "--spec".into(),
                "/dev/zero".into(),
                "--scenario".into(),
                good_sc.clone().into(),
            ],
            "not a regular file",
        ),
        (
            vec![
                "--spec".into(),
                spec.into(),
                "--scenario".into(),
                "/dev/zero".into(),
            ],
            "not a regular file",
        ),
        (
            vec![
                "--spec".into(),
                big.clone().into(),
                "--scenario".into(),
                good_sc.clone().into(),
            ],
            "larger than",
        ),
        (
            vec![
                "--spec".into(),
                spec.into(),
                "--scenario".into(),
                big.clone().into(),
            ],
            "larger than",
        ),
    ];
    for (args, want) in cases {
        let t = std::time::Instant::now();
        let out = ucm().arg("explain").args(&args).output().unwrap();
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(
            t.elapsed().as_secs() < 30,
            "{args:?} took {:?}",
            t.elapsed()
        );
    }
}

/// The writer identity of this (live) test process, as the CLI names
/// scratch stores.
fn live_writer() -> String {
    ucm::store::paths::writer_id().to_string()
}
