//! The host device's copy of large runs: non-temporal (streaming) stores.
//!
//! A plain `memcpy` of a 64 KiB run writes through the caches: every line
//! of the destination is first read for ownership, so the copy moves three
//! bytes over the memory bus for every byte it copies. The C library's own
//! `memcpy` switches to non-temporal stores only above a size threshold
//! (about three quarters of the last-level cache), which one call of a whole
//! gigabyte passes and a 64 KiB run of a pool never does; measured on the
//! 2-core development machine, 64 KiB runs copied by `memcpy` reach about
//! 0.6 of one flat `memcpy` of the same bytes. The "device" memory of the
//! host device is not read back by the thread that copies into it, so the
//! stores may bypass the caches.
//!
//! [`copy`] copies runs of at least [`STREAM_MIN`] bytes with AVX2 streaming
//! stores, line after line in address order, where the CPU has AVX2; any
//! other run, or a CPU without AVX2, uses `memcpy`. (Four 4 KiB pages
//! interleaved with a prefetch ahead, the layout the C library uses for its
//! own large copies, ran at a third of the address order on an AMD EPYC
//! guest: 4.9 against 16 GiB/s for 64 KiB runs; see decision D87.)
//! Streaming stores are weakly ordered: whoever hands the destination to
//! another thread calls [`fence`] first.

/// Runs shorter than this are copied with `memcpy`.
pub(crate) const STREAM_MIN: usize = 16 << 10;

/// Copies `len` bytes from `src` to `dst`.
///
/// # Safety
/// `src..src+len` must be readable, `dst..dst+len` writable, and the two
/// ranges must not overlap.
pub(crate) unsafe fn copy(dst: *mut u8, src: *const u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    if len >= STREAM_MIN && avx2() {
        // SAFETY: the caller's contract, and AVX2 was detected.
        unsafe { x86::stream(dst, src, len) };
        return;
    }
    // SAFETY: the caller's contract.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
}

/// Orders the streaming stores of earlier [`copy`] calls on this thread
/// before any later store (a no-op where none are used).
pub(crate) fn fence() {
    #[cfg(target_arch = "x86_64")]
    if avx2() {
        // SAFETY: `sfence` has no operands and is part of SSE, which every
        // x86_64 CPU has.
        unsafe { std::arch::x86_64::_mm_sfence() };
    }
}

#[cfg(target_arch = "x86_64")]
fn avx2() -> bool {
    use std::sync::atomic::{AtomicU8, Ordering};
    // 0 = unknown, 1 = no, 2 = yes.
    static HAS: AtomicU8 = AtomicU8::new(0);
    match HAS.load(Ordering::Relaxed) {
        0 => {
            let yes = std::is_x86_feature_detected!("avx2")
                && std::env::var_os("UCM_NO_STREAMING_COPY").is_none();
            HAS.store(if yes { 2 } else { 1 }, Ordering::Relaxed);
            yes
        }
        v => v == 2,
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::{__m256i, _mm256_loadu_si256, _mm256_stream_si256};

    const LINE: usize = 64;

    /// Copies one 64-byte line with two streaming stores.
    ///
    /// # Safety
    /// AVX2; `s..s+64` readable, `d..d+64` writable and 32-byte aligned.
    #[target_feature(enable = "avx2")]
    unsafe fn line(d: *mut u8, s: *const u8) {
        // SAFETY: the function's contract.
        unsafe {
            let a = _mm256_loadu_si256(s as *const __m256i);
            let b = _mm256_loadu_si256(s.add(32) as *const __m256i);
            _mm256_stream_si256(d as *mut __m256i, a);
            _mm256_stream_si256(d.add(32) as *mut __m256i, b);
        }
    }

    /// The streaming copy (see the module).
    ///
    /// # Safety
    /// AVX2; the ranges valid as for [`super::copy`] and disjoint.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn stream(mut dst: *mut u8, mut src: *const u8, mut len: usize) {
        // SAFETY: every pointer below stays within `dst..dst+len` and
        // `src..src+len` of the caller's contract; streaming stores get a
        // line-aligned destination (the head is copied first), so each line
        // fills whole write-combining buffers.
        unsafe {
            let head = dst.align_offset(LINE).min(len);
            std::ptr::copy_nonoverlapping(src, dst, head);
            dst = dst.add(head);
            src = src.add(head);
            len -= head;
            // One line after another, in address order.
            while len >= LINE {
                line(dst, src);
                dst = dst.add(LINE);
                src = src.add(LINE);
                len -= LINE;
            }
            std::ptr::copy_nonoverlapping(src, dst, len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_length_and_misalignment_copies_exactly() {
        let src: Vec<u8> = (0..(80 << 10) + 200u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8)
            .collect();
        for &len in &[
            0usize,
            1,
            63,
            64,
            4095,
            STREAM_MIN,
            STREAM_MIN + 77,
            80 << 10,
        ] {
            for &(so, dof) in &[(0usize, 0usize), (1, 5), (31, 17), (64, 33)] {
                let mut dst = vec![0xEEu8; len + 128];
                // SAFETY: in bounds of both vectors, which do not overlap.
                unsafe { copy(dst.as_mut_ptr().add(dof), src.as_ptr().add(so), len) };
                fence();
                assert_eq!(
                    &dst[dof..dof + len],
                    &src[so..so + len],
                    "len {len} at {so}/{dof}"
                );
                assert!(dst[..dof].iter().all(|&b| b == 0xEE), "before the run");
                assert!(dst[dof + len..].iter().all(|&b| b == 0xEE), "after the run");
            }
        }
    }
}
