//! Engine memory of one worker (one TP rank of one pipeline stage), shaped
//! like a vLLM KV cache.
//!
//! Per access unit one tensor (a row unit: one tensor its layers share):
//! - chain and sidecar units: `[num_blocks][2 (K, V)][block_tokens][bytes]`,
//!   block-major: block `b` is one contiguous chunk of `stride` bytes at
//!   `b * stride`, its K half first, then its V half (the CPU layout vLLM
//!   uses, `[num_blocks, kv_heads, block_size, 2 * head_size]`, has the same
//!   property: each block of a layer is one contiguous chunk);
//! - snapshot units: `[num_slots][state bytes]`, slot `s` at `s * stride`.
//!
//! `stride` is the group's shard size in the store (the block's bytes,
//! padded to the O_DIRECT alignment).

use std::collections::HashMap;

use ucm_coordinator::adapter::{LayerRegistration, StoreSet, Unit};
use ucm_coordinator::{Kind, SpecTable};
use ucm_device::{Device, Memory};

/// One unit's tensor.
#[derive(Clone, Debug)]
pub struct Region {
    /// The device memory.
    pub memory: Memory,
    /// Bytes per engine block (chain, sidecar) or state slot (snapshot).
    pub stride: usize,
    /// Engine blocks or state slots in it.
    pub count: usize,
}

/// The engine memory of one worker.
#[derive(Clone, Debug, Default)]
pub struct Layout {
    /// Per global unit index.
    pub regions: HashMap<u32, Region>,
    /// Per layer: the global unit index of its tensor.
    pub layer_unit: HashMap<u32, u32>,
}

impl Layout {
    /// Allocates the tensors of `units` (a stage's units): `blocks[g]`
    /// engine blocks for chain and sidecar group `g`, `slots[g]` state slots
    /// for snapshot group `g`.
    pub fn new<D: Device>(
        dev: &D,
        spec: &SpecTable,
        stores: &StoreSet<D>,
        units: &[Unit],
        blocks: &HashMap<usize, usize>,
        slots: &HashMap<usize, usize>,
    ) -> ucm_device::Result<Layout> {
        let mut out = Layout::default();
        for u in units {
            let stride = stores.shard_bytes(u.group);
            let count = match spec.groups()[u.group].kind {
                Kind::Snapshot => slots.get(&u.group).copied().unwrap_or(1),
                _ => blocks.get(&u.group).copied().unwrap_or(1),
            }
            .max(1);
            let memory = dev.alloc_device(stride * count)?;
            for &l in &u.layers {
                out.layer_unit.insert(l, u.global);
            }
            out.regions.insert(
                u.global,
                Region {
                    memory,
                    stride,
                    count,
                },
            );
        }
        Ok(out)
    }

    /// The registrations `register_kv_caches` takes: every layer with its
    /// tensor.
    pub fn registrations(&self) -> Vec<LayerRegistration> {
        let mut v: Vec<LayerRegistration> = self
            .layer_unit
            .iter()
            .map(|(&layer, g)| {
                let r = &self.regions[g];
                LayerRegistration {
                    layer,
                    memory: r.memory.clone(),
                    stride: r.stride,
                }
            })
            .collect();
        v.sort_by_key(|r| r.layer);
        v
    }

    /// The tensor of unit `global`.
    pub fn region(&self, global: u32) -> &Region {
        &self.regions[&global]
    }
}
