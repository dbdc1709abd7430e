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
