//! `ucm info --store DIR` and `ucm gc --store DIR`: the deployments'
//! identities a store directory holds, and removing them
//! ([`ucm_coordinator::adapter::identities`]).

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde::Serialize;
use ucm_coordinator::adapter::identities::{self, IdentityEntry};
use ucm_coordinator::CoordError;

/// Why `ucm info --store` or `ucm gc --store` did nothing.
#[derive(Debug, thiserror::Error)]
pub enum IdentitiesError {
    /// The store directory is not a directory.
    #[error("{0:?}: not a directory")]
    NotADirectory(PathBuf),
    /// Listing or removing failed (or the digest is not one).
    #[error(transparent)]
    Coord(#[from] CoordError),
    /// `gc --store` needs exactly one of `--identity` and `--max-idle`.
    #[error("with --store, give one of --identity DIGEST or --max-idle DAYS")]
    WhatToRemove,
}

/// One identity as `ucm info --store --json` prints it.
#[derive(Serialize)]
pub struct IdentityRow {
    /// The digest (its stores are under `id-<digest>`).
    pub identity: String,
    /// The model name.
    pub model: String,
    /// Bytes under its directory.
    pub bytes: u64,
    /// Seconds since it was last used.
    pub idle_s: u64,
    /// Its canonical text.
    pub text: String,
}

fn row(e: IdentityEntry) -> IdentityRow {
    let idle = SystemTime::now()
        .duration_since(e.last_used)
        .unwrap_or(Duration::ZERO);
    IdentityRow {
        identity: e.hex,
        model: e.model,
        bytes: e.bytes,
        idle_s: idle.as_secs(),
        text: e.text,
    }
}

/// The identities of the store directory `dir`.
pub fn rows(dir: &Path) -> Result<Vec<IdentityRow>, IdentitiesError> {
    if !dir.is_dir() {
        return Err(IdentitiesError::NotADirectory(dir.to_path_buf()));
    }
    Ok(identities::list(dir)?.into_iter().map(row).collect())
}

/// A table of `rows`: digest, model, bytes, idle time; then what the
/// identities differ in when there are several of one model.
pub fn render_text(dir: &Path, rows: &[IdentityRow]) -> String {
    let mut s = format!(
        "{} identit{} in {}\n",
        rows.len(),
        if rows.len() == 1 { "y" } else { "ies" },
        dir.display()
    );
    if rows.is_empty() {
        s.push_str("(stores of spec tables without an [identity] are not listed)\n");
        return s;
    }
    s.push_str(&format!(
        "{:<32}  {:<24} {:>14} {:>10}\n",
        "identity", "model", "bytes", "idle"
    ));
    for r in rows {
        s.push_str(&format!(
            "{:<32}  {:<24} {:>14} {:>9.1}h\n",
            r.identity,
            r.model,
            r.bytes,
            r.idle_s as f64 / 3600.0
        ));
    }
    for (i, a) in rows.iter().enumerate() {
        for b in &rows[i + 1..] {
            if a.model == b.model {
                let d = identities::differences(&a.text, &b.text);
                s.push_str(&format!(
                    "{} -> {}: {}\n",
                    &a.identity[..8],
                    &b.identity[..8],
                    d.join(", ")
                ));
            }
        }
    }
    s
}

/// Removes the identity `hex` from `dir`, or every identity idle longer
/// than `max_idle`; returns a line saying what was removed.
pub fn gc(
    dir: &Path,
    hex: Option<&str>,
    max_idle: Option<Duration>,
) -> Result<String, IdentitiesError> {
    if !dir.is_dir() {
        return Err(IdentitiesError::NotADirectory(dir.to_path_buf()));
    }
    match (hex, max_idle) {
        (Some(h), None) => {
            let bytes = identities::remove(dir, h)?;
            Ok(format!(
                "removed identity {h} ({bytes} bytes) from {}",
                dir.display()
            ))
        }
        (None, Some(idle)) => {
            let gone = identities::expire(dir, idle, None)?;
            let bytes: u64 = gone.iter().map(|g| g.1).sum();
            Ok(format!(
                "removed {} identities idle over {} s ({bytes} bytes) from {}",
                gone.len(),
                idle.as_secs(),
                dir.display()
            ))
        }
        _ => Err(IdentitiesError::WhatToRemove),
    }
}
