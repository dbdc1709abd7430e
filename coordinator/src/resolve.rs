//! Hit resolution: `resolve_hit -> (l, p*)`, exactly DESIGN.md section 5.
//!
//! A position `p` is **servable** when every full chain group holds all
//! blocks of `[0, p)` (for `intersection` groups: every rank's copy), every
//! windowed chain group holds the blocks covering `[p - W, p)`, every
//! snapshot group holds a checkpoint at exactly `(group, p, H(p))` (every
//! rank's, for `intersection`), and `p` lies on the common grid (LCM of the
//! chain block sizes and the snapshot grids).
//!
//! - `l` is the largest position on the LCM grid of the chain block sizes
//!   at which every full chain group holds `[0, l)` and every windowed group
//!   `[l - W, l)`;
//! - `p*` is the largest servable position `<= l` (`0` when none is).
//!
//! Sidecars and `none` groups never vote. The module sees stores only
//! through [`Presence`] and checkpoints only through [`Checkpoints`].

use serde::Serialize;

use crate::error::{CoordError, RequestError, Result};
use crate::hash::{checkpoint_hash, Id, RequestHashes};
use crate::spec::{Group, Kind, SpecTable};

/// The narrow presence interface the decision modules see a chain store
/// through.
pub trait Presence {
    /// Per id: is the block (all its shards) present in `group`'s store?
    fn lookup(&self, group: &Group, ids: &[Id]) -> Vec<bool>;
    /// Number of leading ids present.
    fn lookup_on_prefix(&self, group: &Group, ids: &[Id]) -> usize {
        self.lookup(group, ids).iter().take_while(|&&p| p).count()
    }
}

/// Which checkpoints exist (the coordinator's checkpoint directory).
pub trait Checkpoints {
    /// Is there a checkpoint of `group` at `position` with prefix hash
    /// `hash`?
    fn has(&self, group: &Group, position: u64, hash: &Id) -> bool;
}

/// One group's part in a resolution (for `ucm explain`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct GroupVote {
    /// The group's own bound: held prefix (full chain), deepest position
    /// whose window is held (windowed chain), deepest checkpoint `<= l`
    /// (snapshot); `None` for groups that never vote.
    pub vote: Option<u64>,
    /// Why, in words.
    pub reason: String,
}

/// The answer of [`resolve_hit`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Resolution {
    /// Longest prefix the chain groups jointly hold.
    pub l: u64,
    /// Largest servable position `<= l`: the tokens the engine skips.
    pub p_star: u64,
    /// Per group, in table order: name and vote.
    pub groups: Vec<(String, GroupVote)>,
}

/// Per chain group: presence of each block, ANDed over ranks, as prefix
/// sums of missing blocks so a range check is O(1).
struct ChainView<'a> {
    group: &'a Group,
    blocks: usize,
    missing_before: Vec<u32>,
}

impl ChainView<'_> {
    /// All blocks of `[a, b)` present (block indices).
    fn holds(&self, a: usize, b: usize) -> bool {
        b <= self.blocks && self.missing_before[b] == self.missing_before[a]
    }
    /// Tokens `[from, to)` covered by present blocks (to on the block grid).
    fn holds_tokens(&self, from: u64, to: u64) -> bool {
        let bs = self.group.block;
        self.holds((from / bs) as usize, (to / bs) as usize)
    }
    /// Servability at `x` (a multiple of the block size).
    fn serves(&self, x: u64) -> bool {
        match self.group.window {
            None => self.holds_tokens(0, x),
            Some(w) => self.holds_tokens(x.saturating_sub(w), x),
        }
    }
    fn held_prefix(&self) -> u64 {
        let n = (0..self.blocks)
            .take_while(|&i| self.missing_before[i + 1] == 0)
            .count();
        n as u64 * self.group.block
    }
}

/// Resolves a request of `tokens` whose ids are `hashes`.
pub fn resolve_hit(
    spec: &SpecTable,
    tokens: &[u32],
    hashes: &RequestHashes,
    presence: &dyn Presence,
    checkpoints: &dyn Checkpoints,
) -> Result<Resolution> {
    resolve(spec, tokens, hashes, presence, checkpoints, true)
}

