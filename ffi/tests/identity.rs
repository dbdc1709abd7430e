//! Cache identity through a real store: what one deployment saved is
//! served to nobody whose identity differs in any field, and to the same
//! deployment opened again in full.

mod common;

use common::{alloc, engine_of, lookup, step, SPEC};

const IDENTITY: &str = r#"
[identity]
revision = "r1"
weights = "md5:aa"
quantization = "none"
position = "rope theta=10000"
extra = { tokenizer = "t1" }
[identity.groups.attn]
kv_dtype = "bf16"
layout = "L1"
[identity.groups.ssm]
kv_dtype = "fp32"
layout = "S1"
"#;

#[test]
fn a_deployment_that_differs_in_any_field_is_served_nothing_and_the_same_one_everything() {
    let dir = tempfile::tempdir().unwrap();
    let spec = format!("{SPEC}{IDENTITY}");
    let tokens: Vec<u32> = (0..64).collect();
    // A later turn: a's 64 tokens (blocks and the state at 64) and more.
    let next: Vec<u32> = (0..80).collect();
    {
        let mut e = engine_of(&spec, dir.path(), 1);
        assert_eq!(lookup(&mut e, "a", &tokens), 0);
        e.sched
            .update_state_after_alloc("a", alloc(0..4, 0), 0)
            .unwrap();
        step(&mut e, "a", 0, 64);
        e.sched.request_finished("a");
    }
    let changes = [
        ("revision", "r1", "r2"),
        ("weights", "md5:aa", "md5:ab"),
        ("quantization", "\"none\"", "\"fp8\""),
        ("position", "theta=10000", "theta=20000"),
        ("extra", "t1", "t2"),
        ("kv_dtype", "\"bf16\"", "\"fp8_e4m3\""),
        ("layout", "L1", "L2"),
        ("state layout", "S1", "S2"),
    ];
    for (field, from, to) in changes {
        let other = format!("{SPEC}{}", IDENTITY.replacen(from, to, 1));
        assert_ne!(other, spec, "{field}");
        let mut e = engine_of(&other, dir.path(), 2);
        assert_eq!(
            lookup(&mut e, "b", &next),
            0,
            "{field}: a hit across identities"
        );
    }
    // Without an identity at all: nothing either.
    let mut e = engine_of(SPEC, dir.path(), 2);
    assert_eq!(lookup(&mut e, "b", &next), 0, "no identity");
    // The same deployment again: the whole servable prefix.
    let mut e = engine_of(&spec, dir.path(), 2);
    assert_eq!(lookup(&mut e, "c", &next), 64);
}

/// Saves one request of 64 tokens through a fresh instance of `spec` on
/// `dir`.
fn save_one(spec: &str, dir: &std::path::Path) {
    let mut e = engine_of(spec, dir, 1);
    let tokens: Vec<u32> = (0..64).collect();
    lookup(&mut e, "a", &tokens);
    e.sched
        .update_state_after_alloc("a", alloc(0..4, 0), 0)
        .unwrap();
    step(&mut e, "a", 0, 64);
    e.sched.request_finished("a");
}

