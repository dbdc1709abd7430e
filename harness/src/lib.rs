//! # ucm-harness: one simulated engine for every test and for `ucm replay`
//!
//! The harness plays the engine's part of the connector contract against
//! the real adapter, stores and coordinator on the host device:
//!
//! - [`layout`]: engine memory shaped like a vLLM KV cache: per layer one
//!   tensor, block-major, each block a K half then a V half; a state slot
//!   pool per snapshot layer;
//! - [`alloc`]: a block allocator whose free lists rotate, so that every
//!   request gets **other physical blocks** than the one before it;
//! - [`oracle`]: the content oracle: the bytes every block and state must
//!   hold, the poison that no content can equal, and the load range the
//!   design (DESIGN.md section 5) prescribes, computed independently of the
//!   adapter;
//! - [`driver`]: the hook driver: scheduler calls, then per step every
//!   rank and pipeline stage (threads) calls `start_load_kv`, per layer
//!   `wait_for_layer_load` and `save_kv_layer`, then `wait_for_save`; it
//!   checks every loaded byte, checks that nothing was written where the
//!   engine computes, and audits that every save reported good is held.
//!
//! **What the oracle proves.** Every block and state the engine is given is
//! poisoned before its first hook. After a unit's wait, every block the
//! design says must be loaded equals the oracle's bytes, unless the adapter
//! reported it failed (the engine recomputes it); every block the engine
//! will compute still holds the poison. So a skipped load, a load into the
//! wrong block, a stale block left from an earlier request, a state of
//! another position and a flipped byte are all caught and reported with the
//! request, group, layer and block ([`driver::WrongHit`]); a save that is
//! silently skipped is caught by the save audit ([`driver::LostSave`]).

#![deny(missing_docs)]

pub mod alloc;
pub mod driver;
pub mod io;
pub mod layout;
pub mod oracle;
pub mod scratch;

pub use driver::{
    Engine, EngineConfig, HarnessError, LostSave, Outcome, Request, StepTiming, WrongHit, WrongKind,
};
#[cfg(feature = "sabotage")]
pub use ucm_coordinator::adapter::Sabotage;
