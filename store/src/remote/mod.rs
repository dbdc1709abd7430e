//! The remote tiers: blocks on storage that many engine instances (on many
//! machines) share, below the disk tier: a Redis or Valkey cluster
//! (`redis.rs`, feature `redis`) and S3-compatible object storage (`s3.rs`,
//! feature `s3`, the cold tier).
//! One layout and one check for both; a backend only moves keys and bytes.
//!
//! **Layout.** Every block carries the disk tier's block-file header (one
//! format): geometry, id, a CRC32C per shard, its own CRC32C. Block `id` of
//! an instance of geometry `S x N` (shard bytes by shards) in namespace
//! `ns`:
//!
//! ```text
//! Redis: ucm:<ns>:<S>x<N>:{<hex id>}:<i>     N shard values
//!        ucm:<ns>:<S>x<N>:{<hex id>}:pub     the header, written last
//! S3:    [<prefix>/]ucm/<ns>/<S>x<N>/<hex id>/block
//!                                            one object: header, then shards
//! ```
//!
//! Redis: a write sends the shards, then the header, on one connection to
//! the slot's master (one hash tag per block), so the header is never
//! visible before its shards. S3: one PUT per block (atomic: the object is
//! whole or absent), and a read fetches the header's and the shards' byte
//! ranges, so a block of many layers costs one request to write, not one
//! per shard. Either way a crash or a lost connection mid-write leaves the
//! block invisible, never half there.
//!
//! **Presence** is the header's (the object's) existence, batched (Redis:
//! one pipeline; S3: concurrent HEADs). **A read** checks every shard
//! against the header: a missing shard (evicted by the server's `maxmemory`
//! policy), a wrong length (a truncated object) or a checksum mismatch is a
//! miss, and the block is deleted. Geometry is part of the key, so
//! instances of another geometry never meet.
//!
//! **Faults.** Every call is bounded by the configured timeout. A backend
//! that is down or slow makes lookups and reads miss (and counts the error)
//! and writes fail with a typed error (`StoreError::Remote` with feature
//! `redis`, `StoreError::ObjectStore` with `s3`, [`StoreError::Timeout`]).

#[cfg(feature = "redis")]
mod redis;
#[cfg(feature = "s3")]
mod s3;
mod url;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::error::{bad_value, ConfigError, Result, StoreError};
use crate::geometry::{hex, BlockId, Geometry};
use crate::header;

pub use self::url::S3Location;

/// Longest namespace accepted.
const MAX_NAMESPACE: usize = 64;

/// Where a remote tier's blocks live.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// A Redis or Valkey cluster: its seed nodes, `redis://host:port` each.
    Redis(Vec<String>),
    /// An S3-compatible bucket.
    S3(S3Location),
}

/// How a remote tier is set up.
#[derive(Clone, Debug)]
pub struct RemoteConfig {
    /// The servers.
    pub endpoint: Endpoint,
    /// Key namespace (letters, digits, `_`, `-`, `.`): one per store
    /// instance (group), shared by the engine instances that share blocks.
    pub namespace: String,
    /// The instance's geometry.
    pub geometry: Geometry,
    /// Bound of every connect and every response.
    pub timeout: Duration,
}

/// Cuts user text for an error message.
pub(crate) fn shown(s: &str) -> String {
    s.chars().take(80).collect()
}

impl RemoteConfig {
    /// A configuration from a URL: `redis://host:port[,host:port...]` (a
    /// Redis or Valkey cluster's seed nodes; `valkey://` too) or
    /// `s3://bucket[/prefix][?endpoint=http://host:port&region=r]` (an
    /// S3-compatible bucket; credentials from the usual `AWS_*` variables).
    pub fn from_url(url: &str, namespace: &str, geometry: Geometry) -> Result<Self> {
        let endpoint = if url.starts_with("s3://") {
            Endpoint::S3(S3Location::from_url(url)?)
        } else {
            Endpoint::Redis(url::nodes_from_url(url)?)
        };
        let cfg = RemoteConfig {
            endpoint,
            namespace: namespace.to_string(),
            geometry,
            timeout: Duration::from_secs(2),
        };
        cfg.validate()?;
        Ok(cfg)
    }

