//! The worked examples of DESIGN.md (fig 13, examples B and C) and the
//! spec table's validation messages.

mod common;

use common::{tokens, x_hybrid, MemPresence};
use ucm_coordinator::hash::checkpoint_hash;
use ucm_coordinator::retention::{
    joint_plan, plan, speculative_plan, speculative_spacing, JunctionLog, Priority,
    RecurrenceTracker, Shared, SpeculativeBudget, MAX_LEVEL,
};
use ucm_coordinator::{
    resolve_hit, CheckpointDirectory, CoordError, Deployment, GroupProblem, RequestError,
    RequestHashes, RequestKeys, SpecError, SpecTable,
};

const DEP: Deployment = Deployment { tp_size: 8 };

/// Fig 13: a 3000-token prompt; mla holds 2560, csa_c16 2432, swa 3000;
/// checkpoints at 2304 -> l = 2432, p* = 2304.
#[test]
fn fig13_gives_l_2432_and_p_star_2304() {
    let spec = x_hybrid();
    let t = tokens(13, 3000);
    let h = RequestHashes::compute(&spec, DEP, &t, &RequestKeys::default()).unwrap();
    let mut pres = MemPresence::default();
    let held = |g: &str, tokens: usize| {
        let gi = spec.group(g).unwrap();
        h.chains[gi.index][0][..tokens / gi.block as usize].to_vec()
    };
    pres.put("mla", held("mla", 2560));
    pres.put("csa_c16", held("csa_c16", 2432));
    pres.put("swa", held("swa", 3000));
    let dir = CheckpointDirectory::new();
    // Checkpoints at 2304 for both snapshot groups, and a deeper mamba2 one
    // at 2496 (> l: never a candidate), and one at 2432 of another prefix.
    for g in ["mamba2", "kda_perslot"] {
        let s = spec.group(g).unwrap();
        let c = |p| {
            checkpoint_hash(
                &h.seeds[s.index][0],
                &h.chains[s.index][0],
                &t,
                s.hash_block,
                p,
            )
            .unwrap()
        };
        dir.register(g, 2304, c(2304));
        dir.register(g, 2496, c(2496));
    }
    let other = tokens(14, 3000);
    let ho = RequestHashes::compute(&spec, DEP, &other, &RequestKeys::default()).unwrap();
    for g in ["mamba2", "kda_perslot"] {
        let s = spec.group(g).unwrap();
        let c = checkpoint_hash(
            &ho.seeds[s.index][0],
            &ho.chains[s.index][0],
            &other,
            s.hash_block,
            2432,
        )
        .unwrap();
        dir.register(g, 2432, c);
    }
    let r = resolve_hit(&spec, &t, &h, &pres, &dir).unwrap();
    assert_eq!((r.l, r.p_star), (2432, 2304));
    let vote = |g: &str| r.groups.iter().find(|(n, _)| n == g).unwrap().1.vote;
    assert_eq!(vote("mla"), Some(2560));
    assert_eq!(vote("csa_c16"), Some(2432));
    assert_eq!(vote("swa"), Some(2944)); // whole blocks of 3000 tokens
    assert_eq!(vote("mamba2"), Some(2304));
    assert_eq!(vote("dsa_indexer"), None);
    assert_eq!(vote("cross"), None);

    // Without the kda checkpoint at 2304, p* falls to 0: every snapshot
    // group must be there.
    let dir2 = CheckpointDirectory::new();
    let s = spec.group("mamba2").unwrap();
    dir2.register(
        "mamba2",
        2304,
        checkpoint_hash(
            &h.seeds[s.index][0],
            &h.chains[s.index][0],
            &t,
            s.hash_block,
            2304,
        )
        .unwrap(),
    );
    let r = resolve_hit(&spec, &t, &h, &pres, &dir2).unwrap();
    assert_eq!((r.l, r.p_star), (2432, 0));
}

