//! Compiles `tests/c/abi_test.c` with `cc` against the shared library and
//! runs it: create and destroy, the golden hash vectors (the C program
//! prints what the ABI computes; this test compares it with
//! `coordinator/tests/golden/hash-vectors.json`), a save then load round
//! trip through the worker on host memory, bad arguments, and a cache with
//! no disk over the remote and cold tiers (a Redis cluster and an S3
//! server on loopback; skipped without them unless `UCM_REQUIRE_REDIS=1` /
//! `UCM_REQUIRE_S3=1`).

#[path = "../../store/tests/redis_cluster/mod.rs"]
mod redis_cluster;
#[path = "../../store/tests/s3_server/mod.rs"]
mod s3_server;

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// `target/<profile>/deps`, where cargo builds `libucm_ffi.so` for this
/// test (the copy one level up is refreshed only by `cargo build`).
fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable");
    exe.parent().expect("target/<profile>/deps").to_path_buf()
}

fn build(out: &Path) -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    compile(
        &manifest.join("tests/c/abi_test.c"),
        &out.join("abi_test"),
        &["-D_DEFAULT_SOURCE"],
    )
}

/// Compiles the C program `src` against the freshly built library into
/// `exe`, warnings as errors.
fn compile(src: &Path, exe: &Path, extra: &[&str]) -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let lib = lib_dir();
    assert!(
        lib.join("libucm_ffi.so").exists(),
        "libucm_ffi.so not in {}",
        lib.display()
    );
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let st = Command::new(&cc)
        .arg("-std=c11")
        .args(extra)
        .args(["-Wall", "-Wextra", "-Werror", "-O1"])
        .arg("-I")
        .arg(manifest.join("include"))
        .arg(src)
        .arg("-o")
        .arg(exe)
        .arg(format!("-L{}", lib.display()))
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .arg("-lucm_ffi")
        .status()
        .unwrap_or_else(|e| panic!("{cc}: {e}"));
    assert!(st.success(), "compiling {} failed", src.display());
    exe.to_path_buf()
}

fn run(exe: &Path, args: &[String]) -> String {
    // cargo puts target/<profile> (whose copy of the library may be stale)
    // on LD_LIBRARY_PATH, which wins over a runpath: name the fresh one.
    let out = Command::new(exe)
        .args(args)
        .env("LD_LIBRARY_PATH", lib_dir())
        .output()
        .expect("run abi_test");
    assert!(
        out.status.success(),
        "abi_test {args:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

#[test]
fn c_program_round_trips_checks_arguments_and_matches_golden_hashes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = build(dir.path());
    // Both sync modes: `files` never calls syncfs; `auto` does where the
    // file system's syncfs stands for an fsync of each file.
    for mode in ["files", "auto"] {
        let rt = dir.path().join(format!("rt-{mode}"));
        let out = run(
            &exe,
            &["roundtrip".into(), rt.display().to_string(), mode.into()],
        );
        let shown = |what: &str| -> u64 {
            out.lines()
                .find_map(|l| l.strip_prefix(what)?.strip_prefix(' '))
                .and_then(|n| n.trim().parse().ok())
                .unwrap_or_else(|| panic!("no {what} line in {out:?}"))
        };
        assert!(
            shown("blocks_written") > 0,
            "{mode}: blocks reached the disk"
        );
        let syncs = shown("fs_syncs");
        let by_fs = ucm_device::io::IoDir::open(dir.path())
            .unwrap()
            .syncfs_reports_all();
        let want = mode == "auto" && by_fs;
        assert_eq!(syncs > 0, want, "{mode}: {syncs} syncfs calls");
    }
    run(
        &exe,
        &[
            "badargs".into(),
            dir.path().join("bad").display().to_string(),
        ],
    );

    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let golden: Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("coordinator/tests/golden/hash-vectors.json"))
            .expect("golden vectors"),
    )
    .expect("json");
    let mut checked = 0;
    for v in golden["vectors"].as_array().expect("vectors") {
        let spec = root.join(v["spec"].as_str().expect("spec"));
        let salt = v["cache_salt"].as_str().unwrap_or("-").to_string();
        let extra = v["extra_keys_hex"]
            .as_array()
            .and_then(|a| a.first())
            .and_then(Value::as_str)
            .unwrap_or("-")
            .to_string();
        let mut args = vec![
            "hash".to_string(),
            spec.display().to_string(),
            v["tp_size"].to_string(),
            salt,
            extra,
        ];
        let mut expect = Vec::new();
        for (g, ranks) in v["blocks"].as_object().expect("blocks") {
            for (r, ids) in ranks.as_object().expect("ranks") {
                let item = format!("b:{g}:{r}");
                let hexes: Vec<&str> = ids
                    .as_array()
                    .expect("ids")
                    .iter()
                    .map(|x| x.as_str().expect("hex"))
                    .collect();
                expect.push(format!("{item} {}", hexes.join(" ")).trim_end().to_string());
                args.push(item);
            }
        }
        for (g, ranks) in v["checkpoints"].as_object().expect("checkpoints") {
            for (r, at) in ranks.as_object().expect("ranks") {
                for (p, h) in at.as_object().expect("positions") {
                    let item = format!("c:{g}:{r}:{p}");
                    expect.push(format!("{item} {}", h.as_str().expect("hex")));
                    args.push(item);
                }
            }
        }
        let got = run(&exe, &args);
        let got: Vec<&str> = got.lines().map(str::trim_end).collect();
        assert_eq!(got.len(), expect.len(), "one line per item");
        for (g, e) in got.iter().zip(&expect) {
            assert_eq!(g, e, "the C ABI disagrees with the golden vector");
            checked += 1;
        }
    }
    assert!(checked > 50, "only {checked} golden items checked");
}

