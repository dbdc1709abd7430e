//! The engine's block allocator: per chain or sidecar group a pool of
//! engine blocks, per snapshot group a pool of state slots, each a free
//! list that rotates (allocate from the front, free to the back), shuffled
//! once from a seed. Consecutive requests therefore get other physical
//! blocks, in no particular order: a load that lands in the wrong block,
//! or that is skipped because "the engine still holds the bytes", cannot
//! pass by luck.

use std::collections::{HashMap, VecDeque};

use ucm_coordinator::adapter::Allocation;
use ucm_coordinator::{Kind, SpecTable};

/// Free lists of engine blocks and state slots.
#[derive(Clone, Debug)]
pub struct BlockAllocator {
    blocks: HashMap<usize, VecDeque<u32>>,
    slots: HashMap<usize, VecDeque<u32>>,
    sizes: HashMap<usize, usize>,
    slot_sizes: HashMap<usize, usize>,
}

fn shuffled(n: usize, seed: u64) -> VecDeque<u32> {
    let mut v: Vec<u32> = (0..n as u32).collect();
    let mut s = seed | 1;
    for i in (1..v.len()).rev() {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        v.swap(i, (s % (i as u64 + 1)) as usize);
    }
    v.into()
}

impl BlockAllocator {
    /// Pools sized for requests of up to `max_tokens` tokens: twice the
    /// blocks one such request needs, plus two, so that two consecutive
    /// requests never share a block; `slots` state slots per snapshot group.
    pub fn new(spec: &SpecTable, max_tokens: usize, slots: usize, seed: u64) -> Self {
        let mut a = BlockAllocator {
            blocks: HashMap::new(),
            slots: HashMap::new(),
            sizes: HashMap::new(),
            slot_sizes: HashMap::new(),
        };
        for g in spec.groups() {
            match g.kind {
                Kind::Chain | Kind::Sidecar => {
                    let b = spec.block_of(g.index).max(1) as usize;
                    let n = 2 * (max_tokens / b + 1) + 2;
                    a.sizes.insert(g.index, n);
                    a.blocks
                        .insert(g.index, shuffled(n, seed ^ (g.index as u64 + 1)));
                }
                Kind::Snapshot => {
                    let n = slots.max(2);
                    a.slot_sizes.insert(g.index, n);
                    a.slots
                        .insert(g.index, shuffled(n, seed ^ 0x5107 ^ g.index as u64));
                }
                Kind::None => {}
            }
        }
        a
    }

    /// Engine blocks per chain or sidecar group (the tensor sizes).
    pub fn block_counts(&self) -> &HashMap<usize, usize> {
        &self.sizes
    }

    /// State slots per snapshot group.
    pub fn slot_counts(&self) -> &HashMap<usize, usize> {
        &self.slot_sizes
    }

    /// Blocks and slots for a request of `tokens` tokens: per group as many
    /// blocks as the group's block size gives (the last one partial), one
    /// slot per snapshot group. `None` when a pool is exhausted.
    pub fn allocate(&mut self, spec: &SpecTable, tokens: usize) -> Option<Allocation> {
        let mut a = Allocation::default();
        for g in spec.groups() {
            match g.kind {
                Kind::Chain | Kind::Sidecar => {
                    let b = spec.block_of(g.index).max(1) as usize;
                    let need = tokens.div_ceil(b);
                    if self.blocks.get(&g.index).map_or(0, VecDeque::len) < need {
                        self.free(a);
                        return None;
                    }
                    let free = self.blocks.get_mut(&g.index)?;
                    a.blocks.insert(g.index, free.drain(..need).collect());
                }
                Kind::Snapshot => {
                    match self.slots.get_mut(&g.index).and_then(VecDeque::pop_front) {
                        Some(s) => {
                            a.state_slots.insert(g.index, s);
                        }
                        None => {
                            self.free(a);
                            return None;
                        }
                    }
                }
                Kind::None => {}
            }
        }
        Some(a)
    }

    /// Returns a request's blocks and slots to the back of the free lists.
    pub fn free(&mut self, a: Allocation) {
        for (g, bs) in a.blocks {
            if let Some(f) = self.blocks.get_mut(&g) {
                f.extend(bs);
            }
        }
        for (g, s) in a.state_slots {
            if let Some(f) = self.slots.get_mut(&g) {
                f.push_back(s);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consecutive_requests_get_disjoint_shuffled_blocks() {
        let spec = SpecTable::from_toml(
            "model = \"m\"\n[[group]]\nname = \"a\"\nkind = \"chain\"\nblock_size = 16\n\
             layers = \"0\"\nbytes_per_token = 8\n[[group]]\nname = \"s\"\nkind = \"snapshot\"\n\
             grid = 16\nstate_bytes = 64\nlayers = \"1\"\n",
        )
        .unwrap();
        let mut al = BlockAllocator::new(&spec, 160, 3, 7);
        let mut last: Option<Allocation> = None;
        for _ in 0..20 {
            let a = al.allocate(&spec, 160).unwrap();
            assert_eq!(a.blocks[&0].len(), 10);
            if let Some(l) = last.take() {
                assert!(a.blocks[&0].iter().all(|b| !l.blocks[&0].contains(b)));
                assert_ne!(a.state_slots[&1], l.state_slots[&1]);
                al.free(l);
            }
            last = Some(a);
        }
        let a = last.unwrap();
        assert_ne!(
            a.blocks[&0],
            (a.blocks[&0][0]..a.blocks[&0][0] + 10).collect::<Vec<_>>()
        );
    }
}
