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

use crate::error::{CoordError, GroupProblem, LayersError, RequestError, Result, SpecError};
pub use crate::group::{AccessUnit, Group, Kind, RankRule, RetentionPolicy, MAX_LAYERS};
use crate::identity::{Identity, IdentityRow};
use ucm_store::paths::{check_name, short};

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
    /// The layer indices, in order, or what is wrong with the list.
    pub fn expand(&self) -> std::result::Result<Vec<u32>, LayersError> {
        match self {
            Layers::List(v) => match v.iter().find(|&&l| l >= MAX_LAYERS) {
                Some(&layer) => Err(LayersError::TooHigh {
                    layer: layer.to_string(),
                    layers: None,
                }),
                None if v.len() > MAX_LAYERS as usize => Err(LayersError::TooMany { layers: None }),
                None => Ok(v.clone()),
            },
            Layers::Ranges(s) => {
                let whole = || Some(short(s));
                let mut out = Vec::new();
                for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
                    let num = |t: &str| {
                        let t = t.trim();
                        match t.parse::<u32>() {
                            Ok(v) if v < MAX_LAYERS => Ok(v),
                            Ok(_) => Err(LayersError::TooHigh {
                                layer: t.to_string(),
                                layers: whole(),
                            }),
                            Err(_) => Err(LayersError::NotAnIndex {
                                text: short(t),
                                layers: short(s),
                            }),
                        }
                    };
                    match part.split_once('-') {
                        Some((a, b)) => {
                            let (a, b) = (num(a)?, num(b)?);
                            if b < a {
                                return Err(LayersError::Reversed {
                                    range: short(part),
                                    layers: short(s),
                                });
                            }
                            out.extend(a..=b);
                        }
                        None => out.push(num(part)?),
                    }
                    if out.len() > MAX_LAYERS as usize {
                        return Err(LayersError::TooMany { layers: whole() });
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
        let by_name = check_rows(model, num_layers, &rows)?;
        let min_chain = rows
            .iter()
            .filter(|r| r.kind == Kind::Chain)
            .filter_map(|r| r.block_size)
            .filter(|&b| b > 0)
            .min();
        let mut owner: BTreeMap<u32, String> = BTreeMap::new();
        let mut groups = Vec::new();
        for (index, r) in rows.iter().enumerate() {
            let in_group = |problem| {
                spec_err(SpecError::Group {
                    group: r.name.clone(),
                    problem,
                })
            };
            let layers = group_layers(r, num_layers, &mut owner)?;
            let shape = group_shape(r, &rows, &by_name, min_chain).map_err(in_group)?;
            let rank_rule = match shape.source {
                Some(si) => rows[si].rank_rule.unwrap_or_default(),
                None => r.rank_rule.unwrap_or_default(),
            };
            let access_unit = access_unit_of(r, shape.window).map_err(in_group)?;
            let retention = retention_of(r).map_err(in_group)?;
            groups.push(Group {
                index,
                name: r.name.clone(),
                kind: r.kind,
                source: shape.source,
                block: shape.block,
                hash_block: shape.hash_block,
                layers,
                unit_bytes: shape.unit_bytes,
                window: shape.window,
                rank_rule,
                retention,
                access_unit,
            });
        }
        if !groups.iter().any(|g| g.kind == Kind::Chain) {
            return Err(spec_err(SpecError::NoChainGroup));
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
        let f: SpecFile = toml::from_str(text).map_err(|e| {
            spec_err(SpecError::Toml {
                message: e.to_string(),
            })
        })?;
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

    /// Bytes of one stored unit of group `group` at full size: a block
    /// over all its layers (chain, sidecar) or a state over its layers
    /// (snapshot); 0 for `none` groups.
    pub fn unit_bytes(&self, group: usize) -> u64 {
        let g = &self.groups[group];
        let layers = g.layers.len() as u64;
        match g.kind {
            Kind::Chain | Kind::Sidecar => g.bytes_per_layer_block(self.block_of(group)) * layers,
            Kind::Snapshot => g.unit_bytes * layers,
            Kind::None => 0,
        }
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

/// A spec table error as the coordinator's error.
fn spec_err(e: SpecError) -> CoordError {
    CoordError::Spec(e)
}

/// Table-wide checks of the rows: a model name, at least one group, a
/// bounded layer count, plain and unique group names. The names' indices.
fn check_rows(
    model: &str,
    num_layers: Option<u32>,
    rows: &[GroupRow],
) -> Result<HashMap<String, usize>> {
    if model.is_empty() {
        return Err(spec_err(SpecError::EmptyModel));
    }
    if rows.is_empty() {
        return Err(spec_err(SpecError::NoGroups));
    }
    if num_layers.is_some_and(|n| n > MAX_LAYERS) {
        return Err(spec_err(SpecError::TooManyLayers { max: MAX_LAYERS }));
    }
    let mut by_name = HashMap::new();
    for (index, r) in rows.iter().enumerate() {
        // A group name becomes a directory of the store: a plain name.
        check_name("group name", &r.name)
            .map_err(|why| spec_err(SpecError::BadGroupName { index, why }))?;
        if by_name.insert(r.name.clone(), index).is_some() {
            return Err(spec_err(SpecError::Group {
                group: r.name.clone(),
                problem: GroupProblem::DefinedTwice,
            }));
        }
    }
    Ok(by_name)
}

/// A group's layers, sorted: each below `num_layers` and in no other
/// group (`owner` records whose each layer is).
fn group_layers(
    r: &GroupRow,
    num_layers: Option<u32>,
    owner: &mut BTreeMap<u32, String>,
) -> Result<Vec<u32>> {
    let g = &r.name;
    let in_group = |problem| {
        spec_err(SpecError::Group {
            group: g.clone(),
            problem,
        })
    };
    let mut layers = r
        .layers
        .expand()
        .map_err(|e| in_group(GroupProblem::Layers(e)))?;
    if layers.is_empty() {
        return Err(in_group(GroupProblem::NoLayers));
    }
    for &l in &layers {
        if let Some(n) = num_layers.filter(|&n| l >= n) {
            return Err(in_group(GroupProblem::LayerPastModel {
                layer: l,
                num_layers: n,
            }));
        }
        if let Some(other) = owner.insert(l, g.clone()) {
            return Err(spec_err(SpecError::LayerInTwoGroups {
                layer: l,
                first: other,
                second: g.clone(),
            }));
        }
    }
    layers.sort_unstable();
    Ok(layers)
}

/// What a group's kind makes of its row's sizes.
struct Shape {
    block: u64,
    hash_block: u64,
    unit_bytes: u64,
    window: Option<u64>,
    source: Option<usize>,
}

/// The largest value a size field may take.
fn field_max(field: &'static str) -> u64 {
    match field {
        "block_size" | "grid" => MAX_BLOCK_TOKENS,
        "bytes_per_token" => MAX_BYTES_PER_TOKEN,
        "state_bytes" => MAX_STATE_BYTES,
        _ => u64::MAX,
    }
}

/// A size field the group's kind needs: present, positive, bounded.
fn positive(r: &GroupRow, field: &'static str, v: Option<u64>) -> ProblemOr<u64> {
    let max = field_max(field);
    match v {
        Some(x) if x > max => Err(GroupProblem::FieldTooLarge {
            field,
            value: x,
            max,
        }),
        None => Err(GroupProblem::FieldMissing {
            field,
            kind: r.kind,
        }),
        Some(0) => Err(GroupProblem::FieldNotPositive { field }),
        Some(x) => Ok(x),
    }
}

/// A field the group's kind does not take: absent.
fn absent(r: &GroupRow, field: &'static str, present: bool) -> ProblemOr<()> {
    if present {
        Err(GroupProblem::FieldNotApplicable {
            field,
            kind: r.kind,
        })
    } else {
        Ok(())
    }
}

type ProblemOr<T> = std::result::Result<T, GroupProblem>;

/// The block, hash block, bytes per unit, window and source a row's kind
/// gives it; every field its kind does not take absent.
fn group_shape(
    r: &GroupRow,
    rows: &[GroupRow],
    by_name: &HashMap<String, usize>,
    min_chain: Option<u64>,
) -> ProblemOr<Shape> {
    if r.kind != Kind::Sidecar {
        absent(r, "source", r.source.is_some())?;
    }
    if r.kind != Kind::Snapshot {
        absent(r, "grid", r.grid.is_some())?;
        absent(r, "hash_block", r.hash_block.is_some())?;
        absent(r, "state_bytes", r.state_bytes.is_some())?;
        absent(r, "retention", r.retention.is_some())?;
    }
    if r.kind != Kind::Chain {
        absent(r, "block_size", r.block_size.is_some())?;
        absent(r, "window", r.window.is_some())?;
    }
    let shape = match r.kind {
        Kind::Chain => {
            let block = positive(r, "block_size", r.block_size)?;
            let window = match r.window {
                Some(0) => return Err(GroupProblem::FieldNotPositive { field: "window" }),
                Some(w) if w > MAX_SPAN_TOKENS => {
                    return Err(GroupProblem::FieldTooLarge {
                        field: "window",
                        value: w,
                        max: MAX_SPAN_TOKENS,
                    })
                }
                w => w,
            };
            let unit_bytes = positive(r, "bytes_per_token", r.bytes_per_token)?;
            if unit_bytes
                .checked_mul(block)
                .is_none_or(|b| b > MAX_LAYER_BLOCK_BYTES)
            {
                return Err(GroupProblem::LayerBlockTooLarge {
                    max: MAX_LAYER_BLOCK_BYTES,
                });
            }
            Shape {
                block,
                hash_block: block,
                unit_bytes,
                window,
                source: None,
            }
        }
        Kind::Snapshot => {
            absent(r, "bytes_per_token", r.bytes_per_token.is_some())?;
            let grid = positive(r, "grid", r.grid)?;
            let hash_block = match (r.hash_block, min_chain) {
                (Some(0), _) => {
                    return Err(GroupProblem::FieldNotPositive {
                        field: "hash_block",
                    })
                }
                (Some(h), _) if h > MAX_BLOCK_TOKENS => {
                    return Err(GroupProblem::FieldTooLarge {
                        field: "hash_block",
                        value: h,
                        max: MAX_BLOCK_TOKENS,
                    })
                }
                (Some(h), _) | (None, Some(h)) => h,
                (None, None) => return Err(GroupProblem::NoHashBlock),
            };
            Shape {
                block: grid,
                hash_block,
                unit_bytes: positive(r, "state_bytes", r.state_bytes)?,
                window: None,
                source: None,
            }
        }
        Kind::Sidecar => {
            absent(r, "rank_rule", r.rank_rule.is_some())?;
            let Some(src) = &r.source else {
                return Err(GroupProblem::NoSource);
            };
            let Some(&si) = by_name.get(src) else {
                return Err(GroupProblem::UnknownSource {
                    followed: src.clone(),
                });
            };
            if rows[si].kind != Kind::Chain {
                return Err(GroupProblem::SourceNotChain {
                    followed: src.clone(),
                    kind: rows[si].kind,
                });
            }
            Shape {
                block: 0,
                hash_block: 0,
                unit_bytes: positive(r, "bytes_per_token", r.bytes_per_token)?,
                window: None,
                source: Some(si),
            }
        }
        Kind::None => Shape {
            block: 0,
            hash_block: 0,
            unit_bytes: r.bytes_per_token.unwrap_or(0),
            window: None,
            source: None,
        },
    };
    Ok(shape)
}

/// The group's access unit: sidecars follow, windowed chains default to
/// window units, only chains have windows.
fn access_unit_of(r: &GroupRow, window: Option<u64>) -> ProblemOr<AccessUnit> {
    match (r.kind, r.access_unit) {
        (Kind::Sidecar, None | Some(AccessUnit::Follower)) => Ok(AccessUnit::Follower),
        (Kind::Sidecar, Some(unit)) => Err(GroupProblem::SidecarUnit { unit }),
        (_, Some(AccessUnit::Follower)) => Err(GroupProblem::FollowerNotSidecar),
        (Kind::Chain, None) if window.is_some() => Ok(AccessUnit::Window),
        (Kind::Chain, Some(AccessUnit::Window)) if window.is_none() => {
            Err(GroupProblem::WindowUnitWithoutWindow)
        }
        (k, Some(AccessUnit::Window)) if k != Kind::Chain => Err(GroupProblem::WindowUnitNotChain),
        (_, u) => Ok(u.unwrap_or_default()),
    }
}

/// A snapshot group's retention (others have none): a positive, bounded
/// interval where one is set.
fn retention_of(r: &GroupRow) -> ProblemOr<Option<RetentionPolicy>> {
    if r.kind != Kind::Snapshot {
        return Ok(None);
    }
    let p = r.retention.clone().unwrap_or_default();
    match p.interval {
        Some(0) => Err(GroupProblem::FieldNotPositive {
            field: "retention interval",
        }),
        Some(i) if i > MAX_SPAN_TOKENS => Err(GroupProblem::FieldTooLarge {
            field: "retention interval",
            value: i,
            max: MAX_SPAN_TOKENS,
        }),
        _ => Ok(Some(p)),
    }
}
