//! The adapter driven exactly as an engine drives it (hooks in the
//! contract's order) on the host device, with a content oracle: the bytes
//! of (group, layer, block) are a pure function of the block's id and the
//! layer (and the rank, for `intersection` groups), a state at position p a
//! pure function of H(p) and the layer. Every loaded byte is checked.
//!
//! Covered: every access-unit kind (layer, row, window, follower, snapshot
//! layers), TP = 8 with both rank rules, PP = 2 with an uneven partition,
//! speculative decoding (repeated hooks), a slow load that holds back only
//! its own request, injected load and save failures, graph-safe waits.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use ucm_coordinator::adapter::units::partition;
use ucm_coordinator::adapter::{
    Allocation, ConnectorMeta, EngineRequest, LayerRegistration, Scheduled, Scheduler, StoreSet,
    StoreSetConfig, UnitMap, Worker, WorkerConfig,
};
use ucm_coordinator::hash::{checkpoint_hash, Id};
use ucm_coordinator::{CheckpointDirectory, Deployment, Kind, RankRule, RequestKeys, SpecTable};
use ucm_device::conformance::{download, pattern, upload};
use ucm_device::{Device, HostDevice, Memory};

const SPEC: &str = r#"
model = "adapter-test"
num_layers = 8
[[group]]
name = "attn"
kind = "chain"
block_size = 16
layers = "0-1"
bytes_per_token = 256
rank_rule = "RULE"
[[group]]
name = "row"
kind = "chain"
block_size = 16
layers = "2-3"
bytes_per_token = 128
access_unit = "row"
[[group]]
name = "swa"
kind = "chain"
block_size = 16
window = 32
layers = "4"
bytes_per_token = 256
[[group]]
name = "idx"
kind = "sidecar"
source = "attn"
layers = "5"
bytes_per_token = 256
[[group]]
name = "state"
kind = "snapshot"
grid = 16
state_bytes = 4096
layers = "6"
retention = { interval = 64 }
[[group]]
name = "x"
kind = "none"
layers = "7"
bytes_per_token = 64
"#;

fn spec(rule: &str) -> Arc<SpecTable> {
    Arc::new(SpecTable::from_toml(&SPEC.replace("RULE", rule)).unwrap())
}

fn tokens(seed: u64, n: usize) -> Vec<u32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (s >> 40) as u32 % 50_000
        })
        .collect()
}

fn seed_of(id: &Id, layer: u32, rank: u32) -> u64 {
    u64::from_le_bytes(id[..8].try_into().unwrap()) ^ (u64::from(layer) << 48) ^ u64::from(rank)
}

/// The emulated engine of one rank and stage: one region per layer, the
/// content oracle, and the hooks in contract order.
struct Engine {
    dev: Arc<HostDevice>,
    spec: Arc<SpecTable>,
    units: Arc<UnitMap>,
    rank: u32,
    regions: HashMap<u32, (Memory, usize)>,
    worker: Worker<HostDevice>,
}

const BLOCKS: usize = 64; // engine blocks per layer
const SLOTS: usize = 8; // state slots per layer

impl Engine {
    fn new(
        dev: &Arc<HostDevice>,
        spec: &Arc<SpecTable>,
        units: &Arc<UnitMap>,
        stores: &Arc<StoreSet<HostDevice>>,
        dir: &Arc<CheckpointDirectory>,
        cfg: WorkerConfig,
    ) -> Engine {
        let mut worker = Worker::new(
            Arc::clone(spec),
            Arc::clone(units),
            Arc::clone(stores),
            Arc::clone(dir),
            Arc::clone(dev),
            cfg.clone(),
        )
        .unwrap();
        let mut regions = HashMap::new();
        let mut regs = Vec::new();
        for u in worker.stage_units() {
            let stride = stores.shard_bytes(u.group);
            let n = if spec.groups()[u.group].kind == Kind::Snapshot {
                SLOTS
            } else {
                BLOCKS
            };
            let mem = dev.alloc_device(stride * n).unwrap();
            for &l in &u.layers {
                regions.insert(l, (mem.clone(), stride));
                regs.push(LayerRegistration {
                    layer: l,
                    memory: mem.clone(),
                    stride,
                });
            }
        }
        worker.register_kv_caches(regs).unwrap();
        Engine {
            dev: Arc::clone(dev),
            spec: Arc::clone(spec),
            units: Arc::clone(units),
            rank: cfg.rank,
            regions,
            worker,
        }
    }

