//! The spec table: one row per kv-cache group, read-only after start-up.
//!
//! Loaded from TOML ([`SpecTable::from_toml`], [`SpecTable::load`]) or
//! built in code ([`SpecTable::new`]); both paths run the same
//! [`SpecTable::validate`]. A file looks like this (see `specs/`):
//!
//! ```toml
//! model = "x-hybrid-96"
//! dtype = "bf16"
//! num_layers = 96
//!
//! [[group]]
//! name = "mla"
//! kind = "chain"            # chain | snapshot | none | sidecar
//! block_size = 128          # chain: tokens per block
//! layers = "0-15"           # "a-b,c" ranges or a list of integers
//! bytes_per_token = 512     # chain, sidecar, none: per token per layer
//! rank_rule = "all_union"   # or "intersection"
//! access_unit = "layer"     # layer | row | window | follower
//!
//! [[group]]
//! name = "mamba2"
//! kind = "snapshot"
//! grid = 64                 # snapshot: checkpoint grid in tokens
//! state_bytes = 1048576     # snapshot: bytes of state per layer
//! layers = "64-83"
//! retention = { request_end = true, second_unserved = true, interval = 1024, speculative = true }
//! ```

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{CoordError, RequestError, Result};
use crate::identity::{Identity, IdentityRow};
use ucm_store::paths::{check_name, short};

/// Most layers a model may have (layer indices lie below it).
pub const MAX_LAYERS: u32 = 1 << 16;
/// Largest chain block, snapshot grid, hash block, in tokens.
pub const MAX_BLOCK_TOKENS: u64 = 1 << 20;
/// Largest window or retention interval, in tokens.
pub const MAX_SPAN_TOKENS: u64 = 1 << 40;
/// Largest `bytes_per_token` of a layer.
pub const MAX_BYTES_PER_TOKEN: u64 = 1 << 24;
/// Largest `state_bytes` of a layer (16 GiB).
pub const MAX_STATE_BYTES: u64 = 1 << 34;
/// Largest stored block of one layer (a chain block's bytes), 64 GiB.
pub const MAX_LAYER_BLOCK_BYTES: u64 = 1 << 36;

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
    /// ([`crate::retention::speculative_plan`]).
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

/// A layer list: `"0-15,20"` or `[0, 1, 2]`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Layers {
    /// Explicit layer indices.
    List(Vec<u32>),
    /// Comma-separated indices and inclusive `a-b` ranges.
    Ranges(String),
}

impl Layers {
    /// The layer indices, in order, or a message naming the bad part.
    pub fn expand(&self) -> std::result::Result<Vec<u32>, String> {
        match self {
            Layers::List(v) => match v.iter().find(|&&l| l >= MAX_LAYERS) {
                Some(l) => Err(format!("layer {l} is not below {MAX_LAYERS}")),
                None if v.len() > MAX_LAYERS as usize => {
                    Err(format!("more than {MAX_LAYERS} layers"))
                }
                None => Ok(v.clone()),
            },
            Layers::Ranges(s) => {
                let mut out = Vec::new();
                for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
                    let num = |t: &str| {
                        let t = t.trim();
                        match t.parse::<u32>() {
                            Ok(v) if v < MAX_LAYERS => Ok(v),
                            Ok(_) => Err(format!(
                                "layer {t} in layers \"{}\" is not below {MAX_LAYERS}",
                                short(s)
                            )),
                            Err(_) => Err(format!(
                                "`{}` in layers \"{}\" is not a layer index",
                                short(t),
                                short(s)
                            )),
                        }
                    };
                    match part.split_once('-') {
                        Some((a, b)) => {
                            let (a, b) = (num(a)?, num(b)?);
                            if b < a {
                                return Err(format!(
                                    "range `{}` in layers \"{}\" is reversed",
                                    short(part),
                                    short(s)
                                ));
                            }
                            out.extend(a..=b);
                        }
                        None => out.push(num(part)?),
                    }
                    if out.len() > MAX_LAYERS as usize {
                        return Err(format!(
                            "layers \"{}\" list more than {MAX_LAYERS}",
                            short(s)
                        ));
                    }
                }
                Ok(out)
            }
        }
    }
}

