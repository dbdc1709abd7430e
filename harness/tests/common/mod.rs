//! The small model every adapter test runs: one group of each unit kind.

#![allow(dead_code)]

use std::path::Path;
use std::sync::Arc;

use ucm_coordinator::adapter::StoreSetConfig;
use ucm_coordinator::SpecTable;
use ucm_harness::{Engine, EngineConfig};

pub const SPEC: &str = r#"
model = "adapter-test"
num_layers = 8
[[group]]
name = "attn"
kind = "chain"
block_size = 16
layers = "0-1"
bytes_per_token = 256
rank_rule = "RULE"
[[group]]
name = "row"
kind = "chain"
block_size = 16
layers = "2-3"
bytes_per_token = 128
access_unit = "row"
[[group]]
name = "swa"
kind = "chain"
block_size = 16
window = 32
layers = "4"
bytes_per_token = 256
[[group]]
name = "idx"
kind = "sidecar"
source = "attn"
layers = "5"
bytes_per_token = 256
[[group]]
name = "state"
kind = "snapshot"
grid = 16
state_bytes = 4096
layers = "6"
retention = { interval = 64 }
[[group]]
name = "x"
kind = "none"
layers = "7"
bytes_per_token = 64
"#;

pub fn spec(rule: &str) -> Arc<SpecTable> {
    Arc::new(SpecTable::from_toml(&SPEC.replace("RULE", rule)).unwrap())
}

pub fn tokens(seed: u64, n: usize) -> Vec<u32> {
    ucm_coordinator::hash::seeded_tokens(seed, n)
}

/// The engine configuration of the tests: 512 pool slots per group.
pub fn config(rule: &str, path: &Path) -> EngineConfig {
    let mut c = EngineConfig::new(spec(rule), path, 256);
    c.stores = StoreSetConfig {
        pool_slots: 512,
        ..StoreSetConfig::default()
    };
    c
}

pub fn engine(rule: &str, path: &Path) -> Engine {
    Engine::open(config(rule, path)).unwrap()
}