/// Tenants never share ids; groups never alias; ranks share all_union ids.
#[test]
fn salts_groups_and_ranks_isolate_ids() {
    let spec = x_hybrid();
    let t = tokens(1, 512);
    let a = RequestHashes::compute(&spec, DEP, &t, &RequestKeys::default()).unwrap();
    let salted = RequestKeys {
        cache_salt: Some("tenant-b".into()),
        ..Default::default()
    };
    let b = RequestHashes::compute(&spec, DEP, &t, &salted).unwrap();
    let mla = spec.group("mla").unwrap().index;
    let csa = spec.group("csa_c16").unwrap().index;
    let dsa = spec.group("dsa_indexer").unwrap().index;
    assert_ne!(a.chains[mla], b.chains[mla]);
    assert_ne!(a.chains[mla][0][0], a.chains[csa][0][0]);
    assert_eq!(a.chains[dsa], a.chains[mla], "sidecars follow their source");
    let extra = RequestKeys {
        extra_keys: vec![b"lora-7".to_vec()],
        ..Default::default()
    };
    let c = RequestHashes::compute(&spec, DEP, &t, &extra).unwrap();
    assert_ne!(a.chains[mla], c.chains[mla]);
    // Equal tokens after different prefixes get different ids.
    let mut t2 = t.clone();
    t2[0] ^= 1;
    let d = RequestHashes::compute(&spec, DEP, &t2, &RequestKeys::default()).unwrap();
    assert!(a.chains[mla][0]
        .iter()
        .zip(&d.chains[mla][0])
        .all(|(x, y)| x != y));
}

/// Example C: 10,000 tokens, interval 1024, grid 64 -> 1024 ... 9216 plus
/// the request-end checkpoint at 9984.
#[test]
fn example_c_interval_and_request_end_checkpoints() {
    let spec = SpecTable::from_toml(
        r#"
model = "c"
[[group]]
name = "attn"
kind = "chain"
block_size = 64
layers = "0"
bytes_per_token = 64
[[group]]
name = "state"
kind = "snapshot"
grid = 64
state_bytes = 4096
layers = "1"
retention = { interval = 1024 }
"#,
    )
    .unwrap();
    let g = spec.group("state").unwrap();
    let mut want: Vec<u64> = (1..=9).map(|k| k * 1024).collect();
    want.push(9984);
    assert_eq!(plan(g, spec.common_grid(), 0, 10_000), want);
    // Resumed at 4096: only new state is kept.
    assert_eq!(
        plan(g, spec.common_grid(), 4096, 10_000),
        vec![5120, 6144, 7168, 8192, 9216, 9984]
    );
    // A full hit with nothing new keeps nothing.
    assert_eq!(plan(g, spec.common_grid(), 9984, 9984), Vec::<u64>::new());
    // Chain groups keep no checkpoints.
    assert!(plan(spec.group("attn").unwrap(), 64, 0, 10_000).is_empty());
}

/// Trigger 2: where a request meets and leaves an earlier one. The
/// tracker reports the common boundary of every request (the scheduler
/// keeps a checkpoint there when the request was not served up to it).
#[test]
fn the_tracker_reports_where_a_request_leaves_an_earlier_one() {
    let spec = x_hybrid();
    let m = spec.group("mamba2").unwrap();
    let system = tokens(99, 1000); // shared system prompt
    let req = |user: u64| {
        let mut t = system.clone();
        t.extend(tokens(user, 700));
        let h = RequestHashes::compute(&spec, DEP, &t, &RequestKeys::default()).unwrap();
        h.chains[m.index][0].clone()
    };
    let mut tr = RecurrenceTracker::new(64);
    let none = Shared {
        boundary: 0,
        diverges: false,
    };
    // First occurrence: nothing shared.
    assert_eq!(tr.observe(m, 128, &req(1)), none);
    // Second: the common prefix is 1000 tokens; whole hash blocks of 128
    // give 896, on mamba2's grid of 64; it goes on with other tokens.
    let junction = Shared {
        boundary: 896,
        diverges: true,
    };
    assert_eq!(tr.observe(m, 128, &req(2)), junction);
    assert_eq!(tr.observe(m, 128, &req(3)), junction);
    // An exact repeat shares everything and diverges nowhere.
    assert_eq!(
        tr.observe(m, 128, &req(3)),
        Shared {
            boundary: 1664,
            diverges: false
        }
    );
    // An unrelated prompt shares nothing.
    assert_eq!(tr.observe(m, 128, &tokens_ids(&spec, 5)), none);
}

