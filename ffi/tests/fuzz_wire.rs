//! Step metadata from elsewhere (another process, a pickle, the C ABI's
//! `ucm_worker_start_load`) under mutation, from a valid message for one
//! request of 4 blocks that loads and saves: every single bit flip, every
//! offset set to extreme 32- and 64-bit values, then random mutants
//! (random bytes, extremes, truncations, extensions). Each mutant is
//! decoded and, when it decodes, run through a whole step of a real worker
//! on host memory. The run is bounded in count (`UCM_FUZZ_CASES` random
//! mutants, default 500) and in memory (the process's address
//! space is capped 2 GiB above what it holds when the test starts, so an
//! allocation driven by a decoded count aborts the test instead of taking
//! the machine). Errors are fine; a panic, an abort or a hang is not.

use std::sync::Arc;

use ucm_coordinator::adapter::{Allocation, Scheduled};
use ucm_coordinator::{RequestKeys, SpecTable};
use ucm_ffi::{wire, Backend, Cache, CacheOptions, RawRegion};

const SPEC: &str = r#"
model = "fuzz-wire"
dtype = "fp32"
num_layers = 3

[[group]]
name = "attn"
kind = "chain"
block_size = 16
layers = "0-1"
bytes_per_token = 256

[[group]]
name = "ssm"
kind = "snapshot"
grid = 16
state_bytes = 8192
layers = "2"
"#;

const BLOCK: usize = 16 * 256;
const STATE: usize = 8192;
const BLOCKS: usize = 8;

