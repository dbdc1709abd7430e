//! `ucm info --store DIR` lists the deployments' identities a store holds,
//! with their bytes; `ucm gc --store DIR --identity D` drops one,
//! `--max-idle DAYS` the idle ones; bad input gets a clear error.

use std::process::{Command, Output};

use ucm::coordinator::adapter::identities;
use ucm::coordinator::SpecTable;

fn ucm() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ucm"))
}

fn out(cmd: &mut Command) -> Output {
    cmd.output().expect("run ucm")
}

const SPEC: &str = r#"
model = "cli-id"
[identity]
revision = "REV"
[[group]]
name = "attn"
kind = "chain"
block_size = 16
layers = "0"
bytes_per_token = 256
"#;

/// Records the identity of revision `rev` in `dir`, with `bytes` of data
/// in its group's directory; returns its digest.
fn identity(dir: &std::path::Path, rev: &str, bytes: usize) -> String {
    let t = SpecTable::from_toml(&SPEC.replace("REV", rev)).unwrap();
    let id = t.identity.unwrap();
    let root = identities::record(dir, &id).unwrap();
    std::fs::create_dir_all(root.join("attn")).unwrap();
    std::fs::write(root.join("attn").join("data"), vec![7u8; bytes]).unwrap();
    id.hex()
}

#[test]
fn info_lists_identities_with_bytes_and_gc_drops_them() {
    let dir = tempfile::tempdir().unwrap();
    let a = identity(dir.path(), "r1", 10_000);
    let b = identity(dir.path(), "r2", 20_000);
    let o = out(ucm().args(["info", "--json", "--store"]).arg(dir.path()));
    assert!(o.status.success(), "{o:?}");
    let rows: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 2);
    for r in rows {
        let want = if r["identity"] == a.as_str() {
            10_000
        } else {
            20_000
        };
        assert!(r["bytes"].as_u64().unwrap() >= want, "{r}");
        assert_eq!(r["model"], "cli-id");
    }
    let o = out(ucm().args(["info", "--store"]).arg(dir.path()));
    let text = String::from_utf8_lossy(&o.stdout);
    // Which comes first depends on the digests; what differs is named.
    let diff = ["revision: \"r1\" -> \"r2\"", "revision: \"r2\" -> \"r1\""];
    assert!(
        text.contains("2 identities") && diff.iter().any(|d| text.contains(d)),
        "{text}"
    );

    let o = out(ucm()
        .args(["gc", "--store"])
        .arg(dir.path())
        .args(["--identity", &b]));
    assert!(o.status.success(), "{o:?}");
    assert!(String::from_utf8_lossy(&o.stdout).contains(&format!("removed identity {b}")));
    let left: Vec<String> = identities::list(dir.path())
        .unwrap()
        .into_iter()
        .map(|e| e.hex)
        .collect();
    assert_eq!(left, vec![a.clone()]);

    // Idle for less than a day: kept; with --max-idle 0: removed.
    let o = out(ucm()
        .args(["gc", "--store"])
        .arg(dir.path())
        .args(["--max-idle", "1"]));
    assert!(o.status.success() && String::from_utf8_lossy(&o.stdout).contains("removed 0"));
    std::thread::sleep(std::time::Duration::from_millis(20));
    let o = out(ucm()
        .args(["gc", "--store"])
        .arg(dir.path())
        .args(["--max-idle", "0"]));
    assert!(o.status.success() && String::from_utf8_lossy(&o.stdout).contains("removed 1"));
    assert!(identities::list(dir.path()).unwrap().is_empty());
}

#[test]
fn bad_identity_requests_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec!["--identity".into(), "nothex".into()],
            "not an identity digest",
        ),
        (
            vec!["--identity".into(), "0".repeat(32)],
            "holds no identity",
        ),
        (vec!["--max-idle=-1".into()], "give days"),
        (vec![], "give one of"),
    ];
    for (args, says) in cases {
        let o = out(ucm().args(["gc", "--store"]).arg(dir.path()).args(&args));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains(says), "{args:?}: {err}");
    }
    let o = out(ucm().args(["info", "--store", "/nonexistent/ucm"]));
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("not a directory"));
    let o = out(ucm().args(["gc", "--stale", "--store"]).arg(dir.path()));
    assert!(!o.status.success(), "--stale and --store conflict");
}