    fn write(&self, mem: &Memory, at: usize, bytes: &[u8]) {
        upload(self.dev.as_ref(), mem, at, bytes).unwrap();
    }

    fn read(&self, mem: &Memory, at: usize, len: usize) -> Vec<u8> {
        download(self.dev.as_ref(), mem, at, len).unwrap()
    }

    fn rank_of(&self, group: usize) -> u32 {
        match self.spec.groups()[group].rank_rule {
            RankRule::AllUnion => 0,
            RankRule::Intersection => self.rank,
        }
    }

    /// The oracle's bytes of unit `layer`'s block `i` (or state at `p`).
    fn oracle(
        &self,
        layer: u32,
        r: &ucm_coordinator::adapter::ReqMeta,
        i: usize,
        p: u64,
    ) -> Vec<u8> {
        let u = self.units.unit_of(layer).unwrap();
        let g = &self.spec.groups()[u.group];
        let (_, stride) = self.regions[&u.first_layer()];
        let rank = self.rank_of(u.group);
        let id = match g.kind {
            Kind::Snapshot => {
                let ids = &r.hashes.chains[u.group][rank as usize];
                let seed = &r.hashes.seeds[u.group][rank as usize];
                checkpoint_hash(seed, ids, &r.tokens, g.hash_block, p).unwrap()
            }
            _ => r.hashes.chains[u.group][rank as usize][i],
        };
        pattern(seed_of(&id, u.first_layer(), rank), stride)
    }

    /// One step, hooks in contract order. `compute` writes the oracle's
    /// bytes of what the chunk completes; loaded bytes are checked first.
    /// Returns the number of loaded items checked.
    fn step(&mut self, meta: &Arc<ConnectorMeta>, chunks: &[Scheduled], repeat: usize) -> usize {
        self.worker.start_load_kv(Arc::clone(meta)).unwrap();
        let mut checked = 0;
        let mut layers: Vec<u32> = self.regions.keys().copied().collect();
        layers.sort_unstable();
        for &layer in &layers {
            for _ in 0..repeat {
                self.worker.wait_for_layer_load(layer).unwrap();
            }
            let u = self.units.unit_of(layer).unwrap().clone();
            let g = self.spec.groups()[u.group].clone();
            let (mem, stride) = self.regions[&layer].clone();
            for (r, c) in meta.requests.iter().zip(chunks) {
                // Check what was loaded (first layer of the unit only).
                if let (Some((p, have)), true) = (r.load, layer == u.first_layer()) {
                    match g.kind {
                        Kind::Snapshot => {
                            let slot = r.alloc.state_slots[&u.group] as usize;
                            let got = self.read(&mem, slot * stride, stride);
                            assert_eq!(
                                got,
                                self.oracle(layer, r, 0, p),
                                "state of {} at {p}",
                                r.id
                            );
                            checked += 1;
                        }
                        _ => {
                            let b =
                                ucm_coordinator::adapter::scheduler::block_of(&self.spec, u.group);
                            let from = match (g.window, g.source) {
                                (Some(w), _) => have.max(p.saturating_sub(w)),
                                (None, Some(s)) => match self.spec.groups()[s].window {
                                    Some(w) => have.max(p.saturating_sub(w)),
                                    None => have,
                                },
                                _ => have,
                            };
                            for i in (from / b) as usize..(p / b) as usize {
                                let eb = r.alloc.blocks[&u.group][i] as usize;
                                let got = self.read(&mem, eb * stride, stride);
                                assert_eq!(
                                    got,
                                    self.oracle(layer, r, i, 0),
                                    "{} group {} block {i}",
                                    r.id,
                                    g.name
                                );
                                checked += 1;
                            }
                        }
                    }
                }
                // Compute: write what this chunk completes (a row's tensor
                // once, at its first layer).
                if layer != u.first_layer() {
                    continue;
                }
                match g.kind {
                    Kind::Snapshot => {
                        let slot = r.alloc.state_slots[&u.group] as usize;
                        let bytes = self.oracle(layer, r, 0, c.end);
                        self.write(&mem, slot * stride, &bytes);
                    }
                    Kind::None => {}
                    _ => {
                        let b = ucm_coordinator::adapter::scheduler::block_of(&self.spec, u.group);
                        for i in (c.start / b) as usize..(c.end / b) as usize {
                            let eb = r.alloc.blocks[&u.group][i] as usize;
                            let bytes = self.oracle(layer, r, i, 0);
                            self.write(&mem, eb * stride, &bytes);
                        }
                    }
                }
            }
            for _ in 0..repeat {
                self.worker.save_kv_layer(layer, None).unwrap();
            }
        }
        self.worker.wait_for_save().unwrap();
        checked
    }
}

