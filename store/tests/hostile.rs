//! Hostile files inside a store: links, oversized markers, foreign and
//! malformed files, concurrent first opens. Each test builds the hostile
//! state, opens or uses the store, and checks that nothing outside the
//! store changed and that nothing false is reported present.

use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::Path;
use std::sync::Arc;

use ucm_device::{IoBuf, IoEngine, IoEngineConfig, IoEngineKind};
use ucm_store::{DiskConfig, DiskTier, Geometry, StoreError};

const GEO: Geometry = Geometry {
    shard_bytes: 4096,
    shards_per_block: 2,
};

fn engine() -> Arc<dyn IoEngine> {
    Arc::from(IoEngineConfig::new(IoEngineKind::Posix).build().unwrap())
}

fn open(dir: &Path) -> ucm_store::Result<DiskTier> {
    DiskTier::open(DiskConfig::new(dir, GEO, 100), engine())
}

fn shards(v: u8) -> Vec<IoBuf> {
    (0..GEO.shards_per_block)
        .map(|_| {
            let mut b = IoBuf::new(GEO.shard_bytes);
            b.as_mut_slice().fill(v);
            b
        })
        .collect()
}

/// An outside directory with a file and a mode, and a check that both are
/// unchanged.
struct Outside {
    dir: tempfile::TempDir,
}

impl Outside {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("precious"), b"keep me").unwrap();
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
        Outside { dir }
    }
    fn path(&self) -> &Path {
        self.dir.path()
    }
    fn unchanged(&self) {
        assert_eq!(fs::read(self.path().join("precious")).unwrap(), b"keep me");
        let mode = fs::metadata(self.path()).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o755, "the outside directory was chmodded");
        assert_eq!(
            fs::read_dir(self.path()).unwrap().count(),
            1,
            "files appeared outside"
        );
    }
}

#[test]
fn a_tmp_or_blocks_link_is_refused_and_its_target_untouched() {
    for sub in ["tmp", "blocks"] {
        let store = tempfile::tempdir().unwrap();
        let out = Outside::new();
        symlink(out.path(), store.path().join(sub)).unwrap();
        match open(store.path()) {
            Err(StoreError::Unsafe { why, .. }) => assert!(why.contains("link"), "{why}"),
            Err(e) => panic!("{sub}: unexpected {e}"),
            Ok(_) => panic!("{sub}: a link was followed"),
        }
        out.unchanged();
    }
}

#[test]
fn a_fanout_link_cannot_carry_a_block_outside() {
    let store = tempfile::tempdir().unwrap();
    let out = Outside::new();
    let t = open(store.path()).unwrap();
    let id = [0xab; 16];
    symlink(out.path(), store.path().join("blocks").join("ab")).unwrap();
    assert!(t.write_block(&id, shards(1)).is_err());
    assert!(!t.exists(&id));
    out.unchanged();
}

#[test]
fn the_geometry_marker_is_never_followed_or_echoed_whole() {
    // A link to a file outside.
    let store = tempfile::tempdir().unwrap();
    let out = Outside::new();
    symlink(out.path().join("precious"), store.path().join("GEOMETRY")).unwrap();
    let e = open(store.path())
        .err()
        .expect("a linked marker was accepted");
    assert!(!e.to_string().contains("keep me"), "{e}");
    out.unchanged();
    // A huge marker: refused at once, with a short message.
    let store = tempfile::tempdir().unwrap();
    let f = fs::File::create(store.path().join("GEOMETRY")).unwrap();
    f.set_len(200 << 20).unwrap();
    let e = open(store.path())
        .err()
        .expect("a 200 MB marker was accepted");
    assert!(e.to_string().len() < 300, "{} bytes", e.to_string().len());
    // A long wrong marker is echoed only as a short prefix.
    let store = tempfile::tempdir().unwrap();
    fs::write(store.path().join("GEOMETRY"), "z".repeat(3000)).unwrap();
    match open(store.path()) {
        Err(StoreError::GeometryMismatch { found, .. }) => assert!(found.len() < 100),
        other => panic!("{:?}", other.err()),
    }
}

