//! The Mooncake trace reader (`ucm::replay::trace`): the vendored FAST'25
//! synthetic trace loads whole; malformed lines are errors naming the line
//! and the field; derived tokens share exactly what the hash ids share; and
//! the ideal and LRU hit figures agree with an independent count written
//! differently (prefixes as id sequences, a linear-scan LRU).

use std::collections::{HashSet, VecDeque};
use std::path::PathBuf;

use ucm::replay::trace::{
    ideal_hit, lru_hit, output_tokens, parse_line, prompt_tokens, read_trace, read_trace_from,
    TraceError, TraceRequest, TRACE_BLOCK,
};

fn vendored_trace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/mooncake/synthetic_trace.jsonl")
}

fn req(ids: &[u64], input: u64) -> TraceRequest {
    TraceRequest {
        timestamp_ms: 0,
        input_length: input,
        output_length: 8,
        hash_ids: ids.to_vec(),
    }
}

/// Hits as leading full blocks whose whole prefix (the id sequence up to
/// there) an earlier prompt had: no reliance on ids being prefix hashes.
fn independent_ideal(trace: &[TraceRequest]) -> u64 {
    let mut seen: HashSet<Vec<u64>> = HashSet::new();
    let mut hit = 0u64;
    for r in trace {
        let full = (r.input_length / TRACE_BLOCK) as usize;
        let mut n = 0;
        while n < full && seen.contains(&r.hash_ids[..=n]) {
            n += 1;
        }
        hit += n as u64 * TRACE_BLOCK;
        for i in 0..full {
            seen.insert(r.hash_ids[..=i].to_vec());
        }
    }
    hit
}

/// LRU as a recency list scanned linearly (front: most recent).
fn independent_lru(trace: &[TraceRequest], capacity: usize) -> u64 {
    let mut list: VecDeque<u64> = VecDeque::new();
    let mut hit = 0u64;
    for r in trace {
        let full = &r.hash_ids[..(r.input_length / TRACE_BLOCK) as usize];
        hit += full.iter().take_while(|id| list.contains(id)).count() as u64 * TRACE_BLOCK;
        for id in full {
            if let Some(p) = list.iter().position(|x| x == id) {
                list.remove(p);
            }
            list.push_front(*id);
            list.truncate(capacity);
        }
    }
    hit
}

#[test]
fn the_shared_trace_loads_whole_and_its_hit_figures_match_an_independent_count() {
    let path = vendored_trace();
    let t = read_trace(&path).unwrap();
    assert_eq!(t.len(), 3993);
    let input: u64 = t.iter().map(|r| r.input_length).sum();
    // The README of the release: average input 15,325 tokens, output 149.
    assert_eq!(input / t.len() as u64, 15_325);
    assert_eq!(
        t.iter().map(|r| r.output_length).sum::<u64>() / t.len() as u64,
        149
    );
    let ideal = ideal_hit(&t);
    assert_eq!(ideal.input_tokens, input);
    assert_eq!(ideal.hit_tokens, independent_ideal(&t));
    assert!(ideal.rate() > 0.3 && ideal.rate() < 1.0, "{}", ideal.rate());
    let blocks: HashSet<u64> = t.iter().flat_map(|r| r.hash_ids.iter().copied()).collect();
    // Small capacities (the linear LRU is slow) and the unlimited case.
    let mut last = 0;
    for cap in [0usize, 64, 512, 2048] {
        let got = lru_hit(&t, cap);
        assert_eq!(got.hit_tokens, independent_lru(&t, cap), "capacity {cap}");
        assert!(got.hit_tokens >= last, "more capacity never hits less");
        last = got.hit_tokens;
    }
    assert_eq!(
        lru_hit(&t, blocks.len()),
        ideal,
        "an LRU holding every block is ideal"
    );
}

#[test]
fn derived_tokens_share_exactly_what_the_ids_share() {
    let a = req(&[1, 2, 3], 3 * 512);
    let b = req(&[1, 2, 9], 2 * 512 + 100);
    let (ta, tb) = (prompt_tokens(7, &a), prompt_tokens(7, &b));
    assert_eq!((ta.len(), tb.len()), (1536, 1124));
    assert_eq!(ta[..1024], tb[..1024], "equal ids: equal blocks");
    assert_ne!(ta[1024..1124], tb[1024..], "other ids: other blocks");
    // The same id elsewhere is the same block (ids name content).
    let c = req(&[2], 512);
    assert_eq!(prompt_tokens(7, &c)[..], ta[512..1024]);
    // Another seed, other tokens; outputs differ per request.
    assert_ne!(prompt_tokens(8, &a), ta);
    assert_eq!(output_tokens(7, 0, &a).len(), 8);
    assert_ne!(output_tokens(7, 0, &a), output_tokens(7, 1, &a));
    assert_eq!(output_tokens(7, 3, &a), output_tokens(7, 3, &b));
}

