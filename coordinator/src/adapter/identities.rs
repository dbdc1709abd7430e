//! The identities a store directory holds: where each deployment's stores
//! live, when it was last used, and removing the ones nothing uses.
//!
//! A spec table with an `[identity]` ([`crate::identity`]) keeps its
//! stores under `<dir>/id-<digest hex>/<group>`, beside a file `IDENTITY`
//! holding the identity's canonical text; a table without one keeps them
//! under `<dir>/<group>`, as it always did. So each identity's bytes are
//! its directory's, one identity can be dropped by removing its directory,
//! and deployments of other layouts never meet one another's geometry
//! markers.
//!
//! **Last use** is `IDENTITY`'s modification time: set when the stores
//! open, and again at most every [`TOUCH_EVERY`] while they are used.
//! [`expire`] removes the identities not used for longer than a given idle
//! time (the stores' open does this with [`StoreSetConfig::identity_max_idle`],
//! `ucm gc --store DIR --max-idle` on demand), never the caller's own.
//!
//! [`StoreSetConfig::identity_max_idle`]: super::StoreSetConfig::identity_max_idle

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::error::{CoordError, RequestError, Result};
use crate::identity::Identity;
use crate::spec::SpecTable;
use ucm_store::StoreError;

/// The name of the file holding an identity's canonical text.
pub const IDENTITY_FILE: &str = "IDENTITY";

/// How often, at most, a store in use marks its identity as used.
pub const TOUCH_EVERY: Duration = Duration::from_secs(600);

/// The directory prefix of an identity's stores.
const PREFIX: &str = "id-";

/// The most bytes of an `IDENTITY` file read.
const MAX_TEXT: u64 = 1 << 20;

/// The text of `file`: `None` when it is missing.
fn read_text(file: &Path) -> Result<Option<String>> {
    use ucm_store::device::io::{read_small_file, SmallFileError};
    match read_small_file(file, MAX_TEXT) {
        Ok(t) => Ok(Some(t)),
        Err(SmallFileError::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(SmallFileError::Io(e)) => Err(fs_err("read", file)(e)),
        Err(e) => Err(CoordError::BadRequest(RequestError::UnreadableFile {
            path: file.to_path_buf(),
            why: e.to_string(),
        })),
    }
}

/// One identity a store directory holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IdentityEntry {
    /// The digest, in hex (its directory is `id-<hex>`).
    pub hex: String,
    /// The model name, from the canonical text (`model=` line).
    pub model: String,
    /// The canonical text.
    pub text: String,
    /// Bytes of every file under its directory.
    pub bytes: u64,
    /// When it was last used (its `IDENTITY` file's modification time).
    pub last_used: SystemTime,
}