/// One row of the spec table, as written in a file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GroupRow {
    /// Group name (unique; part of the group's hash seed).
    pub name: String,
    /// Kind of data.
    pub kind: Kind,
    /// Sidecars: the chain group they follow.
    #[serde(default)]
    pub source: Option<String>,
    /// Chain groups: tokens per block.
    #[serde(default)]
    pub block_size: Option<u64>,
    /// Snapshot groups: checkpoint grid in tokens.
    #[serde(default)]
    pub grid: Option<u64>,
    /// Snapshot groups: hash block for `H(p)` (default: the smallest chain
    /// block size of the model).
    #[serde(default)]
    pub hash_block: Option<u64>,
    /// The layers of the group.
    pub layers: Layers,
    /// Chain, sidecar and none groups: bytes per token per layer.
    #[serde(default)]
    pub bytes_per_token: Option<u64>,
    /// Snapshot groups: bytes of state per layer.
    #[serde(default)]
    pub state_bytes: Option<u64>,
    /// Windowed chain groups: the window in tokens.
    #[serde(default)]
    pub window: Option<u64>,
    /// Rank rule (sidecars take their source's).
    #[serde(default)]
    pub rank_rule: Option<RankRule>,
    /// Snapshot groups: where checkpoints are kept.
    #[serde(default)]
    pub retention: Option<RetentionPolicy>,
    /// Access unit of the group's layers.
    #[serde(default)]
    pub access_unit: Option<AccessUnit>,
    /// Free text: where the sizes come from.
    #[serde(default)]
    pub note: Option<String>,
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

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SpecFile {
    model: String,
    #[serde(default = "bf16")]
    dtype: String,
    #[serde(default)]
    num_layers: Option<u32>,
    #[serde(default)]
    spec_info: String,
    #[serde(default)]
    sparse_info: String,
    #[serde(default)]
    note: Option<String>,
    #[serde(default)]
    identity: Option<IdentityRow>,
    group: Vec<GroupRow>,
}

fn bf16() -> String {
    "bf16".into()
}

/// The spec table of one model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpecTable {
    /// Model name (part of every hash seed).
    pub model: String,
    /// KV dtype (part of every hash seed).
    pub dtype: String,
    /// Speculative-decoding info appended to the hash meta (may be empty).
    pub spec_info: String,
    /// Sparse-attention info appended to the hash meta (may be empty).
    pub sparse_info: String,
    /// Total layers of the model, when given (layers must lie below it).
    pub num_layers: Option<u32>,
    /// The deployment's identity, from an `[identity]` table: its digest
    /// goes into every group seed ([`crate::identity`]).
    pub identity: Option<Identity>,
    groups: Vec<Group>,
    by_name: HashMap<String, usize>,
}

impl SpecTable {
    /// Builds and validates a table from rows.
    pub fn new(
        model: &str,
        dtype: &str,
        num_layers: Option<u32>,
        rows: Vec<GroupRow>,
    ) -> Result<Self> {
        Self::build(model, dtype, num_layers, String::new(), String::new(), rows)
    }