struct World {
    dev: Arc<HostDevice>,
    spec: Arc<SpecTable>,
    units: Arc<UnitMap>,
    stores: Arc<StoreSet<HostDevice>>,
    dir: Arc<CheckpointDirectory>,
    sched: Scheduler<StoreSet<HostDevice>>,
}

fn world(rule: &str, tp: u32, path: &Path) -> World {
    let dev = Arc::new(HostDevice::new());
    let spec = spec(rule);
    let units = Arc::new(UnitMap::new(&spec));
    let stores = Arc::new(
        StoreSet::open(
            &spec,
            &units,
            path,
            Arc::clone(&dev),
            &StoreSetConfig {
                pool_slots: 512,
                ..StoreSetConfig::default()
            },
        )
        .unwrap(),
    );
    let dir = Arc::new(CheckpointDirectory::new());
    let sched = Scheduler::new(
        Arc::clone(&spec),
        Deployment { tp_size: tp },
        Arc::clone(&stores),
        Arc::clone(&dir),
    );
    World {
        dev,
        spec,
        units,
        stores,
        dir,
        sched,
    }
}

impl World {
    fn engine(&self, rank: u32, tp: u32, stage: std::ops::Range<u32>) -> Engine {
        Engine::new(
            &self.dev,
            &self.spec,
            &self.units,
            &self.stores,
            &self.dir,
            WorkerConfig {
                rank,
                tp_size: tp,
                stage,
                lookahead: 1,
            },
        )
    }

    /// Engine blocks `base..` for every chain/sidecar group, slot `slot`.
    fn alloc(&self, base: u32, slot: u32, blocks: usize) -> Allocation {
        let mut a = Allocation::default();
        for g in self.spec.groups() {
            match g.kind {
                Kind::Chain | Kind::Sidecar => {
                    a.blocks
                        .insert(g.index, (0..blocks as u32).map(|i| base + i).collect());
                }
                Kind::Snapshot => {
                    a.state_slots.insert(g.index, slot);
                }
                Kind::None => {}
            }
        }
        a
    }

    /// Admits a request: returns (matched tokens, chunk plan).
    fn admit(&mut self, id: &str, toks: &[u32], base: u32, slot: u32) -> (u64, Vec<u64>) {
        let req = EngineRequest {
            id: id.into(),
            tokens: Arc::new(toks.to_vec()),
            keys: RequestKeys::default(),
        };
        let (matched, async_load) = self.sched.get_num_new_matched_tokens(&req, 0).unwrap();
        assert!(!async_load);
        let a = self.alloc(base, slot, toks.len() / 16 + 1);
        self.sched.update_state_after_alloc(id, a, matched).unwrap();
        let mut bounds: Vec<u64> = self
            .sched
            .checkpoint_positions(id)
            .into_iter()
            .filter(|&p| p > matched)
            .collect();
        bounds.push(toks.len() as u64);
        bounds.dedup();
        (matched, bounds)
    }
}

/// Runs request `id` to the end on `engines` (all ranks / stages), chunks
/// ending at the planned checkpoint positions. Returns loaded items checked.
fn run(
    w: &mut World,
    engines: &mut [Engine],
    id: &str,
    toks: &[u32],
    base: u32,
    slot: u32,
    repeat: usize,
) -> (u64, usize) {
    let (matched, bounds) = w.admit(id, toks, base, slot);
    let mut start = matched;
    let mut checked = 0;
    for end in bounds {
        let chunk = Scheduled {
            req: id.into(),
            start,
            end,
        };
        let meta = w.sched.build_meta(std::slice::from_ref(&chunk)).unwrap();
        for e in engines.iter_mut() {
            checked += e.step(&meta, std::slice::from_ref(&chunk), repeat);
        }
        start = end;
    }
    assert!(!w.sched.request_finished(id));
    (matched, checked)
}

