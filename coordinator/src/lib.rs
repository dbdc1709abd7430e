//! # ucm-coordinator: spec table, hashing, hit resolution and the adapter
//!
//! This crate will hold the decision modules (`SpecTable`, block hashing,
//! `resolve_hit`, the checkpoint directory, retention), which never import
//! the HAL and see stores only through a presence interface, and the
//! `adapter` module, the only one that moves bytes.
//!
//! Red line: the decision modules never touch bytes or start transfers.
//!
//! Status: skeleton. The coordinator and adapter issues fill it.

#![deny(missing_docs)]

pub use ucm_store as store;