    fn validate(&self) -> Result<()> {
        self.geometry.validate()?;
        if matches!(&self.endpoint, Endpoint::Redis(n) if n.is_empty()) {
            return Err(StoreError::Config(ConfigError::NoRemote("node")));
        }
        let ns_ok = !self.namespace.is_empty()
            && self.namespace.len() <= MAX_NAMESPACE
            && self
                .namespace
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c));
        if !ns_ok {
            return Err(bad_value(
                "remote tier namespace",
                format!("`{}`", shown(&self.namespace)),
                "1-64 letters, digits, `_`, `-` or `.`",
            ));
        }
        if self.timeout.is_zero() {
            return Err(bad_value("remote tier timeout", "0", "positive"));
        }
        Ok(())
    }
}

/// Counters of the remote tier.
#[derive(Debug, Default)]
pub struct RemoteStats {
    /// Blocks written.
    pub written: AtomicU64,
    /// Blocks read whole and checked.
    pub read: AtomicU64,
    /// Blocks found damaged or incomplete (a miss; their keys deleted).
    pub damaged: AtomicU64,
    /// Calls that failed (server down, refused, timed out).
    pub errors: AtomicU64,
}

/// What reading one block gave: its shards, `None` for a miss (absent or
/// damaged), or the backend's failure.
pub type RemoteRead = Result<Option<Vec<Vec<u8>>>>;

/// How a backend lays a block out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Layout {
    /// One value per shard and a header value written after them (a
    /// key-value store: Redis).
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    Keys,
    /// One object per block, the header first and the shards after it,
    /// written by one atomic PUT and read by byte ranges (object storage:
    /// S3, where a request per shard would cost too much).
    #[cfg_attr(not(feature = "s3"), allow(dead_code))]
    Object,
}

/// One object read by ranges: the bytes of each range, or `Err(size)`
/// when the object is not the expected size (damaged).
type RangedObject = std::result::Result<Vec<Vec<u8>>, u64>;

/// What a backend does: keys and bytes, in batches.
trait Backend: Send + Sync {
    /// Its layout.
    fn layout(&self) -> Layout;
    /// The key of `part` (`pub` or a shard index) of the block whose id is
    /// `hex`, under `base` (`ucm`, namespace, geometry).
    fn key(&self, base: &[&str], hex: &str, part: &str) -> String;
    /// Per key: does it exist?
    fn exists(&self, keys: &[String]) -> Result<Vec<bool>>;
    /// [`Layout::Keys`]: per key, its value, `None` when absent.
    fn get(&self, _keys: &[String]) -> Result<Vec<Option<Vec<u8>>>> {
        Err(StoreError::Config(ConfigError::RemoteLayout {
            has: "objects",
            asked: "keys",
        }))
    }
    /// Per block, its values in order; the last (the header) is stored
    /// only after every other of its block is.
    fn put(&self, blocks: &[Vec<(String, &[u8])>]) -> Result<()>;
    /// Deletes keys (absent ones are fine).
    fn delete(&self, keys: &[String]) -> Result<()>;
    /// [`Layout::Object`]: per object, the bytes of each range; `None`:
    /// absent; `Some(Err(len))`: present but not `expected` bytes long
    /// (damaged: the ranges do not fit).
    fn get_ranges(
        &self,
        _reqs: &[(String, Vec<std::ops::Range<u64>>)],
        _expected: u64,
    ) -> Result<Vec<Option<RangedObject>>> {
        Err(StoreError::Config(ConfigError::RemoteLayout {
            has: "keys",
            asked: "objects",
        }))
    }
    /// A description for logs.
    fn describe(&self) -> String;
}

