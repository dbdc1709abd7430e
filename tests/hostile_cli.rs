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
        .args(["replay", "--modes", "ucm", "--dir"])
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
    for mode in ["recompute", "ucm"] {
        let out = ucm()
            .args([
                "replay",
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