#[test]
fn a_second_request_loads_every_unit_kind_byte_exact() {
    let tmp = tempfile::tempdir().unwrap();
    let mut w = world("all_union", 1, tmp.path());
    let mut e = vec![w.engine(0, 1, 0..8)];
    let t = tokens(1, 150);
    let (m, _) = run(&mut w, &mut e, "a", &t, 0, 0, 1);
    assert_eq!(m, 0, "nothing stored yet");
    // 149 visible tokens: l = 144 (9 blocks); checkpoints at 64, 128 and the
    // request end 144: p* = 144.
    let (m, checked) = run(&mut w, &mut e, "b", &t, 20, 1, 1);
    assert_eq!(m, 144);
    // attn 2 layers x 9 + row 9 + swa 2 (window 32) + idx 9 + state 1.
    assert_eq!(checked, 18 + 9 + 2 + 9 + 1);
    assert!(e[0].worker.block_ids_with_load_errors().is_empty());
    let f = e[0].worker.get_finished(&["a".into(), "b".into()]);
    assert!(f.save_failed.is_empty(), "{f:?}");
}

#[test]
fn speculative_decoding_loads_and_saves_each_layer_once() {
    let tmp = tempfile::tempdir().unwrap();
    let mut w = world("all_union", 1, tmp.path());
    let mut e = vec![w.engine(0, 1, 0..8)];
    let t = tokens(2, 100);
    run(&mut w, &mut e, "a", &t, 0, 0, 3);
    let saved_once = e[0]
        .worker
        .metrics()
        .saved_items
        .load(std::sync::atomic::Ordering::Relaxed);
    let tasks_before = e[0]
        .worker
        .metrics()
        .load_tasks
        .load(std::sync::atomic::Ordering::Relaxed);
    let (m, checked) = run(&mut w, &mut e, "b", &t, 20, 1, 3);
    assert!(m > 0);
    assert!(checked > 0);
    let met = e[0].worker.metrics();
    let tasks = met.load_tasks.load(std::sync::atomic::Ordering::Relaxed) - tasks_before;
    // One load task per unit with something to load: 2 attn + row + swa +
    // idx + state.
    assert_eq!(tasks, 6);
    assert!(
        met.repeated_calls
            .load(std::sync::atomic::Ordering::Relaxed)
            > 0
    );
    // A reference run with single calls saves exactly as much.
    let tmp2 = tempfile::tempdir().unwrap();
    let mut w2 = world("all_union", 1, tmp2.path());
    let mut e2 = vec![w2.engine(0, 1, 0..8)];
    run(&mut w2, &mut e2, "a", &t, 0, 0, 1);
    assert_eq!(
        e2[0]
            .worker
            .metrics()
            .saved_items
            .load(std::sync::atomic::Ordering::Relaxed),
        saved_once
    );
}

#[test]
fn tp8_with_both_rank_rules() {
    for rule in ["all_union", "intersection"] {
        let tmp = tempfile::tempdir().unwrap();
        let mut w = world(rule, 8, tmp.path());
        let mut engines: Vec<Engine> = (0..8).map(|r| w.engine(r, 8, 0..8)).collect();
        let t = tokens(3, 120);
        run(&mut w, &mut engines, "a", &t, 0, 0, 1);
        let (m, checked) = run(&mut w, &mut engines, "b", &t, 20, 1, 1);
        assert_eq!(m, 112, "{rule}");
        assert!(checked > 0);
        for e in &mut engines {
            assert!(e.worker.block_ids_with_load_errors().is_empty(), "{rule}");
        }
        // Under intersection one rank missing its copy of a block makes it
        // unusable; under all_union any rank's copy serves.
        let t2 = tokens(4, 120);
        let mut seven: Vec<Engine> = engines.drain(..7).collect();
        run(&mut w, &mut seven, "c", &t2, 0, 0, 1);
        let (m, _) = w.admit("probe", &t2, 40, 2);
        assert_eq!(m, if rule == "intersection" { 0 } else { 112 }, "{rule}");
    }
}

