//! Scratch directories of the CLI's temporary stores (`replay`, `explain`,
//! the benches): named after their writer, 0700, removed on every exit
//! path that runs destructors (success, error, panic), and removed by a
//! later run when their writer was killed.
//!
//! A scratch directory is `<parent>/ucm-<kind>.<writer>.<n>`, where
//! `<writer>` is the process's identity (`ucm_store::paths::writer_id`:
//! host, pid and start time, so a reused pid is another writer). Creating
//! one first removes every `ucm-*.<writer>.*` directory in `parent` whose
//! writer is a dead process of this host; nothing else is touched, and
//! links are never followed.

use std::fs;
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use ucm_store::paths::{writer_alive, writer_id};

/// A scratch directory, removed when dropped.
#[derive(Debug)]
pub struct Scratch {
    path: PathBuf,
}

impl Scratch {
    /// Creates a fresh scratch directory for `kind` (a plain name) under
    /// `parent`, after clearing those of dead runs there.
    pub fn new(parent: &Path, kind: &str) -> io::Result<Scratch> {
        static N: AtomicU64 = AtomicU64::new(0);
        fs::create_dir_all(parent)?;
        let removed = clear_stale(parent);
        if removed > 0 {
            log::info!(
                "removed {removed} scratch directories of killed runs in {}",
                parent.display()
            );
        }
        let n = N.fetch_add(1, Ordering::Relaxed);
        let path = parent.join(format!("ucm-{kind}.{}.{n}", writer_id()));
        let _ = fs::remove_dir_all(&path);
        fs::DirBuilder::new().mode(0o700).create(&path)?;
        Ok(Scratch { path })
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // Never panics: a directory already gone is fine.
        let _ = fs::remove_dir_all(&self.path);
    }
}

/// Removes the scratch directories in `parent` of dead writers of this
/// host; returns how many.
pub fn clear_stale(parent: &Path) -> usize {
    let mut removed = 0;
    for e in fs::read_dir(parent).into_iter().flatten().flatten() {
        let Some(name) = e.file_name().to_str().map(String::from) else {
            continue;
        };
        let parts: Vec<&str> = name.split('.').collect();
        let [kind, writer, n] = parts[..] else {
            continue;
        };
        if !kind.starts_with("ucm-") || n.parse::<u64>().is_err() {
            continue;
        }
        // A real directory (file_type does not follow links) of a dead
        // writer of this host.
        if e.file_type().is_ok_and(|t| t.is_dir())
            && writer_alive(writer) == Some(false)
            && fs::remove_dir_all(e.path()).is_ok()
        {
            removed += 1;
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dead_runs_scratch_goes_and_a_live_ones_stays() {
        let parent = tempfile::tempdir().unwrap();
        let stale = parent
            .path()
            .join(format!("ucm-replay.{}.0", ucm_store::paths::dead_writer()));
        fs::create_dir(&stale).unwrap();
        fs::write(stale.join("blk"), b"x").unwrap();
        let other = parent.path().join("ucm-notes");
        fs::create_dir(&other).unwrap();
        let s = Scratch::new(parent.path(), "test").unwrap();
        assert!(!stale.exists(), "a killed run's scratch stayed");
        assert!(other.exists(), "a directory the CLI did not name went");
        let again = Scratch::new(parent.path(), "test").unwrap();
        assert!(s.path().exists(), "a live run's scratch went");
        let p = s.path().to_path_buf();
        drop(s);
        drop(again);
        assert!(!p.exists());
    }
}
