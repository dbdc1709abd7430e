//! The remote tier: blocks on a Redis or Valkey cluster that many engine
//! instances (on many machines) share, below the disk tier or instead of
//! it.
//!
//! **Layout.** Block `id` of an instance of geometry `S x N` (shard bytes
//! by shards) in namespace `ns` is N shard values and one "published"
//! value, all under one hash tag so they live in one slot of one master:
//!
//! ```text
//! ucm:<ns>:<S>x<N>:{<hex id>}:<i>    shard i, raw bytes
//! ucm:<ns>:<S>x<N>:{<hex id>}:pub    the block header: geometry, id, a
//!                                     CRC32C per shard, its own CRC32C
//! ```
//!
//! The header is the disk tier's block-file header (one format). A write
//! sends the shards, then the header, on one connection to the slot's
//! master, so the header is never visible before its shards: a crash or a
//! lost connection mid-write leaves the block invisible, never half there.
//!
//! **Presence** is the header's existence (`EXISTS`, pipelined: one round
//! trip per master for any number of ids). **A read** fetches the header
//! and the shards in one pipeline and checks every shard against the
//! header: a missing shard (evicted by the server's `maxmemory` policy),
//! a wrong length or a checksum mismatch is a miss, and the block's keys
//! are deleted. Geometry is part of the key, so instances of another
//! geometry never meet.
//!
//! **Faults.** Every call is bounded by the configured timeout (connect and
//! response). A cluster that is down or slow makes lookups and reads miss
//! (and counts the error) and writes fail with [`StoreError::Remote`];
//! nothing waits longer than the timeout per attempt. A failed connection
//! is dropped and re-made by the next call.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use redis::cluster::{cluster_pipe, ClusterClient, ClusterClientBuilder, ClusterConnection};

use crate::error::{Result, StoreError};
use crate::geometry::{BlockId, Geometry};
use crate::header;

/// Longest namespace accepted.
const MAX_NAMESPACE: usize = 64;

/// How the remote tier is set up.
#[derive(Clone, Debug)]
pub struct RemoteConfig {
    /// Seed nodes of the cluster, `redis://host:port` each.
    pub nodes: Vec<String>,
    /// Key namespace (letters, digits, `_`, `-`, `.`): one per store
    /// instance (group), shared by the engine instances that share blocks.
    pub namespace: String,
    /// The instance's geometry.
    pub geometry: Geometry,
    /// Bound of every connect and every response.
    pub timeout: Duration,
}

impl RemoteConfig {
    /// A configuration from a URL `redis://host:port[,host:port...]` (a
    /// Redis or Valkey cluster's seed nodes).
    pub fn from_url(url: &str, namespace: &str, geometry: Geometry) -> Result<Self> {
        let rest = url
            .strip_prefix("redis://")
            .or_else(|| url.strip_prefix("valkey://"))
            .ok_or_else(|| {
                StoreError::Config(format!(
                    "remote tier URL `{}` must start with redis:// or valkey://",
                    url.chars().take(80).collect::<String>()
                ))
            })?;
        let mut nodes = Vec::new();
        for part in rest.split(',').map(str::trim) {
            let part = part
                .strip_prefix("redis://")
                .or_else(|| part.strip_prefix("valkey://"))
                .unwrap_or(part);
            let ok = part.rsplit_once(':').is_some_and(|(host, port)| {
                !host.is_empty()
                    && host.len() <= 253
                    && host
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || "-._[]:".contains(c))
                    && port.parse::<u16>().is_ok_and(|p| p > 0)
            });
            if !ok {
                return Err(StoreError::Config(format!(
                    "remote tier URL: `{}` is not host:port",
                    part.chars().take(80).collect::<String>()
                )));
            }
            nodes.push(format!("redis://{part}"));
        }
        let cfg = RemoteConfig {
            nodes,
            namespace: namespace.to_string(),
            geometry,
            timeout: Duration::from_secs(2),
        };
        cfg.validate()?;
        Ok(cfg)
    }

    fn validate(&self) -> Result<()> {
        self.geometry.validate()?;
        if self.nodes.is_empty() {
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
                self.namespace.chars().take(80).collect::<String>()
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
/// damaged), or the cluster's failure.
pub type RemoteRead = Result<Option<Vec<Vec<u8>>>>;

/// A block store on a Redis or Valkey cluster.
pub struct RemoteTier {
    cfg: RemoteConfig,
    client: ClusterClient,
    conn: Mutex<Option<ClusterConnection>>,
    prefix: String,
    stats: RemoteStats,
}

impl std::fmt::Debug for RemoteTier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteTier")
            .field("nodes", &self.cfg.nodes)
            .field("prefix", &self.prefix)
            .finish()
    }
}