#[test]
fn pp2_with_an_uneven_partition_has_disjoint_stable_shards() {
    let spec = spec("all_union");
    let units = UnitMap::new(&spec);
    let stages = partition(&[5], 8).unwrap();
    assert_eq!(stages, vec![0..5, 5..8]);
    let mut seen = std::collections::HashSet::new();
    for s in &stages {
        for u in units.stage(s.clone()).unwrap() {
            assert!(
                seen.insert((u.group, u.shard)),
                "shard {:?} twice",
                (u.group, u.shard)
            );
            assert_eq!(units.units()[u.global as usize], *u, "stable under PP");
        }
    }
    assert_eq!(seen.len(), units.units().len());
    // A row may not straddle stages.
    assert!(units.stage(0..3).is_err());
    // End to end with two stage workers sharing the stores.
    let tmp = tempfile::tempdir().unwrap();
    let mut w = world("all_union", 1, tmp.path());
    let mut engines = vec![w.engine(0, 1, 0..5), w.engine(0, 1, 5..8)];
    let t = tokens(5, 130);
    run(&mut w, &mut engines, "a", &t, 0, 0, 1);
    let (m, checked) = run(&mut w, &mut engines, "b", &t, 20, 1, 1);
    assert_eq!(m, 128);
    assert!(checked > 0);
}

#[test]
fn a_slow_load_holds_back_only_its_own_request() {
    let tmp = tempfile::tempdir().unwrap();
    let t_a = tokens(6, 80);
    let t_b = tokens(7, 80);
    {
        let mut w = world("all_union", 1, tmp.path());
        let mut e = vec![w.engine(0, 1, 0..8)];
        run(&mut w, &mut e, "a0", &t_a, 0, 0, 1);
        run(&mut w, &mut e, "b0", &t_b, 10, 1, 1);
    }
    // A fresh process: empty pools, everything on disk, the directory
    // rebuilt from the snapshot stores.
    let mut w = world("all_union", 1, tmp.path());
    w.stores.rebuild_directory(&w.spec, &w.dir);
    let mut e = w.engine(0, 1, 0..8);
    let (ma, _) = w.admit("a", &t_a, 0, 0);
    let (mb, _) = w.admit("b", &t_b, 10, 1);
    assert_eq!((ma, mb), (64, 64));
    // Another rank is loading a's first attn block into the shared pool and
    // is slow: a's load of layer 0 waits for it.
    let attn = w.spec.group("attn").unwrap().index;
    let meta = w
        .sched
        .build_meta(&[
            Scheduled {
                req: "a".into(),
                start: 64,
                end: 80,
            },
            Scheduled {
                req: "b".into(),
                start: 64,
                end: 80,
            },
        ])
        .unwrap();
    let a_id = meta.requests[0].hashes.chains[attn][0][0];
    let pool = w.stores.blocks(attn).unwrap().pool();
    let guard = match pool.acquire((a_id, 0)).unwrap() {
        Some(ucm_store::Acquire::Load(g)) => g,
        _ => panic!("expected to own the load"),
    };
    e.worker.start_load_kv(Arc::clone(&meta)).unwrap();
    e.worker.wait_for_layer_load_of(0, "b").unwrap();
    assert!(e.worker.layer_ready(0, "b"), "b's layer 0 is not held back");
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert!(
        !e.worker.layer_ready(0, "a"),
        "a's layer 0 waits for the slow load"
    );
    // The slow loader gives up: a's block is a load error, b is untouched.
    guard.fail(libc::EIO);
    e.worker.wait_for_layer_load(0).unwrap();
    for l in 1..8 {
        e.worker.wait_for_layer_load(l).unwrap();
        e.worker.save_kv_layer(l, None).unwrap();
    }
    e.worker.save_kv_layer(0, None).unwrap();
    e.worker.wait_for_save().unwrap();
    let errs = e.worker.block_ids_with_load_errors();
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert_eq!(
        (errs[0].req.as_str(), errs[0].group, errs[0].engine_block),
        ("a", attn, 0)
    );
}

