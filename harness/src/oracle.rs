//! The content oracle: what every block and state must hold, the poison no
//! content can equal, and what the design says a hit loads.
//!
//! Content is a keyed stream: a block's bytes are a function of its id (a
//! pure function of the token prefix up to its end, the group and, under
//! `intersection`, the rank), the unit's first layer and the K/V half; a
//! state's are one of `H(p)` and the layer. The first byte of each half is
//! below 0x80, and the poison is 0xDE everywhere, so a block that still
//! holds the poison never equals any content.
//!
//! The load range is DESIGN.md section 5, restated here on purpose (never
//! the adapter's own helper): to resume at `p*` the engine needs every
//! block of `[0, p*)` of a full chain group, the blocks covering
//! `[p* - W, p*)` of a windowed group (a sidecar follows its source), the
//! state at exactly `p*` of every snapshot group, less what it holds
//! itself (`[0, have)`).

use std::ops::Range;

use ucm_coordinator::hash::Id;
use ucm_coordinator::{Kind, SpecTable};
use ucm_device::conformance::pattern;

/// The byte every poisoned block and slot holds.
pub const POISON: u8 = 0xDE;

/// The oracle's bytes of one block (or state) of `len` bytes: a K half and
/// a V half, each a stream keyed by `id`, the unit's first layer and the
/// key rank.
pub fn content(id: &Id, first_layer: u32, key_rank: usize, len: usize) -> Vec<u8> {
    let mut seed = [0u8; 8];
    seed.copy_from_slice(&id[..8]);
    let base = u64::from_le_bytes(seed) ^ (u64::from(first_layer) << 48) ^ key_rank as u64;
    let half = len / 2;
    let mut out = pattern(base, half);
    out.extend(pattern(base ^ 0x7f4a_7c15_9e37_79b9, len - half));
    if let Some(b) = out.first_mut() {
        *b &= 0x7f;
    }
    if let Some(b) = out.get_mut(half) {
        *b &= 0x7f;
    }
    out
}

/// `len` bytes of poison.
pub fn poison(len: usize) -> Vec<u8> {
    vec![POISON; len]
}

/// True when every byte is the poison (nothing was written there).
pub fn is_poison(bytes: &[u8]) -> bool {
    bytes.iter().all(|&b| b == POISON)
}

/// Block indices of chain or sidecar group `group` that a hit at `p_star`
/// loads when the engine holds `[0, have)` itself (DESIGN.md section 5).
pub fn loaded_blocks(spec: &SpecTable, group: usize, p_star: u64, have: u64) -> Range<usize> {
    let g = &spec.groups()[group];
    if !matches!(g.kind, Kind::Chain | Kind::Sidecar) || p_star == 0 {
        return 0..0;
    }
    let b = spec.block_of(group).max(1);
    let needed_from = spec
        .window_of(group)
        .map_or(0, |w| p_star.saturating_sub(w));
    let from = needed_from.max(have);
    if from >= p_star {
        return 0..0;
    }
    (from / b) as usize..p_star.div_ceil(b) as usize
}

/// Whether a hit at `p_star` loads a state of snapshot group `group`.
pub fn loads_state(spec: &SpecTable, group: usize, p_star: u64, have: u64) -> bool {
    spec.groups()[group].kind == Kind::Snapshot && p_star > have
}

/// Where the engine resumes after load errors: `p_star` without any; with
/// some, the first failed token position, floored to the chain grid, when
/// the model has neither a snapshot group nor a windowed group; otherwise
/// `have` (a recurrent state or a window exists only at `p_star`, so the
/// whole prefix is recomputed). `first_failed` is the token position of the
/// first failed block over every group.
pub fn resume_point(spec: &SpecTable, p_star: u64, have: u64, first_failed: Option<u64>) -> u64 {
    let Some(f) = first_failed else {
        return p_star;
    };
    if f >= p_star {
        return p_star;
    }
    let exact =
        spec.snapshot_groups().next().is_some() || spec.groups().iter().any(|g| g.is_windowed());
    if exact {
        have.min(p_star)
    } else {
        let grid = spec.chain_grid().max(1);
        (f / grid * grid).max(have).min(p_star)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_content_equals_the_poison() {
        for i in 0..64u8 {
            let c = content(&[i; 16], u32::from(i), 0, 4096);
            assert!(!is_poison(&c));
            assert_ne!(c, poison(4096));
        }
        assert_ne!(content(&[1; 16], 0, 0, 64), content(&[1; 16], 1, 0, 64));
        assert_ne!(content(&[1; 16], 0, 0, 64), content(&[1; 16], 0, 1, 64));
    }

    #[test]
    fn load_ranges_follow_the_design() {
        let spec = SpecTable::from_toml(
            "model = \"m\"\n[[group]]\nname = \"a\"\nkind = \"chain\"\nblock_size = 16\n\
             layers = \"0\"\nbytes_per_token = 8\n[[group]]\nname = \"w\"\nkind = \"chain\"\n\
             block_size = 32\nwindow = 40\nlayers = \"1\"\nbytes_per_token = 8\n\
             [[group]]\nname = \"i\"\nkind = \"sidecar\"\nsource = \"w\"\nlayers = \"2\"\n\
             bytes_per_token = 8\n",
        )
        .unwrap();
        assert_eq!(loaded_blocks(&spec, 0, 96, 0), 0..6);
        assert_eq!(loaded_blocks(&spec, 0, 96, 32), 2..6);
        // [96 - 40, 96) = [56, 96): blocks 1 (32..64) and 2 (64..96).
        assert_eq!(loaded_blocks(&spec, 1, 96, 0), 1..3);
        assert_eq!(loaded_blocks(&spec, 2, 96, 0), 1..3);
        assert_eq!(loaded_blocks(&spec, 0, 0, 0), 0..0);
        assert_eq!(resume_point(&spec, 96, 0, None), 96);
        // A windowed group: a failure anywhere below p* recomputes it all.
        assert_eq!(resume_point(&spec, 96, 0, Some(64)), 0);
    }
}
