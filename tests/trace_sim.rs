//! The capacity-only trace replay (`ucm::replay::sim`): each mode's policy
//! on worked examples (where states are kept, where a hit may end), the
//! engine's cache in front of the offload layer, capacities that evict,
//! decode retention, and the CLI over the shared trace.

use std::path::PathBuf;
use std::process::Command;

use ucm::coordinator::SpecTable;
use ucm::replay::sim::units::Model;
use ucm::replay::sim::{simulate, Sim, SimConfig, SimMode, SimRequest};
use ucm::replay::trace::TraceRequest;

/// One chain group of 128-token blocks and one recurrent group on the
/// same grid: every hit needs K/V up to `p` and a state exactly at `p`.
const SPEC: &str = r#"
model = "sim-test"
[[group]]
name = "attn"
kind = "chain"
block_size = 128
layers = "0-1"
bytes_per_token = 64
[[group]]
name = "ssm"
kind = "snapshot"
grid = 128
state_bytes = 8192
layers = "2"
retention = { request_end = true, second_unserved = true }
"#;

fn model() -> Model {
    Model::new(SpecTable::from_toml(SPEC).unwrap())
}

fn req(ids: &[u64], input: u64, output: u64) -> TraceRequest {
    TraceRequest {
        timestamp_ms: 0,
        input_length: input,
        output_length: output,
        hash_ids: ids.to_vec(),
    }
}

fn cfg() -> SimConfig {
    SimConfig {
        sglang_chunk: 512,
        lmcache_chunk: 256,
        ..SimConfig::default()
    }
}

/// Per request: tokens served, running `mode` with an engine cache of
/// `engine` tokens.
fn served(mode: SimMode, engine: u64, cfg: &SimConfig, trace: &[TraceRequest]) -> Vec<u64> {
    let m = model();
    let mut sim = Sim::new(&m, mode, engine, cfg);
    trace
        .iter()
        .enumerate()
        .map(|(k, t)| {
            let r = SimRequest::new(&m, cfg.seed, k, t).unwrap();
            sim.step(&m, &r).unwrap().served
        })
        .collect()
}

/// A shares 1024 tokens with B and C (two 512-token blocks); C comes
/// after B.
fn diverging() -> Vec<TraceRequest> {
    vec![
        req(&[1, 2, 3], 1536, 16),
        req(&[1, 2, 4], 1536, 16),
        req(&[1, 2, 5], 1536, 16),
    ]
}

#[test]
fn vllm_keeps_states_only_at_prompt_ends_so_a_diverging_prefix_misses() {
    // States of A at floor(1535/128)*128 = 1408 and 1536; B and C match
    // 1024 tokens of K/V with no state at or below it.
    assert_eq!(
        served(SimMode::Vllm, 1 << 20, &cfg(), &diverging()),
        [0, 0, 0]
    );
    // The same prompt again: the state at 1408 (<= P-1) serves it.
    let again = vec![req(&[1, 2, 3], 1536, 16), req(&[1, 2, 3], 1536, 16)];
    assert_eq!(served(SimMode::Vllm, 1 << 20, &cfg(), &again), [0, 1408]);
}

#[test]
fn ucm_serves_the_second_occurrence_of_a_diverging_prefix() {
    // A keeps speculative states along its prompt (no junction seen yet:
    // every grid point, 128): B, the second occurrence of [0, 1024), hits
    // the one at 1024, and so does C.
    assert_eq!(
        served(SimMode::Ucm, 1 << 20, &cfg(), &diverging()),
        [0, 1024, 1024]
    );
    // Without speculative states, only the second-unserved trigger: B
    // keeps a state at the junction and only C hits it.
    let no_spec = SPEC.replace(
        "retention = { request_end = true, second_unserved = true }",
        "retention = { request_end = true, second_unserved = true, speculative = false }",
    );
    let m = Model::new(SpecTable::from_toml(&no_spec).unwrap());
    let mut sim = Sim::new(&m, SimMode::Ucm, 1 << 20, &cfg());
    let got: Vec<u64> = diverging()
        .iter()
        .enumerate()
        .map(|(k, t)| {
            let r = SimRequest::new(&m, 1, k, t).unwrap();
            sim.step(&m, &r).unwrap().served
        })
        .collect();
    assert_eq!(got, [0, 0, 1024]);
    // fold keeps a state only where a prompt ended on the grid (1536).
    assert_eq!(
        served(SimMode::Fold, 1 << 20, &cfg(), &diverging()),
        [0, 0, 0]
    );
}

