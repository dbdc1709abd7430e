//! The Redis / Valkey cluster backend of the remote tier: the `redis`
//! crate's synchronous cluster client (no async runtime), one connection
//! behind a mutex, pipelines grouped per master by the client.
//!
//! Keys carry the block's id as a hash tag (`{<hex>}`), so a block's
//! shards and header live in one slot of one master and the header, sent
//! after them on the same connection, is never stored before them.

use std::sync::Mutex;
use std::time::Duration;

use redis::cluster::{cluster_pipe, ClusterClient, ClusterClientBuilder, ClusterConnection};

use super::{Backend, Layout};
use crate::error::{ConfigError, Result, StoreError};

/// A Redis or Valkey cluster.
pub(super) struct RedisBackend {
    nodes: Vec<String>,
    timeout: Duration,
    client: ClusterClient,
    conn: Mutex<Option<ClusterConnection>>,
}

impl RedisBackend {
    pub(super) fn new(nodes: &[String], timeout: Duration) -> Result<Self> {
        let client = ClusterClientBuilder::new(nodes.to_vec())
            .connection_timeout(timeout)
            .response_timeout(timeout)
            .retries(1)
            .min_retry_wait(10)
            .max_retry_wait(50)
            .build()
            .map_err(|source| StoreError::Remote {
                op: "configure the client",
                source,
            })?;
        Ok(RedisBackend {
            nodes: nodes.to_vec(),
            timeout,
            client,
            conn: Mutex::new(None),
        })
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
            let c = self
                .client
                .get_connection()
                .map_err(|source| StoreError::Remote {
                    op: "connect",
                    source,
                })?;
            let _ = c.set_read_timeout(Some(self.timeout));
            let _ = c.set_write_timeout(Some(self.timeout));
            *guard = Some(c);
        }
        let Some(conn) = guard.as_mut() else {
            return Err(StoreError::Config(ConfigError::NoRemote("connection")));
        };
        f(conn).map_err(|source| {
            *guard = None;
            StoreError::Remote { op, source }
        })
    }
}

impl Backend for RedisBackend {
    fn layout(&self) -> Layout {
        Layout::Keys
    }

    fn key(&self, base: &[&str], hex: &str, part: &str) -> String {
        let mut k = String::with_capacity(64);
        for b in base {
            k.push_str(b);
            k.push(':');
        }
        k.push('{');
        k.push_str(hex);
        k.push_str("}:");
        k.push_str(part);
        k
    }

    fn exists(&self, keys: &[String]) -> Result<Vec<bool>> {
        let mut p = cluster_pipe();
        for k in keys {
            p.cmd("EXISTS").arg(k);
        }
        let v = self.with_conn("lookup", |c| p.query::<Vec<i64>>(c))?;
        Ok(v.into_iter().map(|n| n > 0).collect())
    }

    fn get(&self, keys: &[String]) -> Result<Vec<Option<Vec<u8>>>> {
        let mut p = cluster_pipe();
        for k in keys {
            p.cmd("GET").arg(k);
        }
        self.with_conn("read", |c| p.query(c))
    }

    fn put(&self, blocks: &[Vec<(String, &[u8])>]) -> Result<()> {
        // In order on one connection: a block's header after its shards.
        let mut p = cluster_pipe();
        for (k, v) in blocks.iter().flatten() {
            p.cmd("SET").arg(k).arg(*v).ignore();
        }
        self.with_conn("write", |c| p.query::<()>(c))
    }

    fn delete(&self, keys: &[String]) -> Result<()> {
        let mut p = cluster_pipe();
        for k in keys {
            p.cmd("DEL").arg(k).ignore();
        }
        self.with_conn("delete", |c| p.query::<()>(c))
    }

    fn describe(&self) -> String {
        format!("redis cluster {:?}", self.nodes)
    }
}
