//! The adapter driven by the engine harness (hooks in the contract's
//! order, poisoned and rotating engine memory, the content oracle and the
//! save audit) on the host device.
//!
//! Covered: every access-unit kind (layer, row, window, follower, snapshot
//! layers), TP = 8 with both rank rules, PP = 2 with an uneven partition,
//! speculative decoding (repeated hooks), a slow load that holds back only
//! its own request, injected load and save failures with their typed
//! causes, graph-safe waits, a spec of mixed block sizes.

mod common;

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use common::{config, engine, spec, tokens};
use ucm_coordinator::adapter::units::partition;
use ucm_coordinator::adapter::{EngineRequest, LoadCause, Scheduled, UnitMap};
use ucm_coordinator::RequestKeys;
use ucm_device::Device;
use ucm_harness::{Engine, Outcome, Request};
use ucm_store::FailureKind;

fn clean(o: &Outcome) {
    assert!(o.wrong.is_empty(), "{:?}", o.wrong);
    assert!(o.lost.is_empty(), "{:?}", o.lost);
}

/// Stores an 80-token request "a", admits the same prompt as "b" (a hit of
/// 64 tokens) and returns b's allocation and the metadata of its step
/// `[64, 80)`, for tests that drive the worker's hooks by hand.
fn second_request_step(
    e: &mut Engine,
    seed: u64,
) -> (
    Arc<ucm_coordinator::adapter::Allocation>,
    Arc<ucm_coordinator::adapter::ConnectorMeta>,
) {
    let t = tokens(seed, 80);
    run(e, "a", &t);
    let (m, alloc, _) = e.admit(&Request::new("b", t)).unwrap();
    assert_eq!(m, 64);
    let meta = e
        .scheduler()
        .build_meta(&[Scheduled {
            req: "b".into(),
            start: 64,
            end: 80,
        }])
        .unwrap();
    (alloc, meta)
}

fn run(e: &mut Engine, id: &str, t: &[u32]) -> Outcome {
    let o = e.run(&Request::new(id, t.to_vec())).unwrap();
    clean(&o);
    o
}

#[test]
fn a_second_request_loads_every_unit_kind_byte_exact() {
    let tmp = tempfile::tempdir().unwrap();
    let mut e = engine("all_union", tmp.path());
    let t = tokens(1, 150);
    let a = run(&mut e, "a", &t);
    assert_eq!(a.matched, 0, "nothing stored yet");
    assert!(a.untouched > 0, "computed blocks were checked untouched");
    // 149 visible tokens: l = 144 (9 blocks); checkpoints at 64, 128 and the
    // request end 144: p* = 144.
    let b = run(&mut e, "b", &t);
    assert_eq!((b.l, b.matched, b.served), (144, 144, 144));
    // attn 2 layers x 9 + row 9 + swa 2 (window 32) + idx 9 + state 1.
    assert_eq!(b.checked, 18 + 9 + 2 + 9 + 1);
    assert!(b.load_errors.is_empty(), "{:?}", b.load_errors);
    assert!(b.save_failures.is_empty(), "{:?}", b.save_failures);
}

#[test]
fn speculative_decoding_loads_and_saves_each_layer_once() {
    let tmp = tempfile::tempdir().unwrap();
    let mut c = config("all_union", tmp.path());
    c.repeat = 3;
    let mut e = Engine::open(c).unwrap();
    let t = tokens(2, 100);
    run(&mut e, "a", &t);
    let met = Arc::clone(e.ranks()[0].worker.metrics());
    let saved_once = met.saved_items.load(Relaxed);
    let tasks_before = met.load_tasks.load(Relaxed);
    let b = run(&mut e, "b", &t);
    assert!(b.matched > 0 && b.checked > 0);
    // One load task per unit with something to load: 2 attn + row + swa +
    // idx + state.
    assert_eq!(met.load_tasks.load(Relaxed) - tasks_before, 6);
    assert!(met.repeated_calls.load(Relaxed) > 0);
    // A reference run with single calls saves exactly as much.
    let tmp2 = tempfile::tempdir().unwrap();
    let mut e2 = engine("all_union", tmp2.path());
    run(&mut e2, "a", &t);
    assert_eq!(
        e2.ranks()[0].worker.metrics().saved_items.load(Relaxed),
        saved_once
    );
}