    fn build(
        model: &str,
        dtype: &str,
        num_layers: Option<u32>,
        spec_info: String,
        sparse_info: String,
        rows: Vec<GroupRow>,
    ) -> Result<Self> {
        let err = |m: String| Err(CoordError::Spec(m));
        if model.is_empty() {
            return err("the model name is empty".into());
        }
        if rows.is_empty() {
            return err("no groups".into());
        }
        if num_layers.is_some_and(|n| n > MAX_LAYERS) {
            return err(format!("num_layers must not exceed {MAX_LAYERS}"));
        }
        let mut by_name = HashMap::new();
        for (i, r) in rows.iter().enumerate() {
            // A group name becomes a directory of the store: a plain name.
            check_name("group name", &r.name)
                .map_err(|m| CoordError::Spec(format!("group {i}: {m}")))?;
            if by_name.insert(r.name.clone(), i).is_some() {
                return err(format!("group `{}` is defined twice", r.name));
            }
        }
        let min_chain = rows
            .iter()
            .filter(|r| r.kind == Kind::Chain)
            .filter_map(|r| r.block_size)
            .filter(|&b| b > 0)
            .min();
        let mut owner: BTreeMap<u32, String> = BTreeMap::new();
        let mut groups = Vec::new();
        for (index, r) in rows.iter().enumerate() {
            let g = &r.name;
            let layers = r
                .layers
                .expand()
                .map_err(|m| CoordError::Spec(format!("group `{g}`: {m}")))?;
            if layers.is_empty() {
                return err(format!("group `{g}` has no layers"));
            }
            for &l in &layers {
                if let Some(n) = num_layers {
                    if l >= n {
                        return err(format!(
                            "group `{g}`: layer {l} is not below num_layers = {n}"
                        ));
                    }
                }
                if let Some(other) = owner.insert(l, g.clone()) {
                    return err(format!("layer {l} is in two groups: `{other}` and `{g}`"));
                }
            }
            let mut layers = layers;
            layers.sort_unstable();
            let positive = |field: &str, v: Option<u64>| -> Result<u64> {
                let max = match field {
                    "block_size" | "grid" => MAX_BLOCK_TOKENS,
                    "bytes_per_token" => MAX_BYTES_PER_TOKEN,
                    "state_bytes" => MAX_STATE_BYTES,
                    _ => u64::MAX,
                };
                if let Some(x) = v.filter(|&x| x > max) {
                    return Err(CoordError::Spec(format!(
                        "group `{g}`: `{field}` = {x} exceeds {max}"
                    )));
                }
                match v {
                    None => Err(CoordError::Spec(format!(
                        "group `{g}` ({:?}) needs `{field}`",
                        r.kind
                    ))),
                    Some(0) => Err(CoordError::Spec(format!(
                        "group `{g}`: `{field}` must be positive"
                    ))),
                    Some(x) => Ok(x),
                }
            };
            let absent = |field: &str, present: bool| -> Result<()> {
                if present {
                    Err(CoordError::Spec(format!(
                        "group `{g}`: `{field}` does not apply to a {:?} group",
                        r.kind
                    )))
                } else {
                    Ok(())
                }
            };
            if r.kind != Kind::Sidecar {
                absent("source", r.source.is_some())?;
            }
            if r.kind != Kind::Snapshot {
                absent("grid", r.grid.is_some())?;
                absent("hash_block", r.hash_block.is_some())?;
                absent("state_bytes", r.state_bytes.is_some())?;
                absent("retention", r.retention.is_some())?;
            }
            if r.kind != Kind::Chain {
                absent("block_size", r.block_size.is_some())?;
                absent("window", r.window.is_some())?;
            }
            let (block, hash_block, unit_bytes, window, source) = match r.kind {
                Kind::Chain => {
                    let bs = positive("block_size", r.block_size)?;
                    let window = match r.window {
                        Some(0) => return err(format!("group `{g}`: the window must be positive")),
                        Some(w) if w > MAX_SPAN_TOKENS => {
                            return err(format!(
                                "group `{g}`: the window exceeds {MAX_SPAN_TOKENS}"
                            ))
                        }
                        w => w,
                    };
                    (
                        bs,
                        bs,
                        positive("bytes_per_token", r.bytes_per_token)?,
                        window,
                        None,
                    )
                }
                Kind::Snapshot => {
                    absent("bytes_per_token", r.bytes_per_token.is_some())?;
                    let grid = positive("grid", r.grid)?;
                    let hb = match (r.hash_block, min_chain) {
                        (Some(0), _) => {
                            return err(format!("group `{g}`: `hash_block` must be positive"))
                        }
                        (Some(h), _) if h > MAX_BLOCK_TOKENS => {
                            return err(format!(
                                "group `{g}`: `hash_block` exceeds {MAX_BLOCK_TOKENS}"
                            ))
                        }
                        (Some(h), _) | (None, Some(h)) => h,
                        (None, None) => {
                            return err(format!(
                                "group `{g}`: no chain group to take `hash_block` from; set it"
                            ))
                        }
                    };
                    (
                        grid,
                        hb,
                        positive("state_bytes", r.state_bytes)?,
                        None,
                        None,
                    )
                }
                Kind::Sidecar => {
                    absent("rank_rule", r.rank_rule.is_some())?;
                    let Some(src) = &r.source else {
                        return err(format!(
                            "sidecar `{g}` needs `source` (the chain group it follows)"
                        ));
                    };
                    let Some(&si) = by_name.get(src) else {
                        return err(format!("sidecar `{g}` follows unknown group `{src}`"));
                    };
                    if rows[si].kind != Kind::Chain {
                        return err(format!(
                            "sidecar `{g}` follows `{src}`, a {:?} group; a source must be a chain group",
                            rows[si].kind
                        ));
                    }
                    (
                        0,
                        0,
                        positive("bytes_per_token", r.bytes_per_token)?,
                        None,
                        Some(si),
                    )
                }
                Kind::None => (0, 0, r.bytes_per_token.unwrap_or(0), None, None),
            };
            let rank_rule = match source {
                Some(si) => rows[si].rank_rule.unwrap_or_default(),
                None => r.rank_rule.unwrap_or_default(),
            };
            let access_unit = match (r.kind, r.access_unit) {
                (Kind::Sidecar, None | Some(AccessUnit::Follower)) => AccessUnit::Follower,
                (Kind::Sidecar, Some(u)) => {
                    return err(format!(
                        "sidecar `{g}`: access unit {u:?}; sidecars are followers"
                    ))
                }
                (_, Some(AccessUnit::Follower)) => {
                    return err(format!("group `{g}`: only sidecars are followers"))
                }
                (Kind::Chain, None) if window.is_some() => AccessUnit::Window,
                (Kind::Chain, Some(AccessUnit::Window)) if window.is_none() => {
                    return err(format!("group `{g}`: access unit window needs a `window`"))
                }
                (k, Some(AccessUnit::Window)) if k != Kind::Chain => {
                    return err(format!("group `{g}`: only chain groups have window units"))
                }
                (_, u) => u.unwrap_or_default(),
            };
            let retention = match r.kind {
                Kind::Snapshot => {
                    let p = r.retention.clone().unwrap_or_default();
                    if p.interval == Some(0) {
                        return err(format!("group `{g}`: retention interval must be positive"));
                    }
                    if p.interval.is_some_and(|i| i > MAX_SPAN_TOKENS) {
                        return err(format!(
                            "group `{g}`: retention interval exceeds {MAX_SPAN_TOKENS}"
                        ));
                    }
                    Some(p)
                }
                _ => None,
            };
            if r.kind == Kind::Chain
                && unit_bytes
                    .checked_mul(block)
                    .is_none_or(|b| b > MAX_LAYER_BLOCK_BYTES)
            {
                return err(format!(
                    "group `{g}`: a block of one layer (block_size x bytes_per_token) exceeds {MAX_LAYER_BLOCK_BYTES} bytes"
                ));
            }
            groups.push(Group {
                index,
                name: g.clone(),
                kind: r.kind,
                source,
                block,
                hash_block,
                layers,
                unit_bytes,
                window,
                rank_rule,
                retention,
                access_unit,
            });
        }
        if !groups.iter().any(|g| g.kind == Kind::Chain) {
            return err(
                "no chain group: a hit is a prefix the chain groups hold, so this table could \
                 never serve one"
                    .into(),
            );
        }
        Ok(SpecTable {
            model: model.to_string(),
            dtype: dtype.to_string(),
            spec_info,
            sparse_info,
            num_layers,
            identity: None,
            groups,
            by_name,
        })
    }

