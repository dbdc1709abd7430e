//! The adapter: the only module that moves bytes. It ties the engine's
//! layers to access units and shards ([`units`]), owns the store instances
//! ([`stores`]), and mirrors the split of vLLM's `KVConnectorBase_V1`: a
//! scheduler side ([`scheduler::Scheduler`]) that asks the coordinator how
//! much of a prompt is persisted and plans each step, and a worker side
//! ([`worker::Worker`]) that loads and saves layer by layer behind the
//! engine's hooks. No engine types appear here: a Python or C connector is
//! a thin shim over these calls.
//!
//! **Graph-captured steps.** A step captured in a CUDA graph (or an ACL
//! model-run) cannot block the host inside the capture, so it uses
//! [`worker::Worker::wait_for_layer_load_on`]: the compute stream waits for
//! the unit's loads through a host function, and the capture holds only
//! stream work. What such a step requires: `start_load_kv` runs before the
//! graph is launched (it is host work: it submits the store tasks); the
//! device must allow host functions on the captured stream; the engine's
//! blocks and state slots must be the same addresses at every replay
//! (registration is once); and `save_kv_layer`'s event must be recorded
//! inside the graph after the layer's kernels, so the store's copies wait
//! for it on the device.

pub mod identities;
pub mod scheduler;
pub mod stores;
pub mod units;
pub mod worker;

pub use scheduler::{
    Allocation, ConnectorMeta, EngineRequest, ReqMeta, Scheduled, Scheduler, StateSave,
};
pub use stores::{GroupCounters, StoreSet, StoreSetConfig, IDENTITY_MAX_IDLE};
pub use units::{Unit, UnitMap};
#[cfg(feature = "sabotage")]
pub use worker::Sabotage;
pub use worker::{
    AdapterMetrics, Finished, LayerRegistration, LoadCause, LoadError, Worker, WorkerConfig,
    DEFAULT_LOOKAHEAD,
};