#[test]
fn injected_save_and_load_failures_are_reported() {
    use ucm_device::io::faults::{self, FaultOp, FaultRule};
    let tmp = tempfile::tempdir().unwrap();
    let t = tokens(8, 80);
    {
        let mut w = world("all_union", 1, tmp.path());
        let mut e = vec![w.engine(0, 1, 0..8)];
        // Every disk write of the swa group fails: its saves reach the
        // pool but never the disk.
        let _g = faults::inject(FaultRule::errno(
            tmp.path().join("swa"),
            FaultOp::Write,
            libc::EIO,
        ));
        run(&mut w, &mut e, "a", &t, 0, 0, 1);
        let mut failed = Vec::new();
        for _ in 0..200 {
            let f = e[0].worker.get_finished(&["a".into()]);
            failed.extend(f.save_failed);
            if !failed.is_empty() && f.saved.is_empty() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert!(failed.iter().any(|(r, _)| r == "a"), "{failed:?}");
        assert!(
            e[0].worker
                .metrics()
                .save_failures
                .load(std::sync::atomic::Ordering::Relaxed)
                > 0
        );
    }
    // A fresh process: swa's blocks are not on disk, so l is 0: a miss,
    // never a wrong hit.
    let mut w = world("all_union", 1, tmp.path());
    w.stores.rebuild_directory(&w.spec, &w.dir);
    let (m, _) = w.admit("b", &t, 10, 1);
    assert_eq!(m, 0);
    // Now a load failure: store a request whole, then make the attn reads
    // fail in a fresh process.
    let t2 = tokens(9, 80);
    {
        let mut w = world("all_union", 1, tmp.path());
        let mut e = vec![w.engine(0, 1, 0..8)];
        run(&mut w, &mut e, "c", &t2, 0, 0, 1);
    }
    let mut w = world("all_union", 1, tmp.path());
    w.stores.rebuild_directory(&w.spec, &w.dir);
    let mut e = w.engine(0, 1, 0..8);
    let (m, _) = w.admit("d", &t2, 10, 1);
    assert_eq!(m, 64);
    let _g = faults::inject(FaultRule::errno(
        tmp.path().join("attn"),
        FaultOp::Read,
        libc::EIO,
    ));
    let meta = w
        .sched
        .build_meta(&[Scheduled {
            req: "d".into(),
            start: 64,
            end: 80,
        }])
        .unwrap();
    e.worker.start_load_kv(meta).unwrap();
    for l in 0..8 {
        e.worker.wait_for_layer_load(l).unwrap();
        e.worker.save_kv_layer(l, None).unwrap();
    }
    e.worker.wait_for_save().unwrap();
    let errs = e.worker.block_ids_with_load_errors();
    let attn = w.spec.group("attn").unwrap().index;
    // Every attn block of d (4 blocks, two layers share engine blocks).
    let mut blocks: Vec<u32> = errs
        .iter()
        .filter(|x| x.group == attn)
        .map(|x| x.engine_block)
        .collect();
    blocks.dedup();
    assert_eq!(blocks, vec![10, 11, 12, 13], "{errs:?}");
    assert!(errs.iter().all(|x| x.req == "d"));
}

#[test]
fn graph_safe_wait_queues_on_the_stream() {
    let tmp = tempfile::tempdir().unwrap();
    let mut w = world("all_union", 1, tmp.path());
    let mut e = vec![w.engine(0, 1, 0..8)];
    let t = tokens(10, 80);
    run(&mut w, &mut e, "a", &t, 0, 0, 1);
    let (m, _) = w.admit("b", &t, 10, 1);
    assert_eq!(m, 64);
    let meta = w
        .sched
        .build_meta(&[Scheduled {
            req: "b".into(),
            start: 64,
            end: 80,
        }])
        .unwrap();
    let eng = &mut e[0];
    let stream = eng.dev.create_stream().unwrap();
    eng.worker.start_load_kv(meta).unwrap();
    for l in 0..8 {
        eng.worker.wait_for_layer_load_on(l, &stream).unwrap();
    }
    // After the stream's host functions ran, every load is complete.
    eng.dev.synchronize_stream(&stream).unwrap();
    for l in 0..8 {
        assert!(eng.worker.layer_ready(l, "b"));
    }
    eng.worker.wait_for_save().unwrap();
    assert!(eng.worker.block_ids_with_load_errors().is_empty());
}
