//! The hit-ceiling metric through the embedding: a prompt that shares a
//! prefix with an earlier one but finds no checkpoint there is served
//! nothing, while unlimited capacity (a checkpoint at every grid point)
//! would have served the shared prefix; the metric says so.

use std::sync::Arc;

use ucm_coordinator::adapter::{Allocation, Scheduled};
use ucm_coordinator::{RequestKeys, SpecTable};
use ucm_ffi::{Backend, Cache, CacheOptions, RawRegion};

const SPEC: &str = r#"
model = "ceiling"
dtype = "fp32"
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
state_bytes = 8192
layers = "1"
retention = { request_end = true, second_unserved = true, speculative = false }
"#;

fn metric(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{name} missing:\n{text}"))
}

#[test]
fn the_ceiling_counts_what_unlimited_capacity_would_have_served() {
    let spec = SpecTable::from_toml(SPEC).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut opts = CacheOptions::new(dir.path());
    opts.store.pool_bytes = Some(4 << 20);
    let cache = Cache::open(spec, opts).unwrap();
    let mut sched = cache.scheduler();
    let mut mem = [vec![0u8; 4096 * 8], vec![0u8; 8192 * 2]];
    let mut worker = cache.worker(Backend::Host, 0, 0..2).unwrap();
    let regions: Vec<RawRegion> = mem
        .iter_mut()
        .enumerate()
        .map(|(l, m)| RawRegion {
            layer: l as u32,
            addr: m.as_mut_ptr() as u64,
            len: m.len(),
            stride: if l == 1 { 8192 } else { 4096 },
        })
        .collect();
    // SAFETY: the Vecs outlive `worker` (dropped at the end of the test,
    // before them: declared after).
    unsafe { worker.register_kv_caches(&regions) }.unwrap();
    let keys = RequestKeys::default();
    // "a" (64 tokens) computed in one step: its state is kept at 64 only.
    let a: Vec<u32> = (0..64).collect();
    assert_eq!(
        sched
            .get_num_new_matched_tokens("a", Arc::new(a.clone()), keys.clone(), 0)
            .unwrap(),
        0
    );
    let mut alloc = Allocation::default();
    alloc.blocks.insert(0, vec![0, 1, 2, 3]);
    alloc.state_slots.insert(1, 0);
    sched.update_state_after_alloc("a", alloc, 0).unwrap();
    let meta = sched
        .build_meta(&[Scheduled {
            req: "a".into(),
            start: 0,
            end: 64,
        }])
        .unwrap();
    worker.start_load_kv(meta).unwrap();
    for l in 0..2 {
        worker.wait_for_layer_load(l).unwrap();
        worker.save_kv_layer(l).unwrap();
    }
    worker.wait_for_save().unwrap();
    sched.request_finished("a");
    // "b" shares a's first 48 tokens, then diverges: no checkpoint at 48,
    // so nothing is served; a checkpoint at every grid point would have
    // served 48.
    let mut b: Vec<u32> = (0..48).collect();
    b.extend(1000..1016);
    let served = sched
        .get_num_new_matched_tokens("b", Arc::new(b), keys, 0)
        .unwrap();
    assert_eq!(served, 0);
    let text = cache.prometheus();
    assert_eq!(metric(&text, "ucm_lookup_tokens_total"), 63 + 63);
    assert_eq!(metric(&text, "ucm_served_tokens_total"), 0);
    assert_eq!(metric(&text, "ucm_hit_ceiling_tokens_total"), 48);
}