#[test]
fn tp8_with_both_rank_rules() {
    for rule in ["all_union", "intersection"] {
        let tmp = tempfile::tempdir().unwrap();
        let mut c = config(rule, tmp.path());
        c.tp = 8;
        let mut e = Engine::open(c).unwrap();
        let t = tokens(3, 120);
        run(&mut e, "a", &t);
        let b = run(&mut e, "b", &t);
        assert_eq!(b.matched, 112, "{rule}");
        assert!(b.checked > 0 && b.load_errors.is_empty(), "{rule}");
        // Under intersection one rank missing its copy of a block makes it
        // unusable; under all_union any rank's copy serves.
        let t2 = tokens(4, 120);
        let mut dying = Request::new("c", t2.clone());
        dying.dead_rank = Some(7);
        let c = e.run(&dying).unwrap();
        clean(&c);
        let probe = EngineRequest {
            id: "probe".into(),
            tokens: Arc::new(t2),
            keys: RequestKeys::default(),
        };
        let (m, _) = e.scheduler().get_num_new_matched_tokens(&probe, 0).unwrap();
        if rule == "intersection" {
            assert_eq!(m, 0);
            assert!(
                c.dead_rank_missing > 0,
                "the dead rank's shards are missing"
            );
        } else {
            assert_eq!(m, 112);
            assert_eq!(c.dead_rank_missing, 0, "the other ranks' copies cover it");
        }
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
            assert!(seen.insert((u.group, u.shard)), "shard twice");
            assert_eq!(units.units()[u.global as usize], *u, "stable under PP");
        }
    }
    assert_eq!(seen.len(), units.units().len());
    // A row may not straddle stages.
    assert!(units.stage(0..3).is_err());
    // End to end with two stage workers sharing the stores.
    let tmp = tempfile::tempdir().unwrap();
    let mut c = config("all_union", tmp.path());
    c.stage_bounds = vec![5];
    c.pp = 2;
    let mut e = Engine::open(c).unwrap();
    let t = tokens(5, 130);
    run(&mut e, "a", &t);
    let b = run(&mut e, "b", &t);
    assert_eq!(b.matched, 128);
    assert!(b.checked > 0);
}

