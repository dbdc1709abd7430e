//! The remote tiers: blocks on storage that many engine instances (on many
//! machines) share, below the disk tier: a Redis or Valkey cluster
//! ([`redis`]) and S3-compatible object storage ([`s3`], the cold tier).
//! One layout and one check for both; a backend only moves keys and bytes.
//!
//! **Layout.** Block `id` of an instance of geometry `S x N` (shard bytes
//! by shards) in namespace `ns` is N shard values and one "published"
//! value:
//!
//! ```text
//! Redis: ucm:<ns>:<S>x<N>:{<hex id>}:<i>       S3: [<prefix>/]ucm/<ns>/<S>x<N>/<hex id>/<i>
//!        ucm:<ns>:<S>x<N>:{<hex id>}:pub           [<prefix>/]ucm/<ns>/<S>x<N>/<hex id>/pub
//! ```
//!
//! `pub` holds the disk tier's block-file header (one format): geometry,
//! id, a CRC32C per shard, its own CRC32C. A write stores the shards, then
//! the header only once they are stored, so the header is never visible
//! before its shards: a crash or a lost connection mid-write leaves the
//! block invisible, never half there. (Redis: one hash tag per block, so
//! its keys share a master and one connection orders them; S3: a PUT is
//! atomic per object, the header's PUT starts after the shards' succeeded.)
//!
//! **Presence** is the header's existence, batched (Redis: one pipeline; S3:
//! concurrent HEADs). **A read** fetches the header and the shards and
//! checks every shard against the header: a missing shard (evicted by the
//! server's `maxmemory` policy, expired by a bucket's lifecycle rule), a
//! wrong length or a checksum mismatch is a miss, and the block's keys are
//! deleted. Geometry is part of the key, so instances of another geometry
//! never meet.
//!
//! **Faults.** Every call is bounded by the configured timeout. A backend
//! that is down or slow makes lookups and reads miss (and counts the error)
//! and writes fail with a typed error ([`StoreError::Remote`],
//! [`StoreError::ObjectStore`], [`StoreError::Timeout`]).

mod redis;
mod s3;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::error::{Result, StoreError};
use crate::geometry::{BlockId, Geometry};
use crate::header;