/// The same failure again, for each block of a batch that failed as one.
pub(crate) fn again(e: &std::sync::Arc<StoreError>) -> StoreError {
    match &**e {
        #[cfg(feature = "redis")]
        StoreError::Remote { op, source } => StoreError::Remote {
            op,
            source: source.clone(),
        },
        #[cfg(feature = "s3")]
        StoreError::ObjectStore { op, source } => StoreError::ObjectStore {
            op,
            source: std::sync::Arc::clone(source),
        },
        StoreError::Timeout { op, after } => StoreError::Timeout { op, after: *after },
        _ => StoreError::Batch(std::sync::Arc::clone(e)),
    }
}

/// What the storage gave for one block.
enum Reply {
    /// Not published.
    Absent,
    /// Published but not of its expected shape.
    Damaged,
    /// The header's bytes and each shard asked (`None`: missing).
    Parts(Vec<u8>, Vec<Option<Vec<u8>>>),
}

/// The backend serving `cfg`'s endpoint, or [`StoreError::NotBuilt`]
/// where this build leaves it out.
fn backend(cfg: &RemoteConfig) -> Result<Box<dyn Backend>> {
    match &cfg.endpoint {
        #[cfg(feature = "redis")]
        Endpoint::Redis(nodes) => Ok(Box::new(redis::RedisBackend::new(nodes, cfg.timeout)?)),
        #[cfg(not(feature = "redis"))]
        Endpoint::Redis(_) => Err(StoreError::NotBuilt {
            what: "a Redis or Valkey remote tier",
            feature: "redis",
        }),
        #[cfg(feature = "s3")]
        Endpoint::S3(loc) => Ok(Box::new(s3::S3Backend::new(loc, cfg.timeout)?)),
        #[cfg(not(feature = "s3"))]
        Endpoint::S3(_) => Err(StoreError::NotBuilt {
            what: "an S3 cold tier",
            feature: "s3",
        }),
    }
}

/// A block store on shared remote storage (a Redis or Valkey cluster, an
/// S3-compatible bucket).
pub struct RemoteTier {
    cfg: RemoteConfig,
    backend: Box<dyn Backend>,
    base: [String; 3],
    stats: RemoteStats,
}

impl std::fmt::Debug for RemoteTier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteTier")
            .field("backend", &self.backend.describe())
            .field("base", &self.base)
            .finish()
    }
}

impl RemoteTier {
    /// A tier on the servers of `cfg` (a Redis cluster is not contacted
    /// yet; an S3 client is built, without a request).
    pub fn new(cfg: RemoteConfig) -> Result<Self> {
        cfg.validate()?;
        let backend = backend(&cfg)?;
        let g = cfg.geometry;
        let base = [
            "ucm".to_string(),
            cfg.namespace.clone(),
            format!("{}x{}", g.shard_bytes, g.shards_per_block),
        ];
        Ok(RemoteTier {
            cfg,
            backend,
            base,
            stats: RemoteStats::default(),
        })
    }

    /// The geometry.
    pub fn geometry(&self) -> Geometry {
        self.cfg.geometry
    }

    /// The servers.
    pub fn endpoint(&self) -> &Endpoint {
        &self.cfg.endpoint
    }

    /// The counters.
    pub fn stats(&self) -> &RemoteStats {
        &self.stats
    }

    fn key(&self, id: &BlockId, part: &str) -> String {
        let b = [
            self.base[0].as_str(),
            self.base[1].as_str(),
            self.base[2].as_str(),
        ];
        self.backend.key(&b, &hex(id), part)
    }

    /// The key whose existence publishes a block.
    fn published(&self, id: &BlockId) -> String {
        match self.backend.layout() {
            Layout::Keys => self.key(id, "pub"),
            Layout::Object => self.key(id, "block"),
        }
    }

    /// Counts a failed call.
    fn failed<T>(&self, r: Result<T>) -> Result<T> {
        if r.is_err() {
            self.stats.errors.fetch_add(1, Ordering::Relaxed);
        }
        r
    }

