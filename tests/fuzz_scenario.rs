//! `ucm explain`'s scenario reader takes arbitrary JSON without panicking
//! or allocating without bound: what validates against X-Hybrid-96 has a
//! bounded prompt. `UCM_FUZZ_CASES` sets the case count (default 512).

use proptest::prelude::*;
use ucm::coordinator::SpecTable;
use ucm::explain::{Scenario, MAX_TOKENS};

fn cases() -> u32 {
    std::env::var("UCM_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(512)
}

fn json_value() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<u64>().prop_map(|v| v.to_string()),
        Just("1e300".to_string()),
        Just("-1".to_string()),
        Just("null".to_string()),
        Just("{\"mla\": [[0, 18446744073709551615]]}".to_string()),
        Just("{\"mamba2\": [18446744073709551615]}".to_string()),
        Just("{\"../x\": [[0, 1]]}".to_string()),
        "[ -~]{0,20}".prop_map(|s| format!("{s:?}")),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    #[test]
    fn arbitrary_scenarios_never_panic(
        bytes in proptest::collection::vec(any::<u8>(), 0..512),
        fields in proptest::collection::vec((0usize..6, json_value()), 0..6),
    ) {
        let spec = SpecTable::load(std::path::Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/specs/x-hybrid-96.toml"
        )))
        .unwrap();
        let _ = serde_json::from_slice::<Scenario>(&bytes);
        let names = ["tokens", "seed", "held", "checkpoints", "tp_size", "cache_salt"];
        let body: Vec<String> = fields
            .iter()
            .map(|(k, v)| format!("{:?}: {v}", names[*k]))
            .collect();
        let text = format!("{{{}}}", body.join(", "));
        if let Ok(sc) = serde_json::from_str::<Scenario>(&text) {
            if sc.validate(&spec).is_ok() {
                prop_assert!(sc.tokens <= MAX_TOKENS);
            }
        }
    }
}