#[test]
fn a_slow_load_holds_back_only_its_own_request() {
    let tmp = tempfile::tempdir().unwrap();
    let t_a = tokens(6, 80);
    let t_b = tokens(7, 80);
    let mut e = engine("all_union", tmp.path());
    run(&mut e, "a0", &t_a);
    run(&mut e, "b0", &t_b);
    // A fresh process: empty pools, everything on disk, the directory
    // rebuilt from the snapshot stores.
    e.restart().unwrap();
    let (ma, alloc_a, _) = e.admit(&Request::new("a", t_a)).unwrap();
    let (mb, _, _) = e.admit(&Request::new("b", t_b)).unwrap();
    assert_eq!((ma, mb), (64, 64));
    // Another rank is loading a's first attn block into the shared pool and
    // is slow: a's load of layer 0 waits for it.
    let attn = e.spec().group("attn").unwrap().index;
    let chunks = [
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
    ];
    let meta = e.scheduler().build_meta(&chunks).unwrap();
    let a_id = meta.requests[0].hashes.chains[attn][0][0];
    let stores = Arc::clone(e.stores());
    let pool = stores.blocks(attn).unwrap().pool();
    let guard = match pool.acquire((a_id, 0)).unwrap() {
        Some(ucm_store::Acquire::Load(g)) => g,
        _ => panic!("expected to own the load"),
    };
    let w = &mut e.ranks()[0].worker;
    w.start_load_kv(Arc::clone(&meta)).unwrap();
    w.wait_for_layer_load_of(0, "b").unwrap();
    assert!(w.layer_ready(0, "b"), "b's layer 0 is not held back");
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert!(
        !w.layer_ready(0, "a"),
        "a's layer 0 waits for the slow load"
    );
    // The slow loader gives up: a's block is a load error, b is untouched.
    guard.fail(libc::EIO);
    w.wait_for_layer_load(0).unwrap();
    for l in 1..8 {
        w.wait_for_layer_load(l).unwrap();
        w.save_kv_layer(l, None).unwrap();
    }
    w.save_kv_layer(0, None).unwrap();
    w.wait_for_save().unwrap();
    let errs = w.block_ids_with_load_errors();
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert_eq!(
        (errs[0].req.as_str(), errs[0].group, errs[0].engine_block),
        ("a", attn, alloc_a.blocks[&attn][0])
    );
    match &errs[0].cause {
        LoadCause::Failed(f) => {
            assert_eq!((f.kind, f.errno), (FailureKind::OtherRank, Some(libc::EIO)))
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn injected_save_and_load_failures_are_reported_with_their_kind() {
    use ucm_device::io::faults::{self, FaultOp, FaultRule};
    let tmp = tempfile::tempdir().unwrap();
    let t = tokens(8, 80);
    let mut e = engine("all_union", tmp.path());
    {
        // Every disk write of the swa group fails with ENOSPC: its saves
        // reach the pool but never the disk, and the engine is told why.
        let _g = faults::inject(FaultRule::errno(
            tmp.path().join("swa"),
            FaultOp::Write,
            libc::ENOSPC,
        ));
        let a = e.run(&Request::new("a", t.clone())).unwrap();
        clean(&a);
        assert!(
            a.save_failures
                .iter()
                .any(|f| f.kind == FailureKind::NoSpace && f.errno == Some(libc::ENOSPC)),
            "{:?}",
            a.save_failures
        );
        assert!(e.ranks()[0].worker.metrics().save_failures.load(Relaxed) > 0);
    }
    // A fresh process: swa's blocks are not on disk, so l is 0: a miss,
    // never a wrong hit.
    e.restart().unwrap();
    let b = run(&mut e, "b", &t);
    assert_eq!(b.matched, 0);
    // Now a load failure: store a request whole, then make the attn reads
    // fail in a fresh process.
    let t2 = tokens(9, 80);
    run(&mut e, "c", &t2);
    e.restart().unwrap();
    let _g = faults::inject(FaultRule::errno(
        tmp.path().join("attn"),
        FaultOp::Read,
        libc::EIO,
    ));
    let d = run(&mut e, "d", &t2);
    assert_eq!(d.matched, 64);
    let attn = e.spec().group("attn").unwrap().index;
    let failed: Vec<_> = d.load_errors.iter().filter(|x| x.group == attn).collect();
    // Every attn block of d (4 blocks, two layers share engine blocks).
    assert_eq!(failed.len(), 4, "{:?}", d.load_errors);
    assert!(failed.iter().all(|x| matches!(
        &x.cause,
        LoadCause::Failed(f) if f.kind == FailureKind::Io && f.errno == Some(libc::EIO)
    )));
    // The model has a state group: the whole prefix is recomputed.
    assert_eq!(d.served, 0);
}

#[test]
fn graph_safe_wait_queues_on_the_stream() {
    let tmp = tempfile::tempdir().unwrap();
    let mut e = engine("all_union", tmp.path());
    let (_, meta) = second_request_step(&mut e, 10);
    let dev = Arc::clone(e.device());
    let w = &mut e.ranks()[0].worker;
    let stream = dev.create_stream().unwrap();
    w.start_load_kv(meta).unwrap();
    for l in 0..8 {
        w.wait_for_layer_load_on(l, &stream).unwrap();
    }
    // After the stream's host functions ran, every load is complete.
    dev.synchronize_stream(&stream).unwrap();
    for l in 0..8 {
        assert!(w.layer_ready(l, "b"));
    }
    w.wait_for_save().unwrap();
    assert!(w.block_ids_with_load_errors().is_empty());
}

#[test]
fn a_spec_of_mixed_block_sizes_and_grids_runs_byte_exact() {
    let spec = Arc::new(
        ucm_coordinator::SpecTable::load(std::path::Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../specs/mixed-sizes.toml"
        )))
        .unwrap()
        .scaled(64),
    );
    let tmp = tempfile::tempdir().unwrap();
    let mut c = ucm_harness::EngineConfig::new(spec, tmp.path(), 2048);
    c.tp = 2;
    c.pp = 2;
    let mut e = Engine::open(c).unwrap();
    let t = tokens(11, 1500);
    let a = run(&mut e, "a", &t);
    assert_eq!(a.matched, 0);
    let b = run(&mut e, "b", &t);
    assert!(b.matched > 0, "a hit on a mixed-size spec");
    assert!(b.checked > 0 && b.load_errors.is_empty());
    assert_eq!(b.served, b.matched);
}

/// A block the worker cannot address (no id for it: hashes of a shorter
/// prompt) is reported, as a failed load of its engine block and as a
/// failed save, never silently left out.
#[test]
fn a_block_without_an_id_is_reported_not_skipped() {
    let tmp = tempfile::tempdir().unwrap();
    let mut e = engine("all_union", tmp.path());
    let (alloc, meta) = second_request_step(&mut e, 12);
    let attn = e.spec().group("attn").unwrap().index;
    let mut r = meta.requests[0].clone();
    let mut hashes = (*r.hashes).clone();
    hashes.chains[attn][0].truncate(2);
    r.hashes = Arc::new(hashes);
    let meta = Arc::new(ucm_coordinator::adapter::ConnectorMeta {
        step: meta.step,
        requests: vec![r],
        speculative_share: meta.speculative_share,
    });
    let w = &mut e.ranks()[0].worker;
    w.start_load_kv(meta).unwrap();
    for l in 0..8 {
        w.wait_for_layer_load(l).unwrap();
        w.save_kv_layer(l, None).unwrap();
    }
    w.wait_for_save().unwrap();
    let errs = w.block_ids_with_load_errors();
    let table = &alloc.blocks[&attn];
    for i in [2usize, 3] {
        assert!(
            errs.iter().any(|x| x.group == attn
                && x.engine_block == table[i]
                && matches!(&x.cause, LoadCause::Failed(f) if f.kind == FailureKind::NotSubmitted)),
            "block {i} not reported: {errs:?}"
        );
    }
    let f = w.get_finished(&["b".into()]);
    assert!(
        f.save_failed
            .iter()
            .any(|(r, why)| r == "b" && why.kind == FailureKind::NotSubmitted),
        "{f:?}"
    );
}

#[test]
fn decoded_tokens_are_saved_so_the_next_turn_hits_through_the_answer() {
    let prompt = tokens(7, 100);
    let answer = tokens(8, 60);
    let mut next = prompt.clone();
    next.extend(&answer);
    next.extend(tokens(9, 40));
    let turn = |decode: bool| {
        let tmp = tempfile::tempdir().unwrap();
        let mut e = engine("all_union", tmp.path());
        let mut first = Request::new("t1", prompt.clone());
        if decode {
            first.output = Arc::new(answer.clone());
        }
        let o = e.run(&first).unwrap();
        clean(&o);
        run(&mut e, "t2", &next)
    };
    // Request end is the end of the whole sequence: once the answer is
    // decoded, the state after its last token (160) is kept and the
    // answer's full blocks are saved like the prompt's, so the next turn
    // (which re-sends the answer) resumes at 160, every loaded byte
    // checked.
    let with = turn(true);
    assert_eq!((with.matched, with.served), (160, 160));
    // attn 2 layers x 10 + row 10 + swa 2 + idx 10 + state 1.
    assert_eq!(with.checked, 20 + 10 + 2 + 10 + 1);
    // Without decoding, the prompt's end aligned down (96).
    let without = turn(false);
    assert_eq!((without.matched, without.served), (96, 96));
}

#[test]
fn workers_give_every_tier_the_schedulers_speculative_share() {
    let tmp = tempfile::tempdir().unwrap();
    let mut e = engine("all_union", tmp.path());
    for g in e.spec().groups().to_vec() {
        if let Some(t) = e.stores().tier(g.index) {
            assert_eq!(t.pool().speculative_share(), 0.0, "the store's default");
        }
    }
    run(&mut e, "a", &tokens(3, 80));
    let share = e.scheduler().speculative_share();
    assert_eq!(share, 0.5, "no evidence yet");
    let mut tiers = 0;
    for g in e.spec().groups().to_vec() {
        if let Some(t) = e.stores().tier(g.index) {
            assert_eq!(t.pool().speculative_share(), share, "{}", g.name);
            assert_eq!(t.disk().unwrap().speculative_share(), share, "{}", g.name);
            tiers += 1;
        }
    }
    assert!(tiers >= 2);
}

#[test]
fn every_groups_disk_tier_collects_with_one_byte_budget() {
    let tmp = tempfile::tempdir().unwrap();
    let e = engine("all_union", tmp.path());
    let blocks = config("all_union", tmp.path()).stores.disk_blocks;
    let mut budget: Option<Arc<ucm_store::DiskBudget>> = None;
    let mut total = 0u64;
    for g in e.spec().groups().to_vec() {
        let Some(d) = e.stores().tier(g.index).and_then(|t| t.disk()) else {
            continue;
        };
        total += d.file_bytes() * blocks;
        let b = d
            .budget()
            .expect("every group's disk tier joined the budget");
        match &budget {
            None => budget = Some(Arc::clone(b)),
            Some(first) => assert!(Arc::ptr_eq(first, b), "{}", g.name),
        }
    }
    let budget = budget.expect("disk tiers");
    assert_eq!(
        budget.high_bytes(),
        total,
        "disk_blocks files of every group"
    );
}
