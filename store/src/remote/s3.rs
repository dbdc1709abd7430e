//! The S3 backend of the remote tier (the cold tier): any S3-compatible
//! object store, through the `object_store` crate.
//!
//! A block is one object (header, then shards: the object layout of
//! [`super`]), written by one PUT, which is atomic, and read by byte
//! ranges. The client is asynchronous: the backend owns a small tokio
//! runtime and blocks the calling store thread on each batch, bounded by
//! the timeout (per request, and for the whole batch). Requests of a batch
//! run concurrently, [`CONCURRENCY`] at a time.

use std::sync::Arc;
use std::time::Duration;

use futures::stream::{self, StreamExt, TryStreamExt};
use object_store::aws::{AmazonS3, AmazonS3Builder, AmazonS3ConfigKey};
use object_store::path::Path;
use object_store::{ClientOptions, ObjectStore, ObjectStoreExt, PutPayload, RetryConfig};

use super::{Backend, Layout, RangedObject, S3Location};
use crate::error::{ConfigError, Result, StoreError};

/// Requests in flight per batch.
pub const CONCURRENCY: usize = 32;

/// An S3-compatible bucket.
pub(super) struct S3Backend {
    loc: S3Location,
    store: Arc<AmazonS3>,
    rt: tokio::runtime::Runtime,
    timeout: Duration,
}

fn s3_err(op: &'static str) -> impl Fn(object_store::Error) -> StoreError {
    move |e| StoreError::ObjectStore {
        op,
        source: Arc::new(e),
    }
}

impl S3Backend {
    pub(super) fn new(loc: &S3Location, timeout: Duration) -> Result<Self> {
        let mut b = AmazonS3Builder::from_env().with_bucket_name(&loc.bucket);
        if let Some(e) = &loc.endpoint {
            b = b.with_endpoint(e);
        }
        let endpoint = b.get_config_value(&AmazonS3ConfigKey::Endpoint);
        // A plain-HTTP endpoint (a local server) is allowed explicitly.
        let http = endpoint
            .as_deref()
            .is_some_and(|e| e.starts_with("http://"));
        match &loc.region {
            Some(r) => b = b.with_region(r),
            None if b.get_config_value(&AmazonS3ConfigKey::Region).is_none() => {
                b = b.with_region("us-east-1");
            }
            None => {}
        }
        let store = b
            .with_client_options(
                ClientOptions::new()
                    .with_allow_http(http)
                    .with_timeout(timeout)
                    .with_connect_timeout(timeout),
            )
            .with_retry(RetryConfig {
                max_retries: 1,
                retry_timeout: timeout,
                ..RetryConfig::default()
            })
            .build()
            .map_err(s3_err("configure the client"))?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("ucm-s3")
            .enable_all()
            .build()
            .map_err(|e| StoreError::Config(ConfigError::Runtime(e)))?;
        Ok(S3Backend {
            loc: loc.clone(),
            store: Arc::new(store),
            rt,
            timeout,
        })
    }

    /// Runs a batch, bounded by a few timeouts in all (a request, its
    /// retry, and the queueing of a batch beyond [`CONCURRENCY`]).
    fn run<T>(
        &self,
        op: &'static str,
        n: usize,
        f: impl std::future::Future<Output = Result<T>>,
    ) -> Result<T> {
        let rounds = n.div_ceil(CONCURRENCY).max(1) as u32;
        let bound = self.timeout * 2 + self.timeout * rounds.min(8);
        self.rt
            .block_on(async { tokio::time::timeout(bound, f).await })
            .map_err(|_| StoreError::Timeout { op, after: bound })?
    }
}

impl Backend for S3Backend {
    fn layout(&self) -> Layout {
        Layout::Object
    }

    fn get_ranges(
        &self,
        reqs: &[(String, Vec<std::ops::Range<u64>>)],
        expected: u64,
    ) -> Result<Vec<Option<RangedObject>>> {
        let s = &self.store;
        self.run("read", reqs.len(), async {
            stream::iter(reqs)
                .map(|(k, ranges)| async move {
                    let path = Path::from(k.as_str());
                    match s.get_ranges(&path, ranges).await {
                        Ok(parts) => Ok(Some(Ok(parts.into_iter().map(|b| b.to_vec()).collect()))),
                        Err(object_store::Error::NotFound { .. }) => Ok(None),
                        // A range that does not fit: is the object of
                        // another length (damaged), or did the server fail?
                        Err(e) => match s.head(&path).await {
                            Ok(m) if m.size != expected => Ok(Some(Err(m.size))),
                            Err(object_store::Error::NotFound { .. }) => Ok(None),
                            _ => Err(s3_err("read")(e)),
                        },
                    }
                })
                .buffered(CONCURRENCY)
                .try_collect()
                .await
        })
    }

    fn key(&self, base: &[&str], hex: &str, part: &str) -> String {
        let mut k = String::with_capacity(96);
        if !self.loc.prefix.is_empty() {
            k.push_str(&self.loc.prefix);
            k.push('/');
        }
        for b in base {
            k.push_str(b);
            k.push('/');
        }
        k.push_str(hex);
        k.push('/');
        k.push_str(part);
        k
    }

    fn exists(&self, keys: &[String]) -> Result<Vec<bool>> {
        let s = &self.store;
        self.run("lookup", keys.len(), async {
            stream::iter(keys)
                .map(|k| async move {
                    match s.head(&Path::from(k.as_str())).await {
                        Ok(_) => Ok(true),
                        Err(object_store::Error::NotFound { .. }) => Ok(false),
                        Err(e) => Err(s3_err("lookup")(e)),
                    }
                })
                .buffered(CONCURRENCY)
                .try_collect()
                .await
        })
    }

    fn put(&self, blocks: &[Vec<(String, &[u8])>]) -> Result<()> {
        let s = &self.store;
        let put = |k: &String, v: &[u8]| {
            let payload = PutPayload::from(v.to_vec());
            let path = Path::from(k.as_str());
            async move {
                s.put(&path, payload)
                    .await
                    .map(|_| ())
                    .map_err(s3_err("write"))
            }
        };
        let n: usize = blocks.iter().map(Vec::len).sum();
        self.run("write", n, async {
            // Every shard of the batch, then the headers: a header is
            // stored only once its block's shards are.
            stream::iter(
                blocks
                    .iter()
                    .flat_map(|b| b.split_last().map_or(&[][..], |(_, rest)| rest)),
            )
            .map(|(k, v)| put(k, v))
            .buffer_unordered(CONCURRENCY)
            .try_collect::<Vec<()>>()
            .await?;
            stream::iter(blocks.iter().filter_map(|b| b.last()))
                .map(|(k, v)| put(k, v))
                .buffer_unordered(CONCURRENCY)
                .try_collect::<Vec<()>>()
                .await?;
            Ok(())
        })
    }

    fn delete(&self, keys: &[String]) -> Result<()> {
        let s = &self.store;
        self.run("delete", keys.len(), async {
            stream::iter(keys)
                .map(|k| async move {
                    match s.delete(&Path::from(k.as_str())).await {
                        Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                        Err(e) => Err(s3_err("delete")(e)),
                    }
                })
                .buffer_unordered(CONCURRENCY)
                .try_collect::<Vec<()>>()
                .await?;
            Ok(())
        })
    }

    fn describe(&self) -> String {
        format!(
            "s3 bucket {} prefix {:?} at {}",
            self.loc.bucket,
            self.loc.prefix,
            self.loc
                .endpoint
                .as_deref()
                .unwrap_or("the default endpoint")
        )
    }
}
