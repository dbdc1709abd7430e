//! Helpers of the remote-tier tests (Redis and S3): blocks of a fixed
//! geometry whose bytes are a function of their number, written and read
//! back checked.

use std::time::Duration;

use ucm_store::pool::PoolMode;
use ucm_store::{BlockId, ClockPool, Geometry, PoolConfig, RemoteTier, StoreError};

/// The geometry of every remote test.
pub const GEO: Geometry = Geometry {
    shard_bytes: 4096,
    shards_per_block: 4,
};

/// The id of block `n`.
pub fn id(n: u64) -> BlockId {
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&n.to_le_bytes());
    b[8] = 0x5a;
    b
}

/// The lowercase hex of an id (as in the tiers' keys).
pub fn hex(b: &BlockId) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The bytes of shard `s` of block `n`.
pub fn shard(n: u64, s: u32) -> Vec<u8> {
    (0..GEO.shard_bytes)
        .map(|i| (n.wrapping_mul(31) ^ (u64::from(s) * 7) ^ i as u64) as u8)
        .collect()
}

/// Writes blocks `ns` whole; one result per block.
pub fn write(t: &RemoteTier, ns: impl IntoIterator<Item = u64>) -> Vec<Result<(), StoreError>> {
    let data: Vec<(u64, Vec<Vec<u8>>)> = ns
        .into_iter()
        .map(|n| (n, (0..GEO.shards_per_block).map(|s| shard(n, s)).collect()))
        .collect();
    let blocks: Vec<(BlockId, Vec<&[u8]>)> = data
        .iter()
        .map(|(n, v)| (id(*n), v.iter().map(Vec::as_slice).collect()))
        .collect();
    t.write_blocks(&blocks)
        .into_iter()
        .map(|(_, r)| r)
        .collect()
}

/// Reads block `n` whole; panics on wrong bytes.
pub fn read_checked(t: &RemoteTier, n: u64) -> Result<Option<()>, StoreError> {
    let all: Vec<u32> = (0..GEO.shards_per_block).collect();
    Ok(t.read_shards(&id(n), &all)?.map(|v| {
        for (s, got) in v.iter().enumerate() {
            assert!(
                *got == shard(n, s as u32),
                "WRONG BYTES: block {n} shard {s}"
            );
        }
    }))
}

/// A private pool of `slots` slots of the test geometry's shards.
pub fn pool(slots: usize) -> ClockPool {
    ClockPool::open(PoolConfig {
        shard_bytes: GEO.shard_bytes,
        slots,
        ways: 16.min(slots),
        mode: PoolMode::Private,
        load_timeout: Duration::from_secs(1),
        dirty_timeout: Duration::from_secs(60),
    })
    .unwrap()
}
