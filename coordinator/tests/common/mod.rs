//! Test doubles shared by the coordinator tests: an in-memory presence
//! keyed by real block ids.

#![allow(dead_code)]

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;

use ucm_coordinator::hash::Id;
use ucm_coordinator::{Group, Presence, SpecTable};

/// Block ids present, per group name.
#[derive(Default)]
pub struct MemPresence {
    pub held: HashMap<String, HashSet<Id>>,
}

impl MemPresence {
    pub fn put(&mut self, group: &str, ids: impl IntoIterator<Item = Id>) {
        self.held.entry(group.to_string()).or_default().extend(ids);
    }
}

impl Presence for MemPresence {
    fn lookup(&self, group: &Group, ids: &[Id]) -> Vec<bool> {
        let set = self.held.get(&group.name);
        ids.iter()
            .map(|i| set.is_some_and(|s| s.contains(i)))
            .collect()
    }
}

pub fn spec_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("specs")
        .join(name)
}

pub fn x_hybrid() -> SpecTable {
    SpecTable::load(&spec_path("x-hybrid-96.toml")).expect("x-hybrid-96.toml loads")
}

/// Deterministic tokens (splitmix64 of the seed), below 2^17.
pub fn tokens(seed: u64, n: usize) -> Vec<u32> {
    ucm_coordinator::hash::seeded_tokens(seed, n)
}
