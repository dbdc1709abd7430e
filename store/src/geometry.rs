//! Geometry: fixed when an instance is built, never carried by a task.

use crate::error::{bad_value, Result, StoreError};
use ucm_device::io::DIRECT_IO_ALIGN;

/// A block id: 16 bytes, content-addressed and prefix-chained upstream.
pub type BlockId = [u8; 16];

/// The 32 lowercase hex digits of `id` (its name in files and keys).
pub(crate) fn hex_digits(id: &BlockId) -> [u8; 32] {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut hex = [0u8; 32];
    for (i, b) in id.iter().enumerate() {
        hex[2 * i] = DIGITS[usize::from(b >> 4)];
        hex[2 * i + 1] = DIGITS[usize::from(b & 15)];
    }
    hex
}

/// The lowercase hex of `id`.
pub(crate) fn hex(id: &BlockId) -> String {
    hex_digits(id).iter().map(|&d| char::from(d)).collect()
}

/// The shape of every block of one store instance. Another geometry means
/// another instance, with its own directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Geometry {
    /// Bytes of one shard (one access unit of one block); a multiple of 4 KiB.
    pub shard_bytes: usize,
    /// Shards per block.
    pub shards_per_block: u32,
}

impl Geometry {
    /// Checks the values: positive, shard size a multiple of 4 KiB (O_DIRECT).
    pub fn validate(&self) -> Result<()> {
        if self.shard_bytes == 0 || self.shard_bytes % DIRECT_IO_ALIGN != 0 {
            return Err(bad_value(
                "shard size",
                self.shard_bytes,
                "a positive multiple of 4096",
            ));
        }
        if self.shards_per_block == 0 || self.shards_per_block > 65_536 {
            return Err(bad_value(
                "shards per block",
                self.shards_per_block,
                "1..=65536",
            ));
        }
        Ok(())
    }

    /// Checks that `shard` exists in this geometry.
    pub fn check_shard(&self, shard: u32) -> Result<()> {
        if shard < self.shards_per_block {
            Ok(())
        } else {
            Err(StoreError::ShardOutOfRange {
                shard,
                shards: self.shards_per_block,
            })
        }
    }

    /// A one-line description, also written into the geometry marker.
    pub fn describe(&self) -> String {
        format!(
            "shard_bytes={} shards_per_block={}",
            self.shard_bytes, self.shards_per_block
        )
    }
}