/// Appends the lowercase hex of `id` to `out`.
fn push_hex(out: &mut String, id: &BlockId) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for b in id {
        out.push(DIGITS[usize::from(b >> 4)] as char);
        out.push(DIGITS[usize::from(b & 15)] as char);
    }
}

impl RemoteTier {
    /// A tier on the cluster of `cfg` (nothing is contacted yet).
    pub fn new(cfg: RemoteConfig) -> Result<Self> {
        cfg.validate()?;
        let client = ClusterClientBuilder::new(cfg.nodes.clone())
            .connection_timeout(cfg.timeout)
            .response_timeout(cfg.timeout)
            .retries(1)
            .min_retry_wait(10)
            .max_retry_wait(50)
            .build()
            .map_err(|source| StoreError::Remote {
                op: "configure the client",
                source,
            })?;
        let g = cfg.geometry;
        let prefix = format!(
            "ucm:{}:{}x{}",
            cfg.namespace, g.shard_bytes, g.shards_per_block
        );
        Ok(RemoteTier {
            cfg,
            client,
            conn: Mutex::new(None),
            prefix,
            stats: RemoteStats::default(),
        })
    }

    /// The geometry.
    pub fn geometry(&self) -> Geometry {
        self.cfg.geometry
    }

    /// The counters.
    pub fn stats(&self) -> &RemoteStats {
        &self.stats
    }

    fn key(&self, id: &BlockId, part: &str) -> String {
        let mut k = String::with_capacity(self.prefix.len() + 36 + part.len());
        k.push_str(&self.prefix);
        k.push_str(":{");
        push_hex(&mut k, id);
        k.push_str("}:");
        k.push_str(part);
        k
    }

    /// Runs `f` on the connection (made first if needed). A failure drops
    /// the connection; one that is not a timeout (a connection reset by a
    /// restarted server, a cluster that was re-sharded) is tried once more
    /// on a new connection, so a stale connection costs no miss. Timeouts
    /// are not retried: a slow cluster must not hold the caller longer.
    fn with_conn<T>(
        &self,
        op: &'static str,
        mut f: impl FnMut(&mut ClusterConnection) -> redis::RedisResult<T>,
    ) -> Result<T> {
        match self.try_conn(op, &mut f) {
            Err(StoreError::Remote { source, .. }) if !source.is_timeout() => {
                self.try_conn(op, &mut f)
            }
            r => r,
        }
    }

    fn try_conn<T>(
        &self,
        op: &'static str,
        f: &mut impl FnMut(&mut ClusterConnection) -> redis::RedisResult<T>,
    ) -> Result<T> {
        let mut guard = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        if guard.is_none() {
            match self.client.get_connection() {
                Ok(c) => {
                    let _ = c.set_read_timeout(Some(self.cfg.timeout));
                    let _ = c.set_write_timeout(Some(self.cfg.timeout));
                    *guard = Some(c);
                }
                Err(source) => {
                    self.stats.errors.fetch_add(1, Ordering::Relaxed);
                    return Err(StoreError::Remote {
                        op: "connect",
                        source,
                    });
                }
            }
        }
        let Some(conn) = guard.as_mut() else {
            return Err(StoreError::Config("remote tier: no connection".into()));
        };
        match f(conn) {
            Ok(v) => Ok(v),
            Err(source) => {
                *guard = None;
                self.stats.errors.fetch_add(1, Ordering::Relaxed);
                Err(StoreError::Remote { op, source })
            }
        }
    }

    /// Per id: is the block published? One pipeline (a round trip per
    /// master). A cluster that cannot answer: every id is a miss.
    pub fn lookup(&self, ids: &[BlockId]) -> Vec<bool> {
        if ids.is_empty() {
            return Vec::new();
        }
        let mut p = cluster_pipe();
        for id in ids {
            p.cmd("EXISTS").arg(self.key(id, "pub"));
        }
        match self.with_conn("lookup", |c| p.query::<Vec<i64>>(c)) {
            Ok(v) if v.len() == ids.len() => v.into_iter().map(|n| n > 0).collect(),
            _ => vec![false; ids.len()],
        }
    }

