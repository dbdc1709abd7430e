//! The 16-byte id that every block id, group seed, checkpoint hash and
//! identity digest is, and its hex form. Hashing ([`crate::hash`]) makes
//! them; the identity and the stores name things by them.

/// A 16-byte id (block id, group seed or checkpoint hash).
pub type Id = [u8; 16];

/// Lowercase hex of an id.
pub fn hex(id: &Id) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}