    /// The same table with the identity `row` ([`crate::identity`]): every
    /// id it derives changes with any field of `row`.
    pub fn with_identity(&self, row: &IdentityRow) -> Result<Self> {
        let mut t = self.clone();
        t.identity = Some(Identity::build(
            &self.model,
            &self.dtype,
            &self.groups,
            row,
        )?);
        Ok(t)
    }

    /// Parses and validates a TOML spec.
    pub fn from_toml(text: &str) -> Result<Self> {
        let f: SpecFile = toml::from_str(text).map_err(|e| CoordError::Spec(e.to_string()))?;
        let _ = f.note;
        let t = Self::build(
            &f.model,
            &f.dtype,
            f.num_layers,
            f.spec_info,
            f.sparse_info,
            f.group,
        )?;
        match &f.identity {
            Some(row) => t.with_identity(row),
            None => Ok(t),
        }
    }

    /// Reads, parses and validates a TOML spec file (a regular file of at
    /// most 16 MiB).
    pub fn load(path: &Path) -> Result<Self> {
        let text =
            ucm_store::device::io::read_small_file(path, ucm_store::device::io::SMALL_FILE_LIMIT)
                .map_err(|e| CoordError::SpecFile {
                path: path.display().to_string(),
                why: e.to_string(),
            })?;
        Self::from_toml(&text).map_err(|e| CoordError::SpecFile {
            path: path.display().to_string(),
            why: e.to_string(),
        })
    }