pub use self::s3::S3Location;

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
            Endpoint::Redis(redis::nodes_from_url(url)?)
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
            return Err(StoreError::Config("remote tier: no node".into()));
        }
        let ns_ok = !self.namespace.is_empty()
            && self.namespace.len() <= MAX_NAMESPACE
            && self
                .namespace
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c));
        if !ns_ok {
            return Err(StoreError::Config(format!(
                "remote tier namespace `{}` must be 1-{MAX_NAMESPACE} letters, digits, `_`, `-` or `.`",
                shown(&self.namespace)
            )));
        }
        if self.timeout.is_zero() {
            return Err(StoreError::Config("remote tier: a zero timeout".into()));
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

/// What a backend does: keys and bytes, in batches.
trait Backend: Send + Sync {
    /// The key of `part` (`pub` or a shard index) of the block whose id is
    /// `hex`, under `base` (`ucm`, namespace, geometry).
    fn key(&self, base: &[&str], hex: &str, part: &str) -> String;
    /// Per key: does it exist?
    fn exists(&self, keys: &[String]) -> Result<Vec<bool>>;
    /// Per key: its value, `None` when absent.
    fn get(&self, keys: &[String]) -> Result<Vec<Option<Vec<u8>>>>;
    /// Per block, its values in order; the last (the header) is stored
    /// only after every other of its block is.
    fn put(&self, blocks: &[Vec<(String, &[u8])>]) -> Result<()>;
    /// Deletes keys (absent ones are fine).
    fn delete(&self, keys: &[String]) -> Result<()>;
    /// A description for logs.
    fn describe(&self) -> String;
}

/// The same failure again, for each block of a batch that failed as one.
pub(crate) fn again(e: &StoreError) -> StoreError {
    match e {
        StoreError::Remote { op, source } => StoreError::Remote {
            op,
            source: source.clone(),
        },
        StoreError::ObjectStore { op, source } => StoreError::ObjectStore {
            op,
            source: std::sync::Arc::clone(source),
        },
        StoreError::Timeout { op, after } => StoreError::Timeout { op, after: *after },
        other => StoreError::Config(other.to_string()),
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

/// The lowercase hex of `id`.
fn hex(id: &BlockId) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(32);
    for b in id {
        out.push(DIGITS[usize::from(b >> 4)] as char);
        out.push(DIGITS[usize::from(b & 15)] as char);
    }
    out
}

impl RemoteTier {
    /// A tier on the servers of `cfg` (a Redis cluster is not contacted
    /// yet; an S3 client is built, without a request).
    pub fn new(cfg: RemoteConfig) -> Result<Self> {
        cfg.validate()?;
        let backend: Box<dyn Backend> = match &cfg.endpoint {
            Endpoint::Redis(nodes) => Box::new(redis::RedisBackend::new(nodes, cfg.timeout)?),
            Endpoint::S3(loc) => Box::new(s3::S3Backend::new(loc, cfg.timeout)?),
        };
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
        let keys: Vec<String> = ids.iter().map(|id| self.key(id, "pub")).collect();
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
        let mut heads = heads.iter();
        for (id, shards) in blocks.iter().filter(|(id, _)| !bad.contains(id)) {
            let mut kv: Vec<(String, &[u8])> = shards
                .iter()
                .enumerate()
                .map(|(i, s)| (self.key(id, &i.to_string()), *s))
                .collect();
            if let Some(h) = heads.next() {
                kv.push((self.key(id, "pub"), h.as_slice()));
            }
            batch.push(kv);
        }
        let r = if batch.is_empty() {
            Ok(())
        } else {
            self.failed(self.backend.put(&batch))
        };
        if r.is_ok() {
            self.stats
                .written
                .fetch_add(batch.len() as u64, Ordering::Relaxed);
        }
        blocks
            .iter()
            .map(|(id, _)| {
                let res = if bad.contains(id) {
                    Err(StoreError::Config(format!(
                        "a block of {} shards of {} bytes was expected",
                        g.shards_per_block, g.shard_bytes
                    )))
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
        let mut out: Vec<Option<RemoteRead>> = Vec::with_capacity(reqs.len());
        let mut keys = Vec::new();
        for (id, shards) in reqs {
            if let Some(e) = shards.iter().find_map(|&s| g.check_shard(s).err()) {
                out.push(Some(Err(e)));
                continue;
            }
            keys.push(self.key(id, "pub"));
            keys.extend(shards.iter().map(|s| self.key(id, &s.to_string())));
            out.push(None);
        }
        if out.iter().all(Option::is_some) {
            return out.into_iter().flatten().collect();
        }
        let got = match self.failed(self.backend.get(&keys)) {
            Ok(v) if v.len() == keys.len() => v,
            Ok(_) => {
                let e = StoreError::Config("remote read: a reply of the wrong length".into());
                return out
                    .into_iter()
                    .map(|o| o.unwrap_or_else(|| Err(again(&e))))
                    .collect();
            }
            Err(e) => {
                return out
                    .into_iter()
                    .map(|o| o.unwrap_or_else(|| Err(again(&e))))
                    .collect();
            }
        };
        let mut values = got.into_iter();
        let mut damaged = Vec::new();
        let mut read = 0u64;
        let result = reqs
            .iter()
            .zip(out)
            .map(|((id, shards), o)| {
                if let Some(r) = o {
                    return r;
                }
                let head = values.next().flatten();
                let vals: Vec<Option<Vec<u8>>> = values.by_ref().take(shards.len()).collect();
                let Some(head) = head else {
                    return Ok(None);
                };
                let crcs = header::parse_header(g, id, &head);
                let whole = crcs.as_ref().is_some_and(|crcs| {
                    vals.len() == shards.len()
                        && vals.iter().zip(shards).all(|(v, &s)| {
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

    /// Deletes blocks: every header first, then the shards, so none is
    /// ever half visible.
    pub fn delete(&self, ids: &[BlockId]) -> Result<()> {
        let heads: Vec<String> = ids.iter().map(|id| self.key(id, "pub")).collect();
        self.failed(self.backend.delete(&heads))?;
        let shards: Vec<String> = ids
            .iter()
            .flat_map(|id| {
                (0..self.cfg.geometry.shards_per_block).map(move |s| self.key(id, &s.to_string()))
            })
            .collect();
        self.failed(self.backend.delete(&shards))
    }
}