/// Trigger 4, worked example: the spacing of speculative checkpoints and
/// their levels. X-Hybrid-96 keeps 26.5 MB of state per position against
/// 107,536 B of K/V per token, so a state is kept at most every 247 tokens:
/// on the grid of 128, every 256. Junctions seen at multiples of 512 (and
/// one at 1536) widen it to 512; one off those (at 640) narrows it to 128,
/// then the K/V rule to 256 again.
#[test]
fn speculative_checkpoints_follow_the_junctions_and_the_bytes() {
    let spec = x_hybrid();
    let m = spec.group("mamba2").unwrap();
    let (state, kv) = (spec.state_bytes_per_position(), spec.kv_bytes_per_token());
    assert_eq!((state, kv), (26_476_544, 107_536));
    let mut log = JunctionLog::new(8);
    assert_eq!(log.spacing(128), 128, "no junction yet: the grid");
    assert_eq!(speculative_spacing(log.spacing(128), state, kv), 256);
    for j in [2048, 1536, 4096] {
        log.observe(j);
    }
    assert_eq!(log.spacing(128), 512, "1536 = 3 x 512");
    assert_eq!(speculative_spacing(log.spacing(128), state, kv), 512);
    log.observe(640);
    assert_eq!(log.spacing(128), 128);
    assert_eq!(speculative_spacing(log.spacing(128), state, kv), 256);
    // The plan of a 3000-token prompt resumed at 600, spacing 512: every
    // multiple of 512 in between, levels by how many times 512 divides it,
    // and the prompt's last servable point (2944) at the top level.
    let plan = speculative_plan(m, spec.common_grid(), 600, 3000, Some(512));
    assert_eq!(
        plan,
        vec![
            (1024, 1),
            (1536, 0),
            (2048, 2),
            (2560, 0),
            (2944, MAX_LEVEL)
        ]
    );
    // A group without the trigger plans nothing.
    let mut off = m.clone();
    off.retention.as_mut().unwrap().speculative = false;
    assert!(speculative_plan(&off, spec.common_grid(), 0, 3000, Some(512)).is_empty());
}

/// The speculative share follows the recompute each kind of ghost would
/// have saved.
#[test]
fn the_speculative_share_follows_what_each_kind_would_have_saved() {
    let mut b = SpeculativeBudget::new();
    assert_eq!(b.share(), 0.5, "no evidence");
    b.observe(0, 300);
    assert_eq!(b.share(), 0.0);
    b.observe(900, 0);
    assert!((b.share() - 0.75).abs() < 1e-12);
}

