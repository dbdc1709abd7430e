//! The engine harness's content oracle, driven through the interfaces the
//! bindings use: `ffi::runtime` (what the C ABI and the Python module wrap)
//! with every step's metadata round-tripped through the wire format. A
//! chain group, a windowed group and a snapshot group; prompts that share
//! prefixes; engine memory poisoned before each request. Every loaded block
//! and state must equal the oracle's bytes for its id, every block the
//! design does not load must still be poison. The same run with the
//! scheduler told the wrong engine blocks must fail the oracle.

use std::sync::Arc;
use std::time::Duration;

use ucm_coordinator::adapter::{Allocation, Scheduled};
use ucm_coordinator::{RequestKeys, SpecTable};
use ucm_ffi::{hashing, wire, Backend, Cache, CacheOptions, RawRegion};
use ucm_harness::oracle::{content, is_poison, loaded_blocks, POISON};

const SPEC: &str = r#"
model = "oracle-ffi"
dtype = "fp32"
num_layers = 4

[[group]]
name = "attn"
kind = "chain"
block_size = 16
layers = "0-1"
bytes_per_token = 256

[[group]]
name = "swa"
kind = "chain"
block_size = 16
window = 32
layers = "2"
bytes_per_token = 256

[[group]]
name = "ssm"
kind = "snapshot"
grid = 16
state_bytes = 8192
layers = "3"
"#;

const BLOCK: usize = 16 * 256;
const STATE: usize = 8192;
const BLOCKS: usize = 64;
const SLOTS: usize = 8;

fn seq(seed: u32, n: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (seed * 7919 + i * 104_729) % 30_000 + 10)
        .collect()
}

