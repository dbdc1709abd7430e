//! A small engine over the embeddable cache, shared by the runtime tests:
//! one chain group and one snapshot group on host memory, driven through
//! the scheduler and worker sides (the step metadata crossing the wire).

#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use ucm_coordinator::adapter::{Allocation, Scheduled};
use ucm_coordinator::{RequestKeys, SpecTable};
use ucm_ffi::{wire, Backend, Cache, CacheOptions, RawRegion, SchedulerSide, WorkerSide};

/// Blocks of 16 tokens (one layer) and states on a grid of 16 (one layer).
pub const SPEC: &str = r#"
model = "runtime-tests"
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

/// One engine instance: its cache's two sides and its memory.
pub struct Engine {
    pub sched: SchedulerSide,
    pub worker: WorkerSide,
    _mem: Vec<Vec<u8>>,
    _dir: Option<tempfile::TempDir>,
}

/// An instance on a fresh directory of its own.
pub fn engine() -> Engine {
    engine_with(SPEC)
}

/// An instance of `spec` (the layout of [`SPEC`]: a chain group on layer 0,
/// 4 KiB states on layer 1; its retention may differ) on a fresh
/// directory of its own.
pub fn engine_with(spec: &str) -> Engine {
    let dir = tempfile::tempdir().unwrap();
    let mut e = engine_of(spec, dir.path(), 1);
    e._dir = Some(dir);
    e
}

/// An instance on `dir` (shared with others), its memory filled with
/// `fill` (64 blocks, 8 state slots).
pub fn engine_in(dir: &std::path::Path, fill: u8) -> Engine {
    engine_of(SPEC, dir, fill)
}

/// An instance of `spec` (the layout of [`SPEC`]) on `dir`, its memory
/// filled with `fill`.
pub fn engine_of(spec: &str, dir: &std::path::Path, fill: u8) -> Engine {
    let mut opts = CacheOptions::new(dir);
    opts.store.pool_bytes = Some(2 << 20);
    let cache = Cache::open(SpecTable::from_toml(spec).unwrap(), opts).unwrap();
    let mem = vec![vec![fill; 4096 * 64], vec![fill ^ 0xff; 4096 * 8]];
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
        _dir: None,
    }
}

/// Engine blocks `blocks` and state slot `slot`.
pub fn alloc(blocks: std::ops::Range<u32>, slot: u32) -> Allocation {
    let mut a = Allocation::default();
    a.blocks.insert(0, blocks.collect());
    a.state_slots.insert(1, slot);
    a
}

/// One step of `req` computing `[start, end)`, until its saves are out.
pub fn step(e: &mut Engine, req: &str, start: u64, end: u64) {
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

/// The scheduler's hit for `tokens`.
pub fn lookup(e: &mut Engine, req: &str, tokens: &[u32]) -> u64 {
    e.sched
        .get_num_new_matched_tokens(req, Arc::new(tokens.to_vec()), RequestKeys::default(), 0)
        .unwrap()
}

/// The value of the unlabelled Prometheus metric `name` in `text`.
pub fn metric(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{name} missing:\n{text}"))
}