#[test]
fn malformed_lines_name_the_line_and_what_is_wrong() {
    let bad = [
        ("not json", "expected"),
        (
            r#"{"timestamp": 0, "input_length": 10, "output_length": 1}"#,
            "hash_ids",
        ),
        (
            r#"{"timestamp": -1, "input_length": 10, "output_length": 1, "hash_ids": [0]}"#,
            "invalid value",
        ),
        (
            r#"{"timestamp": 0, "input_length": 10.5, "output_length": 1, "hash_ids": [0]}"#,
            "invalid type",
        ),
        (
            r#"{"timestamp": 0, "input_length": 0, "output_length": 1, "hash_ids": []}"#,
            "input_length 0",
        ),
        (
            r#"{"timestamp": 0, "input_length": 1025, "output_length": 1, "hash_ids": [0, 1]}"#,
            "2 hash_ids for input_length 1025",
        ),
        (
            r#"{"timestamp": 0, "input_length": 99999999999, "output_length": 1, "hash_ids": [0]}"#,
            "outside",
        ),
        (
            r#"{"timestamp": 0, "input_length": 5, "output_length": 9999999999, "hash_ids": [0]}"#,
            "output_length",
        ),
        (
            r#"{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [0], "x": 1}"#,
            "unknown field",
        ),
    ];
    for (line, want) in bad {
        let err = parse_line(line).unwrap_err().to_string();
        assert!(err.contains(want), "{line}: {err}");
        let text = format!(
            "{}\n\n{line}\n",
            r#"{"timestamp": 5, "input_length": 3, "output_length": 1, "hash_ids": [7]}"#
        );
        match read_trace_from(text.as_bytes()) {
            Err(TraceError::Line { line: 3, why }) => {
                assert!(why.to_string().contains(want), "{why}")
            }
            other => panic!("{line}: {other:?}"),
        }
    }
    let back = "{\"timestamp\": 5, \"input_length\": 3, \"output_length\": 1, \"hash_ids\": [7]}\n\
                {\"timestamp\": 4, \"input_length\": 3, \"output_length\": 1, \"hash_ids\": [7]}\n";
    assert!(matches!(
        read_trace_from(back.as_bytes()),
        Err(TraceError::Line { line: 2, .. })
    ));
    assert!(matches!(
        read_trace_from(&b"\n\n"[..]),
        Err(TraceError::Empty)
    ));
    assert!(matches!(
        read_trace_from(&b"\xff\xfe\n"[..]),
        Err(TraceError::Line { line: 1, .. })
    ));
    assert!(matches!(
        read_trace(std::path::Path::new("/nonexistent/trace.jsonl")),
        Err(TraceError::Io(_))
    ));
}

#[test]
fn small_traces_count_as_worked_by_hand() {
    // r0: blocks 1 2 3 (full); r1: 1 2 then other; r2: 1 2 3 4 with the
    // last partial; r3 the same as r0.
    let t = vec![
        req(&[1, 2, 3], 1536),
        req(&[1, 2, 5], 1536),
        req(&[1, 2, 3, 4], 1600),
        req(&[1, 2, 3], 1536),
    ];
    let ideal = ideal_hit(&t);
    assert_eq!(ideal.hit_tokens, (2 + 3 + 3) * 512);
    assert_eq!(ideal.input_tokens, 1536 * 3 + 1600);
    // Two blocks of LRU: after r0 it holds {2, 3}, so no request finds its
    // leading block 1. Three: r1 hits 1 2, r2 hits 1 2 (3 was evicted by 5),
    // r3 hits all three.
    assert_eq!(lru_hit(&t, 2).hit_tokens, independent_lru(&t, 2));
    assert_eq!(lru_hit(&t, 2).hit_tokens, 0);
    assert_eq!(lru_hit(&t, 3).hit_tokens, (2 + 2 + 3) * 512);
    assert_eq!(lru_hit(&t, 100), ideal);
}

fn ucm(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_ucm"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn ucm_trace_sweeps_capacities_and_refuses_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("t.jsonl");
    let lines: Vec<String> = (0..40u64)
        .map(|i| {
            let ids: Vec<String> = (0..4).map(|b| (if b < 2 { b } else { 100 * i + b }).to_string()).collect();
            format!(
                r#"{{"timestamp": {i}, "input_length": 2048, "output_length": 3, "hash_ids": [{}]}}"#,
                ids.join(", ")
            )
        })
        .collect();
    std::fs::write(&f, lines.join("\n")).unwrap();
    let o = ucm(&[
        "trace",
        f.to_str().unwrap(),
        "--json",
        "--sweep",
        "1e3,2048,1e6",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["requests"], 40);
    // Every request after the first finds the 2 shared blocks of its 4.
    assert_eq!(
        v["ideal_hit_rate"].as_f64().unwrap(),
        39.0 * 1024.0 / (40.0 * 2048.0)
    );
    let lru = v["lru"].as_array().unwrap();
    assert_eq!(lru.len(), 3);
    assert_eq!(lru[0]["capacity_tokens"], 1000);
    assert_eq!(
        lru[0]["hit_rate"], 0.0,
        "one block of capacity never holds a prefix"
    );
    assert_eq!(lru[2]["hit_rate"], v["ideal_hit_rate"]);
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("LRU hit rate"),
        "progress lines"
    );
    let o = ucm(&["trace", f.to_str().unwrap(), "--limit", "1"]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("1 requests"));
    for (args, want) in [
        (vec!["--sweep", "abc"], "not a number"),
        (vec!["--sweep", "0"], "whole number"),
        (vec!["--sweep", "1.5"], "whole number"),
        (vec!["--sweep", ","], "no capacity"),
        (vec!["--limit", "0"], "--limit"),
    ] {
        let mut a = vec!["trace", f.to_str().unwrap()];
        a.extend(args);
        let o = ucm(&a);
        assert!(!o.status.success());
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(want), "{a:?}: {err}");
    }
    std::fs::write(&f, format!("{}\nnot json\n", lines[0])).unwrap();
    let o = ucm(&["trace", f.to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("trace line 2"));
}
