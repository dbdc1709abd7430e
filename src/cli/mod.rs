//! The `ucm` command line's subcommands, one file per area; `main.rs`
//! parses the arguments and dispatches.

pub(crate) mod admin;
pub(crate) mod bench;
pub(crate) mod replay;

use std::path::PathBuf;

/// Where the replay's stores go by default: /dev/shm when present.
pub(crate) fn default_scratch_parent() -> PathBuf {
    let shm = PathBuf::from("/dev/shm");
    if shm.is_dir() {
        shm
    } else {
        std::env::temp_dir()
    }
}
