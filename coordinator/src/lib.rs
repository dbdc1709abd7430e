//! # ucm-coordinator: spec table, hashing, hit resolution, checkpoints
//!
//! The decision modules ([`spec`], [`hash`], [`resolve`], [`directory`],
//! [`retention`], [`ceiling`]) never import the HAL and never move bytes: they see
//! stores only through the narrow [`resolve::Presence`] interface and the
//! [`directory::CheckpointDirectory`]. The [`adapter`] is the only module
//! that moves bytes: it maps layers to access units and shards and drives
//! the stores behind the engine's hooks.
//!
//! The hash encoding is documented byte by byte in [`hash`].

#![deny(missing_docs)]

pub mod adapter;
pub mod ceiling;
pub mod directory;
pub mod error;
pub mod hash;
pub mod identity;
pub mod resolve;
pub mod retention;
pub mod spec;

pub use directory::{CheckpointDirectory, CheckpointSource};
pub use error::{
    CoordError, GroupProblem, LayersError, MetaProblem, RequestError, Result, SpecError,
};
pub use hash::{Deployment, RequestHashes, RequestKeys};
pub use identity::{Identity, IdentityRow};
pub use resolve::{resolve_hit, Checkpoints, Presence, Resolution};
pub use spec::{AccessUnit, Group, Kind, RankRule, RetentionPolicy, SpecTable};
pub use ucm_store as store;
