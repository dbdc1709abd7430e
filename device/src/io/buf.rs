//! `IoBuf`: an owned, aligned byte buffer that knows the O_DIRECT rules.
//!
//! An I/O engine takes the buffer by value and hands it back with the
//! completion, so no buffer can be freed or touched while the kernel may
//! still read or write it.

use std::alloc::{self, Layout};
use std::fmt;
use std::ptr::NonNull;

use crate::error::{DeviceError, Result};

/// Alignment O_DIRECT asks of buffer addresses, lengths and file offsets.
/// 4 KiB covers every logical block size in use (512 B and 4 KiB).
pub const DIRECT_IO_ALIGN: usize = 4096;

/// An owned byte buffer with a chosen alignment, and a window (`start`,
/// `len`) into it that I/O reads or writes.
pub struct IoBuf {
    ptr: NonNull<u8>,
    layout: Layout,
    start: usize,
    len: usize,
    /// False for [`IoBuf::external`] buffers: memory someone else owns.
    owned: bool,
}

// SAFETY: `IoBuf` owns its allocation exclusively, like a `Vec<u8>` (an
// external buffer's creator promised the same for its lifetime).
unsafe impl Send for IoBuf {}
// SAFETY: shared access only reads through `&self`, like a `Vec<u8>`.
unsafe impl Sync for IoBuf {}

impl fmt::Debug for IoBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IoBuf")
            .field("addr", &format_args!("{:#x}", self.as_ptr() as usize))
            .field("len", &self.len)
            .field("capacity", &self.layout.size())
            .finish()
    }
}

impl IoBuf {
    /// A zeroed buffer of `len` bytes aligned for O_DIRECT.
    pub fn new(len: usize) -> Self {
        match Self::with_alignment(len, DIRECT_IO_ALIGN) {
            Ok(b) => b,
            // Only a size overflowing `isize` gets here, as with `Vec`.
            Err(_) => alloc::handle_alloc_error(
                Layout::from_size_align(1, DIRECT_IO_ALIGN).unwrap_or(Layout::new::<u8>()),
            ),
        }
    }

    /// A zeroed buffer of `len` bytes whose address is aligned to `align`
    /// (a power of two).
    pub fn with_alignment(len: usize, align: usize) -> Result<Self> {
        let layout = Layout::from_size_align(len.max(1), align).map_err(|e| {
            DeviceError::InvalidArgument(format!("buffer of {len} bytes aligned to {align}: {e}"))
        })?;
        // SAFETY: `layout` has a non-zero size.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            alloc::handle_alloc_error(layout)
        };
        Ok(IoBuf {
            ptr,
            layout,
            start: 0,
            len,
            owned: true,
        })
    }

    /// Wraps memory owned elsewhere (a slot of a shared-memory pool), so
    /// I/O goes straight to or from it with no copy. Dropping the buffer
    /// frees nothing.
    ///
    /// # Safety
    /// 1. `ptr` is valid for reads and writes of `len` bytes.
    /// 2. The memory stays valid, and is not used in conflicting ways by
    ///    others, until this buffer and every operation on it are finished.
    pub unsafe fn external(ptr: NonNull<u8>, len: usize) -> Result<Self> {
        let layout = Layout::from_size_align(len.max(1), 1).map_err(|e| {
            DeviceError::InvalidArgument(format!("external buffer of {len} bytes: {e}"))
        })?;
        Ok(IoBuf {
            ptr,
            layout,
            start: 0,
            len,
            owned: false,
        })
    }

    /// A buffer holding a copy of `data`, aligned for O_DIRECT.
    pub fn from_slice(data: &[u8]) -> Self {
        let mut b = Self::new(data.len());
        b.as_mut_slice().copy_from_slice(data);
        b
    }

    /// Narrows the window to `[start, start + len)` of the whole allocation.
    /// A window at an unaligned start is legal here; an engine rejects it for
    /// O_DIRECT files.
    pub fn set_window(&mut self, start: usize, len: usize) -> Result<()> {
        match start.checked_add(len) {
            Some(end) if end <= self.layout.size() => {
                self.start = start;
                self.len = len;
                Ok(())
            }
            _ => Err(DeviceError::OutOfBounds {
                what: "io buffer",
                offset: start as u64,
                len: len as u64,
                limit: self.layout.size() as u64,
            }),
        }
    }

    /// Bytes in the window.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the window is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Size of the whole allocation.
    pub fn capacity(&self) -> usize {
        self.layout.size()
    }

    /// Address of the window.
    pub fn as_ptr(&self) -> *const u8 {
        // SAFETY: `start <= capacity`, so the result stays in the allocation.
        unsafe { self.ptr.as_ptr().add(self.start) }
    }

    /// Mutable address of the window.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        // SAFETY: as in `as_ptr`.
        unsafe { self.ptr.as_ptr().add(self.start) }
    }

    /// The window's bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the window lies inside the allocation, which is initialised
        // (zeroed at allocation) and owned by `self`.
        unsafe { std::slice::from_raw_parts(self.as_ptr(), self.len) }
    }

    /// The window's bytes, mutable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, with exclusive access through `&mut self`.
        unsafe { std::slice::from_raw_parts_mut(self.as_mut_ptr(), self.len) }
    }

    /// Checks the O_DIRECT rules for this buffer: address and length
    /// multiples of [`DIRECT_IO_ALIGN`].
    pub fn check_direct(&self) -> Result<()> {
        let align = DIRECT_IO_ALIGN as u64;
        let addr = self.as_ptr() as u64;
        if addr % align != 0 {
            return Err(DeviceError::Misaligned {
                what: "buffer address",
                value: addr,
                align,
            });
        }
        if self.len as u64 % align != 0 {
            return Err(DeviceError::Misaligned {
                what: "buffer length",
                value: self.len as u64,
                align,
            });
        }
        Ok(())
    }
}

impl Drop for IoBuf {
    fn drop(&mut self) {
        if self.owned {
            // SAFETY: allocated in `with_alignment` with exactly this layout.
            unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_is_aligned_and_zeroed() {
        let b = IoBuf::new(8192);
        assert_eq!(b.as_ptr() as usize % DIRECT_IO_ALIGN, 0);
        assert!(b.as_slice().iter().all(|&x| x == 0));
        b.check_direct().unwrap();
    }

    #[test]
    fn external_buffers_alias_memory_and_free_nothing() {
        let mut backing = IoBuf::new(8192);
        let p = NonNull::new(backing.as_mut_ptr()).unwrap();
        // SAFETY: `backing` outlives `ext`, and nothing else uses it meanwhile.
        let mut ext = unsafe { IoBuf::external(p, 8192) }.unwrap();
        ext.as_mut_slice()[..4].copy_from_slice(b"ucm!");
        ext.check_direct().unwrap();
        drop(ext);
        assert_eq!(&backing.as_slice()[..4], b"ucm!");
    }

    #[test]
    fn window_rules() {
        let mut b = IoBuf::new(8192);
        b.set_window(512, 4096).unwrap();
        assert!(matches!(
            b.check_direct(),
            Err(DeviceError::Misaligned {
                what: "buffer address",
                ..
            })
        ));
        b.set_window(0, 1000).unwrap();
        assert!(matches!(
            b.check_direct(),
            Err(DeviceError::Misaligned {
                what: "buffer length",
                ..
            })
        ));
        assert!(b.set_window(4096, 8192).is_err());
        assert!(b.set_window(usize::MAX, 2).is_err());
    }
}
