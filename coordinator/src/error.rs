//! The coordinator's one error type.

use thiserror::Error;

/// Everything the coordinator can refuse or fail at.
#[derive(Debug, Error)]
pub enum CoordError {
    /// The spec table is malformed; the text names the group and field.
    #[error("spec table: {0}")]
    Spec(String),
    /// A spec file could not be read or parsed.
    #[error("spec file {path}: {why}")]
    SpecFile {
        /// The file.
        path: String,
        /// What went wrong.
        why: String,
    },
    /// A request the coordinator cannot answer (empty prompt, unknown group,
    /// out-of-range position, ...). Never turned into a hit.
    #[error("bad request: {0}")]
    BadRequest(String),
    /// The spec table and a store disagree on geometry.
    #[error("geometry mismatch: {0}")]
    Geometry(String),
    /// An `[identity]` field is malformed.
    #[error("spec table: identity field `{field}`: {why}")]
    Identity {
        /// The field (`extra`, `groups.NAME`, `revision`, ...).
        field: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// A store operation failed.
    #[error(transparent)]
    Store(#[from] ucm_store::StoreError),
}

/// The coordinator's result type.
pub type Result<T> = std::result::Result<T, CoordError>;
