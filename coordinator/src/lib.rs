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
//!
//! Resolving a hit: a spec table, a prompt's hashes, what the stores hold
//! (here: nothing, then every block) and which checkpoints exist. `l` is
//! the prefix every chain group holds, `p*` the part the engine may skip
//! (where every state group also holds a checkpoint):
//!
//! ```
//! use ucm_coordinator::hash::Id;
//! use ucm_coordinator::resolve::Presence;
//! use ucm_coordinator::{
//!     resolve_hit, CheckpointDirectory, Deployment, Group, RequestHashes, RequestKeys,
//!     SpecTable,
//! };
//!
//! let spec = SpecTable::from_toml(
//!     r#"
//! model = "tiny-hybrid"
//! [[group]]
//! name = "attn"
//! kind = "chain"
//! block_size = 16
//! layers = "0-1"
//! bytes_per_token = 256
//! [[group]]
//! name = "mamba"
//! kind = "snapshot"
//! grid = 64
//! layers = "2-3"
//! state_bytes = 4096
//! "#,
//! )?;
//! let tokens: Vec<u32> = (0..200).collect();
//! let hashes = RequestHashes::compute(
//!     &spec,
//!     Deployment { tp_size: 1 },
//!     &tokens,
//!     &RequestKeys::default(),
//! )?;
//!
//! /// Every block present, or none.
//! struct All(bool);
//! impl Presence for All {
//!     fn lookup(&self, _: &Group, ids: &[Id]) -> Vec<bool> {
//!         vec![self.0; ids.len()]
//!     }
//! }
//! let none = CheckpointDirectory::new();
//! let r = resolve_hit(&spec, &tokens, &hashes, &All(false), &none)?;
//! assert_eq!((r.l, r.p_star), (0, 0));
//! // Every block held, but no state checkpoint: the attention layers
//! // could resume at 192, the Mamba layers nowhere, so nothing is skipped.
//! let r = resolve_hit(&spec, &tokens, &hashes, &All(true), &none)?;
//! assert_eq!((r.l, r.p_star), (192, 0));
//! # Ok::<(), ucm_coordinator::CoordError>(())
//! ```

#![deny(missing_docs)]

pub mod adapter;
pub mod ceiling;
pub mod directory;
pub mod error;
pub mod ghosts;
pub mod group;
pub mod hash;
pub mod id;
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