    /// Leading ids published.
    pub fn lookup_on_prefix(&self, ids: &[BlockId]) -> usize {
        self.lookup(ids).iter().take_while(|&&p| p).count()
    }

    /// Writes blocks, each with all its shards in shard order: per block the
    /// shards, then its header (after them on the same connection). One
    /// pipeline for all of them; a failure fails every block of the call
    /// (some may still be stored whole: a reported failure is never a
    /// wrong hit).
    pub fn write_blocks(&self, blocks: &[(BlockId, Vec<&[u8]>)]) -> Vec<(BlockId, Result<()>)> {
        let g = self.cfg.geometry;
        let mut p = cluster_pipe();
        let mut bad = Vec::new();
        for (id, shards) in blocks {
            if shards.len() != g.shards_per_block as usize
                || shards.iter().any(|s| s.len() != g.shard_bytes)
            {
                bad.push(*id);
                continue;
            }
            let crcs: Vec<u32> = shards.iter().map(|s| crc32c::crc32c(s)).collect();
            for (i, s) in shards.iter().enumerate() {
                p.cmd("SET")
                    .arg(self.key(id, &i.to_string()))
                    .arg(*s)
                    .ignore();
            }
            let mut h = vec![0u8; header::header_len(g)];
            header::write_header(g, id, &crcs, &mut h);
            p.cmd("SET").arg(self.key(id, "pub")).arg(h).ignore();
        }
        let sent = blocks.len() - bad.len();
        let r = if sent > 0 {
            self.with_conn("write", |c| p.query::<()>(c))
        } else {
            Ok(())
        };
        if r.is_ok() {
            self.stats.written.fetch_add(sent as u64, Ordering::Relaxed);
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
                    match &r {
                        Ok(()) => Ok(()),
                        Err(StoreError::Remote { op, source }) => Err(StoreError::Remote {
                            op,
                            source: source.clone(),
                        }),
                        Err(e) => Err(StoreError::Config(e.to_string())),
                    }
                };
                (*id, res)
            })
            .collect()
    }

    /// Reads shards `shards` of block `id`, checked against its header.
    /// `Ok(None)`: not published, or damaged (a missing or wrong shard: its
    /// keys are deleted); `Err`: the cluster failed.
    pub fn read_shards(&self, id: &BlockId, shards: &[u32]) -> Result<Option<Vec<Vec<u8>>>> {
        self.read_many(&[(*id, shards.to_vec())])
            .pop()
            .unwrap_or(Ok(None))
    }

    /// [`RemoteTier::read_shards`] of many blocks in one pipeline (a round
    /// trip per master). A cluster failure fails every block of the call.
    pub fn read_many(&self, reqs: &[(BlockId, Vec<u32>)]) -> Vec<RemoteRead> {
        let g = self.cfg.geometry;
        let mut out: Vec<Option<RemoteRead>> = Vec::with_capacity(reqs.len());
        let mut p = cluster_pipe();
        for (id, shards) in reqs {
            if let Some(e) = shards.iter().find_map(|&s| g.check_shard(s).err()) {
                out.push(Some(Err(e)));
                continue;
            }
            p.cmd("GET").arg(self.key(id, "pub"));
            for s in shards {
                p.cmd("GET").arg(self.key(id, &s.to_string()));
            }
            out.push(None);
        }
        if out.iter().all(Option::is_some) {
            return out.into_iter().flatten().collect();
        }
        let got: Vec<Option<Vec<u8>>> = match self.with_conn("read", |c| p.query(c)) {
            Ok(v) => v,
            Err(e) => {
                return out
                    .into_iter()
                    .map(|o| match o {
                        Some(r) => r,
                        None => Err(match &e {
                            StoreError::Remote { op, source } => StoreError::Remote {
                                op,
                                source: source.clone(),
                            },
                            other => StoreError::Config(other.to_string()),
                        }),
                    })
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

    /// Deletes blocks (the header first, so none is ever half visible).
    pub fn delete(&self, ids: &[BlockId]) -> Result<()> {
        let mut p = cluster_pipe();
        for id in ids {
            p.cmd("DEL").arg(self.key(id, "pub")).ignore();
            for s in 0..self.cfg.geometry.shards_per_block {
                p.cmd("DEL").arg(self.key(id, &s.to_string())).ignore();
            }
        }
        self.with_conn("delete", |c| p.query::<()>(c))
    }
}