/// xorshift64*: deterministic cases from a seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Caps the address space `extra` bytes above the current size.
fn cap_memory(extra: u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let vm_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmSize:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let limit = vm_kib * 1024 + extra;
    let r = libc::rlimit {
        rlim_cur: limit,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: a valid rlimit struct; lowering our own soft limit.
    unsafe { libc::setrlimit(libc::RLIMIT_AS, &r) };
}

fn mutate(rng: &mut Rng, valid: &[u8]) -> Vec<u8> {
    let mut m = valid.to_vec();
    match rng.below(6) {
        0 => {
            let i = rng.below(m.len());
            m[i] ^= 1 << rng.below(8);
        }
        1 => {
            for _ in 0..1 + rng.below(4) {
                let i = rng.below(m.len());
                m[i] = rng.next() as u8;
            }
        }
        2 => {
            // A 32-bit field (counts, lengths, groups) set to an extreme.
            let i = rng.below(m.len().saturating_sub(4));
            let v: u32 = [u32::MAX, u32::MAX / 2, 1 << 24, 0, 1 << 31][rng.below(5)];
            m[i..i + 4].copy_from_slice(&v.to_le_bytes());
        }
        3 => {
            // A 64-bit field (positions, ranges) set to an extreme.
            let i = rng.below(m.len().saturating_sub(8));
            let v: u64 = [u64::MAX, 1 << 40, u64::MAX / 2][rng.below(3)];
            m[i..i + 8].copy_from_slice(&v.to_le_bytes());
        }
        4 => m.truncate(rng.below(m.len())),
        _ => {
            let extra = 1 + rng.below(64);
            for _ in 0..extra {
                m.push(rng.next() as u8);
            }
        }
    }
    m
}

#[test]
fn mutated_step_metadata_is_refused_or_run_never_a_panic_abort_or_hang() {
    let cases: usize = std::env::var("UCM_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(500);
    let spec = SpecTable::from_toml(SPEC).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut opts = CacheOptions::new(dir.path());
    opts.store.pool_bytes = Some(4 << 20);
    let cache = Cache::open(spec.clone(), opts).unwrap();
    let mut sched = cache.scheduler();
    let mut mem: Vec<Vec<u8>> = (0..2).map(|_| vec![0u8; BLOCK * BLOCKS]).collect();
    mem.push(vec![0u8; STATE * 4]);
    let mut worker = cache.worker(Backend::Host, 0, 0..3).unwrap();
    let regions: Vec<RawRegion> = mem
        .iter()
        .enumerate()
        .map(|(l, m)| RawRegion {
            layer: l as u32,
            addr: m.as_ptr() as u64,
            len: m.len(),
            stride: if l == 2 { STATE } else { BLOCK },
        })
        .collect();
    // SAFETY: the Vecs are never reallocated and outlive `worker`, which
    // is dropped at the end of this function before them (declared after).
    unsafe { worker.register_kv_caches(&regions) }.unwrap();

    // A valid step: request "a" (64 tokens) stored, then "b", which
    // continues it, loads its 4 blocks and state and saves one more block.
    let keys = RequestKeys::default();
    let a: Vec<u32> = (0..64).collect();
    let mut b: Vec<u32> = (0..64).collect();
    b.extend(1000..1016);
    let mut valid = Vec::new();
    for (id, tokens, blocks) in [
        ("a", &a, vec![0u32, 1, 2, 3]),
        ("b", &b, vec![3, 4, 5, 6, 7]),
    ] {
        let p = sched
            .get_num_new_matched_tokens(id, Arc::new(tokens.clone()), keys.clone(), 0)
            .unwrap();
        let mut alloc = Allocation::default();
        alloc.blocks.insert(0, blocks);
        alloc.state_slots.insert(1, 1);
        sched.update_state_after_alloc(id, alloc, p).unwrap();
        let meta = sched
            .build_meta(&[Scheduled {
                req: id.into(),
                start: p,
                end: tokens.len() as u64,
            }])
            .unwrap();
        let bytes = wire::encode(&meta);
        worker
            .start_load_kv(wire::decode(&spec, &bytes).unwrap())
            .unwrap();
        for l in 0..3 {
            worker.wait_for_layer_load(l).unwrap();
            worker.save_kv_layer(l).unwrap();
        }
        worker.wait_for_save().unwrap();
        valid = bytes;
    }
    assert!(valid.len() > 200, "a step of one request of 4 blocks");
    let v = wire::decode(&spec, &valid).unwrap();
    assert_eq!(v.requests[0].load, Some((64, 0)), "the step loads");

    cap_memory(2 << 30);
    // Every single bit flip, and every offset holding each extreme 32-bit
    // and 64-bit value (counts, lengths, groups, positions, ranges), then
    // `cases` random mutants.
    let mut mutants: Vec<Vec<u8>> = Vec::new();
    for i in 0..valid.len() {
        for bit in 0..8 {
            let mut m = valid.clone();
            m[i] ^= 1 << bit;
            mutants.push(m);
        }
    }
    for i in 0..valid.len().saturating_sub(8) {
        for v in [u64::MAX, 1 << 40, u64::MAX / 2] {
            let mut m = valid.clone();
            m[i..i + 8].copy_from_slice(&v.to_le_bytes());
            mutants.push(m);
        }
        for v in [u32::MAX, 1 << 24, 1 << 31] {
            let mut m = valid.clone();
            m[i..i + 4].copy_from_slice(&v.to_le_bytes());
            mutants.push(m);
        }
    }
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for _ in 0..cases {
        mutants.push(mutate(&mut rng, &valid));
    }
    let total = mutants.len();
    let (mut decoded, mut ran) = (0, 0);
    for m in mutants {
        let Ok(meta) = wire::decode(&spec, &m) else {
            continue;
        };
        decoded += 1;
        if worker.start_load_kv(meta).is_err() {
            continue;
        }
        ran += 1;
        for l in 0..3 {
            let _ = worker.wait_for_layer_load(l);
            let _ = worker.save_kv_layer(l);
        }
        let _ = worker.wait_for_save();
        let _ = worker.block_ids_with_load_errors();
    }
    eprintln!("{total} mutants: {decoded} decoded, {ran} run through a step");
    assert!(
        ran > 0,
        "no mutant ran: the fuzz exercises only the decoder"
    );
}