/// Runs `abi_test tiers` over the remote and cold URLs given ("-": none):
/// a cache with `no_disk` saves a prompt, and a second cache in another
/// directory, with its own pool and no disk, is served it from the tiers
/// below, byte for byte.
fn tiers_round_trip(remote: &str, cold: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = build(dir.path());
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    let out = run(
        &exe,
        &[
            "tiers".into(),
            a.display().to_string(),
            b.display().to_string(),
            remote.into(),
            cold.into(),
        ],
    );
    assert!(out.contains("served 48"), "{out}");
    for d in [&a, &b] {
        // A block of one layer is 4 KiB; the store's own small files
        // (markers, leases) are far smaller.
        let big: Vec<_> = walk(d)
            .into_iter()
            .filter(|p| std::fs::metadata(p).is_ok_and(|m| m.len() >= 4096))
            .collect();
        assert!(
            big.is_empty(),
            "no block files on a node without a disk tier: {big:?}"
        );
    }
}

fn walk(d: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(d) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(walk(&p));
            } else {
                out.push(p);
            }
        }
    }
    out
}

#[test]
fn c_program_with_no_disk_is_served_through_the_remote_tier() {
    let Some(c) = redis_cluster::Cluster::start(3) else {
        return;
    };
    tiers_round_trip(&c.url(), "-");
}

#[test]
fn c_program_with_no_disk_is_served_through_the_cold_tier() {
    let Some(s3) = s3_server::S3Server::start() else {
        return;
    };
    s3_server::credentials();
    tiers_round_trip("-", &s3.url("c-abi"));
}

/// The C quick start of `docs/embedding.md` compiles and runs as written.
#[test]
fn the_c_quick_start_in_the_docs_runs() {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(manifest.join("../docs/embedding.md")).unwrap();
    let start = doc.find("```c\n").expect("a C block in docs/embedding.md") + 5;
    let end = start + doc[start..].find("```").expect("the block ends");
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("quick.c");
    std::fs::write(&src, &doc[start..end]).unwrap();
    let exe = compile(&src, &dir.path().join("quick"), &[]);
    let out = run(&exe, &[dir.path().join("store").display().to_string()]);
    assert!(out.contains("6 blocks, the first id starts"), "{out}");
    assert!(out.contains("request req-1: 0 tokens from cache"), "{out}");
}
