//! A validated group of layers: what one row of the spec table becomes,
//! and the enums a row chooses from. The spec table ([`crate::spec`])
//! parses and checks rows into these; the identity, retention and resolve
//! code read them.

use serde::{Deserialize, Serialize};

/// Most layers a model may have (layer indices lie below it).
pub const MAX_LAYERS: u32 = 1 << 16;

/// What kind of data a group holds: the one stable classification axis.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// Prefix-chained K/V blocks (full or windowed attention).
    Chain,
    /// Position-keyed recurrent-state checkpoints.
    Snapshot,
    /// Never reused (e.g. cross-attention on per-request input).
    None,
    /// Per-block side data that follows its `source` chain group.
    Sidecar,
}

/// Which ranks write a group and how presence combines across ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RankRule {
    /// Content identical across ranks: one id, one copy, any rank serves.
    #[default]
    AllUnion,
    /// Content differs per rank: rank-specific ids; a block is present only
    /// when every rank's shard is.
    Intersection,
}

/// How a group's layers map onto stored shards (used by the adapter).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AccessUnit {
    /// One tensor per layer: one shard per layer.
    #[default]
    Layer,
    /// The group's layers share one tensor: one shard for the row, loaded
    /// before its first layer and saved after its last.
    Row,
    /// Windowed attention: only the window before the resume point moves.
    Window,
    /// A sidecar: stored with its source unit, never votes.
    Follower,
}

/// Where a snapshot group creates checkpoints (DESIGN.md section 6).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetentionPolicy {
    /// At request end, when new computation produced new state.
    #[serde(default = "yes")]
    pub request_end: bool,
    /// At the common boundary on the second unserved occurrence of a prefix.
    #[serde(default = "yes")]
    pub second_unserved: bool,
    /// Every `interval` tokens of input and output.
    #[serde(default)]
    pub interval: Option<u64>,
    /// Speculative checkpoints along the prompt, kept at a lower priority
    /// (evicted first, promoted when a request uses one): the only way the
    /// second occurrence of a prefix that then diverges can hit
    /// (`retention::speculative_plan`).
    #[serde(default = "yes")]
    pub speculative: bool,
}

fn yes() -> bool {
    true
}

impl Default for RetentionPolicy {
    fn default() -> Self {
        RetentionPolicy {
            request_end: true,
            second_unserved: true,
            interval: None,
            speculative: true,
        }
    }
}

/// A validated group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Group {
    /// Index in the table.
    pub index: usize,
    /// Name.
    pub name: String,
    /// Kind.
    pub kind: Kind,
    /// Sidecars: index of the source group.
    pub source: Option<usize>,
    /// Chain: block size; snapshot: the grid; otherwise 0.
    pub block: u64,
    /// Snapshot: hash block of `H(p)`; chain: the block size; otherwise 0.
    pub hash_block: u64,
    /// Layers, ascending.
    pub layers: Vec<u32>,
    /// Chain/sidecar/none: bytes per token per layer; snapshot: state bytes
    /// per layer.
    pub unit_bytes: u64,
    /// Windowed chain groups: the window.
    pub window: Option<u64>,
    /// Rank rule (sidecars: the source's).
    pub rank_rule: RankRule,
    /// Snapshot groups: retention.
    pub retention: Option<RetentionPolicy>,
    /// Access unit.
    pub access_unit: AccessUnit,
}

impl Group {
    /// Bytes of one layer of one stored block (chain, sidecar) or of one
    /// layer's state (snapshot); 0 for `none`. The shard size of the
    /// group's store instance when the access unit is a layer.
    pub fn bytes_per_layer_block(&self, chain_block: u64) -> u64 {
        match self.kind {
            Kind::Chain => self.unit_bytes * self.block,
            Kind::Sidecar => self.unit_bytes * chain_block,
            Kind::Snapshot => self.unit_bytes,
            Kind::None => 0,
        }
    }

    /// The rank whose ids and seed `rank` uses: 0 under `all_union` (one
    /// copy for every rank), the rank itself under `intersection`
    /// (sidecars carry their source's rule).
    pub fn key_rank(&self, rank: u32) -> u32 {
        match self.rank_rule {
            RankRule::AllUnion => 0,
            RankRule::Intersection => rank,
        }
    }

    /// True for chain groups with a window.
    pub fn is_windowed(&self) -> bool {
        self.kind == Kind::Chain && self.window.is_some()
    }
}
