//! Two engine instances (their own pools, schedulers and checkpoint
//! directories) over one store directory, as two processes on a shared
//! filesystem: the second, opened before the first stored anything, is
//! served the first one's K/V **and states**, every loaded byte checked.

mod common;

use std::sync::Arc;

use common::{engine, tokens};
use ucm_harness::Request;

#[test]
fn an_instance_resumes_from_a_checkpoint_another_instance_stored_after_it_opened() {
    let tmp = tempfile::tempdir().unwrap();
    let mut a = engine("all_union", tmp.path());
    let mut b = engine("all_union", tmp.path());
    let prompt = tokens(7, 100);
    let answer = tokens(8, 60);
    let mut first = Request::new("a-t1", prompt.clone());
    first.output = Arc::new(answer.clone());
    let o = a.run(&first).unwrap();
    assert!(o.wrong.is_empty() && o.lost.is_empty());
    assert!(!b.directory().contains("state", &[0; 16]));
    assert_eq!(b.directory().len("state"), 0, "b never saw a put");
    let mut next = prompt;
    next.extend(&answer);
    next.extend(tokens(9, 40));
    let o = b.run(&Request::new("b-t2", next)).unwrap();
    assert!(o.wrong.is_empty(), "{:?}", o.wrong);
    // The state after the answer (160) is one `a` stored: `b` found it in
    // the shared snapshot store and registered it.
    assert_eq!((o.matched, o.served), (160, 160));
    // attn 2 layers x 10 + row 10 + swa 2 + idx 10 + state 1.
    assert_eq!(o.checked, 20 + 10 + 2 + 10 + 1);
    assert!(b.directory().positions("state").contains(&160));
}