/// Runs the workload; `Err` names the first byte range the oracle rejects.
fn run(wrong_blocks: bool) -> Result<Vec<u64>, String> {
    let spec = SpecTable::from_toml(SPEC).map_err(|e| e.to_string())?;
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let mut opts = CacheOptions::new(dir.path());
    opts.store.pool_bytes = Some(4 << 20);
    let cache = Cache::open(spec.clone(), opts).map_err(|e| e.to_string())?;
    let mut sched = cache.scheduler();
    // The engine's memory is declared before the worker, so it outlives it
    // on every return (the worker settles its step when dropped).
    let mut mem: Vec<Vec<u8>> = (0..3).map(|_| vec![POISON; BLOCK * BLOCKS]).collect();
    mem.push(vec![POISON; STATE * SLOTS]);
    let mut worker = cache
        .worker(Backend::Host, 0, 0..4)
        .map_err(|e| e.to_string())?;
    let regions: Vec<RawRegion> = mem
        .iter()
        .enumerate()
        .map(|(l, m)| RawRegion {
            layer: l as u32,
            addr: m.as_ptr() as u64,
            len: m.len(),
            stride: if l == 3 { STATE } else { BLOCK },
        })
        .collect();
    // SAFETY: the regions are the Vecs above, never reallocated, and they
    // outlive `worker` (declared after them, so dropped first).
    unsafe { worker.register_kv_caches(&regions) }.map_err(|e| e.to_string())?;

    let base = seq(1, 64);
    let prompts = [
        base.clone(),
        [base.clone(), seq(2, 32)].concat(),
        [base.clone(), seq(2, 32), seq(3, 16)].concat(),
        seq(4, 48),
        [base.clone(), seq(2, 32)].concat(),
    ];
    let keys = RequestKeys::default();
    let mut served = Vec::new();
    let mut next_block = 0usize;
    for (r, tokens) in prompts.iter().enumerate() {
        let id = format!("r{r}");
        let n = tokens.len();
        let p = sched
            .get_num_new_matched_tokens(&id, Arc::new(tokens.clone()), keys.clone(), 0)
            .map_err(|e| e.to_string())?;
        served.push(p);
        // Engine blocks rotate: no two requests share one.
        let nb = n.div_ceil(16);
        let blocks: Vec<u32> = (0..nb)
            .map(|i| ((next_block + i) % BLOCKS) as u32)
            .collect();
        next_block += nb;
        let slot = (r % SLOTS) as u32;
        for layer in mem.iter_mut().take(3) {
            for &b in &blocks {
                layer[b as usize * BLOCK..][..BLOCK].fill(POISON);
            }
        }
        mem[3][slot as usize * STATE..][..STATE].fill(POISON);
        let told: Vec<u32> = if wrong_blocks {
            blocks.iter().map(|b| (b + 1) % BLOCKS as u32).collect()
        } else {
            blocks.clone()
        };
        let mut alloc = Allocation::default();
        alloc.blocks.insert(0, told.clone());
        alloc.blocks.insert(1, told);
        alloc.state_slots.insert(2, slot);
        sched
            .update_state_after_alloc(&id, alloc, p)
            .map_err(|e| e.to_string())?;
        let meta = sched
            .build_meta(&[Scheduled {
                req: id.clone(),
                start: p,
                end: n as u64,
            }])
            .map_err(|e| e.to_string())?;
        let meta = wire::decode(&spec, &wire::encode(&meta)).map_err(|e| e.to_string())?;
        worker.start_load_kv(meta).map_err(|e| e.to_string())?;

        let ids = |g: &str| hashing::block_ids(&spec, 1, &keys, tokens, g, 0).unwrap();
        for l in 0..4u32 {
            worker.wait_for_layer_load(l).map_err(|e| e.to_string())?;
            let m = &mut mem[l as usize];
            if l == 3 {
                let at = &m[slot as usize * STATE..][..STATE];
                if p > 0 {
                    let h = hashing::checkpoint(&spec, 1, &keys, tokens, "ssm", 0, p).unwrap();
                    if at != content(&h, 3, 0, STATE).as_slice() {
                        return Err(format!("{id}: the state at {p} is not the oracle's"));
                    }
                } else if !is_poison(at) {
                    return Err(format!("{id}: a state was written on a miss"));
                }
                // The engine computes to the end: the state at n.
                let h = hashing::checkpoint(&spec, 1, &keys, tokens, "ssm", 0, n as u64).unwrap();
                m[slot as usize * STATE..][..STATE].copy_from_slice(&content(&h, 3, 0, STATE));
            } else {
                let (g, gi) = if l < 2 { ("attn", 0) } else { ("swa", 1) };
                let gids = ids(g);
                let load = loaded_blocks(&spec, gi, p, 0);
                for (i, &b) in blocks.iter().enumerate() {
                    let at = &m[b as usize * BLOCK..][..BLOCK];
                    if (i as u64) < p / 16 {
                        if load.contains(&i) {
                            if at != content(&gids[i], l, 0, BLOCK).as_slice() {
                                return Err(format!(
                                    "{id}: layer {l} block {i} is not the oracle's"
                                ));
                            }
                        } else if !is_poison(at) {
                            return Err(format!(
                                "{id}: layer {l} block {i} outside the window was written"
                            ));
                        }
                    } else if !is_poison(at) {
                        return Err(format!("{id}: layer {l} block {i} beyond p* was written"));
                    }
                }
                // The engine computes the blocks beyond p*.
                for i in (p / 16) as usize..n / 16 {
                    let b = blocks[i] as usize;
                    m[b * BLOCK..][..BLOCK].copy_from_slice(&content(&gids[i], l, 0, BLOCK));
                }
            }
            worker.save_kv_layer(l).map_err(|e| e.to_string())?;
        }
        worker.wait_for_save().map_err(|e| e.to_string())?;
        let errs = worker.block_ids_with_load_errors();
        if !errs.is_empty() {
            return Err(format!("{id}: load errors {errs:?}"));
        }
        let mut saved = false;
        for _ in 0..500 {
            let f = worker.get_finished(std::slice::from_ref(&id));
            if !f.save_failed.is_empty() {
                return Err(format!("{id}: failed saves {:?}", f.save_failed));
            }
            if f.saved.contains(&id) {
                saved = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        if !saved {
            return Err(format!("{id}: never saved"));
        }
        sched.request_finished(&id);
    }
    Ok(served)
}

#[test]
fn every_loaded_byte_is_the_oracles_through_the_binding_interfaces() {
    let served = run(false).expect("the oracle accepts the run");
    assert_eq!(served, vec![0, 64, 96, 0, 64], "tokens served per request");
}

#[test]
fn the_oracle_rejects_loads_into_the_wrong_engine_blocks() {
    let err = run(true).expect_err("the scheduler was told the wrong blocks");
    assert!(err.contains("r1"), "{err}");
}
