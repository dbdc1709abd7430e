//! The access-unit map: layers -> access units -> shards.
//!
//! Built from the spec table, once:
//!
//! - **layer**: one tensor per layer, one unit per layer;
//! - **row**: the group's layers share one tensor: one unit holding all of
//!   them, loaded before its first layer and saved after its last;
//! - **window**: a windowed chain group's layer; only the window before the
//!   resume point moves;
//! - **follower**: a sidecar's layer, stored under its source group's ids
//!   in its own instance; it never votes.
//!
//! `none` groups have no units. Units are numbered in the order of their
//! first layer (the **global unit index**); a unit's **shard** is its index
//! among its group's units, so every group's store instance has one shard
//! per unit of the group. Both numbers depend only on the spec table, never
//! on how pipeline parallelism partitions the layers into stages.

use std::collections::HashMap;
use std::ops::Range;

use crate::error::{CoordError, Result, SpecError};
use crate::spec::{AccessUnit, Kind, SpecTable};

/// One access unit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unit {
    /// Global unit index.
    pub global: u32,
    /// The group (its index in the spec table).
    pub group: usize,
    /// Kind of unit.
    pub kind: AccessUnit,
    /// Its layers, ascending (several for a row).
    pub layers: Vec<u32>,
    /// Shard index in the group's store instance.
    pub shard: u32,
}

impl Unit {
    /// The layer whose call loads the unit (its first).
    pub fn first_layer(&self) -> u32 {
        self.layers[0]
    }

    /// The layer whose save completes the unit (its last).
    pub fn last_layer(&self) -> u32 {
        self.layers[self.layers.len() - 1]
    }
}

/// Every unit of a model.
#[derive(Clone, Debug)]
pub struct UnitMap {
    units: Vec<Unit>,
    by_layer: HashMap<u32, usize>,
    per_group: HashMap<usize, u32>,
}

impl UnitMap {
    /// Builds the map of `spec`.
    pub fn new(spec: &SpecTable) -> Self {
        let mut raw: Vec<(u32, usize, AccessUnit, Vec<u32>)> = Vec::new();
        for g in spec.groups() {
            match (g.kind, g.access_unit) {
                (Kind::None, _) => {}
                (_, AccessUnit::Row) => {
                    raw.push((g.layers[0], g.index, AccessUnit::Row, g.layers.clone()))
                }
                (_, kind) => {
                    for &l in &g.layers {
                        raw.push((l, g.index, kind, vec![l]));
                    }
                }
            }
        }
        raw.sort_by_key(|r| r.0);
        let mut per_group: HashMap<usize, u32> = HashMap::new();
        let mut units = Vec::with_capacity(raw.len());
        let mut by_layer = HashMap::new();
        for (i, (_, group, kind, layers)) in raw.into_iter().enumerate() {
            let shard = per_group.entry(group).or_insert(0);
            for &l in &layers {
                by_layer.insert(l, i);
            }
            units.push(Unit {
                global: i as u32,
                group,
                kind,
                layers,
                shard: *shard,
            });
            *shard += 1;
        }
        UnitMap {
            units,
            by_layer,
            per_group,
        }
    }

    /// All units, by global index.
    pub fn units(&self) -> &[Unit] {
        &self.units
    }

    /// The unit holding `layer` (`None` for layers of `none` groups).
    pub fn unit_of(&self, layer: u32) -> Option<&Unit> {
        self.by_layer.get(&layer).map(|&i| &self.units[i])
    }

    /// Units of `group` (its store instance's shards per block).
    pub fn units_of_group(&self, group: usize) -> u32 {
        self.per_group.get(&group).copied().unwrap_or(0)
    }

    /// The units of one pipeline stage (`layers`, a half-open range of
    /// layer indices), by global index. A row unit split across stages is an
    /// error: its shared tensor cannot live on two stages.
    pub fn stage(&self, layers: Range<u32>) -> Result<Vec<&Unit>> {
        let mut out = Vec::new();
        for u in &self.units {
            let inside = u.layers.iter().filter(|l| layers.contains(l)).count();
            if inside == u.layers.len() {
                out.push(u);
            } else if inside > 0 {
                return Err(CoordError::Spec(SpecError::StageSplitsUnit {
                    unit: u.layers.clone(),
                    stage: layers,
                }));
            }
        }
        Ok(out)
    }
}

/// A pipeline partition: contiguous layer ranges, one per stage, covering
/// `0..num_layers` (uneven partitions allowed).
pub fn partition(bounds: &[u32], num_layers: u32) -> Result<Vec<Range<u32>>> {
    let mut out = Vec::new();
    let mut start = 0;
    for &b in bounds.iter().chain(std::iter::once(&num_layers)) {
        if b <= start && !(b == num_layers && start == num_layers && out.is_empty()) {
            return Err(CoordError::Spec(SpecError::StageBounds {
                bounds: bounds.to_vec(),
                num_layers,
            }));
        }
        out.push(start..b);
        start = b;
    }
    Ok(out)
}
