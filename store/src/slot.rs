//! The slot state machine of the clock pool (`pool::ClockPool`), kept
//! apart from the shared-memory layout so that the very same code runs
//! under the loom model checker (`store/tests/loom_slot.rs` includes this
//! file with loom's atomics in place of std's).
//!
//! One control word per slot packs the state (top two bits) and the
//! reference count (low 30 bits):
//!
//! ```text
//!            claim (refs 0, CLOCK)          publish(READY, keep ref)
//!   EMPTY ───────────────────────> LOADING ─────────────────────────> READY
//!   READY ──┘   (access bit clear)    │  publish(FAILED, drop ref)      │
//!   FAILED ─┘                         └───────────────────────> FAILED  │
//!                                                                       │
//!   READY: try_pin adds a reference (CAS), unpin removes it; a slot with
//!   references is never claimed.
//! ```
//!
//! Every transition is one CAS on the control word, so a state and its
//! reference count are never seen half-updated.

use super::sync::{AtomicU32, Ordering};

/// No key.
pub(crate) const EMPTY: u32 = 0;
/// Claimed; its owner is filling it.
pub(crate) const LOADING: u32 = 1;
/// Holds its key's bytes.
pub(crate) const READY: u32 = 2;
/// The load failed; the error code sits beside the control word.
pub(crate) const FAILED: u32 = 3;
const STATE_SHIFT: u32 = 30;
/// The largest reference count.
pub(crate) const REFS: u32 = (1 << STATE_SHIFT) - 1;

/// Packs a state and a reference count.
pub(crate) fn ctl(state: u32, refs: u32) -> u32 {
    (state << STATE_SHIFT) | refs
}
/// The state of a control word.
pub(crate) fn state_of(c: u32) -> u32 {
    c >> STATE_SHIFT
}
/// The reference count of a control word.
pub(crate) fn refs_of(c: u32) -> u32 {
    c & REFS
}

/// Adds a reference to a READY slot whose key satisfies `key_ok`, checked
/// before the CAS and again under the reference (the key may have changed
/// between the first check and the CAS; it cannot change while pinned).
/// Sets the access bit on success. Lock-free.
pub(crate) fn try_pin(ctl_word: &AtomicU32, access: &AtomicU32, key_ok: impl Fn() -> bool) -> bool {
    let mut c = ctl_word.load(Ordering::Acquire);
    loop {
        if state_of(c) != READY || refs_of(c) == REFS || !key_ok() {
            return false;
        }
        match ctl_word.compare_exchange_weak(c, c + 1, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => break,
            Err(now) => c = now,
        }
    }
    if !key_ok() {
        unpin(ctl_word);
        return false;
    }
    access.store(1, Ordering::Relaxed);
    true
}

/// Drops one reference.
pub(crate) fn unpin(ctl_word: &AtomicU32) {
    ctl_word.fetch_sub(1, Ordering::AcqRel);
}

/// What one CLOCK look at a slot found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Claim {
    /// The slot is now LOADING with one reference: the caller owns it.
    Claimed,
    /// Its access bit was set; it is now clear (second chance).
    SecondChance,
    /// Referenced or loading: never a victim.
    Busy,
}

/// One CLOCK step over a slot: a referenced or LOADING slot is passed over,
/// a READY slot with its access bit set gets a second chance (the bit is
/// cleared), and anything else is claimed by a CAS to LOADING with one
/// reference.
pub(crate) fn try_claim(ctl_word: &AtomicU32, access: &AtomicU32) -> Claim {
    let c = ctl_word.load(Ordering::Acquire);
    if refs_of(c) != 0 || state_of(c) == LOADING {
        return Claim::Busy;
    }
    if state_of(c) == READY && access.swap(0, Ordering::AcqRel) != 0 {
        return Claim::SecondChance;
    }
    if ctl_word
        .compare_exchange(c, ctl(LOADING, 1), Ordering::AcqRel, Ordering::Acquire)
        .is_ok()
    {
        access.store(0, Ordering::Relaxed);
        Claim::Claimed
    } else {
        Claim::Busy
    }
}

/// Ends a load: LOADING -> `state` (READY or FAILED), dropping the owner's
/// reference unless `keep_ref`, sets the access bit on READY (a fresh load
/// counts as a use) and bumps `version`. The caller wakes the waiters.
pub(crate) fn publish(
    ctl_word: &AtomicU32,
    access: &AtomicU32,
    version: &AtomicU32,
    state: u32,
    keep_ref: bool,
) {
    let mut c = ctl_word.load(Ordering::Acquire);
    loop {
        let refs = if keep_ref {
            refs_of(c)
        } else {
            refs_of(c).saturating_sub(1)
        };
        match ctl_word.compare_exchange_weak(
            c,
            ctl(state, refs),
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => break,
            Err(now) => c = now,
        }
    }
    if state == READY {
        access.store(1, Ordering::Relaxed);
    }
    version.fetch_add(1, Ordering::AcqRel);
}

/// Takes a dead owner's load over: exactly one of several waiters wins the
/// owner word (and with it the dead owner's reference).
pub(crate) fn take_over(owner: &AtomicU32, dead: u32, me: u32) -> bool {
    owner
        .compare_exchange(dead, me, Ordering::AcqRel, Ordering::Acquire)
        .is_ok()
}
