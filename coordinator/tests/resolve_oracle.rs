//! `resolve_hit` against a brute-force oracle that evaluates the
//! servability predicate of DESIGN.md section 5 at every position, over
//! random spec tables (full and windowed chain groups, both rank rules,
//! several snapshot groups, sidecars, none groups) and random store
//! contents. They must agree exactly: never larger (a wrong hit), never
//! smaller (a needless miss).

mod common;

use std::collections::HashSet;

use common::MemPresence;
use proptest::prelude::*;
use ucm_coordinator::hash::checkpoint_hash;
use ucm_coordinator::resolve::resolve_positions;
use ucm_coordinator::{
    resolve_hit, CheckpointDirectory, Deployment, Kind, RequestHashes, RequestKeys, SpecTable,
};

#[derive(Clone, Debug)]
struct ChainCase {
    block: u64,
    window: Option<u64>,
    intersection: bool,
    /// Per rank, per block: present?
    present: Vec<Vec<bool>>,
}

#[derive(Clone, Debug)]
struct SnapCase {
    grid: u64,
    hash_block: u64,
    intersection: bool,
    /// Per rank: positions with a checkpoint of this prefix.
    at: Vec<Vec<u64>>,
    /// Positions with a checkpoint of another prefix (must never count).
    foreign: Vec<u64>,
}

#[derive(Clone, Debug)]
struct Case {
    tp: u32,
    n: usize,
    chains: Vec<ChainCase>,
    snaps: Vec<SnapCase>,
    sidecar: bool,
    seed: u64,
}

fn case() -> impl Strategy<Value = Case> {
    (1u32..=3, 1usize..=96, 0u64..u64::MAX, any::<bool>()).prop_flat_map(
        |(tp, n, seed, sidecar)| {
            let chain = (
                prop::sample::select(vec![2u64, 4, 8, 16]),
                prop::option::weighted(0.4, 1u64..=24),
                any::<bool>(),
                prop::collection::vec(prop::collection::vec(prop::bool::weighted(0.85), 48), 3),
            )
                .prop_map(|(block, window, intersection, present)| ChainCase {
                    block,
                    window,
                    intersection,
                    present,
                });
            let snap = (
                prop::sample::select(vec![1u64, 2, 4, 8, 16]),
                prop::sample::select(vec![1u64, 2, 4, 8]),
                any::<bool>(),
                prop::collection::vec(prop::collection::vec(0u64..=96, 0..12), 3),
                prop::collection::vec(0u64..=96, 0..4),
            )
                .prop_map(|(grid, hash_block, intersection, at, foreign)| SnapCase {
                    grid,
                    hash_block,
                    intersection,
                    at,
                    foreign,
                });
            (
                prop::collection::vec(chain, 1..=3),
                prop::collection::vec(snap, 0..=2),
            )
                .prop_map(move |(chains, snaps)| Case {
                    tp,
                    n,
                    chains,
                    snaps,
                    sidecar,
                    seed,
                })
        },
    )
}

fn spec_of(c: &Case) -> SpecTable {
    let mut t = String::from("model = \"oracle\"\n");
    let mut layer = 0;
    let mut next = || {
        layer += 1;
        layer - 1
    };
    for (i, g) in c.chains.iter().enumerate() {
        t += &format!(
            "[[group]]\nname = \"c{i}\"\nkind = \"chain\"\nblock_size = {}\nlayers = \"{}\"\nbytes_per_token = 2\nrank_rule = \"{}\"\n",
            g.block,
            next(),
            if g.intersection { "intersection" } else { "all_union" }
        );
        if let Some(w) = g.window {
            t += &format!("window = {w}\n");
        }
    }
    for (i, s) in c.snaps.iter().enumerate() {
        t += &format!(
            "[[group]]\nname = \"s{i}\"\nkind = \"snapshot\"\ngrid = {}\nhash_block = {}\nlayers = \"{}\"\nstate_bytes = 64\nrank_rule = \"{}\"\n",
            s.grid,
            s.hash_block,
            next(),
            if s.intersection { "intersection" } else { "all_union" }
        );
    }
    if c.sidecar {
        t += &format!(
            "[[group]]\nname = \"side\"\nkind = \"sidecar\"\nsource = \"c0\"\nlayers = \"{}\"\nbytes_per_token = 1\n",
            next()
        );
    }
    t += &format!(
        "[[group]]\nname = \"x\"\nkind = \"none\"\nlayers = \"{}\"\n",
        next()
    );
    SpecTable::from_toml(&t).expect("generated spec is valid")
}

fn tokens(seed: u64, n: usize) -> Vec<u32> {
    common::tokens(seed, n)
}