#[test]
fn sglang_keeps_a_state_at_each_chunk_end_and_lmcache_at_each_chunk() {
    // SGLang with 512-token prefill chunks: A leaves states at 512 and 1024.
    assert_eq!(
        served(SimMode::Sglang, 1 << 20, &cfg(), &diverging()),
        [0, 1024, 1024]
    );
    // LMCache (256-token chunks, a state at each boundary).
    assert_eq!(
        served(SimMode::Lmcache, 1 << 20, &cfg(), &diverging()),
        [0, 1024, 1024]
    );
    // A chunk of 768 tokens: SGLang's state below 1024 is at 768.
    let c = SimConfig {
        sglang_chunk: 768,
        ..cfg()
    };
    assert_eq!(
        served(SimMode::Sglang, 1 << 20, &c, &diverging()),
        [0, 768, 768]
    );
}

#[test]
fn a_hit_in_the_engine_cache_is_not_a_load_and_a_small_engine_leaves_it_to_the_tiers() {
    let m = model();
    let again: Vec<TraceRequest> = (0..3).map(|_| req(&[7, 8], 1024, 0)).collect();
    let run = |engine: u64| {
        let mut sim = Sim::new(&m, SimMode::Ucm, engine, &cfg());
        again
            .iter()
            .enumerate()
            .map(|(k, t)| {
                sim.step(&m, &SimRequest::new(&m, 1, k, t).unwrap())
                    .unwrap()
            })
            .collect::<Vec<_>>()
    };
    // A big engine cache serves the repeats itself (896: vLLM's state at
    // floor(1023/128)*128): UCM loads nothing.
    let big = run(1 << 20);
    for s in &big[1..] {
        assert_eq!((s.served, s.engine), (896, 896));
        assert_eq!(s.loaded.pool + s.loaded.disk, 0);
    }
    // An engine cache smaller than one block keeps nothing: UCM serves the
    // repeats from its memory tier (the first request's speculative state
    // at its last servable point, 896), loading the K/V of [0, 896) and
    // the state: 896 x 128 B + 8 KiB.
    let small = run(64);
    for s in &small[1..] {
        assert_eq!((s.served, s.engine), (896, 0));
        assert_eq!(s.loaded.pool, 896 * 128 + 8192);
        assert_eq!(s.loaded.disk, 0);
    }
    assert_eq!(served(SimMode::Vllm, 64, &cfg(), &again), [0, 0, 0]);
}

#[test]
fn ucm_saves_from_its_own_hit_what_the_engine_served_but_its_tiers_lost() {
    let m = model();
    // Tiers that hold one 1024-token prompt (and its states), a big
    // engine cache.
    let c = SimConfig {
        pool_tokens: 1200,
        disk_tokens: 1200,
        ..cfg()
    };
    let trace = [
        req(&[1, 2], 1024, 0),
        req(&[3, 4], 1024, 0),
        req(&[1, 2], 1024, 0),
    ];
    let mut sim = Sim::new(&m, SimMode::Ucm, 1 << 20, &c);
    let steps: Vec<_> = trace
        .iter()
        .enumerate()
        .map(|(k, t)| {
            sim.step(&m, &SimRequest::new(&m, 1, k, t).unwrap())
                .unwrap()
        })
        .collect();
    // The third request: the engine serves 896, UCM lost the prompt to the
    // second one, so it saves the whole prompt again (8 blocks of 128 x
    // 128 B) from the engine's memory, plus its request-end state.
    assert_eq!((steps[2].engine, steps[2].served), (896, 896));
    assert_eq!(steps[2].saved, 8 * 128 * 128 + 8192);
}