/// As [`resolve_hit`], without the per-group votes (`groups` is empty):
/// the scheduler's hot path needs only `(l, p*)`, and a snapshot group's
/// vote may cost one md5 per grid position below `l`.
pub fn resolve_positions(
    spec: &SpecTable,
    tokens: &[u32],
    hashes: &RequestHashes,
    presence: &dyn Presence,
    checkpoints: &dyn Checkpoints,
) -> Result<Resolution> {
    resolve(spec, tokens, hashes, presence, checkpoints, false)
}

fn resolve(
    spec: &SpecTable,
    tokens: &[u32],
    hashes: &RequestHashes,
    presence: &dyn Presence,
    checkpoints: &dyn Checkpoints,
    votes: bool,
) -> Result<Resolution> {
    let n = check_request(spec, tokens, hashes)?;
    let views = chain_views(spec, hashes, presence, n)?;
    let l = chain_prefix(spec, &views, n);
    let probe = CheckpointProbe {
        tokens,
        hashes,
        checkpoints,
    };
    let p_star = deepest_servable(spec, &views, &probe, l)?;
    let mut groups = Vec::new();
    for g in spec.groups().iter().filter(|_| votes) {
        groups.push((g.name.clone(), group_vote(spec, g, &views, &probe, n, l)?));
    }
    Ok(Resolution { l, p_star, groups })
}

/// The prompt's length, once the request can be resolved at all: a
/// prompt of at least one chain-grid block, hashed for this table.
fn check_request(spec: &SpecTable, tokens: &[u32], hashes: &RequestHashes) -> Result<u64> {
    let n = tokens.len() as u64;
    if n == 0 {
        return Err(CoordError::BadRequest(RequestError::EmptyPrompt));
    }
    let gc = spec.chain_grid();
    if n < gc {
        return Err(CoordError::BadRequest(
            RequestError::PromptShorterThanGrid {
                tokens: n,
                grid: gc,
            },
        ));
    }
    if hashes.chains.len() != spec.groups().len() {
        return Err(CoordError::BadRequest(RequestError::ForeignHashes));
    }
    Ok(n)
}

/// Each chain group's presence of its `n`-token prompt's blocks: one
/// lookup per rank (a prefix lookup without a window), intersected.
fn chain_views<'a>(
    spec: &'a SpecTable,
    hashes: &RequestHashes,
    presence: &dyn Presence,
    n: u64,
) -> Result<Vec<ChainView<'a>>> {
    let mut views = Vec::new();
    for g in spec.chain_groups() {
        let blocks = (n / g.block) as usize;
        let mut present = vec![true; blocks];
        for ids in &hashes.chains[g.index] {
            if ids.len() < blocks {
                return Err(CoordError::BadRequest(RequestError::IdCount {
                    group: g.name.clone(),
                    ids: ids.len() as u64,
                    blocks: blocks as u64,
                }));
            }
            let ids = &ids[..blocks];
            if g.window.is_none() {
                let k = presence.lookup_on_prefix(g, ids).min(blocks);
                present[k..].iter_mut().for_each(|p| *p = false);
            } else {
                for (p, q) in present.iter_mut().zip(presence.lookup(g, ids)) {
                    *p &= q;
                }
            }
        }
        let mut missing_before = Vec::with_capacity(blocks + 1);
        missing_before.push(0u32);
        for (i, p) in present.iter().enumerate() {
            missing_before.push(missing_before[i] + u32::from(!p));
        }
        views.push(ChainView {
            group: g,
            blocks,
            missing_before,
        });
    }
    Ok(views)
}