    /// Per id: is the block published? One batch. Storage that cannot
    /// answer: every id is a miss.
    pub fn lookup(&self, ids: &[BlockId]) -> Vec<bool> {
        if ids.is_empty() {
            return Vec::new();
        }
        let keys: Vec<String> = ids.iter().map(|id| self.published(id)).collect();
        match self.failed(self.backend.exists(&keys)) {
            Ok(v) if v.len() == ids.len() => v,
            Ok(_) => vec![false; ids.len()],
            Err(e) => {
                log::debug!("remote lookup: {e}");
                vec![false; ids.len()]
            }
        }
    }

    /// Leading ids published.
    pub fn lookup_on_prefix(&self, ids: &[BlockId]) -> usize {
        self.lookup(ids).iter().take_while(|&&p| p).count()
    }

    /// Writes blocks, each with all its shards in shard order: per block the
    /// shards, then its header once they are stored. One batch for all of
    /// them; a failure fails every block of the call (some may still be
    /// stored whole: a reported failure is never a wrong hit).
    pub fn write_blocks(&self, blocks: &[(BlockId, Vec<&[u8]>)]) -> Vec<(BlockId, Result<()>)> {
        let g = self.cfg.geometry;
        let mut batch = Vec::with_capacity(blocks.len());
        let mut heads = Vec::with_capacity(blocks.len());
        let mut bad = Vec::new();
        for (id, shards) in blocks {
            if shards.len() != g.shards_per_block as usize
                || shards.iter().any(|s| s.len() != g.shard_bytes)
            {
                bad.push(*id);
                continue;
            }
            let crcs: Vec<u32> = shards.iter().map(|s| crc32c::crc32c(s)).collect();
            let mut h = vec![0u8; header::header_len(g)];
            header::write_header(g, id, &crcs, &mut h);
            heads.push(h);
        }
        let layout = self.backend.layout();
        // Object layout: the header then the shards, one value per block.
        let objects: Vec<Vec<u8>> = if layout == Layout::Object {
            blocks
                .iter()
                .filter(|(id, _)| !bad.contains(id))
                .zip(&heads)
                .map(|((_, shards), h)| {
                    let mut o = Vec::with_capacity(h.len() + g.shard_bytes * shards.len());
                    o.extend_from_slice(h);
                    shards.iter().for_each(|s| o.extend_from_slice(s));
                    o
                })
                .collect()
        } else {
            Vec::new()
        };
        let mut heads = heads.iter();
        let mut objects = objects.iter();
        for (id, shards) in blocks.iter().filter(|(id, _)| !bad.contains(id)) {
            let kv: Vec<(String, &[u8])> = match layout {
                Layout::Object => objects
                    .next()
                    .map(|o| vec![(self.key(id, "block"), o.as_slice())])
                    .unwrap_or_default(),
                Layout::Keys => {
                    let mut kv: Vec<(String, &[u8])> = shards
                        .iter()
                        .enumerate()
                        .map(|(i, s)| (self.key(id, &i.to_string()), *s))
                        .collect();
                    if let Some(h) = heads.next() {
                        kv.push((self.key(id, "pub"), h.as_slice()));
                    }
                    kv
                }
            };
            batch.push(kv);
        }
        let r = if batch.is_empty() {
            Ok(())
        } else {
            self.failed(self.backend.put(&batch))
        }
        .map_err(std::sync::Arc::new);
        if r.is_ok() {
            self.stats
                .written
                .fetch_add(batch.len() as u64, Ordering::Relaxed);
        }
        blocks
            .iter()
            .map(|(id, _)| {
                let res = if bad.contains(id) {
                    Err(StoreError::Config(ConfigError::BlockShape {
                        shards: g.shards_per_block,
                        shard_bytes: g.shard_bytes,
                    }))
                } else {
                    r.as_ref().map(|_| ()).map_err(again)
                };
                (*id, res)
            })
            .collect()
    }