#[test]
fn tiers_too_small_for_a_prompt_serve_nothing_and_big_ones_serve_everything() {
    let trace: Vec<TraceRequest> = (0..6).map(|_| req(&[1, 2, 3, 4], 2048, 0)).collect();
    let small = SimConfig {
        pool_tokens: 100,
        disk_tokens: 100,
        ..cfg()
    };
    // No engine cache either: nothing is kept anywhere.
    assert!(served(SimMode::Ucm, 0, &small, &trace)
        .iter()
        .all(|&s| s == 0));
    assert!(served(SimMode::Lmcache, 0, &small, &trace)
        .iter()
        .all(|&s| s == 0));
    // Tiers that hold the prompt. LMCache's chunk states serve a repeat
    // from the second request on (1792: the last 256-token boundary below
    // P-1). UCM keeps a speculative state at the prompt's last servable
    // grid point (1920): the second request on hits there.
    let ucm = served(SimMode::Ucm, 0, &cfg(), &trace);
    let lm = served(SimMode::Lmcache, 0, &cfg(), &trace);
    assert_eq!(lm, [0, 1792, 1792, 1792, 1792, 1792]);
    assert_eq!(ucm, [0, 1920, 1920, 1920, 1920, 1920]);
    // Tiers of 1.5 prompts: UCM (K/V and two states per prompt) still
    // holds the one prompt.
    let tight = SimConfig {
        pool_tokens: 3072,
        disk_tokens: 3072,
        ..cfg()
    };
    assert_eq!(
        served(SimMode::Ucm, 0, &tight, &trace),
        [0, 1920, 1920, 1920, 1920, 1920]
    );
}

#[test]
fn decode_retention_lets_the_next_turn_hit_through_the_answer() {
    let m = model();
    let prompt: Vec<u32> = (0..1536u32).collect();
    let answer: Vec<u32> = (5000..5512u32).collect();
    let mut next = prompt.clone();
    next.extend(&answer);
    next.extend(9000..9512u32);
    let turn1 = SimRequest::from_tokens(&m, &prompt, &answer).unwrap();
    let turn2 = SimRequest::from_tokens(&m, &next, &[]).unwrap();
    let run = |mode: SimMode, decode: bool| {
        let c = SimConfig {
            decode_retention: decode,
            ..cfg()
        };
        let mut sim = Sim::new(&m, mode, 0, &c);
        sim.step(&m, &turn1).unwrap();
        sim.step(&m, &turn2).unwrap().served
    };
    // The state at the end of the generated sequence (2048) and the
    // answer's blocks: the next turn resumes after the answer.
    assert_eq!(run(SimMode::Ucm, true), 2048);
    // Without it, only the prompt's end (1536).
    assert_eq!(run(SimMode::Ucm, false), 1536);
}

#[test]
fn recompute_serves_nothing_and_simulate_sums_the_steps() {
    let m = model();
    let trace = diverging();
    let noop = |_: &str| {};
    let r = simulate(&trace, &m, SimMode::Recompute, 1 << 20, &cfg(), &noop).unwrap();
    assert_eq!((r.served_tokens, r.prompt_tokens), (0, 3 * 1536));
    let s = simulate(&trace, &m, SimMode::Sglang, 1 << 20, &cfg(), &noop).unwrap();
    assert_eq!(s.served_tokens, 2048);
    assert!((s.hit_rate - 2048.0 / 4608.0).abs() < 1e-9);
    assert!(s.ttft_mean_ms < r.ttft_mean_ms);
}

fn ucm() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ucm"))
}