/// The scheduler's plan, worked through: a first occurrence keeps
/// speculative checkpoints along its prompt and the sure request end; a
/// second request that leaves it at 896 without being served there keeps a
/// sure checkpoint at the junction; a request served beyond the junction
/// keeps none there.
#[test]
fn the_scheduler_plans_sure_and_speculative_checkpoints() {
    use std::sync::Arc;
    use ucm_coordinator::adapter::{EngineRequest, Scheduler};
    use ucm_coordinator::resolve::Presence;
    use ucm_coordinator::CheckpointDirectory;

    struct Nothing;
    impl Presence for Nothing {
        fn lookup(&self, _: &ucm_coordinator::Group, ids: &[[u8; 16]]) -> Vec<bool> {
            vec![false; ids.len()]
        }
    }
    let spec = Arc::new(x_hybrid());
    let m = spec.group("mamba2").unwrap().index;
    let mut s = Scheduler::new(
        Arc::clone(&spec),
        DEP,
        Arc::new(Nothing),
        Arc::new(CheckpointDirectory::new()),
    );
    let system = tokens(99, 1000);
    let req = |id: &str, user: u64| {
        let mut t = system.clone();
        t.extend(tokens(user, 700));
        EngineRequest {
            id: id.into(),
            tokens: Arc::new(t),
            keys: RequestKeys::default(),
        }
    };
    let plan_of = |s: &Scheduler<Nothing>, id: &str| -> Vec<(u64, Priority)> {
        s.checkpoint_plan(id)
            .into_iter()
            .filter(|(g, _, _)| *g == m)
            .map(|(_, p, pr)| (p, pr))
            .collect()
    };
    s.get_num_new_matched_tokens(&req("a", 1), 0).unwrap();
    // No junction seen yet: every 256 tokens (the K/V rule), levels by
    // how often 256 divides the position; the prompt's end (1700, on the
    // grid 1664) is sure (request end), which outranks the speculative
    // last servable point there.
    let a = plan_of(&s, "a");
    let sp = Priority::Speculative;
    assert_eq!(
        a,
        vec![
            (256, sp(0)),
            (512, sp(1)),
            (768, sp(0)),
            (1024, sp(2)),
            (1280, sp(0)),
            (1536, sp(1)),
            (1664, Priority::Sure)
        ]
    );
    s.get_num_new_matched_tokens(&req("b", 2), 0).unwrap();
    let b = plan_of(&s, "b");
    assert!(b.contains(&(896, Priority::Sure)), "the junction: {b:?}");
    // One plan for both snapshot groups: KDA's interval (1024 tokens)
    // alone would keep its state at 1024 as sure data, but a hit there
    // needs Mamba2's too, which is speculative; so KDA's is as well.
    let k = spec.group("kda_perslot").unwrap().index;
    for id in ["a", "b"] {
        let kda: Vec<(u64, Priority)> = s
            .checkpoint_plan(id)
            .into_iter()
            .filter(|(g, _, _)| *g == k)
            .map(|(_, p, pr)| (p, pr))
            .collect();
        assert_eq!(kda, plan_of(&s, id), "request {id}");
    }
    assert!(a.contains(&(1024, sp(2))));
    // Decoding extends the plan: KDA's interval adds 2048 for KDA alone,
    // and the joint plan gives it to Mamba2 too.
    let mut longer = req("a", 1).tokens.as_ref().clone();
    longer.extend(tokens(7, 500));
    s.extend_tokens("a", Arc::new(longer)).unwrap();
    let a = plan_of(&s, "a");
    assert!(a.contains(&(2048, Priority::Sure)), "{a:?}");
    let kda: Vec<(u64, Priority)> = s
        .checkpoint_plan("a")
        .into_iter()
        .filter(|(g, _, _)| *g == k)
        .map(|(_, p, pr)| (p, pr))
        .collect();
    assert_eq!(kda, a);
}

/// The joint plan: every position any group plans, for every group, at
/// the lowest priority any group gives it.
#[test]
fn a_position_is_planned_for_every_snapshot_group_at_its_lowest_priority() {
    use std::collections::{BTreeMap, HashMap};
    let sp = Priority::Speculative;
    let mut plans: HashMap<usize, BTreeMap<u64, Priority>> = HashMap::new();
    plans.insert(4, [(512, sp(0)), (1024, Priority::Sure)].into());
    plans.insert(5, [(1024, sp(1)), (2048, Priority::Sure)].into());
    joint_plan(&mut plans);
    let want: BTreeMap<u64, Priority> =
        [(512, sp(0)), (1024, sp(1)), (2048, Priority::Sure)].into();
    assert_eq!(plans[&4], want);
    assert_eq!(plans[&5], want);
    // One group: nothing to join.
    let mut one: HashMap<usize, BTreeMap<u64, Priority>> = HashMap::new();
    one.insert(4, [(512, sp(3))].into());
    joint_plan(&mut one);
    assert_eq!(one[&4], [(512, sp(3))].into());
}

fn tokens_ids(spec: &SpecTable, seed: u64) -> Vec<[u8; 16]> {
    let m = spec.group("mamba2").unwrap();
    let t = tokens(seed, 1700);
    RequestHashes::compute(spec, DEP, &t, &RequestKeys::default())
        .unwrap()
        .chains[m.index][0]
        .clone()
}

