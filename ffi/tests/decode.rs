//! Blocks and states that decoding completes are saved (a chat's next turn
//! re-sends the answer), and an allocation that grows after the first step
//! (an asynchronous load, chunked prefill) is followed: saves stop at the
//! blocks allocated and resume when more are.

use std::sync::Arc;
use std::time::Duration;

use ucm_coordinator::adapter::{Allocation, Scheduled};
use ucm_coordinator::{RequestKeys, SpecTable};
use ucm_ffi::{wire, Backend, Cache, CacheOptions, RawRegion, SchedulerSide, WorkerSide};

const SPEC: &str = r#"
model = "decode"
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
"#;

struct Engine {
    sched: SchedulerSide,
    worker: WorkerSide,
    _mem: Vec<Vec<u8>>,
    _dir: tempfile::TempDir,
}

fn engine() -> Engine {
    let spec = SpecTable::from_toml(SPEC).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut opts = CacheOptions::new(dir.path());
    opts.store.pool_bytes = Some(2 << 20);
    let cache = Cache::open(spec, opts).unwrap();
    let mem = vec![vec![1u8; 4096 * 64], vec![2u8; 4096 * 8]];
    let mut worker = cache.worker(Backend::Host, 0, 0..2).unwrap();
    let regions: Vec<RawRegion> = mem
        .iter()
        .enumerate()
        .map(|(l, m)| RawRegion {
            layer: l as u32,
            addr: m.as_ptr() as u64,
            len: m.len(),
            stride: 4096,
        })
        .collect();
    // SAFETY: the Vecs live in the returned Engine, after the worker in
    // field order, so they outlive it; they are never reallocated.
    unsafe { worker.register_kv_caches(&regions) }.unwrap();
    Engine {
        sched: cache.scheduler(),
        worker,
        _mem: mem,
        _dir: dir,
    }
}

fn alloc(blocks: std::ops::Range<u32>, slot: u32) -> Allocation {
    let mut a = Allocation::default();
    a.blocks.insert(0, blocks.collect());
    a.state_slots.insert(1, slot);
    a
}

fn step(e: &mut Engine, req: &str, start: u64, end: u64) {
    let meta = e
        .sched
        .build_meta(&[Scheduled {
            req: req.into(),
            start,
            end,
        }])
        .unwrap();
    let spec = Arc::clone(e.worker.cache().spec());
    let meta = wire::decode(&spec, &wire::encode(&meta)).unwrap();
    e.worker.start_load_kv(meta).unwrap();
    for l in 0..2 {
        e.worker.wait_for_layer_load(l).unwrap();
        e.worker.save_kv_layer(l).unwrap();
    }
    e.worker.wait_for_save().unwrap();
    for _ in 0..500 {
        if e.worker
            .get_finished(&[req.to_string()])
            .saved
            .contains(&req.to_string())
        {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("{req} never saved");
}

fn lookup(e: &mut Engine, req: &str, tokens: &[u32]) -> u64 {
    e.sched
        .get_num_new_matched_tokens(req, Arc::new(tokens.to_vec()), RequestKeys::default(), 0)
        .unwrap()
}

#[test]
fn blocks_and_states_completed_by_decoding_hit_the_next_turn() {
    let mut e = engine();
    let prompt: Vec<u32> = (0..40).collect();
    assert_eq!(lookup(&mut e, "a", &prompt), 0);
    e.sched
        .update_state_after_alloc("a", alloc(0..4, 0), 0)
        .unwrap();
    step(&mut e, "a", 0, 40);
    // Decoding: the answer grows to 64 tokens; the step that computes
    // position 63 completes blocks 2 and 3 (the prompt filled block 2 up to 40).
    let answer: Vec<u32> = (0..64).map(|i| if i < 40 { i } else { 500 + i }).collect();
    e.sched
        .extend_tokens("a", Arc::new(answer.clone()))
        .unwrap();
    step(&mut e, "a", 63, 64);
    e.sched.request_finished("a");

    let next_turn: Vec<u32> = answer.iter().copied().chain(900..910).collect();
    assert_eq!(
        lookup(&mut e, "b", &next_turn),
        64,
        "the decoded blocks and the state at 64"
    );
    // Another continuation of the prompt shares its 2 blocks, but no state
    // below 64: retention planned one at 32 (40 aligned down), and a state
    // exists only where a step ends (the prompt's step ended at 40).
    let other: Vec<u32> = prompt.iter().copied().chain(700..730).collect();
    assert_eq!(lookup(&mut e, "c", &other), 0);
}

#[test]
fn extended_tokens_must_begin_with_the_known_ones() {
    let mut e = engine();
    let prompt: Vec<u32> = (0..40).collect();
    lookup(&mut e, "a", &prompt);
    let err = e
        .sched
        .extend_tokens("a", Arc::new((1..50).collect()))
        .unwrap_err();
    assert!(err.to_string().contains("begin with"), "{err}");
    assert!(e.sched.extend_tokens("nope", Arc::new(vec![1])).is_err());
}

#[test]
fn saves_stop_at_the_allocated_blocks_and_resume_when_it_grows() {
    let mut e = engine();
    let prompt: Vec<u32> = (100..164).collect();
    lookup(&mut e, "a", &prompt);
    // Chunked prefill: 2 blocks allocated, 32 tokens computed.
    e.sched
        .update_state_after_alloc("a", alloc(0..2, 0), 0)
        .unwrap();
    step(&mut e, "a", 0, 32);
    e.sched.update_allocation("a", alloc(0..4, 0)).unwrap();
    step(&mut e, "a", 32, 64);
    e.sched.request_finished("a");
    let again: Vec<u32> = prompt.iter().copied().chain(1..3).collect();
    assert_eq!(
        lookup(&mut e, "b", &again),
        64,
        "all 4 blocks and the state at 64"
    );
    assert!(e.sched.update_allocation("never", alloc(0..1, 0)).is_err());
}

#[test]
fn a_step_past_the_allocation_saves_the_rest_once_it_is_allocated() {
    let mut e = engine();
    let prompt: Vec<u32> = (300..364).collect();
    lookup(&mut e, "a", &prompt);
    // The scheduler learns of only 2 blocks before a step that computes
    // all 64 tokens: it saves those 2, and the other 2 once allocated.
    e.sched
        .update_state_after_alloc("a", alloc(0..2, 0), 0)
        .unwrap();
    step(&mut e, "a", 0, 64);
    e.sched.update_allocation("a", alloc(0..4, 0)).unwrap();
    step(&mut e, "a", 64, 64);
    e.sched.request_finished("a");
    let again: Vec<u32> = prompt.iter().copied().chain(1..3).collect();
    assert_eq!(
        lookup(&mut e, "b", &again),
        64,
        "all 4 blocks and the state at 64"
    );
}
