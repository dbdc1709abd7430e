//! The oracle can fail: each deliberate bug (a sabotage switch of the
//! adapter's worker, or the harness's flipped byte) must make the run
//! report a finding that names the request, group, layer and block. The
//! same runs without a sabotage are clean (`adapter.rs`).

mod common;

use common::{config, tokens};
use ucm_harness::{Engine, Outcome, Request, Sabotage, WrongKind};

fn with(sabotage: Option<Sabotage>, flip: bool) -> (tempfile::TempDir, Engine) {
    let tmp = tempfile::tempdir().unwrap();
    let mut c = config("all_union", tmp.path());
    c.sabotage = sabotage;
    c.flip_byte = flip;
    let e = Engine::open(c).unwrap();
    (tmp, e)
}

fn go(e: &mut Engine, id: &str, t: &[u32]) -> Outcome {
    e.run(&Request::new(id, t.to_vec())).unwrap()
}

/// The first finding's text, which must name everything.
fn first_wrong(o: &Outcome) -> String {
    assert!(!o.wrong.is_empty(), "the oracle missed the sabotage");
    o.wrong[0].to_string()
}

#[test]
fn a_skipped_load_of_one_block_is_caught() {
    let (_tmp, mut e) = with(Some(Sabotage::SkipLoad), false);
    let t = tokens(21, 150);
    go(&mut e, "a", &t);
    let b = go(&mut e, "b", &t);
    assert!(b.load_errors.is_empty(), "the skip is silent");
    let w = &b.wrong[0];
    assert_eq!((w.kind, w.block), (WrongKind::NotLoaded, Some(0)));
    let msg = first_wrong(&b);
    for part in ["request b", "group attn", "layer 0", "block 0"] {
        assert!(msg.contains(part), "{msg}");
    }
}

#[test]
fn a_load_into_the_wrong_engine_block_is_caught() {
    let (_tmp, mut e) = with(Some(Sabotage::WrongEngineBlock), false);
    let t = tokens(22, 150);
    go(&mut e, "a", &t);
    let b = go(&mut e, "b", &t);
    let msg = first_wrong(&b);
    assert!(
        msg.contains("request b") && msg.contains("group attn"),
        "{msg}"
    );
    assert!(msg.contains("layer 0") && msg.contains("block "), "{msg}");
}

#[test]
fn a_state_loaded_from_another_position_is_caught() {
    let (_tmp, mut e) = with(Some(Sabotage::StateFromOtherPosition), false);
    let t = tokens(23, 150);
    // Checkpoints at 64, 128 and 144: the sabotage serves 128 for 144.
    go(&mut e, "a", &t);
    let b = go(&mut e, "b", &t);
    assert_eq!(b.matched, 144);
    let w = b
        .wrong
        .iter()
        .find(|w| w.group == "state")
        .unwrap_or_else(|| panic!("{:?}", b.wrong));
    assert_eq!(
        (w.kind, w.position, w.layer),
        (WrongKind::WrongBytes, Some(144), 6)
    );
    let msg = w.to_string();
    assert!(
        msg.contains("request b") && msg.contains("state at 144"),
        "{msg}"
    );
}

#[test]
fn a_stale_block_of_the_previous_request_is_caught() {
    // The bug of the shared system prompt: blocks the previous request
    // loaded are skipped because "the engine still holds them". With
    // rotating, poisoned engine blocks they hold poison.
    let (_tmp, mut e) = with(Some(Sabotage::StalePrefix), false);
    let system = tokens(24, 96);
    let ask = |q: u64| {
        let mut t = system.clone();
        t.extend(tokens(100 + q, 40));
        t
    };
    go(&mut e, "first", &ask(0));
    let b = go(&mut e, "second", &ask(1));
    assert!(
        b.wrong.is_empty(),
        "the second request loads everything once: {:?}",
        b.wrong
    );
    let c = go(&mut e, "third", &ask(2));
    assert!(c.matched > 0, "{}", c.matched);
    let msg = first_wrong(&c);
    for part in ["request third", "group attn", "layer 0", "block 0"] {
        assert!(msg.contains(part), "{msg}");
    }
    assert!(c.wrong.iter().all(|w| w.kind == WrongKind::NotLoaded));
}

#[test]
fn a_skipped_save_is_caught_and_the_next_request_misses() {
    let (_tmp, mut e) = with(Some(Sabotage::SkipSave), false);
    let t = tokens(25, 150);
    let a = go(&mut e, "a", &t);
    assert!(a.save_failures.is_empty(), "the skip is silent");
    let lost = a
        .lost
        .first()
        .unwrap_or_else(|| panic!("the audit missed it"));
    let msg = lost.to_string();
    for part in ["request a", "group attn", "layer 0", "block 0"] {
        assert!(msg.contains(part), "{msg}");
    }
    // Never a wrong hit: block 0 is missing, so the next request misses.
    let b = go(&mut e, "b", &t);
    assert_eq!(b.matched, 0);
    assert!(b.wrong.is_empty());
}

#[test]
fn a_flipped_byte_is_caught() {
    let (_tmp, mut e) = with(None, true);
    let t = tokens(26, 150);
    go(&mut e, "a", &t);
    let b = go(&mut e, "b", &t);
    assert_eq!(b.wrong.len(), 1, "{:?}", b.wrong);
    assert_eq!(b.wrong[0].kind, WrongKind::WrongBytes);
    let msg = first_wrong(&b);
    for part in ["request b", "group attn", "layer 0", "block 0"] {
        assert!(msg.contains(part), "{msg}");
    }
}