    /// The same table with every byte size divided by `divisor` (rounded
    /// up, at least 1 byte): the same structure at a smaller scale, for
    /// simulations that must fit a small machine. Block sizes, grids,
    /// windows and layers are unchanged, so hits are too.
    pub fn scaled(&self, divisor: u64) -> SpecTable {
        let d = divisor.max(1);
        let mut t = self.clone();
        for g in &mut t.groups {
            if g.unit_bytes > 0 {
                g.unit_bytes = g.unit_bytes.div_ceil(d).max(1);
            }
        }
        t
    }

    /// All groups, in table order.
    pub fn groups(&self) -> &[Group] {
        &self.groups
    }

    /// The group called `name`, or a clear error.
    pub fn group(&self, name: &str) -> Result<&Group> {
        self.by_name
            .get(name)
            .map(|&i| &self.groups[i])
            .ok_or_else(|| {
                CoordError::BadRequest(RequestError::UnknownGroup {
                    name: name.chars().take(80).collect(),
                })
            })
    }

    /// Chain groups (the ones that vote on `l`).
    pub fn chain_groups(&self) -> impl Iterator<Item = &Group> {
        self.groups.iter().filter(|g| g.kind == Kind::Chain)
    }

    /// Snapshot groups.
    pub fn snapshot_groups(&self) -> impl Iterator<Item = &Group> {
        self.groups.iter().filter(|g| g.kind == Kind::Snapshot)
    }

    /// K/V bytes of one token over every chain and sidecar layer (one
    /// rank's share for the whole model at full size).
    pub fn kv_bytes_per_token(&self) -> u64 {
        self.groups
            .iter()
            .filter(|g| matches!(g.kind, Kind::Chain | Kind::Sidecar))
            .map(|g| g.unit_bytes.saturating_mul(g.layers.len() as u64))
            .fold(0u64, u64::saturating_add)
    }

    /// Bytes of the states of one checkpoint position: every snapshot
    /// group's state over its layers (a hit needs them all).
    pub fn state_bytes_per_position(&self) -> u64 {
        self.snapshot_groups()
            .map(|g| g.unit_bytes.saturating_mul(g.layers.len() as u64))
            .fold(0u64, u64::saturating_add)
    }

    /// Tokens per block of group `group`: a chain group's block size, a
    /// sidecar's source's, a snapshot group's grid; 0 for `none` groups.
    pub fn block_of(&self, group: usize) -> u64 {
        let g = &self.groups[group];
        match (g.kind, g.source) {
            (Kind::Sidecar, Some(s)) => self.groups[s].block,
            _ => g.block,
        }
    }

    /// The attention window of a windowed chain group, or of a sidecar's
    /// windowed source; `None` for every other group.
    pub fn window_of(&self, group: usize) -> Option<u64> {
        let g = &self.groups[group];
        match (g.kind, g.source) {
            (Kind::Sidecar, Some(s)) => self.groups[s].window,
            (Kind::Chain, _) => g.window,
            _ => None,
        }
    }

    /// The rank whose ids and seed `rank` uses for `group`: 0 under
    /// `all_union` (one copy for every rank), the rank itself under
    /// `intersection`.
    pub fn key_rank(&self, group: usize, rank: u32) -> usize {
        self.groups[group].key_rank(rank) as usize
    }

    /// Layers of the model: `num_layers` when given, else one past the
    /// highest layer of any group.
    pub fn layer_count(&self) -> u32 {
        self.num_layers.unwrap_or_else(|| {
            self.groups
                .iter()
                .flat_map(|g| g.layers.last().copied())
                .max()
                .map_or(0, |m| m.saturating_add(1))
        })
    }

    /// LCM of the chain block sizes (1 without chain groups): the grid of `l`.
    pub fn chain_grid(&self) -> u64 {
        self.chain_groups().map(|g| g.block).fold(1, lcm)
    }

    /// LCM of the chain block sizes and the snapshot grids: the grid of `p*`.
    pub fn common_grid(&self) -> u64 {
        self.snapshot_groups()
            .map(|g| g.block)
            .fold(self.chain_grid(), lcm)
    }
}

/// Greatest common divisor (`gcd(a, 0) = a`).
pub fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// Least common multiple (saturating).
pub fn lcm(a: u64, b: u64) -> u64 {
    (a / gcd(a, b)).saturating_mul(b)
}