#[test]
fn the_cli_replays_a_sample_of_the_shared_trace_in_every_mode() {
    let file =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/mooncake/synthetic_trace.jsonl");
    let svg = tempfile::NamedTempFile::new().unwrap();
    let out = ucm()
        .args(["replay", "--trace"])
        .arg(&file)
        .args(["--limit", "300", "--sweep", "1e5,1e7", "--json", "--plot"])
        .arg(svg.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["kind"], "capacity-only");
    let points = v["points"].as_array().unwrap();
    // Six modes at two capacities, recompute once.
    assert_eq!(points.len(), 13);
    let ideal = v["summary"]["ideal_hit_rate"].as_f64().unwrap();
    for p in points {
        let h = p["hit_rate"].as_f64().unwrap();
        assert!((0.0..=ideal + 0.01).contains(&h), "{p}");
    }
    let plot = std::fs::read_to_string(svg.path()).unwrap();
    assert!(plot.starts_with("<svg") && plot.contains("lmcache") && plot.contains("ideal"));
    assert!(String::from_utf8_lossy(&out.stderr).contains("capacity-only"));
}

#[test]
fn the_default_sweep_gives_every_mode_the_same_capacity_and_a_ceiling_above_each() {
    let file =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/mooncake/synthetic_trace.jsonl");
    let out = ucm()
        .args(["replay", "--trace"])
        .arg(&file)
        .args(["--limit", "200", "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["sweep"], "cache");
    let points = v["points"].as_array().unwrap();
    // Seven modes at six capacities (1% to 200% of the working set),
    // recompute once.
    assert_eq!(points.len(), 6 * 6 + 1);
    let caps: std::collections::BTreeSet<u64> = points
        .iter()
        .map(|p| p["capacity_tokens"].as_u64().unwrap())
        .collect();
    assert_eq!(caps.len(), 6);
    for p in points {
        let mode = p["mode"].as_str().unwrap();
        let c = p["capacity_tokens"].as_u64().unwrap();
        let (e, d) = (
            p["engine_tokens"].as_u64().unwrap(),
            p["disk_tokens"].as_u64().unwrap(),
        );
        match mode {
            "ucm" | "lmcache" | "marconi" | "fold" => {
                assert_eq!((e, d), (0, c), "{p}");
                assert_eq!(p["pool_tokens"].as_u64().unwrap(), c / 10, "{p}");
            }
            "vllm" | "sglang" => assert_eq!((e, d), (c, 0), "{p}"),
            _ => {}
        }
        // No mode serves more than unlimited capacity would have.
        let (h, ceil) = (
            p["hit_rate"].as_f64().unwrap(),
            p["ceiling_hit_rate"].as_f64().unwrap(),
        );
        assert!(h <= ceil + 1e-9, "{p}");
        assert_eq!(p["marconi_alpha"].is_number(), mode == "marconi", "{p}");
    }
    let ceilings: std::collections::BTreeSet<String> = points
        .iter()
        .map(|p| format!("{:.9}", p["ceiling_hit_rate"].as_f64().unwrap()))
        .collect();
    assert_eq!(ceilings.len(), 1, "the ceiling does not depend on the mode");
}

#[test]
fn the_cli_refuses_bad_trace_options() {
    let file =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/mooncake/synthetic_trace.jsonl");
    for (args, want) in [
        (vec!["--modes", "vllm,nope"], "is not one of"),
        (
            vec!["--sweep", "1e4", "--engine-capacity", "1e5"],
            "not both",
        ),
        (
            vec!["--sweep", "1e5", "--pool-capacity", "1e4,1e5"],
            "one capacity",
        ),
        (
            vec!["--pool-capacity", "1e4"],
            "set the tiers of an engine sweep",
        ),
        (
            vec!["--capacity-sweep", "1e5", "--sweep", "1e5"],
            "not both",
        ),
        (vec!["--capacity-sweep", "0"], "whole number"),
        (vec!["--capacity-sweep", "abc"], "not a number"),
        (vec!["--disk-gib-s", "0"], "positive bandwidth"),
        (
            vec!["--speculative-share", "1.5"],
            "not a share from 0 to 1",
        ),
        (
            vec!["--speculative-share", "NaN"],
            "not a share from 0 to 1",
        ),
        (vec!["--tier-split", "pergroup"], "invalid value 'pergroup'"),
    ] {
        let out = ucm()
            .args(["replay", "--trace"])
            .arg(&file)
            .args(&args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{args:?}: {err}");
    }
    // Trace options without a trace.
    let out = ucm().args(["replay", "--limit", "3"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--limit needs --trace"));
    let out = ucm()
        .args(["replay", "--speculative-share", "0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--speculative-share needs --trace"));
    let out = ucm()
        .args(["replay", "--tier-split", "store"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--tier-split needs --trace"));
}

/// A small trace with reuse: shared prefixes that diverge, exact repeats,
/// a prefix that returns after another one.
const MINI: &str = r#"{"timestamp": 0, "input_length": 3000, "output_length": 200, "hash_ids": [1, 2, 3, 4, 5, 6]}
{"timestamp": 1, "input_length": 3100, "output_length": 100, "hash_ids": [1, 2, 3, 4, 7, 8, 9]}
{"timestamp": 2, "input_length": 2600, "output_length": 50, "hash_ids": [1, 2, 3, 4, 10, 11]}
{"timestamp": 3, "input_length": 3000, "output_length": 200, "hash_ids": [1, 2, 3, 4, 5, 6]}
{"timestamp": 4, "input_length": 3000, "output_length": 10, "hash_ids": [1, 2, 3, 4, 5, 6]}
{"timestamp": 5, "input_length": 1500, "output_length": 10, "hash_ids": [20, 21, 22]}
{"timestamp": 6, "input_length": 5000, "output_length": 10, "hash_ids": [1, 2, 3, 4, 5, 30, 31, 32, 33, 34]}
{"timestamp": 7, "input_length": 5000, "output_length": 10, "hash_ids": [1, 2, 3, 4, 5, 30, 31, 32, 33, 35]}
{"timestamp": 8, "input_length": 1500, "output_length": 10, "hash_ids": [20, 21, 22]}
{"timestamp": 9, "input_length": 1500, "output_length": 10, "hash_ids": [20, 21, 22]}
"#;

fn sample(extra: &[&str]) -> std::process::Output {
    // tmpfs when there is one: the stores sync every block.
    let shm = std::path::Path::new("/dev/shm");
    let dir = if shm.is_dir() {
        tempfile::tempdir_in(shm).unwrap()
    } else {
        tempfile::tempdir().unwrap()
    };
    let file = dir.path().join("mini.jsonl");
    std::fs::write(&file, MINI).unwrap();
    ucm()
        .args(["replay", "--trace"])
        .arg(&file)
        .args(["--limit", "10", "--bytes", "--json", "--dir"])
        .arg(dir.path())
        .args(extra)
        .output()
        .unwrap()
}

#[test]
fn moving_the_bytes_serves_what_the_capacity_only_model_serves() {
    let out = sample(&[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["disagreements"], 0, "{v}");
    assert_eq!(v["wrong"], 0, "{v}");
    let served = v["served_moving"].as_u64().unwrap();
    assert_eq!(served, v["served_capacity_only"].as_u64().unwrap());
    // Both diverging prefixes, the repeats and the returning prefix hit:
    // about half the prompt tokens, every loaded item checked.
    assert!(served > 10_000, "{v}");
    assert!(v["checked_items"].as_u64().unwrap() > 1000, "{v}");
}

#[test]
fn a_planted_bug_in_the_byte_moving_run_fails_the_check() {
    // A byte flipped in a loaded block: the oracle's wrong hit.
    let out = sample(&["--sabotage", "flip-byte"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("wrong hits"));
    // Saves that leave a block out: the save audit reports them lost, and
    // the next requests are served less than the model says.
    let out = sample(&["--sabotage", "skip-save"]);
    assert!(!out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["wrong"].as_u64().unwrap() > 0, "{v}");
    assert!(v["disagreements"].as_u64().unwrap() > 0, "{v}");
}

/// A fixed speculative share (`--speculative-share`): at 0, the stores'
/// rule before D82, A's speculative states go before any of its K/V, and
/// B, which needs A's state at a grid point of the shared prefix, is
/// served less than when they may fill the tiers (1).
#[test]
fn a_fixed_speculative_share_of_zero_evicts_speculative_states_first() {
    let at = |share: Option<f64>| {
        let c = SimConfig {
            pool_tokens: 1536,
            disk_tokens: 1536,
            speculative_share: share,
            ..cfg()
        };
        served(SimMode::Ucm, 0, &c, &diverging())
    };
    let (none, all) = (at(Some(0.0)), at(Some(1.0)));
    assert!(none[1] < all[1], "share 0: {none:?}, share 1: {all:?}");
    assert_eq!(all, [0, 768, 0]);
    // The scheduler's share, on evidence that speculative data serves
    // here, does as well as keeping it all.
    assert_eq!(at(None), all);
}

/// The tiers follow the scheduler's share (1/2 without evidence): on
/// tiers of 1536 tokens, B finds that sure data of A the tiers lost would
/// have served it further (the share drops to 0), C that speculative data
/// would have as well (1/3).
#[test]
fn the_ucm_tiers_follow_the_schedulers_evidence() {
    let c = SimConfig {
        pool_tokens: 1536,
        disk_tokens: 1536,
        ..cfg()
    };
    let m = model();
    let mut sim = Sim::new(&m, SimMode::Ucm, 0, &c);
    let mut shares = vec![];
    for (k, t) in diverging().iter().enumerate() {
        let r = SimRequest::new(&m, c.seed, k, t).unwrap();
        sim.step(&m, &r).unwrap();
        shares.push(sim.speculative_share().unwrap());
    }
    assert_eq!(shares, [0.5, 0.0, 1.0 / 3.0]);
    assert_eq!(
        Sim::new(&m, SimMode::Lmcache, 0, &c).speculative_share(),
        None
    );
}

#[test]
fn per_group_tiers_give_each_group_its_own_room_and_the_stores_disk_one_budget() {
    use ucm::replay::sim::cache::Unit;
    use ucm::replay::sim::tiers::{Split, Tiers};
    let m = model();
    let block = |n: u8| Unit::Block {
        group: 0,
        id: [n; 16],
    };
    let state = Unit::State {
        group: 1,
        hash: [7; 16],
    };
    let (kv, st) = (m.bytes(&block(0)), m.bytes(&state));
    assert!(kv > 0 && st > 0);
    // Room for four of each group's units, no pool; speculative share 0.
    let disk = 4 * (kv + st);
    let mut shared = Tiers::with_share(0, disk, Some(0.0));
    let mut per_group = Tiers::split(Some(&m), Split::Groups, 0, disk, Some(0.0));
    let mut store = Tiers::split(Some(&m), Split::Store, 0, disk, Some(0.0));
    assert_eq!(per_group.capacity(), shared.capacity());
    assert_eq!(store.capacity(), shared.capacity());
    for t in [&mut shared, &mut per_group, &mut store] {
        t.store(&m, &[(state, None)], |_| {});
        let blocks: Vec<(Unit, Option<u8>)> = (0..10).map(|n| (block(n), None)).collect();
        t.store(&m, &blocks, |_| {});
    }
    // One budget (and the store's one disk budget): ten blocks push the
    // older state out. Per group: the blocks evict only blocks, and the
    // state keeps its own room.
    assert!(!shared.contains(&state) && !store.contains(&state));
    assert!(per_group.contains(&state));
    assert!(per_group.contains(&block(9)) && !per_group.contains(&block(0)));
}
