//! # ucm-ffi: foreign interfaces of UCM
//!
//! The C ABI (and, later, the Python module) through which inference
//! engines embed UCM. Engine types never cross into the Rust API; bindings
//! are thin shims over the coordinator's adapter.
//!
//! Status: skeleton. It exports the ABI version so bindings can check
//! compatibility before anything else lands.

#![deny(missing_docs)]

pub use ucm_coordinator as coordinator;

/// Version of the C ABI. Bumped on every incompatible change.
pub const ABI_VERSION: u32 = 1;

/// Returns [`ABI_VERSION`]; the first call a binding makes.
#[no_mangle]
pub extern "C" fn ucm_abi_version() -> u32 {
    ABI_VERSION
}

#[cfg(test)]
mod tests {
    #[test]
    fn abi_version_is_exported() {
        assert_eq!(super::ucm_abi_version(), super::ABI_VERSION);
    }
}
