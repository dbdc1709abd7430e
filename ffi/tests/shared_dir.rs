//! Instances sharing one store directory (a shared file system): each has
//! its own cache, memory pools and checkpoint directory; a new instance's
//! checkpoint directory is rebuilt from what any instance persisted, so it
//! hits prefixes (K/V and recurrent states) that two others computed.

mod common;

use common::{alloc, engine_in, lookup, step, Engine};

/// Serves `prompt` whole: allocation, one step, saves out, finished.
fn serve(e: &mut Engine, req: &str, prompt: &[u32]) {
    assert_eq!(lookup(e, req, prompt), 0, "{req}: nothing stored yet");
    let blocks = prompt.len().div_ceil(16) as u32;
    e.sched
        .update_state_after_alloc(req, alloc(0..blocks, 0), 0)
        .unwrap();
    step(e, req, 0, prompt.len() as u64);
    e.sched.request_finished(req);
}

#[test]
fn a_new_instance_rebuilds_its_checkpoints_from_what_any_instance_persisted() {
    let dir = tempfile::tempdir().unwrap();
    let p1: Vec<u32> = (0..48).collect();
    let p2: Vec<u32> = (1000..1048).collect();
    {
        // Two instances at once on the directory, each computing a prompt.
        let (mut a, mut b) = (engine_in(dir.path(), 1), engine_in(dir.path(), 2));
        serve(&mut a, "a", &p1);
        serve(&mut b, "b", &p2);
        // Each sees the other's work only once on disk: the pools are private.
    }
    // A third instance, started after both: its directory is rebuilt from
    // the disk tier, which holds the blocks and states of both.
    let mut c = engine_in(dir.path(), 3);
    let more = |p: &[u32]| p.iter().copied().chain(5000..5010).collect::<Vec<u32>>();
    assert_eq!(
        lookup(&mut c, "c1", &more(&p1)),
        48,
        "a's blocks and state at 48"
    );
    assert_eq!(
        lookup(&mut c, "c2", &more(&p2)),
        48,
        "b's blocks and state at 48"
    );
    // A prefix nobody computed is a miss.
    let other: Vec<u32> = (7000..7058).collect();
    assert_eq!(lookup(&mut c, "c3", &other), 0);
}
