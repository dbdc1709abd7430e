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
    Config(ConfigError),
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
    /// The failure of a whole batch, reported for each of its blocks.
    #[error("{0}")]
    Batch(std::sync::Arc<StoreError>),
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

/// What is wrong with a store's configuration ([`StoreError::Config`]).
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A setting outside what it takes.
    #[error("{field} {value} (expected {expected})")]
    Value {
        /// The setting.
        field: &'static str,
        /// Its value, as text (untrusted text cut to 64 characters).
        value: String,
        /// What it takes.
        expected: &'static str,
    },
    /// `/dev/shm` has less room than the pool needs.
    #[error("/dev/shm has {free_mib} MiB free, the pool needs {needed_mib} MiB: enlarge /dev/shm or shrink the pool")]
    ShmFull {
        /// Free MiB.
        free_mib: u64,
        /// MiB the pool needs.
        needed_mib: u64,
    },
    /// A shared-pool segment of another size (another geometry, or stale).
    #[error("{path:?} is {len} bytes, this pool needs {needed}: another geometry or a stale segment (remove it)")]
    SegmentSize {
        /// The segment.
        path: PathBuf,
        /// Its size.
        len: u64,
        /// The size this pool needs.
        needed: u64,
    },
    /// A shared-pool segment whose creator never finished it.
    #[error("shared pool {path:?} never finished initialising (stale segment?)")]
    SegmentNotReady {
        /// The segment.
        path: PathBuf,
    },
    /// A shared pool made by a build of another pool format (a segment
    /// left by an older UCM while the processes using it still run, or
    /// after they crashed).
    #[error(
        "shared pool {path:?} has pool format {found}, this build uses {wanted}: stop the \
         processes that use it, then remove it"
    )]
    PoolVersion {
        /// The segment.
        path: PathBuf,
        /// Its format version.
        found: u32,
        /// This build's.
        wanted: u32,
    },
    /// A shared pool made for another geometry.
    #[error("shared pool {path:?} has another geometry ({found}; wanted {wanted})")]
    PoolGeometry {
        /// The segment.
        path: PathBuf,
        /// Its geometry.
        found: String,
        /// This pool's.
        wanted: String,
    },
    /// A buffer or region too small for what it must hold.
    #[error("{what} of {len} bytes where {needed} are needed")]
    BufferSize {
        /// The buffer.
        what: &'static str,
        /// Its length.
        len: usize,
        /// What it must hold.
        needed: usize,
    },
    /// A block given with another number or size of shards.
    #[error("a block needs {shards} shards of {shard_bytes} bytes")]
    BlockShape {
        /// Shards per block.
        shards: u32,
        /// Bytes per shard.
        shard_bytes: usize,
    },
    /// A store with neither a disk nor a remote tier.
    #[error("a store without a disk needs a remote tier")]
    NoTier,
    /// A store set with neither a disk, a remote nor a cold tier.
    #[error("a store without a disk tier needs a remote or a cold tier")]
    NoTierForSet,
    /// A name that becomes a path or a shared segment is not plain.
    #[error(transparent)]
    Name(#[from] NameError),
    /// A remote tier of another geometry than the store's.
    #[error("a remote tier's geometry ({remote}) is not the store's ({store})")]
    RemoteGeometry {
        /// The remote tier's.
        remote: String,
        /// The store's.
        store: String,
    },
    /// A remote tier with no node to talk to, or no live connection.
    #[error("remote tier: no {0}")]
    NoRemote(&'static str),
    /// A remote backend asked for the layout of the other kind.
    #[error("this remote backend stores blocks as {has}, not {asked}")]
    RemoteLayout {
        /// What it stores blocks as.
        has: &'static str,
        /// What was asked for.
        asked: &'static str,
    },
    /// A remote read answered with a reply of the wrong length.
    #[error("remote read: a reply of the wrong length")]
    ReplyLength,
    /// The S3 tier's async runtime could not start.
    #[error("S3 tier: no runtime: {0}")]
    Runtime(#[source] std::io::Error),
}

impl From<ConfigError> for StoreError {
    fn from(e: ConfigError) -> Self {
        StoreError::Config(e)
    }
}

/// A [`ConfigError::Value`].
pub(crate) fn bad_value(
    field: &'static str,
    value: impl std::fmt::Display,
    expected: &'static str,
) -> StoreError {
    StoreError::Config(ConfigError::Value {
        field,
        value: value.to_string(),
        expected,
    })
}

/// A name that is not a plain identifier ([`check_name`](crate::paths::check_name)).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "{what} {name:?} is not a plain name (1-64 letters, digits, `_` or `-`, \
     starting with a letter or digit)"
)]
pub struct NameError {
    /// The field (`group name`, `shared pool prefix`).
    pub what: &'static str,
    /// The name given, cut to 64 characters, control characters replaced.
    pub name: String,
}

/// Result alias of the `store` crate.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;