#[test]
fn cleanup_removes_only_dead_writers_regular_files() {
    let store = tempfile::tempdir().unwrap();
    drop(open(store.path()).unwrap());
    let tmp = store.path().join("tmp");
    let out = Outside::new();
    let name = |w: &str, n: u32| format!("{}.{w}.{n}.tmp", "ab".repeat(16));
    let dead_w = ucm_store::paths::dead_writer();
    // Each of these must survive the open; only `dead_file` goes.
    let dead_file = tmp.join(name(&dead_w, 0));
    fs::write(&dead_file, b"x").unwrap();
    fs::write(tmp.join("notes.txt"), b"not the store's").unwrap();
    fs::write(
        tmp.join(name(ucm_store::paths::writer_id(), 1)),
        b"in flight",
    )
    .unwrap();
    fs::create_dir(tmp.join(name(&dead_w, 2))).unwrap();
    symlink(out.path().join("precious"), tmp.join(name(&dead_w, 3))).unwrap();
    drop(open(store.path()).unwrap());
    assert!(!dead_file.exists());
    assert_eq!(fs::read_dir(&tmp).unwrap().count(), 4);
    out.unchanged();
}

#[test]
fn presence_is_a_regular_file_of_the_full_length() {
    let store = tempfile::tempdir().unwrap();
    let t = open(store.path()).unwrap();
    let good = [1u8; 16];
    t.write_block(&good, shards(7)).unwrap();
    assert!(t.exists(&good));
    let place = |id: &[u8; 16]| {
        let p = t.path_of(id);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        p
    };
    // Empty, truncated, a directory, a FIFO, a link to a whole valid block.
    let ids: Vec<[u8; 16]> = (2..7u8).map(|i| [i; 16]).collect();
    fs::write(place(&ids[0]), b"").unwrap();
    let whole = fs::read(t.path_of(&good)).unwrap();
    fs::write(place(&ids[1]), &whole[..whole.len() - 1]).unwrap();
    fs::create_dir(place(&ids[2])).unwrap();
    let fifo = place(&ids[3]);
    assert!(std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    symlink(t.path_of(&good), place(&ids[4])).unwrap();
    // (Before any read, which removes a damaged file.) A tier that has
    // seen none of them (a new process) asks the file system: the prefix stops at the first bad file, and a batch large
    // enough to be split over threads sees the same as a small one.
    let fresh = open(store.path()).unwrap();
    assert_eq!(fresh.lookup_on_prefix(&[good, ids[0], good]), 1);
    let fresh = open(store.path()).unwrap();
    let mut many = vec![good; 600];
    many.extend(&ids);
    let got = fresh.lookup(&many);
    assert!(got[..600].iter().all(|&p| p), "the valid block");
    assert!(got[600..].iter().all(|&p| !p), "a bad file counted");
    for id in &ids {
        assert!(!t.exists(id), "{id:?} counted as present");
        // The load path refuses it too (a miss or an error, never bytes,
        // and never a hang on the FIFO).
        assert!(
            !matches!(t.read_shards(id, &[0]), Ok(Some(_))),
            "{id:?} read"
        );
    }
    assert!(t.lookup(&ids).iter().all(|p| !p));
    assert_eq!(t.enumerate(), vec![good]);
}

#[test]
fn concurrent_first_opens_all_succeed() {
    for _ in 0..50 {
        let store = tempfile::tempdir().unwrap();
        let path = store.path().join("s");
        let hs: Vec<_> = (0..4)
            .map(|_| {
                let p = path.clone();
                std::thread::spawn(move || open(&p).map(|_| ()))
            })
            .collect();
        for h in hs {
            h.join().unwrap().unwrap();
        }
    }
}

#[test]
fn another_process_keeps_its_in_flight_temporary_files() {
    // A child process (another writer) holds a temporary file; this
    // process opening the store must leave it.
    let store = tempfile::tempdir().unwrap();
    drop(open(store.path()).unwrap());
    let mut child = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    let stat = fs::read_to_string(format!("/proc/{}/stat", child.id())).unwrap();
    let start = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .nth(19)
        .unwrap()
        .to_string();
    let host = ucm_store::paths::writer_id()
        .split('-')
        .next()
        .unwrap()
        .to_string();
    let theirs = store.path().join("tmp").join(format!(
        "{}.{host}-{}-{start}.0.tmp",
        "ef".repeat(16),
        child.id()
    ));
    fs::write(&theirs, b"in flight").unwrap();
    drop(open(store.path()).unwrap());
    assert!(theirs.exists(), "a live writer's file was removed");
    child.kill().unwrap();
    child.wait().unwrap();
    drop(open(store.path()).unwrap());
    assert!(!theirs.exists(), "a dead writer's file stayed");
}
