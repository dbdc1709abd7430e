//! Blocks and states that decoding completes are saved (a chat's next turn
//! re-sends the answer), and an allocation that grows after the first step
//! (an asynchronous load, chunked prefill) is followed: saves stop at the
//! blocks allocated and resume when more are.

mod common;

use std::sync::Arc;

use common::{alloc, engine, lookup, step};

#[test]
fn blocks_and_states_completed_by_decoding_hit_the_next_turn() {
    let mut e = engine();
    let prompt: Vec<u32> = (0..40).collect();
    assert_eq!(lookup(&mut e, "a", &prompt), 0);
    e.sched
        .update_state_after_alloc("a", alloc(0..4, 0), 0)
        .unwrap();
    step(&mut e, "a", 0, 40);
    // Decoding: the answer grows to 64 tokens; the step that computes
    // position 63 completes blocks 2 and 3 (the prompt filled block 2 up to 40).
    let answer: Vec<u32> = (0..64).map(|i| if i < 40 { i } else { 500 + i }).collect();
    e.sched
        .extend_tokens("a", Arc::new(answer.clone()))
        .unwrap();
    step(&mut e, "a", 63, 64);
    e.sched.request_finished("a");

    let next_turn: Vec<u32> = answer.iter().copied().chain(900..910).collect();
    assert_eq!(
        lookup(&mut e, "b", &next_turn),
        64,
        "the decoded blocks and the state at 64"
    );
    // Another continuation of the prompt shares its 2 blocks, but no state
    // below 64: retention planned one at 32 (40 aligned down), and a state
    // exists only where a step ends (the prompt's step ended at 40).
    let other: Vec<u32> = prompt.iter().copied().chain(700..730).collect();
    assert_eq!(lookup(&mut e, "c", &other), 0);
}

#[test]
fn extended_tokens_must_begin_with_the_known_ones() {
    let mut e = engine();
    let prompt: Vec<u32> = (0..40).collect();
    lookup(&mut e, "a", &prompt);
    let err = e
        .sched
        .extend_tokens("a", Arc::new((1..50).collect()))
        .unwrap_err();
    assert!(err.to_string().contains("begin with"), "{err}");
    assert!(e.sched.extend_tokens("nope", Arc::new(vec![1])).is_err());
}

#[test]
fn saves_stop_at_the_allocated_blocks_and_resume_when_it_grows() {
    let mut e = engine();
    let prompt: Vec<u32> = (100..164).collect();
    lookup(&mut e, "a", &prompt);
    // Chunked prefill: 2 blocks allocated, 32 tokens computed.
    e.sched
        .update_state_after_alloc("a", alloc(0..2, 0), 0)
        .unwrap();
    step(&mut e, "a", 0, 32);
    e.sched.update_allocation("a", alloc(0..4, 0)).unwrap();
    step(&mut e, "a", 32, 64);
    e.sched.request_finished("a");
    let again: Vec<u32> = prompt.iter().copied().chain(1..3).collect();
    assert_eq!(
        lookup(&mut e, "b", &again),
        64,
        "all 4 blocks and the state at 64"
    );
    assert!(e.sched.update_allocation("never", alloc(0..1, 0)).is_err());
}

#[test]
fn a_step_past_the_allocation_saves_the_rest_once_it_is_allocated() {
    let mut e = engine();
    let prompt: Vec<u32> = (300..364).collect();
    lookup(&mut e, "a", &prompt);
    // The scheduler learns of only 2 blocks before a step that computes
    // all 64 tokens: it saves those 2, and the other 2 once allocated.
    e.sched
        .update_state_after_alloc("a", alloc(0..2, 0), 0)
        .unwrap();
    step(&mut e, "a", 0, 64);
    e.sched.update_allocation("a", alloc(0..4, 0)).unwrap();
    step(&mut e, "a", 64, 64);
    e.sched.request_finished("a");
    let again: Vec<u32> = prompt.iter().copied().chain(1..3).collect();
    assert_eq!(
        lookup(&mut e, "b", &again),
        64,
        "all 4 blocks and the state at 64"
    );
}
