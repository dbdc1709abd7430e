//! Helpers of the store's multi-instance tests: a block's task items, and
//! device memory of the host device filled and read through the device's
//! own copies.

#![allow(dead_code)]

pub mod remote;

use ucm_device::{CopyRun, Device, HostDevice, Memory};
use ucm_store::{BlockId, Geometry, TaskItem};

/// The items of every shard of `block`, shard `s` at `s * shard_bytes` of
/// `mem`.
pub fn items(block: BlockId, geo: Geometry, mem: &Memory) -> Vec<TaskItem> {
    (0..geo.shards_per_block)
        .map(|s| TaskItem {
            block,
            shard: s,
            memory: mem.clone(),
            offset: s as usize * geo.shard_bytes,
        })
        .collect()
}

/// Copies `len` bytes from `from` to `to` and waits.
pub fn copy(dev: &HostDevice, to: &Memory, from: &Memory, len: usize) {
    let s = dev.create_stream().unwrap();
    dev.copy_async(&s, &CopyRun::new(to, 0, from, 0, len))
        .unwrap();
    dev.synchronize_stream(&s).unwrap();
}

/// Device memory holding a block whose shard `s` is `shard(s)`.
pub fn device_block(dev: &HostDevice, geo: Geometry, shard: impl Fn(u32) -> Vec<u8>) -> Memory {
    let len = geo.shard_bytes * geo.shards_per_block as usize;
    let h = dev.alloc_pinned(len).unwrap();
    for s in 0..geo.shards_per_block {
        h.write_host(s as usize * geo.shard_bytes, &shard(s))
            .unwrap();
    }
    let d = dev.alloc_device(len).unwrap();
    copy(dev, &d, &h, len);
    d
}

/// The first `len` bytes of device memory `mem`.
pub fn read_device(dev: &HostDevice, mem: &Memory, len: usize) -> Vec<u8> {
    let back = dev.alloc_pinned(len).unwrap();
    copy(dev, &back, mem, len);
    let mut got = vec![0u8; len];
    back.read_host(0, &mut got).unwrap();
    got
}
