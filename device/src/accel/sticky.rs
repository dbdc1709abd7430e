//! Sticky stream errors for runtimes that have none of their own for host
//! work (CUDA and ACL host functions cannot fail a stream).
//!
//! Each stream counts the operations queued on it; a failed host function
//! marks its position; an event remembers the position it was recorded at;
//! a stream-wait-event remembers the awaited stream and position. An error
//! "before position p" of a stream is one of its own failures before p, or
//! one reached through a wait queued before p. See `docs/decisions.md` (D17).

use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::{CopyKind, CopyRun, HostFn};
use crate::error::{DeviceError, Result};

/// Refuses a handle (`what`: "stream", "event") made by another device:
/// both must hold the same shared context.
pub(crate) fn same_device<T>(mine: &Arc<T>, theirs: &Arc<T>, what: &str) -> Result<()> {
    if Arc::ptr_eq(mine, theirs) {
        Ok(())
    } else {
        Err(DeviceError::InvalidArgument(format!(
            "{what} belongs to another device"
        )))
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// How a batch goes to a batch-copy API (`cuMemcpyBatchAsync`,
/// `aclrtMemcpyBatchAsync`): both take `numAttrs` attribute entries and as
/// many indices, `attrsIdxs[k]` being the first copy that `attrs[k]` applies
/// to (up to the next entry's first copy; the first is 0, they increase).
/// So the runs are grouped by direction (stable, groups in order of first
/// appearance; copies within a batch are unordered anyway), one entry per
/// group, built by `make` from the group's first run.
pub(crate) struct BatchPlan<A> {
    /// Run indices in submission order (grouped by direction).
    pub order: Vec<usize>,
    /// One attribute entry per group.
    pub attrs: Vec<A>,
    /// The position in `order` of each group's first run.
    pub starts: Vec<usize>,
}

impl<A> BatchPlan<A> {
    /// The caller's run index of position `i` of the submitted batch (a
    /// failure index as the API reports it); out of range stays as it is.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub fn run_at(&self, i: usize) -> usize {
        self.order.get(i).copied().unwrap_or(i)
    }
}

pub(crate) fn batch_attributes<A>(
    runs: &[(&CopyRun<'_>, CopyKind)],
    make: impl Fn(&CopyRun<'_>) -> A,
) -> BatchPlan<A> {
    let mut kinds: Vec<CopyKind> = Vec::new();
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for (i, (_, k)) in runs.iter().enumerate() {
        match kinds.iter().position(|x| x == k) {
            Some(g) => groups[g].push(i),
            None => {
                kinds.push(*k);
                groups.push(vec![i]);
            }
        }
    }
    let mut plan = BatchPlan {
        order: Vec::with_capacity(runs.len()),
        attrs: Vec::with_capacity(groups.len()),
        starts: Vec::with_capacity(groups.len()),
    };
    for g in groups {
        plan.starts.push(plan.order.len());
        plan.attrs.push(make(runs[g[0]].0));
        plan.order.extend(g);
    }
    plan
}

#[cfg(test)]
mod batch_plan_tests {
    use super::*;
    use crate::{Device, HostDevice};

    #[test]
    fn runs_are_grouped_by_direction_with_one_entry_per_group() {
        let dev = HostDevice::new();
        let h = dev.alloc_pinned(4096).unwrap();
        let d = dev.alloc_device(4096).unwrap();
        let runs = [
            CopyRun::new(&d, 0, &h, 0, 64),
            CopyRun::new(&h, 64, &d, 64, 64),
            CopyRun::new(&d, 128, &h, 128, 64),
            CopyRun::new(&d, 256, &d, 512, 64),
            CopyRun::new(&h, 256, &d, 1024, 64),
        ];
        let v = CopyRun::validate_batch(&runs, dev.id(), 1).unwrap();
        let plan = batch_attributes(&v, |r| r.dst_offset);
        assert_eq!(plan.order, [0, 2, 1, 4, 3]);
        assert_eq!(plan.starts, [0, 2, 4]);
        assert_eq!(plan.attrs, [0, 64, 256]);
        assert_eq!(plan.run_at(3), 4);
        assert_eq!(plan.run_at(usize::MAX), usize::MAX);
    }
}

/// Names the failing run of a batch in a driver error's message.
pub(crate) fn at_run(e: DeviceError, run: usize) -> DeviceError {
    match e {
        DeviceError::Driver { api, code, message } => DeviceError::Driver {
            api,
            code,
            message: format!("{message} (run {run})"),
        },
        other => other,
    }
}

/// One stream's positions, failure and waits.
#[derive(Default)]
pub(crate) struct StreamState {
    seq: AtomicU64,
    failed: Mutex<Option<(u64, DeviceError)>>,
    deps: Mutex<Vec<(u64, Arc<StreamState>, u64)>>,
}

impl StreamState {
    /// Takes the next position (the count of operations queued before it).
    pub fn next(&self) -> u64 {
        self.seq.fetch_add(1, Ordering::SeqCst)
    }

    /// Marks the operation at `at` as failed (the earliest failure wins).
    pub fn fail(&self, at: u64, e: DeviceError) {
        let mut f = lock(&self.failed);
        if f.as_ref().is_none_or(|(p, _)| at < *p) {
            *f = Some((at, e));
        }
    }

    /// Records that the operation at `at` waits for `on` up to `upto`.
    pub fn wait_on(&self, at: u64, on: Arc<StreamState>, upto: u64) {
        lock(&self.deps).push((at, on, upto));
    }

    /// The error of work queued before position `bound`, directly or
    /// through waits (followed to a bounded depth).
    pub fn error_before(&self, bound: u64) -> Option<DeviceError> {
        self.error_before_depth(bound, 0)
    }

    fn error_before_depth(&self, bound: u64, depth: u32) -> Option<DeviceError> {
        if let Some((p, e)) = lock(&self.failed).as_ref() {
            if *p < bound {
                return Some(e.clone());
            }
        }
        if depth >= 32 {
            return None;
        }
        let deps = lock(&self.deps).clone();
        deps.into_iter()
            .filter(|(at, _, _)| *at < bound)
            .find_map(|(_, s, upto)| s.error_before_depth(upto, depth + 1))
    }
}

/// Where an event was last recorded: the stream and the position.
#[derive(Default)]
pub(crate) struct EventMark(Mutex<Option<(Arc<StreamState>, u64)>>);

impl EventMark {
    /// Records the mark at the next position of `stream`.
    pub fn set(&self, stream: &Arc<StreamState>) {
        *lock(&self.0) = Some((Arc::clone(stream), stream.next()));
    }

    /// The mark, if the event was ever recorded.
    pub fn get(&self) -> Option<(Arc<StreamState>, u64)> {
        lock(&self.0).clone()
    }

    /// The error of the work the event captured, if any.
    pub fn error(&self) -> Option<DeviceError> {
        self.get().and_then(|(s, bound)| s.error_before(bound))
    }
}

/// A host function on its way through a C runtime.
pub(crate) struct HostCall {
    f: HostFn,
    state: Arc<StreamState>,
    at: u64,
}

impl HostCall {
    /// Boxes `f` for position `at` of `state`; the pointer goes to the
    /// runtime with [`host_trampoline`].
    pub fn into_raw(f: HostFn, state: &Arc<StreamState>, at: u64) -> *mut c_void {
        Box::into_raw(Box::new(HostCall {
            f,
            state: Arc::clone(state),
            at,
        }))
        .cast()
    }

    /// Frees a call the runtime refused to take.
    ///
    /// # Safety
    /// 1. `p` came from [`HostCall::into_raw`] and was never handed over.
    pub unsafe fn reclaim(p: *mut c_void) {
        // SAFETY: per the contract, `p` is an unshared box.
        drop(unsafe { Box::from_raw(p.cast::<HostCall>()) });
    }
}

/// Runs a [`HostCall`]: never unwinds into the C runtime; an error or a
/// panic marks the stream failed at the call's position.
///
/// # Safety
/// 1. `args` came from [`HostCall::into_raw`] and is passed here once.
pub(crate) unsafe extern "C" fn host_trampoline(args: *mut c_void) {
    // SAFETY: per the contract, `args` is the leaked box, passed once.
    let call = unsafe { Box::from_raw(args.cast::<HostCall>()) };
    let HostCall { f, state, at } = *call;
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => {}
        Ok(Err(e)) => state.fail(at, e),
        Err(p) => state.fail(
            at,
            DeviceError::Stream(format!(
                "host function panicked: {}",
                crate::error::panic_message(p.as_ref())
            )),
        ),
    }
}