    /// Reads shards `shards` of block `id`, checked against its header.
    /// `Ok(None)`: not published, or damaged (a missing or wrong shard: its
    /// keys are deleted); `Err`: the storage failed.
    pub fn read_shards(&self, id: &BlockId, shards: &[u32]) -> RemoteRead {
        self.read_many(&[(*id, shards.to_vec())])
            .pop()
            .unwrap_or(Ok(None))
    }

    /// [`RemoteTier::read_shards`] of many blocks in one batch. A storage
    /// failure fails every block of the call.
    pub fn read_many(&self, reqs: &[(BlockId, Vec<u32>)]) -> Vec<RemoteRead> {
        let g = self.cfg.geometry;
        let out: Vec<Option<RemoteRead>> = reqs
            .iter()
            .map(|(_, shards)| shards.iter().find_map(|&s| g.check_shard(s).err()).map(Err))
            .collect();
        let wanted: Vec<(BlockId, &[u32])> = reqs
            .iter()
            .zip(&out)
            .filter(|(_, o)| o.is_none())
            .map(|((id, shards), _)| (*id, shards.as_slice()))
            .collect();
        if wanted.is_empty() {
            return out.into_iter().flatten().collect();
        }
        let replies = match self.backend.layout() {
            Layout::Keys => self.fetch_keys(&wanted),
            Layout::Object => self.fetch_objects(&wanted),
        };
        let replies = match self.failed(replies) {
            Ok(r) if r.len() == wanted.len() => r,
            r => {
                let e = std::sync::Arc::new(match r {
                    Err(e) => e,
                    Ok(_) => StoreError::Config(ConfigError::ReplyLength),
                });
                return out
                    .into_iter()
                    .map(|o| o.unwrap_or_else(|| Err(again(&e))))
                    .collect();
            }
        };
        let mut replies = replies.into_iter();
        let mut damaged = Vec::new();
        let mut read = 0u64;
        let result = reqs
            .iter()
            .zip(out)
            .map(|((id, shards), o)| {
                if let Some(r) = o {
                    return r;
                }
                let (head, vals) = match replies.next() {
                    None | Some(Reply::Absent) => return Ok(None),
                    Some(Reply::Damaged) => {
                        damaged.push(*id);
                        return Ok(None);
                    }
                    Some(Reply::Parts(head, vals)) => (head, vals),
                };
                let whole = vals.len() == shards.len()
                    && header::parse_header(g, id, &head).is_some_and(|crcs| {
                        vals.iter().zip(shards).all(|(v, &s)| {
                            v.as_ref().is_some_and(|v| {
                                v.len() == g.shard_bytes && crc32c::crc32c(v) == crcs[s as usize]
                            })
                        })
                    });
                if !whole {
                    damaged.push(*id);
                    return Ok(None);
                }
                read += 1;
                Ok(Some(vals.into_iter().flatten().collect()))
            })
            .collect();
        self.stats.read.fetch_add(read, Ordering::Relaxed);
        if !damaged.is_empty() {
            self.stats
                .damaged
                .fetch_add(damaged.len() as u64, Ordering::Relaxed);
            // Best effort: a failed delete leaves blocks that read as a
            // miss again.
            let _ = self.delete(&damaged);
        }
        result
    }

    /// The key layout: the header and the shards asked, one batch.
    fn fetch_keys(&self, wanted: &[(BlockId, &[u32])]) -> Result<Vec<Reply>> {
        let mut keys = Vec::new();
        for (id, shards) in wanted {
            keys.push(self.key(id, "pub"));
            keys.extend(shards.iter().map(|s| self.key(id, &s.to_string())));
        }
        let got = self.backend.get(&keys)?;
        if got.len() != keys.len() {
            return Ok(Vec::new());
        }
        let mut values = got.into_iter();
        Ok(wanted
            .iter()
            .map(|(_, shards)| {
                let head = values.next().flatten();
                let vals: Vec<Option<Vec<u8>>> = values.by_ref().take(shards.len()).collect();
                match head {
                    None => Reply::Absent,
                    Some(h) => Reply::Parts(h, vals),
                }
            })
            .collect())
    }

