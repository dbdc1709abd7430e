//! The scheduler's evidence for the speculative share (module `ghosts`):
//! what it saved and the tiers no longer hold, probed when a request
//! resolves.

mod common;

use std::sync::Arc;

use common::{tokens, x_hybrid, MemPresence};
use ucm_coordinator::adapter::{Allocation, EngineRequest, Scheduled, Scheduler};
use ucm_coordinator::hash::checkpoint_hash;
use ucm_coordinator::retention::Priority;
use ucm_coordinator::{CheckpointDirectory, Deployment, Kind, RequestHashes, RequestKeys};

const DEP: Deployment = Deployment { tp_size: 8 };

/// A 1000-token system prompt followed by 700 tokens of user `user`.
fn prompt(user: u64) -> Vec<u32> {
    let mut t = tokens(99, 1000);
    t.extend(tokens(user, 700));
    t
}

fn request(id: &str, t: &[u32]) -> EngineRequest {
    EngineRequest {
        id: id.into(),
        tokens: Arc::new(t.to_vec()),
        keys: RequestKeys::default(),
    }
}

/// Runs request "a" (prompt of user 1) through the scheduler with a chunk
/// ending at every planned checkpoint, so that every planned state and
/// every block is saved; returns its plan for the first snapshot group.
fn run_a(s: &mut Scheduler<MemPresence>) -> Vec<(u64, Priority)> {
    let spec = x_hybrid();
    let t = prompt(1);
    let n = t.len() as u64;
    s.get_num_new_matched_tokens(&request("a", &t), 0).unwrap();
    let mut alloc = Allocation::default();
    for g in spec.groups() {
        match g.kind {
            Kind::Chain | Kind::Sidecar => {
                let b = spec.block_of(g.index).max(1);
                alloc
                    .blocks
                    .insert(g.index, (0..n.div_ceil(b) as u32).collect());
            }
            Kind::Snapshot => {
                alloc.state_slots.insert(g.index, 0);
            }
            Kind::None => {}
        }
    }
    s.update_state_after_alloc("a", alloc, 0).unwrap();
    let first = spec.snapshot_groups().next().unwrap().index;
    let plan: Vec<(u64, Priority)> = s
        .checkpoint_plan("a")
        .into_iter()
        .filter(|(g, _, _)| *g == first)
        .map(|(_, p, pr)| (p, pr))
        .collect();
    let mut start = 0;
    for end in plan.iter().map(|(p, _)| *p).chain([n]) {
        if end > start {
            let meta = s
                .build_meta(&[Scheduled {
                    req: "a".into(),
                    start,
                    end,
                }])
                .unwrap();
            assert_eq!(meta.speculative_share, Some(s.speculative_share()));
            start = end;
        }
    }
    s.request_finished("a");
    plan
}

/// Registers in `dir` every checkpoint of request "a" at `positions`.
fn register(dir: &CheckpointDirectory, positions: &[u64]) {
    let spec = x_hybrid();
    let t = prompt(1);
    let h = RequestHashes::compute(&spec, DEP, &t, &RequestKeys::default()).unwrap();
    for g in spec.snapshot_groups() {
        for &p in positions {
            for (r, ids) in h.chains[g.index].iter().enumerate() {
                let key = checkpoint_hash(&h.seeds[g.index][r], ids, &t, g.hash_block, p).unwrap();
                dir.register(&g.name, p, key);
            }
        }
    }
}

/// Every chain id of request "a", as tiers that still hold its K/V.
fn a_blocks() -> MemPresence {
    let spec = x_hybrid();
    let h = RequestHashes::compute(&spec, DEP, &prompt(1), &RequestKeys::default()).unwrap();
    let mut pres = MemPresence::default();
    for g in spec.groups() {
        for ids in &h.chains[g.index] {
            pres.put(&g.name, ids.iter().copied());
        }
    }
    pres
}

#[test]
fn gone_speculative_checkpoints_raise_the_share_and_gone_blocks_lower_it() {
    // The tiers kept the K/V of "a" but none of its checkpoints: "b",
    // which shares its 1000-token system prompt, would have been served
    // up to a speculative checkpoint below 1000 had those been kept.
    let dir = Arc::new(CheckpointDirectory::new());
    let mut s = Scheduler::new(Arc::new(x_hybrid()), DEP, Arc::new(a_blocks()), dir);
    assert_eq!(s.speculative_share(), 0.5, "no evidence yet");
    let plan = run_a(&mut s);
    assert!(
        plan.iter()
            .any(|(p, pr)| *p < 1000 && matches!(pr, Priority::Speculative(_))),
        "{plan:?}"
    );
    s.get_num_new_matched_tokens(&request("b", &prompt(2)), 0)
        .unwrap();
    assert_eq!(s.speculative_share(), 1.0);

    // The tiers kept every checkpoint of "a" but none of its blocks: only
    // sure data, kept longer, would have served "b".
    let dir = Arc::new(CheckpointDirectory::new());
    let mut s = Scheduler::new(
        Arc::new(x_hybrid()),
        DEP,
        Arc::new(MemPresence::default()),
        Arc::clone(&dir),
    );
    let plan = run_a(&mut s);
    register(&dir, &plan.iter().map(|(p, _)| *p).collect::<Vec<_>>());
    s.get_num_new_matched_tokens(&request("b", &prompt(2)), 0)
        .unwrap();
    assert_eq!(s.speculative_share(), 0.0);

    // Everything kept: no evidence either way.
    let dir = Arc::new(CheckpointDirectory::new());
    let mut s = Scheduler::new(
        Arc::new(x_hybrid()),
        DEP,
        Arc::new(a_blocks()),
        Arc::clone(&dir),
    );
    let plan = run_a(&mut s);
    register(&dir, &plan.iter().map(|(p, _)| *p).collect::<Vec<_>>());
    let (hit, _) = s
        .get_num_new_matched_tokens(&request("b", &prompt(2)), 0)
        .unwrap();
    assert!(hit > 0);
    assert_eq!(s.speculative_share(), 0.5);
}

#[test]
fn saves_recorded_without_step_metadata_count_the_same_and_the_bound_forgets_them() {
    // The replay's engine model saves without step metadata: the record
    // it gives the scheduler must serve as build_meta's does.
    let t = prompt(1);
    let n = t.len() as u64;
    let share_after = |bound_blocks: Option<u64>| {
        let dir = Arc::new(CheckpointDirectory::new());
        let mut s = Scheduler::new(Arc::new(x_hybrid()), DEP, Arc::new(a_blocks()), dir);
        if let Some(b) = bound_blocks {
            s.bound_saved_to_disk(b);
        }
        s.get_num_new_matched_tokens(&request("a", &t), 0).unwrap();
        s.record_saved("a", 0, 0, n).unwrap();
        s.request_finished("a");
        s.get_num_new_matched_tokens(&request("b", &prompt(2)), 0)
            .unwrap();
        s.speculative_share()
    };
    assert_eq!(share_after(None), 1.0);
    // Tiers of a few hundred blocks per group remember all of "a".
    assert_eq!(share_after(Some(1000)), 1.0);
    // Tiers of no blocks remember nothing: no evidence.
    assert_eq!(share_after(Some(0)), 0.5);
}
