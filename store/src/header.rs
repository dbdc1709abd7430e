//! The block header every tier writes beside a block's shards: the magic
//! `UCMBLK\0\x01`, the format version, the geometry, the block id, a
//! CRC32C per shard and a CRC32C of the header itself (little-endian). The
//! disk tier puts it at the start of each block file (padded to the
//! O_DIRECT alignment); the remote tier stores it as the block's
//! "published" value, written after the shards.

use crate::geometry::{BlockId, Geometry};

const MAGIC: [u8; 8] = *b"UCMBLK\x00\x01";
const FORMAT_VERSION: u32 = 1;
/// Bytes of the fixed part before the shard checksums.
const FIXED: usize = 8 + 4 + 4 + 8 + 16;

/// Bytes of a header for `g`, unpadded.
pub(crate) fn header_len(g: Geometry) -> usize {
    FIXED + 4 * g.shards_per_block as usize + 4
}

/// Writes the header of block `id` whose shards have checksums `crcs`
/// into the front of `out` (at least [`header_len`] bytes).
pub(crate) fn write_header(g: Geometry, id: &BlockId, crcs: &[u32], out: &mut [u8]) {
    out[0..8].copy_from_slice(&MAGIC);
    out[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    out[12..16].copy_from_slice(&g.shards_per_block.to_le_bytes());
    out[16..24].copy_from_slice(&(g.shard_bytes as u64).to_le_bytes());
    out[24..40].copy_from_slice(id);
    for (i, c) in crcs.iter().enumerate() {
        let at = FIXED + 4 * i;
        out[at..at + 4].copy_from_slice(&c.to_le_bytes());
    }
    let end = FIXED + 4 * crcs.len();
    let crc = crc32c::crc32c(&out[..end]);
    out[end..end + 4].copy_from_slice(&crc.to_le_bytes());
}

/// Parses and checks the header of block `id` for geometry `g`; returns
/// the shard checksums, or `None` for anything that is not exactly such a
/// header.
pub(crate) fn parse_header(g: Geometry, id: &BlockId, b: &[u8]) -> Option<Vec<u32>> {
    let n = g.shards_per_block as usize;
    let end = FIXED + 4 * n;
    if b.len() < end + 4 {
        return None;
    }
    let le32 = |at: usize| u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
    let ok = b[0..8] == MAGIC
        && le32(8) == FORMAT_VERSION
        && le32(12) == g.shards_per_block
        && b[16..24] == (g.shard_bytes as u64).to_le_bytes()
        && b[24..40] == id[..]
        && crc32c::crc32c(&b[..end]) == le32(end);
    ok.then(|| (0..n).map(|i| le32(FIXED + 4 * i)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_round_trips_and_any_changed_byte_is_refused() {
        let g = Geometry {
            shard_bytes: 4096,
            shards_per_block: 3,
        };
        let id = [7u8; 16];
        let mut b = vec![0u8; header_len(g)];
        write_header(g, &id, &[1, 2, 3], &mut b);
        assert_eq!(parse_header(g, &id, &b), Some(vec![1, 2, 3]));
        assert_eq!(parse_header(g, &[8u8; 16], &b), None, "another block's");
        for i in 0..b.len() {
            let mut c = b.clone();
            c[i] ^= 1;
            assert_eq!(parse_header(g, &id, &c), None, "byte {i}");
        }
        assert_eq!(parse_header(g, &id, &b[..b.len() - 1]), None);
    }
}
