//! The hit-ceiling metric through the embedding: a prompt that shares a
//! prefix with an earlier one but finds no checkpoint there is served
//! nothing, while unlimited capacity (a checkpoint at every grid point)
//! would have served the shared prefix; the metric says so.

mod common;

use common::{alloc, engine_with, lookup, metric, step};

/// The runtime tests' layout, keeping states only where a request ends and
/// at the second unserved occurrence of a junction (no speculative ones).
const SPEC: &str = r#"
model = "ceiling"
num_layers = 2
[[group]]
name = "attn"
kind = "chain"
block_size = 16
layers = "0"
bytes_per_token = 256
[[group]]
name = "ssm"
kind = "snapshot"
grid = 16
state_bytes = 4096
layers = "1"
retention = { request_end = true, second_unserved = true, speculative = false }
"#;

#[test]
fn the_ceiling_counts_what_unlimited_capacity_would_have_served() {
    let mut e = engine_with(SPEC);
    // "a" (64 tokens) computed in one step: its state is kept at 64 only.
    let a: Vec<u32> = (0..64).collect();
    assert_eq!(lookup(&mut e, "a", &a), 0);
    e.sched
        .update_state_after_alloc("a", alloc(0..4, 0), 0)
        .unwrap();
    step(&mut e, "a", 0, 64);
    e.sched.request_finished("a");
    // "b" shares a's first 48 tokens, then diverges: no checkpoint at 48,
    // so nothing is served; a checkpoint at every grid point would have
    // served 48.
    let mut b: Vec<u32> = (0..48).collect();
    b.extend(1000..1016);
    assert_eq!(lookup(&mut e, "b", &b), 0);
    let text = e.worker.cache().prometheus();
    assert_eq!(metric(&text, "ucm_lookup_tokens_total"), 63 + 63);
    assert_eq!(metric(&text, "ucm_served_tokens_total"), 0);
    assert_eq!(metric(&text, "ucm_hit_ceiling_tokens_total"), 48);
}