fn fs_err(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> CoordError {
    let path = path.to_path_buf();
    move |source| CoordError::Store(StoreError::Fs { op, path, source })
}

/// The directory `spec`'s stores live under, in the store directory `dir`.
pub fn store_root(dir: &Path, spec: &SpecTable) -> PathBuf {
    match &spec.identity {
        Some(id) => dir.join(format!("{PREFIX}{}", id.hex())),
        None => dir.to_path_buf(),
    }
}

/// Creates `dir/id-<hex>` and its `IDENTITY` file (atomically, when
/// missing) and marks the identity as used now.
pub fn record(dir: &Path, id: &Identity) -> Result<PathBuf> {
    ucm_store::paths::ensure_dir(dir)?;
    let root = dir.join(format!("{PREFIX}{}", id.hex()));
    ucm_store::paths::ensure_dir(&root)?;
    let file = root.join(IDENTITY_FILE);
    // The marker writer ends the file with a line feed of its own.
    let body = id.text.strip_suffix('\n').unwrap_or(&id.text);
    match read_text(&file)? {
        Some(t) if t == id.text => {}
        Some(_) => {
            // Same digest, other text: a damaged file (md5 collisions
            // aside); written again.
            ucm_store::paths::replace_marker(&file, &root, body)?;
        }
        None => {
            ucm_store::paths::create_marker(&file, &root, body)?;
        }
    }
    touch(&file)?;
    Ok(root)
}

/// Sets `file`'s modification time to now (a link in its place is an
/// error, never followed).
fn touch(file: &Path) -> Result<()> {
    match fs::symlink_metadata(file) {
        Ok(m) if m.is_file() => {}
        Ok(_) => {
            return Err(CoordError::BadRequest(RequestError::NotARegularFile {
                path: file.to_path_buf(),
            }))
        }
        Err(e) => return Err(fs_err("inspect", file)(e)),
    }
    let f = fs::OpenOptions::new()
        .append(true)
        .open(file)
        .map_err(fs_err("open", file))?;
    f.set_modified(SystemTime::now())
        .map_err(fs_err("set the modification time of", file))
}

/// Marks an identity as used at most every [`TOUCH_EVERY`] (cheap to call
/// on every step).
#[derive(Debug)]
pub struct UseMark {
    file: PathBuf,
    last: AtomicU64,
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl UseMark {
    /// The mark of the identity whose stores are under `root` (just
    /// recorded, so used now).
    pub fn new(root: &Path) -> Self {
        UseMark {
            file: root.join(IDENTITY_FILE),
            last: AtomicU64::new(now_secs()),
        }
    }

    /// Marks the identity as used when the last mark is older than
    /// [`TOUCH_EVERY`]. A failure is logged, never returned: the mark only
    /// protects the identity from [`expire`].
    pub fn used(&self) {
        let now = now_secs();
        let last = self.last.load(Ordering::Relaxed);
        if now.saturating_sub(last) < TOUCH_EVERY.as_secs()
            || self
                .last
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        if let Err(e) = touch(&self.file) {
            log::warn!("ucm: could not mark the identity as used: {e}");
        }
    }
}

fn is_hex32(s: &str) -> bool {
    s.len() == 32
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

fn tree_bytes(path: &Path) -> u64 {
    let mut total = 0;
    let Ok(rd) = fs::read_dir(path) else { return 0 };
    for e in rd.flatten() {
        let Ok(m) = e.metadata() else { continue };
        if m.is_dir() {
            total += tree_bytes(&e.path());
        } else if m.is_file() {
            total += m.len();
        }
    }
    total
}

/// The identities `dir` holds, by digest, with their bytes. Entries that
/// are not an identity's directory (links included) are skipped.
pub fn list(dir: &Path) -> Result<Vec<IdentityEntry>> {
    scan(dir, true)
}

/// [`list`], with the bytes walked only when `with_bytes` (else 0).
fn scan(dir: &Path, with_bytes: bool) -> Result<Vec<IdentityEntry>> {
    let mut out = Vec::new();
    let rd = match fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(fs_err("list", dir)(e)),
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(hex) = name.strip_prefix(PREFIX) else {
            continue;
        };
        if !is_hex32(hex) {
            continue;
        }
        let path = e.path();
        match fs::symlink_metadata(&path) {
            Ok(m) if m.is_dir() => {}
            _ => continue,
        }
        let file = path.join(IDENTITY_FILE);
        let Ok(Some(text)) = read_text(&file) else {
            continue;
        };
        let last_used = fs::symlink_metadata(&file)
            .and_then(|m| m.modified())
            .unwrap_or(UNIX_EPOCH);
        let model = text
            .lines()
            .find_map(|l| l.strip_prefix("model="))
            .unwrap_or("")
            .to_string();
        out.push(IdentityEntry {
            hex: hex.to_string(),
            model,
            bytes: if with_bytes { tree_bytes(&path) } else { 0 },
            text,
            last_used,
        });
    }
    out.sort_by(|a, b| a.hex.cmp(&b.hex));
    Ok(out)
}

/// Removes the identity `hex` and its stores from `dir`; returns the bytes
/// freed. An unknown or malformed digest is an error. Engines still using
/// it lose what it held (their loads fail and are recomputed).
pub fn remove(dir: &Path, hex: &str) -> Result<u64> {
    if !is_hex32(hex) {
        return Err(CoordError::BadRequest(RequestError::NotADigest {
            text: hex.chars().take(80).collect(),
        }));
    }
    if !scan(dir, false)?.iter().any(|e| e.hex == hex) {
        return Err(CoordError::BadRequest(RequestError::NoSuchIdentity {
            dir: dir.to_path_buf(),
            digest: hex.to_string(),
        }));
    }
    remove_listed(dir, hex)
}

/// Removes the listed identity `hex`; returns the bytes its tree held
/// (walked here, for this identity only).
fn remove_listed(dir: &Path, hex: &str) -> Result<u64> {
    let path = dir.join(format!("{PREFIX}{hex}"));
    let bytes = tree_bytes(&path);
    // Renamed first, so a concurrent open never sees half a tree under the
    // live name; then removed (remove_dir_all never follows links).
    let gone = dir.join(format!(
        ".{PREFIX}{hex}.gone.{}",
        ucm_store::paths::next_nonce()
    ));
    fs::rename(&path, &gone).map_err(fs_err("rename", &path))?;
    fs::remove_dir_all(&gone).map_err(fs_err("remove", &gone))?;
    Ok(bytes)
}

/// Removes every identity of `dir` not used for longer than `max_idle`,
/// except `keep`; returns what was removed, with the bytes freed.
pub fn expire(dir: &Path, max_idle: Duration, keep: Option<&str>) -> Result<Vec<(String, u64)>> {
    let now = SystemTime::now();
    let mut out = Vec::new();
    // What an interrupted removal left (renamed away, not yet removed).
    if let Ok(rd) = fs::read_dir(dir) {
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let left = name.starts_with(&format!(".{PREFIX}")) && name.contains(".gone.");
            if left && e.file_type().is_ok_and(|t| t.is_dir()) {
                let _ = fs::remove_dir_all(e.path());
            }
        }
    }
    // Runs at every store open: no tree is walked but the removed ones'.
    for e in scan(dir, false)? {
        if Some(e.hex.as_str()) == keep {
            continue;
        }
        let idle = now.duration_since(e.last_used).unwrap_or(Duration::ZERO);
        if idle > max_idle {
            match remove_listed(dir, &e.hex) {
                Ok(bytes) => out.push((e.hex, bytes)),
                // Another process removed it meanwhile.
                Err(_) if !dir.join(format!("{PREFIX}{}", e.hex)).exists() => {}
                Err(err) => return Err(err),
            }
        }
    }
    Ok(out)
}

/// The lines in which two canonical texts differ, as `key: ours -> theirs`
/// (group lines carry their group's name).
pub fn differences(ours: &str, theirs: &str) -> Vec<String> {
    fn keyed(t: &str) -> Vec<(String, String)> {
        let mut group = String::new();
        let mut out = Vec::new();
        for l in t.lines() {
            let (k, v) = l.split_once('=').unwrap_or((l, ""));
            if k == "group" {
                group = v.to_string();
            }
            let key = if group.is_empty() || k == "group" {
                k.to_string()
            } else {
                format!("{group}.{k}")
            };
            out.push((key, v.to_string()));
        }
        out
    }
    let a = keyed(ours);
    let b = keyed(theirs);
    let mut out = Vec::new();
    for (k, v) in &a {
        match b.iter().find(|(k2, _)| k2 == k) {
            Some((_, w)) if w != v => out.push(format!("{k}: {v:?} -> {w:?}")),
            None => out.push(format!("{k}: {v:?} -> (absent)")),
            _ => {}
        }
    }
    for (k, w) in &b {
        if !a.iter().any(|(k2, _)| k2 == k) {
            out.push(format!("{k}: (absent) -> {w:?}"));
        }
    }
    out
}

/// A note for the operator when `dir` holds identities of `spec`'s model
/// other than `spec`'s own (a miss may be one of them): each other digest
/// and what differs. `None` when there are none (or `spec` has no
/// identity).
pub fn others_note(dir: &Path, spec: &SpecTable) -> Option<String> {
    let id = spec.identity.as_ref()?;
    let ours = id.hex();
    let others: Vec<IdentityEntry> = scan(dir, false)
        .ok()?
        .into_iter()
        .filter(|e| e.model == spec.model && e.hex != ours)
        .collect();
    if others.is_empty() {
        return None;
    }
    let mut note = format!(
        "the store holds {} other identit{} of model `{}` (this deployment is {ours}): ",
        others.len(),
        if others.len() == 1 { "y" } else { "ies" },
        spec.model
    );
    let parts: Vec<String> = others
        .iter()
        .map(|e| {
            let d = differences(&id.text, &e.text);
            format!("{} differs in {}", e.hex, d.join(", "))
        })
        .collect();
    note.push_str(&parts.join("; "));
    Some(note)
}