#[test]
fn each_identity_keeps_its_stores_apart_is_listed_with_its_bytes_and_can_be_dropped() {
    use ucm_coordinator::adapter::identities;
    use ucm_coordinator::SpecTable;
    let dir = tempfile::tempdir().unwrap();
    let a = format!("{SPEC}{IDENTITY}");
    let b = format!("{SPEC}{}", IDENTITY.replacen("r1", "r2", 1));
    save_one(&a, dir.path());
    save_one(&b, dir.path());
    let (ta, tb) = (
        SpecTable::from_toml(&a).unwrap(),
        SpecTable::from_toml(&b).unwrap(),
    );
    let (ha, hb) = (
        ta.identity.as_ref().unwrap().hex(),
        tb.identity.as_ref().unwrap().hex(),
    );
    // Stores under id-<digest>/<group>, with the canonical text beside.
    for (t, h) in [(&ta, &ha), (&tb, &hb)] {
        let root = dir.path().join(format!("id-{h}"));
        assert!(root.join("attn").is_dir() && root.join("ssm").is_dir());
        let text = std::fs::read_to_string(root.join("IDENTITY")).unwrap();
        assert_eq!(text, t.identity.as_ref().unwrap().text);
    }
    assert!(
        !dir.path().join("attn").exists(),
        "nothing at the old place"
    );
    let listed = identities::list(dir.path()).unwrap();
    assert_eq!(listed.iter().map(|e| e.hex.clone()).collect::<Vec<_>>(), {
        let mut v = vec![ha.clone(), hb.clone()];
        v.sort();
        v
    });
    for e in &listed {
        assert_eq!(e.model, "runtime-tests");
        // 4 blocks of 4 KiB and a state of 4 KiB at least.
        assert!(e.bytes >= 5 * 4096, "{} holds {} bytes", e.hex, e.bytes);
    }
    // What differs, for the operator.
    let note = identities::others_note(dir.path(), &ta).unwrap();
    assert!(
        note.contains(&hb) && note.contains("revision: \"r1\" -> \"r2\""),
        "{note}"
    );
    assert!(identities::others_note(dir.path(), &SpecTable::from_toml(SPEC).unwrap()).is_none());
    // Dropping b leaves a whole: a still hits.
    let freed = identities::remove(dir.path(), &hb).unwrap();
    assert!(freed >= 5 * 4096);
    assert!(!dir.path().join(format!("id-{hb}")).exists());
    assert!(identities::others_note(dir.path(), &ta).is_none());
    let mut e = engine_of(&a, dir.path(), 2);
    let next: Vec<u32> = (0..80).collect();
    assert_eq!(lookup(&mut e, "c", &next), 64);
    // Bad digests are refused.
    assert!(identities::remove(dir.path(), &hb).is_err());
    assert!(identities::remove(dir.path(), "../x").is_err());
}

#[test]
fn idle_identities_age_out_when_stores_open_and_the_opener_keeps_its_own() {
    use ucm_coordinator::adapter::identities;
    use ucm_coordinator::SpecTable;
    let dir = tempfile::tempdir().unwrap();
    let a = format!("{SPEC}{IDENTITY}");
    let b = format!("{SPEC}{}", IDENTITY.replacen("r1", "r2", 1));
    save_one(&a, dir.path());
    let ha = SpecTable::from_toml(&a).unwrap().identity.unwrap().hex();
    // a was last used 30 days ago.
    let file = dir.path().join(format!("id-{ha}")).join("IDENTITY");
    let old = std::time::SystemTime::now() - std::time::Duration::from_secs(30 * 86_400);
    std::fs::OpenOptions::new()
        .append(true)
        .open(&file)
        .unwrap()
        .set_modified(old)
        .unwrap();
    // Nothing idle for over 40 days: kept.
    assert!(identities::expire(
        dir.path(),
        std::time::Duration::from_secs(40 * 86_400),
        None
    )
    .unwrap()
    .is_empty());
    // b opens its stores (default: 14 days): a goes, b stays.
    save_one(&b, dir.path());
    let left: Vec<String> = identities::list(dir.path())
        .unwrap()
        .into_iter()
        .map(|e| e.hex)
        .collect();
    let hb = SpecTable::from_toml(&b).unwrap().identity.unwrap().hex();
    assert_eq!(left, vec![hb.clone()]);
    // Opening marks as used: b's IDENTITY, made old, is fresh again.
    let fb = dir.path().join(format!("id-{hb}")).join("IDENTITY");
    std::fs::OpenOptions::new()
        .append(true)
        .open(&fb)
        .unwrap()
        .set_modified(old)
        .unwrap();
    save_one(&b, dir.path());
    let m = std::fs::metadata(&fb).unwrap();
    assert!(m.modified().unwrap().elapsed().unwrap() < std::time::Duration::from_secs(60));
    // What an interrupted removal left is cleared.
    let left = dir.path().join(".id-0123.gone.7");
    std::fs::create_dir_all(left.join("attn")).unwrap();
    identities::expire(dir.path(), std::time::Duration::from_secs(86_400), None).unwrap();
    assert!(!left.exists());
    // Its own identity is never expired by its own open, however idle.
    assert!(
        identities::expire(dir.path(), std::time::Duration::ZERO, Some(&hb))
            .unwrap()
            .is_empty()
    );
}