/// `l`: the largest chain-grid position every chain group serves.
fn chain_prefix(spec: &SpecTable, views: &[ChainView<'_>], n: u64) -> u64 {
    let gc = spec.chain_grid();
    (0..=n / gc)
        .rev()
        .map(|k| k * gc)
        .find(|&x| views.iter().all(|v| v.serves(x)))
        .unwrap_or(0)
}

/// Whether a snapshot group holds the checkpoint of a request's prefix.
struct CheckpointProbe<'a> {
    tokens: &'a [u32],
    hashes: &'a RequestHashes,
    checkpoints: &'a dyn Checkpoints,
}

impl CheckpointProbe<'_> {
    /// Every rank's checkpoint of `s` at `p`, under the prefix's hash.
    fn has(&self, s: &Group, p: u64) -> Result<bool> {
        let h = self.hashes;
        for (r, ids) in h.chains[s.index].iter().enumerate() {
            let key = checkpoint_hash(&h.seeds[s.index][r], ids, self.tokens, s.hash_block, p)?;
            if !self.checkpoints.has(s, p, &key) {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

/// `p*`: the largest common-grid position `<= l` that every chain group
/// serves and every snapshot group holds a checkpoint at; 0 if none.
fn deepest_servable(
    spec: &SpecTable,
    views: &[ChainView<'_>],
    probe: &CheckpointProbe<'_>,
    l: u64,
) -> Result<u64> {
    let grid = spec.common_grid();
    let snaps: Vec<&Group> = spec.snapshot_groups().collect();
    for p in (1..=l / grid).rev().map(|k| k * grid) {
        if !views.iter().all(|v| v.serves(p)) {
            continue;
        }
        let mut all = true;
        for s in &snaps {
            if !probe.has(s, p)? {
                all = false;
                break;
            }
        }
        if all {
            return Ok(p);
        }
    }
    Ok(0)
}

/// What group `g` would serve on its own, and why (for explanation).
fn group_vote(
    spec: &SpecTable,
    g: &Group,
    views: &[ChainView<'_>],
    probe: &CheckpointProbe<'_>,
    n: u64,
    l: u64,
) -> Result<GroupVote> {
    Ok(match g.kind {
        Kind::Chain => {
            let v = views
                .iter()
                .find(|v| v.group.index == g.index)
                .ok_or_else(|| {
                    CoordError::BadRequest(RequestError::NoView {
                        group: g.name.clone(),
                    })
                })?;
            match g.window {
                None => {
                    let h = v.held_prefix();
                    GroupVote {
                        vote: Some(h),
                        reason: format!(
                            "holds the prefix [0, {h}) in whole blocks of {}{}",
                            g.block,
                            rank_note(g)
                        ),
                    }
                }
                Some(w) => {
                    let top = n / g.block * g.block;
                    let x = (0..=top / g.block)
                        .rev()
                        .map(|k| k * g.block)
                        .find(|&x| v.serves(x))
                        .unwrap_or(0);
                    GroupVote {
                        vote: Some(x),
                        reason: format!(
                            "window of {w}: holds [{}, {x}), the window before {x}{}",
                            x.saturating_sub(w),
                            rank_note(g)
                        ),
                    }
                }
            }
        }
        Kind::Snapshot => {
            let mut deepest = None;
            for p in (1..=l / g.block).rev().map(|k| k * g.block) {
                if probe.has(g, p)? {
                    deepest = Some(p);
                    break;
                }
            }
            GroupVote {
                vote: deepest,
                reason: match deepest {
                    Some(p) => {
                        format!("deepest checkpoint <= l = {l} with a matching prefix hash: {p}")
                    }
                    None => format!("no checkpoint <= l = {l} with a matching prefix hash"),
                },
            }
        }
        Kind::Sidecar => GroupVote {
            vote: None,
            reason: format!(
                "sidecar of `{}`: follows it, never votes",
                g.source
                    .map(|s| spec.groups()[s].name.as_str())
                    .unwrap_or("?")
            ),
        },
        Kind::None => GroupVote {
            vote: None,
            reason: "never cached".into(),
        },
    })
}

fn rank_note(g: &Group) -> &'static str {
    match g.rank_rule {
        crate::spec::RankRule::AllUnion => "",
        crate::spec::RankRule::Intersection => " (every rank's copy)",
    }
}
