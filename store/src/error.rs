//! The one error type of the `store` crate.

use std::path::PathBuf;

use ucm_device::DeviceError;

/// Everything the store can report.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The HAL (an I/O engine or a device) failed.
    #[error(transparent)]
    Device(#[from] DeviceError),
    /// A file-system call outside the I/O engine failed.
    #[error("{op} {path:?}: {source}")]
    Fs {
        /// What was attempted.
        op: &'static str,
        /// The path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A path beneath the store's root is not what the store made (a
    /// symbolic link, a file where a directory belongs, an oversized
    /// marker): refused, never followed or echoed.
    #[error("refusing {path:?}: it {why}")]
    Unsafe {
        /// The path.
        path: PathBuf,
        /// What is wrong with it.
        why: String,
    },
    /// A configuration value is unusable.
    #[error("bad store configuration: {0}")]
    Config(String),
    /// The directory belongs to an instance of another geometry.
    #[error("{path:?} holds a store of another geometry ({found}); expected {expected}")]
    GeometryMismatch {
        /// The geometry marker file.
        path: PathBuf,
        /// What the directory holds.
        found: String,
        /// What this instance was built with.
        expected: String,
    },
    /// The task queue is full: back off and resubmit. Nothing was dropped.
    #[error("the store's task queue is full; the task was not accepted")]
    QueueFull,
    /// Every slot of the key's pool bucket is pinned or loading: retry
    /// later. Nothing was dropped.
    #[error("every pool slot the key may use is pinned or loading; retry later")]
    PoolFull,
    /// The remote tier's servers failed, refused or did not answer in time
    /// (`op` says what was attempted).
    #[cfg(feature = "redis")]
    #[error("remote tier: {op}: {source}")]
    Remote {
        /// What was attempted.
        op: &'static str,
        /// The client's error (its kind tells a timeout from a refusal).
        #[source]
        source: redis::RedisError,
    },
    /// The S3 tier's object store failed or refused (`op` says what was
    /// attempted).
    #[cfg(feature = "s3")]
    #[error("S3 tier: {op}: {source}")]
    ObjectStore {
        /// What was attempted.
        op: &'static str,
        /// The client's error (shared: one failure of a batch is reported
        /// for each of its blocks).
        #[source]
        source: std::sync::Arc<object_store::Error>,
    },
    /// A tier was configured whose backend this build leaves out.
    #[error("{what} needs a build with the `{feature}` feature")]
    NotBuilt {
        /// What was asked for.
        what: &'static str,
        /// The Cargo feature that compiles it in.
        feature: &'static str,
    },
    /// A remote tier did not answer within its bound.
    #[error("remote tier: {op}: no answer within {after:?}")]
    Timeout {
        /// What was attempted.
        op: &'static str,
        /// The bound.
        after: std::time::Duration,
    },
    /// A snapshot key of another group was given to a group's store.
    #[error("a key of snapshot group {got} was given to the store of group {expected}")]
    WrongGroup {
        /// The key's group.
        got: u32,
        /// The store's group.
        expected: u32,
    },
    /// A task names one (block, shard) twice: refused whole, since two
    /// copies into or out of one slot in one task have no defined order.
    #[error("the task names block {block} shard {shard} twice; each (block, shard) at most once")]
    DuplicateItem {
        /// The block, in hex.
        block: String,
        /// The shard.
        shard: u32,
    },
    /// A request names a shard outside the geometry.
    #[error("shard {shard} out of range: the geometry has {shards} shards per block")]
    ShardOutOfRange {
        /// The shard asked for.
        shard: u32,
        /// Shards per block.
        shards: u32,
    },
}

impl StoreError {
    pub(crate) fn fs(
        op: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| StoreError::Fs { op, path, source }
    }
}

/// Result alias of the `store` crate.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;