/// Example B: 4 ranks, independent per-rank dump failures with p = 0.1
/// over 100k blocks: availability 65.6% under intersection, 99.99% under
/// all_union, through the real resolve path (one block per request).
#[test]
fn example_b_rank_rules() {
    let mk = |rule: &str| {
        SpecTable::from_toml(&format!(
            "model = \"b\"\n[[group]]\nname = \"kv\"\nkind = \"chain\"\nblock_size = 4\nlayers = \"0\"\nbytes_per_token = 8\nrank_rule = \"{rule}\"\n"
        ))
        .unwrap()
    };
    let dep = Deployment { tp_size: 4 };
    let mut rng = 0x1234_5678_9abc_def0u64;
    let mut coin = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        (rng >> 11) as f64 / (1u64 << 53) as f64
    };
    let blocks = 100_000;
    for (rule, want) in [
        ("intersection", 0.9f64.powi(4)),
        ("all_union", 1.0 - 0.1f64.powi(4)),
    ] {
        let spec = mk(rule);
        let dir = CheckpointDirectory::new();
        let mut pres = MemPresence::default();
        let mut reqs = Vec::new();
        for b in 0..blocks {
            let t = vec![b as u32, 7, 7, 7];
            let h = RequestHashes::compute(&spec, dep, &t, &RequestKeys::default()).unwrap();
            // Every rank dumps its copy (all_union: the same id) with p = 0.1
            // of failure.
            for rank in 0..4usize {
                if coin() >= 0.1 {
                    let ids = &h.chains[0];
                    pres.put("kv", [ids[rank.min(ids.len() - 1)][0]]);
                }
            }
            reqs.push((t, h));
        }
        let hits = reqs
            .iter()
            .filter(|(t, h)| resolve_hit(&spec, t, h, &pres, &dir).unwrap().p_star == 4)
            .count();
        let avail = hits as f64 / blocks as f64;
        assert!(
            (avail - want).abs() < 0.01,
            "{rule}: availability {avail}, expected {want}"
        );
    }
}

/// Bad input is a clear error, never a hit.
#[test]
fn bad_requests_are_errors() {
    let spec = x_hybrid();
    let pres = MemPresence::default();
    let dir = CheckpointDirectory::new();
    let empty: Vec<u32> = vec![];
    let h = RequestHashes::compute(&spec, DEP, &empty, &RequestKeys::default()).unwrap();
    let e = resolve_hit(&spec, &empty, &h, &pres, &dir).unwrap_err();
    assert!(e.to_string().contains("empty prompt"), "{e}");
    assert!(
        matches!(e, CoordError::BadRequest(RequestError::EmptyPrompt)),
        "{e:?}"
    );
    let short = tokens(1, 100);
    let h = RequestHashes::compute(&spec, DEP, &short, &RequestKeys::default()).unwrap();
    let e = resolve_hit(&spec, &short, &h, &pres, &dir).unwrap_err();
    assert!(e.to_string().contains("shorter than one block"), "{e}");
    assert!(
        matches!(
            e,
            CoordError::BadRequest(RequestError::PromptShorterThanGrid { tokens: 100, .. })
        ),
        "{e:?}"
    );
    assert!(matches!(
        spec.group("nope"),
        Err(CoordError::BadRequest(RequestError::UnknownGroup { name })) if name == "nope"
    ));
    // Hashes of another spec are refused.
    let other = SpecTable::from_toml(
        "model = \"o\"\n[[group]]\nname = \"a\"\nkind = \"chain\"\nblock_size = 128\nlayers = \"0\"\nbytes_per_token = 2\n",
    )
    .unwrap();
    let t = tokens(1, 300);
    let ho = RequestHashes::compute(&other, DEP, &t, &RequestKeys::default()).unwrap();
    assert!(resolve_hit(&spec, &t, &ho, &pres, &dir).is_err());
}

