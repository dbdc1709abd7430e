//! The spec-table parser takes arbitrary input without panicking or
//! allocating without bound: random bytes, and random mutations of a real
//! table (numbers, layer ranges and names replaced by hostile values).
//! `UCM_FUZZ_CASES` sets the case count (default 512; `.ci/run` runs more).

use proptest::prelude::*;
use ucm_coordinator::SpecTable;

fn cases() -> u32 {
    std::env::var("UCM_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(512)
}

const BASE: &str = include_str!("../../specs/x-hybrid-96.toml");

fn hostile_value() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("0".to_string()),
        Just("-1".to_string()),
        Just("4294967295".to_string()),
        Just("9223372036854775807".to_string()),
        Just("1e308".to_string()),
        Just("nan".to_string()),
        Just("\"0-4294967295\"".to_string()),
        Just("\"../..\"".to_string()),
        Just("\"/etc/passwd\"".to_string()),
        Just("[4294967295, 0]".to_string()),
        Just("\"\"".to_string()),
        any::<u64>().prop_map(|v| v.to_string()),
        "[ -~]{0,40}".prop_map(|s| format!("{s:?}")),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        let _ = SpecTable::from_toml(&String::from_utf8_lossy(&bytes));
    }

    #[test]
    fn mutated_real_tables_never_panic(picks in proptest::collection::vec((any::<prop::sample::Index>(), hostile_value()), 1..6)) {
        let mut lines: Vec<String> = BASE.lines().map(String::from).collect();
        let assignable: Vec<usize> = (0..lines.len()).filter(|&i| lines[i].contains(" = ")).collect();
        for (ix, v) in picks {
            let i = assignable[ix.index(assignable.len())];
            let key = lines[i].split(" = ").next().unwrap_or("x").to_string();
            lines[i] = format!("{key} = {v}");
        }
        if let Ok(t) = SpecTable::from_toml(&lines.join("\n")) {
            // What validates is usable: every size is bounded.
            for g in t.groups() {
                prop_assert!(g.layers.len() <= ucm_coordinator::spec::MAX_LAYERS as usize);
                let _ = g.bytes_per_layer_block(t.block_of(g.index));
            }
            let _ = (t.chain_grid(), t.common_grid(), t.layer_count());
        }
    }
}