/// The oracle: servability evaluated at every position, from the case's
/// own description (no ids).
fn oracle(c: &Case, spec: &SpecTable) -> Option<(u64, u64)> {
    let n = c.n as u64;
    let gc = spec.chain_grid();
    if n < gc {
        return None;
    }
    let ranks = |inter: bool| if inter { c.tp as usize } else { 1 };
    let chain_block_present = |g: &ChainCase, b: usize| -> bool {
        (0..ranks(g.intersection)).all(|r| {
            // all_union: any rank's dump serves: rank copies share one id.
            if g.intersection {
                g.present[r][b]
            } else {
                (0..c.tp as usize).any(|rr| g.present[rr][b])
            }
        })
    };
    let chain_serves = |g: &ChainCase, x: u64| -> bool {
        let from = match g.window {
            None => 0,
            Some(w) => x.saturating_sub(w),
        };
        (from / g.block..x / g.block).all(|b| chain_block_present(g, b as usize))
    };
    let l = (0..=n)
        .filter(|x| x % gc == 0)
        .filter(|&x| c.chains.iter().all(|g| chain_serves(g, x)))
        .max()
        .unwrap_or(0);
    let grid = spec.common_grid();
    let snap_has = |s: &SnapCase, p: u64| -> bool {
        (0..ranks(s.intersection)).all(|r| {
            if s.intersection {
                s.at[r].contains(&p)
            } else {
                (0..c.tp as usize).any(|rr| s.at[rr].contains(&p))
            }
        })
    };
    let p_star = (1..=l)
        .filter(|p| p % grid == 0)
        .filter(|&p| c.chains.iter().all(|g| chain_serves(g, p)))
        .filter(|&p| c.snaps.iter().all(|s| snap_has(s, p)))
        .max()
        .unwrap_or(0);
    Some((l, p_star))
}

fn run(c: &Case) -> Result<(), TestCaseError> {
    let spec = spec_of(c);
    let dep = Deployment { tp_size: c.tp };
    let toks = tokens(c.seed, c.n);
    let keys = RequestKeys::default();
    let h = RequestHashes::compute(&spec, dep, &toks, &keys).unwrap();
    // Materialise the store contents by real ids.
    let mut pres = MemPresence::default();
    for (i, g) in c.chains.iter().enumerate() {
        let gi = spec.group(&format!("c{i}")).unwrap();
        let blocks = c.n / g.block as usize;
        for r in 0..c.tp as usize {
            let ids = &h.chains[gi.index][if g.intersection { r } else { 0 }];
            let held: HashSet<usize> = (0..blocks).filter(|&b| g.present[r][b]).collect();
            pres.put(&gi.name, held.into_iter().map(|b| ids[b]));
        }
    }
    let dir = CheckpointDirectory::new();
    let other = tokens(c.seed ^ 0xdead_beef, c.n);
    let ho = RequestHashes::compute(&spec, dep, &other, &keys).unwrap();
    for (i, s) in c.snaps.iter().enumerate() {
        let gi = spec.group(&format!("s{i}")).unwrap();
        for r in 0..c.tp as usize {
            let rr = if s.intersection { r } else { 0 };
            for &p in s.at[r].iter().filter(|&&p| p <= c.n as u64) {
                let hsh = checkpoint_hash(
                    &h.seeds[gi.index][rr],
                    &h.chains[gi.index][rr],
                    &toks,
                    s.hash_block,
                    p,
                )
                .unwrap();
                dir.register(&gi.name, p, hsh);
            }
        }
        for &p in s.foreign.iter().filter(|&&p| p <= c.n as u64) {
            let hsh = checkpoint_hash(
                &ho.seeds[gi.index][0],
                &ho.chains[gi.index][0],
                &other,
                s.hash_block,
                p,
            )
            .unwrap();
            if toks[..p as usize] != other[..p as usize] {
                dir.register(&gi.name, p, hsh);
            }
        }
    }
    let got = resolve_hit(&spec, &toks, &h, &pres, &dir);
    // The scheduler's vote-less path decides exactly the same.
    match (&got, resolve_positions(&spec, &toks, &h, &pres, &dir)) {
        (Ok(a), Ok(b)) => {
            prop_assert_eq!((a.l, a.p_star), (b.l, b.p_star));
            prop_assert!(b.groups.is_empty());
        }
        (Err(_), Err(_)) => {}
        (a, b) => prop_assert!(
            false,
            "resolve_hit {:?} vs resolve_positions {:?}",
            a.is_ok(),
            b.is_ok()
        ),
    }
    let want = oracle(c, &spec);
    match (got, want) {
        (Ok(r), Some((l, p))) => {
            prop_assert_eq!(
                (r.l, r.p_star),
                (l, p),
                "spec:\n{:?}",
                spec.groups()
                    .iter()
                    .map(|g| (&g.name, g.kind, g.block, g.window))
                    .collect::<Vec<_>>()
            );
            prop_assert!(r.p_star <= r.l);
            for (name, v) in &r.groups {
                let g = spec.group(name).unwrap();
                if matches!(g.kind, Kind::Sidecar | Kind::None) {
                    prop_assert!(v.vote.is_none());
                }
            }
        }
        (Err(_), None) => {}
        (got, want) => prop_assert!(
            false,
            "resolve {:?} vs oracle {:?}",
            got.map(|r| (r.l, r.p_star)),
            want
        ),
    }
    Ok(())
}

fn cases() -> u32 {
    std::env::var("UCM_PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn resolve_hit_agrees_with_the_oracle(c in case()) {
        run(&c)?;
    }
}