/// Validation names the problem precisely.
#[test]
fn spec_validation_messages() {
    let base = |extra: &str| format!("model = \"m\"\n{extra}");
    let chain = "[[group]]\nname = \"a\"\nkind = \"chain\"\nblock_size = 16\nlayers = \"0-3\"\nbytes_per_token = 8\n";
    let cases: &[(&str, &str)] = &[
        (
            "[[group]]\nname = \"s\"\nkind = \"sidecar\"\nsource = \"ghost\"\nlayers = \"4\"\nbytes_per_token = 8\n",
            "follows unknown group `ghost`",
        ),
        (
            "[[group]]\nname = \"z\"\nkind = \"chain\"\nblock_size = 0\nlayers = \"4\"\nbytes_per_token = 8\n",
            "`block_size` must be positive",
        ),
        (
            "[[group]]\nname = \"z\"\nkind = \"chain\"\nblock_size = 16\nlayers = \"4\"\nbytes_per_token = 0\n",
            "`bytes_per_token` must be positive",
        ),
        (
            "[[group]]\nname = \"b\"\nkind = \"chain\"\nblock_size = 16\nlayers = \"3-5\"\nbytes_per_token = 8\n",
            "layer 3 is in two groups: `a` and `b`",
        ),
        (
            "[[group]]\nname = \"w\"\nkind = \"chain\"\nblock_size = 16\nwindow = 0\nlayers = \"9\"\nbytes_per_token = 8\n",
            "group `w`: `window` must be positive",
        ),
        (
            "[[group]]\nname = \"s\"\nkind = \"snapshot\"\nlayers = \"9\"\nstate_bytes = 8\n",
            "needs `grid`",
        ),
        (
            "[[group]]\nname = \"s\"\nkind = \"snapshot\"\ngrid = 16\nlayers = \"9\"\nstate_bytes = 8\nretention = { interval = 0 }\n",
            "`retention interval` must be positive",
        ),
        (
            "[[group]]\nname = \"a\"\nkind = \"none\"\nlayers = \"9\"\n",
            "group `a`: defined twice",
        ),
        (
            "[[group]]\nname = \"x\"\nkind = \"none\"\nlayers = \"9\"\nwindow = 4\n",
            "`window` does not apply",
        ),
        (
            "[[group]]\nname = \"s\"\nkind = \"sidecar\"\nsource = \"n\"\nlayers = \"8\"\nbytes_per_token = 8\n[[group]]\nname = \"n\"\nkind = \"none\"\nlayers = \"9\"\n",
            "a source must be a chain group",
        ),
        (
            "[[group]]\nname = \"r\"\nkind = \"none\"\nlayers = \"7-5\"\n",
            "is reversed",
        ),
    ];
    for (extra, want) in cases {
        let text = base(&format!("{chain}{extra}"));
        let e = SpecTable::from_toml(&text).unwrap_err().to_string();
        assert!(e.contains(want), "expected `{want}` in: {e}");
    }
    let e = SpecTable::from_toml("model = \"m\"\nnum_layers = 2\n[[group]]\nname = \"a\"\nkind = \"none\"\nlayers = \"0-2\"\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("not below num_layers"), "{e}");
    // The cases are typed: a caller matches the group and the problem.
    let e = SpecTable::from_toml(&base(&format!(
        "{chain}[[group]]\nname = \"s\"\nkind = \"sidecar\"\nsource = \"ghost\"\nlayers = \"4\"\nbytes_per_token = 8\n"
    )))
    .unwrap_err();
    assert!(
        matches!(
            &e,
            CoordError::Spec(SpecError::Group {
                group,
                problem: GroupProblem::UnknownSource { followed },
            }) if group == "s" && followed == "ghost"
        ),
        "{e:?}"
    );
    let e = SpecTable::from_toml(
        "model = \"m\"\n[[group]]\nname = \"a\"\nkind = \"chian\"\nlayers = \"0\"\n",
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("chian"), "{e}");
}

/// Names that would become paths outside the store, sizes that would
/// exhaust memory, and tables that could never hit are refused with the
/// field named, before anything is allocated.
#[test]
fn hostile_spec_values_are_refused() {
    let chain = |name: &str, extra: &str| {
        format!(
            "model = \"m\"\n[[group]]\nname = {name:?}\nkind = \"chain\"\nblock_size = 16\n\
             layers = \"0\"\nbytes_per_token = 8\n{extra}"
        )
    };
    for name in ["..", "/etc", "../../x", "a/b", "", ".hidden", "x y", "-rf"] {
        let e = SpecTable::from_toml(&chain(name, ""))
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a plain name"), "{name:?}: {e}");
    }
    let cases: &[(&str, &str)] = &[
        ("layers = \"0-4294967295\"", "is not below 65536"),
        ("layers = [4000000000]", "is not below 65536"),
        (
            "block_size = 99999999999",
            "`block_size` = 99999999999 exceeds",
        ),
        (
            "bytes_per_token = 99999999999",
            "`bytes_per_token` = 99999999999 exceeds",
        ),
    ];
    for (line, want) in cases {
        let key = line.split(' ').next().unwrap();
        let text = chain("a", "")
            .lines()
            .map(|l| {
                if l.starts_with(&format!("{key} ")) {
                    line.to_string()
                } else {
                    l.to_string()
                }
            })
            .collect::<Vec<_>>()
            .join("\n");
        let e = SpecTable::from_toml(&text).unwrap_err().to_string();
        assert!(e.contains(want), "{line}: {e}");
    }
    let e = SpecTable::from_toml(
        "model = \"m\"\n[[group]]\nname = \"x\"\nkind = \"none\"\nlayers = \"0\"\n",
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("no chain group"), "{e}");
    let e = SpecTable::from_toml(&format!(
        "{}[[group]]\nname = \"s\"\nkind = \"snapshot\"\ngrid = 16\nlayers = \"1\"\nstate_bytes = 99999999999999\n",
        chain("a", "")
    ))
    .unwrap_err()
    .to_string();
    assert!(e.contains("`state_bytes`"), "{e}");
    let e = SpecTable::from_toml("model = \"m\"\nnum_layers = 4000000000\n[[group]]\nname = \"a\"\nkind = \"chain\"\nblock_size = 16\nlayers = \"0\"\nbytes_per_token = 8\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("num_layers"), "{e}");
}

/// Every shipped spec loads, and X-Hybrid-96 matches DESIGN.md section 11.
#[test]
fn shipped_specs_load() {
    for f in [
        "x-hybrid-96.toml",
        "attn-mamba-hybrid.toml",
        "mla-csa-swa.toml",
    ] {
        SpecTable::load(&common::spec_path(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
    }
    let s = x_hybrid();
    let count = |g: &str| s.group(g).unwrap().layers.len();
    assert_eq!(
        [
            count("mla"),
            count("csa_c16"),
            count("swa"),
            count("mamba2"),
            count("kda_perslot"),
            count("cross"),
            count("dsa_indexer")
        ],
        [16, 16, 24, 20, 8, 8, 4]
    );
    assert_eq!(s.groups().iter().map(|g| g.layers.len()).sum::<usize>(), 96);
    assert_eq!(s.chain_grid(), 128);
    assert_eq!(s.common_grid(), 128);
}

/// Lazy invalidation: a checkpoint whose load missed is forgotten and stops
/// hitting; a rebuilt (position-less) entry hits like a registered one.
#[test]
fn directory_forget_and_rebuild() {
    let spec = SpecTable::from_toml(
        "model = \"d\"\n[[group]]\nname = \"a\"\nkind = \"chain\"\nblock_size = 64\nlayers = \"0\"\nbytes_per_token = 2\n[[group]]\nname = \"s\"\nkind = \"snapshot\"\ngrid = 64\nlayers = \"1\"\nstate_bytes = 64\n",
    )
    .unwrap();
    let t = tokens(3, 640);
    let h = RequestHashes::compute(&spec, DEP, &t, &RequestKeys::default()).unwrap();
    let mut pres = MemPresence::default();
    pres.put("a", h.chains[0][0].clone());
    let s = spec.group("s").unwrap();
    let c = |p| checkpoint_hash(&h.seeds[s.index][0], &h.chains[s.index][0], &t, 64, p).unwrap();
    let dir = CheckpointDirectory::new();
    // A put that did not store every layer registers nothing.
    assert!(!dir.put_completed("s", 576, c(576), false));
    assert!(dir.put_completed("s", 256, c(256), true));
    assert!(dir.put_completed("s", 512, c(512), true));
    assert_eq!(resolve_hit(&spec, &t, &h, &pres, &dir).unwrap().p_star, 512);
    // The load of 512 missed (evicted from the store): the entry dies.
    assert!(dir.forget("s", &c(512)));
    assert!(!dir.forget("s", &c(512)));
    assert_eq!(resolve_hit(&spec, &t, &h, &pres, &dir).unwrap().p_star, 256);
    assert_eq!(dir.positions("s"), vec![256]);
    // Warm restart: only hashes come back, and they hit the same.
    let warm = CheckpointDirectory::new();
    assert_eq!(warm.rebuild("s", [c(256), c(512)]), 2);
    assert_eq!(
        resolve_hit(&spec, &t, &h, &pres, &warm).unwrap().p_star,
        512
    );
    assert_eq!(warm.len("s"), 2);
    assert!(warm.positions("s").is_empty());
}