    /// The object layout: per block, the header's byte range and each
    /// shard's, one batch.
    fn fetch_objects(&self, wanted: &[(BlockId, &[u32])]) -> Result<Vec<Reply>> {
        let g = self.cfg.geometry;
        let hl = header::header_len(g) as u64;
        let sb = g.shard_bytes as u64;
        let expected = hl + sb * u64::from(g.shards_per_block);
        let asked: Vec<(String, Vec<std::ops::Range<u64>>)> = wanted
            .iter()
            .map(|(id, shards)| {
                let mut ranges = Vec::with_capacity(shards.len() + 1);
                ranges.push(0..hl);
                ranges.extend(shards.iter().map(|&s| {
                    let at = hl + sb * u64::from(s);
                    at..at + sb
                }));
                (self.key(id, "block"), ranges)
            })
            .collect();
        Ok(self
            .backend
            .get_ranges(&asked, expected)?
            .into_iter()
            .map(|r| match r {
                None => Reply::Absent,
                Some(Err(_size)) => Reply::Damaged,
                Some(Ok(mut parts)) if !parts.is_empty() => {
                    let head = parts.remove(0);
                    Reply::Parts(head, parts.into_iter().map(Some).collect())
                }
                Some(Ok(_)) => Reply::Damaged,
            })
            .collect())
    }

    /// Deletes blocks: every header first, then the shards, so none is
    /// ever half visible.
    pub fn delete(&self, ids: &[BlockId]) -> Result<()> {
        let heads: Vec<String> = ids.iter().map(|id| self.published(id)).collect();
        self.failed(self.backend.delete(&heads))?;
        if self.backend.layout() == Layout::Object {
            return Ok(());
        }
        let shards: Vec<String> = ids
            .iter()
            .flat_map(|id| {
                (0..self.cfg.geometry.shards_per_block).map(move |s| self.key(id, &s.to_string()))
            })
            .collect();
        self.failed(self.backend.delete(&shards))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geometry() -> Geometry {
        Geometry {
            shard_bytes: 4096,
            shards_per_block: 2,
        }
    }

    #[test]
    fn a_url_parses_the_same_in_every_build() {
        let r = RemoteConfig::from_url("redis://127.0.0.1:7000,h:7001", "ns", geometry()).unwrap();
        assert_eq!(
            r.endpoint,
            Endpoint::Redis(vec![
                "redis://127.0.0.1:7000".into(),
                "redis://h:7001".into()
            ])
        );
        let s = RemoteConfig::from_url("s3://bucket/a/b?region=eu", "ns", geometry()).unwrap();
        assert!(matches!(&s.endpoint, Endpoint::S3(l) if l.prefix == "a/b"));
        assert!(RemoteConfig::from_url("http://x:1", "ns", geometry()).is_err());
    }

    /// A build without a backend refuses its tier by name: a plain
    /// `cargo test -p ucm-store` runs these.
    #[test]
    fn a_backend_left_out_of_the_build_is_refused_by_name() {
        let redis = RemoteConfig::from_url("redis://127.0.0.1:1", "ns", geometry()).unwrap();
        let s3 =
            RemoteConfig::from_url("s3://bucket?endpoint=http://127.0.0.1:1", "ns", geometry())
                .unwrap();
        for (cfg, feature, built) in [
            (redis, "redis", cfg!(feature = "redis")),
            (s3, "s3", cfg!(feature = "s3")),
        ] {
            match RemoteTier::new(cfg) {
                Err(StoreError::NotBuilt { feature: f, .. }) => {
                    assert!(!built, "{feature} is built in");
                    assert_eq!(f, feature);
                }
                Ok(_) => assert!(built, "{feature} is not built in"),
                Err(e) => panic!("{feature}: {e}"),
            }
        }
    }
}
