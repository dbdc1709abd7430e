//! `ucm bench io`: sequential and random read and write GiB/s of each I/O
//! engine, beside `fio` with the same engine, block size, depth and file,
//! interleaved in the same run.

use std::collections::VecDeque;
use std::fmt;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;
use ucm_device::io::{IoOp, DIRECT_IO_ALIGN};
use ucm_device::{
    DeviceError, IoBuf, IoEngine, IoEngineConfig, IoEngineKind, IoFile, IoRequest, OpenOptions,
};

use super::{gib_s, round_to, Paired, Spread};

/// Access pattern of a case.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Pattern {
    /// Ascending offsets, each block once.
    SeqWrite,
    /// Ascending offsets, each block once.
    SeqRead,
    /// A random permutation of the blocks.
    RandWrite,
    /// A random permutation of the blocks.
    RandRead,
}

impl Pattern {
    /// All four patterns.
    pub const ALL: [Pattern; 4] = [
        Pattern::SeqWrite,
        Pattern::SeqRead,
        Pattern::RandWrite,
        Pattern::RandRead,
    ];

    fn name(self) -> &'static str {
        match self {
            Pattern::SeqWrite => "seq_write",
            Pattern::SeqRead => "seq_read",
            Pattern::RandWrite => "rand_write",
            Pattern::RandRead => "rand_read",
        }
    }

    fn is_write(self) -> bool {
        matches!(self, Pattern::SeqWrite | Pattern::RandWrite)
    }

    fn is_random(self) -> bool {
        matches!(self, Pattern::RandWrite | Pattern::RandRead)
    }

    fn fio_rw(self) -> &'static str {
        match self {
            Pattern::SeqWrite => "write",
            Pattern::SeqRead => "read",
            Pattern::RandWrite => "randwrite",
            Pattern::RandRead => "randread",
        }
    }
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that is not one of [`Pattern::ALL`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown op {0:?} (seq_write, seq_read, rand_write, rand_read)")]
pub struct UnknownPattern(pub String);

impl FromStr for Pattern {
    type Err = UnknownPattern;

    fn from_str(s: &str) -> Result<Self, UnknownPattern> {
        Pattern::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| UnknownPattern(s.chars().take(64).collect()))
    }
}

/// What to measure.
#[derive(Clone, Debug)]
pub struct IoBenchConfig {
    /// Directory of the bench file (use tmpfs `/dev/shm` for stable numbers).
    pub dir: PathBuf,
    /// Engines to measure (those unavailable here are skipped with a note).
    pub engines: Vec<IoEngineKind>,
    /// Access patterns.
    pub ops: Vec<Pattern>,
    /// Block sizes in bytes (multiples of 4 KiB).
    pub blocks: Vec<usize>,
    /// Queue depths.
    pub depths: Vec<usize>,
    /// Bytes each run moves (the bench file's size).
    pub file_bytes: u64,
    /// Rounds of ours and of fio per case, interleaved; the medians are
    /// compared, and the extremes reported beside them.
    pub reps: usize,
    /// Compare with fio when it is installed.
    pub use_fio: bool,
}

impl Default for IoBenchConfig {
    fn default() -> Self {
        IoBenchConfig {
            dir: std::env::temp_dir(),
            engines: IoEngineKind::CONCRETE.to_vec(),
            ops: Pattern::ALL.to_vec(),
            blocks: vec![64 << 10, 512 << 10, 2 << 20],
            depths: vec![1, 8, 32],
            file_bytes: 1 << 30,
            reps: 5,
            use_fio: true,
        }
    }
}

/// One measured case: the JSON record of `ucm bench io --json`.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct IoBenchRecord {
    /// Engine name.
    pub engine: String,
    /// Access pattern.
    pub op: Pattern,
    /// Block size.
    pub block_bytes: usize,
    /// Queue depth.
    pub depth: usize,
    /// Our median GiB/s over the rounds.
    pub gib_s: f64,
    /// fio's median GiB/s over the rounds (None without fio), each round
    /// timed as ours are: its bytes over the span from its first I/O's
    /// issue to its last completion (from fio's latency log).
    pub fio_gib_s: Option<f64>,
    /// fio's own median figure (its bytes over the longest job's runtime,
    /// which leaves out how much later some jobs start than others).
    pub fio_own_gib_s: Option<f64>,
    /// Ours over fio: the median of the per-round ratios (None without fio).
    pub ratio: Option<f64>,
    /// Ours over fio round by round (with fio), their median and quartiles.
    pub fio_paired: Option<Paired>,
    /// Our rounds: median, min and max GiB/s.
    pub spread: Spread,
    /// fio's rounds (None without fio).
    pub fio_spread: Option<Spread>,
    /// The median GiB/s of a hand-off-free psync loop over the client's
    /// `depth` buffers, each reused every `depth` operations (the bound of
    /// any engine serving this client, see `run_loop`; D70).
    pub loop_gib_s: f64,
    /// Ours over the loop, the median of the per-round ratios: what the
    /// engine itself costs. The POSIX engine's goal is judged on it
    /// (>= 0.9; D70); fio's ratio is reported beside it.
    pub loop_ratio: f64,
    /// Ours over the same-pattern loop round by round.
    pub loop_paired: Paired,
    /// The loop's rounds.
    pub loop_spread: Spread,
    /// The machine's 1-minute load average when the bench started.
    pub load_average: Option<f64>,
}

/// Errors of the bench.
#[derive(Debug, thiserror::Error)]
pub enum IoBenchError {
    /// A configuration value is unusable.
    #[error("bad bench configuration: {0}")]
    Config(String),
    /// The HAL reported an error.
    #[error(transparent)]
    Device(#[from] DeviceError),
    /// Setting up the bench file failed.
    #[error("preparing {path}: {source}")]
    Setup {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// fio ran but failed or printed something we cannot read.
    #[error("fio failed: {0}")]
    Fio(String),
}

impl IoBenchConfig {
    fn validate(&self) -> Result<(), IoBenchError> {
        let bad = |m: String| Err(IoBenchError::Config(m));
        if self.reps == 0 {
            return bad("reps must be at least 1".into());
        }
        for &b in &self.blocks {
            if b == 0 || b % DIRECT_IO_ALIGN != 0 {
                return bad(format!("block size {b} is not a positive multiple of 4096"));
            }
            if b as u64 > self.file_bytes {
                return bad(format!(
                    "block size {b} exceeds the file size {}",
                    self.file_bytes
                ));
            }
        }
        if self.depths.iter().any(|&d| d == 0 || d > 1024) {
            return bad("depths must lie in 1..=1024".into());
        }
        if self.file_bytes % DIRECT_IO_ALIGN as u64 != 0 {
            return bad("file size must be a multiple of 4096".into());
        }
        Ok(())
    }
}

/// Whether `fio` is on the PATH.
pub fn fio_available() -> bool {
    Command::new("fio")
        .arg("--version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// Fills `path` with `bytes` of non-zero data, so reads hit real blocks
/// (not holes) and writes overwrite allocated space.
pub(crate) fn lay_out(path: &Path, bytes: u64) -> Result<(), IoBenchError> {
    let setup = |source| IoBenchError::Setup {
        path: path.to_path_buf(),
        source,
    };
    let mut f = std::fs::File::create(path).map_err(setup)?;
    let chunk: Vec<u8> = (0..1 << 20)
        .map(|i: u32| (i.wrapping_mul(2_654_435_761) >> 13) as u8 | 1)
        .collect();
    let mut left = bytes;
    while left > 0 {
        let n = left.min(chunk.len() as u64) as usize;
        f.write_all(&chunk[..n]).map_err(setup)?;
        left -= n as u64;
    }
    f.sync_all().map_err(setup)
}

/// Block offsets of one run, in the order they are issued.
fn offsets(pattern: Pattern, block: usize, file_bytes: u64, seed: u64) -> Vec<u64> {
    let n = file_bytes / block as u64;
    let mut v: Vec<u64> = (0..n).map(|i| i * block as u64).collect();
    if pattern.is_random() {
        // Fisher-Yates with splitmix64: each block once, as fio's random map.
        let mut x = seed;
        for i in (1..v.len()).rev() {
            x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            v.swap(i, (z % (i as u64 + 1)) as usize);
        }
    }
    v
}

/// The client's `n` buffers of `block` bytes, touched (buffer `i` filled
/// with `0x5a ^ i`), as a bench run starts with them.
fn client_buffers(n: usize, block: usize) -> Vec<IoBuf> {
    (0..n)
        .map(|i| {
            let mut b = IoBuf::new(block);
            b.as_mut_slice().fill(0x5a ^ i as u8);
            b
        })
        .collect()
}

/// One run of our engine: keeps `depth` operations in flight until every
/// block was moved once. Returns GiB/s.
fn run_ours(
    engine: &dyn IoEngine,
    file: &Arc<IoFile>,
    pattern: Pattern,
    block: usize,
    depth: usize,
    file_bytes: u64,
    seed: u64,
) -> Result<f64, IoBenchError> {
    let offs = offsets(pattern, block, file_bytes, seed);
    let op = if pattern.is_write() {
        IoOp::Write
    } else {
        IoOp::Read
    };
    let mut free = client_buffers(depth.min(offs.len()), block);
    let mut next = offs.iter();
    let mut inflight = VecDeque::with_capacity(depth);
    let start = Instant::now();
    let mut moved = 0u64;
    loop {
        let mut batch = Vec::new();
        while let Some(buf) = free.pop() {
            match next.next() {
                Some(&off) => batch.push(IoRequest {
                    op,
                    file: Arc::clone(file),
                    offset: off,
                    buf: Some(buf),
                    gather: Vec::new(),
                }),
                None => break,
            }
        }
        if !batch.is_empty() {
            inflight.extend(engine.submit(batch));
        }
        let Some(t) = inflight.pop_front() else { break };
        // The oldest, then every one after it that is already done: their
        // buffers go out again as one batch.
        let mut outs = vec![t.wait()];
        while let Some(t) = inflight.pop_front() {
            match t.wait_timeout(std::time::Duration::ZERO) {
                Ok(out) => outs.push(out),
                Err(t) => {
                    inflight.push_front(t);
                    break;
                }
            }
        }
        for out in outs {
            let n = out.result?;
            if n != block {
                return Err(IoBenchError::Config(format!(
                    "short transfer of {n} bytes; is the bench file complete?"
                )));
            }
            moved += n as u64;
            if let Some(b) = out.buf {
                free.push(b);
            }
        }
    }
    Ok(gib_s(moved, start.elapsed().as_secs_f64()))
}

/// The same-run bound of any engine serving [`run_ours`]' client: `depth`
/// threads issue `pread`/`pwrite` themselves (no hand-off, no completion
/// to wait for), operation `i` into buffer `i % depth` of the client's
/// `depth` buffers, so each buffer is reused once every `depth` operations
/// in order, as the client's are when an engine gives them back. fio's
/// psync jobs instead each reuse one buffer back to back; where `depth`
/// buffers outgrow the cache, that locality is worth more than an engine's
/// own cost (D70). Same file and open flags (`O_DIRECT` where our file has
/// it), same offsets. Returns GiB/s; an error unless every block moved.
fn run_loop(
    file: &IoFile,
    pattern: Pattern,
    block: usize,
    depth: usize,
    file_bytes: u64,
    seed: u64,
) -> Result<f64, IoBenchError> {
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;
    let setup = |source| IoBenchError::Setup {
        path: file.path().to_path_buf(),
        source,
    };
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(pattern.is_write())
        .custom_flags(if file.is_direct() { libc::O_DIRECT } else { 0 })
        .open(file.path())
        .map_err(setup)?;
    let offs = offsets(pattern, block, file_bytes, seed);
    let threads = depth.clamp(1, offs.len().max(1));
    // Operation `i` takes buffer `i % depth`: each buffer is reused once
    // every `depth` operations, in order (as the client's buffers come
    // back from an engine). Its lock is only ever contended when
    // operation `i - depth` is still running.
    let bufs: Vec<Mutex<IoBuf>> = client_buffers(threads, block)
        .into_iter()
        .map(Mutex::new)
        .collect();
    let next = AtomicUsize::new(0);
    let one = || -> std::io::Result<u64> {
        let mut moved = 0u64;
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some(&off) = offs.get(i) else {
                return Ok(moved);
            };
            let mut buf = bufs[i % threads].lock().unwrap_or_else(|e| e.into_inner());
            if pattern.is_write() {
                f.write_all_at(buf.as_slice(), off)?;
            } else {
                f.read_exact_at(buf.as_mut_slice(), off)?;
            }
            moved += block as u64;
        }
    };
    let start = Instant::now();
    let moved = std::thread::scope(|s| {
        let others: Vec<_> = (1..threads).map(|_| s.spawn(one)).collect();
        let mut total = one();
        for h in others {
            let r = h
                .join()
                .unwrap_or_else(|_| Err(std::io::Error::other("a loop thread panicked")));
            total = match (total, r) {
                (Ok(a), Ok(b)) => Ok(a + b),
                (Err(e), _) | (_, Err(e)) => Err(e),
            };
        }
        total
    })
    .map_err(|source| DeviceError::Io {
        op: if pattern.is_write() {
            "pwrite"
        } else {
            "pread"
        },
        path: Some(file.path().to_path_buf()),
        source,
    })?;
    let secs = start.elapsed().as_secs_f64();
    if moved != offs.len() as u64 * block as u64 {
        return Err(IoBenchError::Config(format!(
            "the loop moved {moved} of {} bytes",
            offs.len() * block
        )));
    }
    Ok(gib_s(moved, secs))
}

/// What one fio run measured, in GiB/s.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct FioRun {
    /// fio's own figure: the bytes over the longest job's runtime.
    pub own: f64,
    /// The bytes over the span from the first I/O's issue to the last
    /// completion, from fio's per-I/O latency log: the clock our runs are
    /// timed on. `None` unless asked for.
    pub span: Option<f64>,
}

/// One fio run with the same engine, pattern, size and file. With `span`,
/// fio also logs each I/O's completion time and latency (in files beside
/// `path`, removed afterwards) and [`FioRun::span`] is measured.
pub(crate) fn run_fio(
    kind: IoEngineKind,
    path: &Path,
    pattern: Pattern,
    block: usize,
    depth: usize,
    file_bytes: u64,
    span: bool,
) -> Result<FioRun, IoBenchError> {
    // fio reuses an existing file: make it 0600 first (fio would use 0644).
    {
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        let _ = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(path);
        let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600));
    }
    let mut cmd = Command::new("fio");
    cmd.arg("--name=ucm-bench")
        .arg(format!("--filename={}", path.display()))
        .arg(format!("--rw={}", pattern.fio_rw()))
        .arg(format!("--bs={block}"))
        .arg("--direct=1")
        .arg("--randrepeat=0")
        .arg("--output-format=json")
        .arg("--group_reporting");
    match kind {
        IoEngineKind::Posix => {
            // Our POSIX engine runs `depth` blocking calls on as many threads;
            // fio's equivalent is `depth` psync jobs over slices of the file.
            let jobs = depth.min((file_bytes / block as u64) as usize).max(1);
            let slice = (file_bytes / jobs as u64) / block as u64 * block as u64;
            cmd.arg("--ioengine=psync")
                .arg("--thread")
                .arg(format!("--numjobs={jobs}"))
                .arg(format!("--size={slice}"))
                .arg(format!("--offset_increment={slice}"));
        }
        _ => {
            cmd.arg(format!("--ioengine={}", kind.name()))
                .arg(format!("--iodepth={depth}"))
                .arg(format!("--size={file_bytes}"));
        }
    }
    let log_prefix = path.with_file_name("fio-lat");
    if span {
        // One line per I/O: completion time (Unix ms), latency (ns), ...
        cmd.arg(format!("--write_lat_log={}", log_prefix.display()))
            .arg("--log_unix_epoch=1");
    }
    let out = cmd.output();
    // Read (and removed) whether or not fio succeeded.
    let logs = span.then(|| lat_logs(&log_prefix));
    let out = out.map_err(|e| IoBenchError::Fio(format!("cannot run fio: {e}")))?;
    if !out.status.success() {
        return Err(IoBenchError::Fio(
            String::from_utf8_lossy(&out.stderr).into_owned(),
        ));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    // fio may print notes before the JSON document.
    let json = text.find('{').map_or("", |i| &text[i..]);
    let v: serde_json::Value = serde_json::from_str(json)
        .map_err(|e| IoBenchError::Fio(format!("unreadable JSON ({e})")))?;
    let dir = if pattern.is_write() { "write" } else { "read" };
    let bw = v["jobs"][0][dir]["bw_bytes"]
        .as_f64()
        .ok_or_else(|| IoBenchError::Fio(format!("no jobs[0].{dir}.bw_bytes")))?;
    let io_bytes = v["jobs"][0][dir]["io_bytes"]
        .as_f64()
        .ok_or_else(|| IoBenchError::Fio(format!("no jobs[0].{dir}.io_bytes")))?;
    let span = match logs {
        Some(logs) => Some(gib_s(io_bytes as u64, span_secs(&logs?)?)),
        None => None,
    };
    Ok(FioRun {
        own: bw / (1u64 << 30) as f64,
        span,
    })
}

/// Reads and removes the total-latency logs fio wrote under `prefix`
/// (one per job: `<prefix>_lat.<job>.log`); the other logs of the same
/// option (`_clat`, `_slat`) are removed unread.
fn lat_logs(prefix: &Path) -> Result<Vec<String>, IoBenchError> {
    let dir = prefix.parent().unwrap_or(Path::new("."));
    let stem = prefix
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let entries = std::fs::read_dir(dir).map_err(|source| IoBenchError::Setup {
        path: dir.to_path_buf(),
        source,
    })?;
    let mut texts = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(&stem) else {
            continue;
        };
        if rest.starts_with("_lat.") && rest.ends_with(".log") {
            let text = std::fs::read_to_string(e.path());
            let _ = std::fs::remove_file(e.path());
            texts.push(text.map_err(|source| IoBenchError::Setup {
                path: e.path(),
                source,
            })?);
        } else if rest.starts_with('_') && rest.ends_with(".log") {
            let _ = std::fs::remove_file(e.path());
        }
    }
    Ok(texts)
}

/// Seconds from the first I/O's issue to the last one's completion in
/// fio latency logs: each line is `time_ms, latency_ns, ...`, logged at
/// completion, so the I/O was issued `latency` before `time`.
fn span_secs(logs: &[String]) -> Result<f64, IoBenchError> {
    let (mut first, mut last) = (f64::INFINITY, f64::NEG_INFINITY);
    for line in logs.iter().flat_map(|t| t.lines()) {
        let mut f = line.split(',').map(str::trim);
        let (Some(t), Some(lat)) = (f.next(), f.next()) else {
            continue;
        };
        let (Ok(t), Ok(lat)) = (t.parse::<f64>(), lat.parse::<f64>()) else {
            return Err(IoBenchError::Fio(format!(
                "unreadable latency log line {line:?}"
            )));
        };
        let done = t / 1e3;
        first = first.min(done - lat / 1e9);
        last = last.max(done);
    }
    if last > first {
        Ok(last - first)
    } else {
        Err(IoBenchError::Fio("fio wrote no latency log".into()))
    }
}

/// Runs every case. `progress` gets a line per case as it finishes.
pub fn run(
    cfg: &IoBenchConfig,
    mut progress: impl FnMut(&str),
) -> Result<Vec<IoBenchRecord>, IoBenchError> {
    cfg.validate()?;
    std::fs::create_dir_all(&cfg.dir).map_err(|source| IoBenchError::Setup {
        path: cfg.dir.clone(),
        source,
    })?;
    // The bench file lives in a 0700 scratch directory of this run, gone
    // on every exit path (and cleared by a later run if this one is killed).
    let scratch = ucm_harness::scratch::Scratch::new(&cfg.dir, "bench-io").map_err(|source| {
        IoBenchError::Setup {
            path: cfg.dir.clone(),
            source,
        }
    })?;
    let path = scratch.path().join("bench.dat");
    run_in(cfg, &path, &mut progress)
}

fn run_in(
    cfg: &IoBenchConfig,
    path: &Path,
    progress: &mut dyn FnMut(&str),
) -> Result<Vec<IoBenchRecord>, IoBenchError> {
    let load = super::announce_load(progress);
    let fio = cfg.use_fio && fio_available();
    if cfg.use_fio && !fio {
        progress("fio not found: fio_gib_s and ratio will be null");
    }
    progress(&format!(
        "laying out {} MiB in {}",
        cfg.file_bytes >> 20,
        path.display()
    ));
    lay_out(path, cfg.file_bytes)?;
    let file = Arc::new(IoFile::open(path, OpenOptions::read_write())?);
    if !file.is_direct() {
        progress("O_DIRECT refused here: our runs use buffered I/O, fio's use --direct=1");
    }
    let total = cfg.engines.len() * cfg.ops.len() * cfg.blocks.len() * cfg.depths.len();
    let mut done = 0;
    let mut records = Vec::new();
    for &kind in &cfg.engines {
        for &depth in &cfg.depths {
            let mut ecfg = IoEngineConfig::new(kind);
            ecfg.queue_depth = depth.max(8);
            if kind == IoEngineKind::Posix {
                ecfg.workers = depth;
            }
            let engine = match ecfg.build() {
                Ok(e) => e,
                Err(e) => {
                    progress(&format!("skipping {kind}: {e}"));
                    done += cfg.ops.len() * cfg.blocks.len();
                    continue;
                }
            };
            for &pattern in &cfg.ops {
                for &block in &cfg.blocks {
                    let mut ours = Vec::new();
                    let mut looped = Vec::new();
                    let mut theirs = Vec::new();
                    let mut theirs_own = Vec::new();
                    for rep in 0..cfg.reps {
                        let seed = 0x5eed ^ rep as u64;
                        let mine = || {
                            run_ours(
                                engine.as_ref(),
                                &file,
                                pattern,
                                block,
                                depth,
                                cfg.file_bytes,
                                seed,
                            )
                        };
                        // Alternate who goes first: the disk drifts.
                        if rep % 2 == 0 {
                            ours.push(mine()?);
                        }
                        if fio {
                            let r =
                                run_fio(kind, path, pattern, block, depth, cfg.file_bytes, true)?;
                            // Never fio's own figure in its place: the
                            // two sides must share one clock.
                            theirs.push(
                                r.span
                                    .ok_or_else(|| IoBenchError::Fio("no span measured".into()))?,
                            );
                            theirs_own.push(r.own);
                        }
                        if rep % 2 == 1 {
                            ours.push(mine()?);
                        }
                        looped.push(run_loop(
                            &file,
                            pattern,
                            block,
                            depth,
                            cfg.file_bytes,
                            seed,
                        )?);
                    }
                    // Medians of the interleaved rounds on both sides, the
                    // extremes beside them.
                    let fio_paired = fio.then(|| Paired::of(&ours, &theirs, 3));
                    let loop_paired = Paired::of(&ours, &looped, 3);
                    let ours = Spread::of(&ours);
                    let looped = Spread::of(&looped);
                    let theirs = fio.then(|| Spread::of(&theirs));
                    let own = fio.then(|| Spread::of(&theirs_own).median);
                    let g = ours.median;
                    let f = theirs.map(|t| t.median);
                    let rec = IoBenchRecord {
                        engine: kind.name().to_string(),
                        op: pattern,
                        block_bytes: block,
                        depth,
                        gib_s: round_to(g, 3),
                        fio_gib_s: f.map(|x| round_to(x, 3)),
                        fio_own_gib_s: own.map(|x| round_to(x, 3)),
                        ratio: f
                            .filter(|&f| f > 0.0)
                            .and(fio_paired.as_ref().map(|p| p.median)),
                        fio_paired,
                        spread: ours.rounded(3),
                        fio_spread: theirs.map(|t| t.rounded(3)),
                        loop_gib_s: round_to(looped.median, 3),
                        loop_ratio: loop_paired.median,
                        loop_paired,
                        loop_spread: looped.rounded(3),
                        load_average: load,
                    };
                    done += 1;
                    progress(&format!(
                        "[{done}/{total}] {:<8} {:<10} {:>5} KiB depth {:>2}: {} GiB/s (loop {}, ratio {:.2}), fio {}",
                        rec.engine,
                        rec.op.name(),
                        block >> 10,
                        depth,
                        ours.text(3),
                        looped.text(3),
                        rec.loop_ratio,
                        theirs.map_or("n/a".to_string(), |t| format!(
                            "{} GiB/s, its own figure {:.3} (ratio of medians {:.2})",
                            t.text(3),
                            own.unwrap_or(f64::NAN),
                            g / t.median.max(1e-9)
                        ))
                    ));
                    records.push(rec);
                }
            }
        }
    }
    Ok(records)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_cover_every_block_once() {
        for p in Pattern::ALL {
            let mut v = offsets(p, 8192, 8192 * 100, 7);
            if p.is_random() {
                assert_ne!(v, offsets(Pattern::SeqRead, 8192, 8192 * 100, 7));
            }
            v.sort();
            assert_eq!(v, (0..100).map(|i| i * 8192).collect::<Vec<u64>>());
        }
    }

    #[test]
    fn the_span_runs_from_the_first_issue_to_the_last_completion() {
        // Two jobs' logs: completion time (ms), latency (ns), direction,
        // block size, offset. The first I/O was issued at 95 ms (done at
        // 100 ms after 5 ms), the last done at 120 ms.
        let logs = vec![
            "100, 5000000, 1, 2097152, 0\n110, 2000000, 1, 2097152, 2097152\n".to_string(),
            "104, 3000000, 1, 2097152, 4194304\n120, 1000000, 1, 2097152, 6291456\n".to_string(),
        ];
        let s = span_secs(&logs).unwrap();
        assert!((s - 0.025).abs() < 1e-9, "{s}");
        assert!(matches!(
            span_secs(&[String::new()]),
            Err(IoBenchError::Fio(_))
        ));
        assert!(matches!(
            span_secs(&["12, x, 1\n".to_string()]),
            Err(IoBenchError::Fio(_))
        ));
    }

    #[test]
    fn latency_logs_are_read_and_every_log_of_the_run_removed() {
        let dir = tempfile::tempdir().unwrap();
        let prefix = dir.path().join("fio-lat");
        for (name, text) in [
            ("fio-lat_lat.1.log", "10, 1000000, 1, 4096, 0\n"),
            ("fio-lat_lat.2.log", "12, 1000000, 1, 4096, 4096\n"),
            ("fio-lat_clat.1.log", "junk"),
            ("fio-lat_slat.1.log", "junk"),
            ("bench.dat", "kept"),
        ] {
            std::fs::write(dir.path().join(name), text).unwrap();
        }
        let mut logs = lat_logs(&prefix).unwrap();
        logs.sort();
        assert_eq!(
            logs,
            ["10, 1000000, 1, 4096, 0\n", "12, 1000000, 1, 4096, 4096\n"]
        );
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(left, ["bench.dat"]);
    }

    #[test]
    fn fio_is_timed_on_the_span_beside_its_own_figure() {
        if !fio_available() {
            eprintln!("skipped: fio is not installed");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bench.dat");
        lay_out(&path, 8 << 20).unwrap();
        let r = run_fio(
            IoEngineKind::Posix,
            &path,
            Pattern::SeqRead,
            1 << 20,
            4,
            8 << 20,
            true,
        )
        .unwrap();
        assert!(r.own > 0.0);
        assert!(r.span.is_some_and(|s| s > 0.0), "{r:?}");
        let left = std::fs::read_dir(dir.path()).unwrap().count();
        assert_eq!(left, 1, "fio's logs were left behind");
    }

    #[test]
    fn bad_configs_are_refused() {
        let bad = [
            IoBenchConfig {
                blocks: vec![1000],
                ..Default::default()
            },
            IoBenchConfig {
                reps: 0,
                ..Default::default()
            },
            IoBenchConfig {
                depths: vec![0],
                ..Default::default()
            },
        ];
        for c in bad {
            assert!(matches!(run(&c, |_| {}), Err(IoBenchError::Config(_))));
        }
    }

    #[test]
    fn small_run_without_fio_reports_every_case() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = IoBenchConfig {
            dir: dir.path().to_path_buf(),
            engines: vec![IoEngineKind::Posix],
            ops: Pattern::ALL.to_vec(),
            blocks: vec![64 << 10],
            depths: vec![1, 4],
            file_bytes: 4 << 20,
            reps: 2,
            use_fio: false,
        };
        let recs = run(&cfg, |_| {}).unwrap();
        assert_eq!(recs.len(), 8);
        assert!(recs
            .iter()
            .all(|r| r.gib_s > 0.0 && r.fio_gib_s.is_none() && r.ratio.is_none()));
        assert!(recs
            .iter()
            .all(|r| r.loop_gib_s > 0.0 && r.loop_ratio > 0.0 && r.loop_spread.rounds == 2));
        // The bench file is removed.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    /// The loop moves every block once, operation `i` through buffer
    /// `i % depth`: a sequential write leaves block `i` filled with buffer
    /// `i % depth`'s byte, and a random one the same at each block's
    /// place in the random order.
    #[test]
    fn the_loop_writes_each_block_from_buffer_i_mod_depth() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bench.dat");
        let (block, blocks, depth) = (8192usize, 64u64, 5usize);
        lay_out(&path, block as u64 * blocks).unwrap();
        let file = IoFile::open(&path, OpenOptions::read_write()).unwrap();
        for pattern in [Pattern::SeqWrite, Pattern::RandWrite] {
            let bytes = block as u64 * blocks;
            let g = run_loop(&file, pattern, block, depth, bytes, 9).unwrap();
            assert!(g > 0.0);
            let data = std::fs::read(&path).unwrap();
            for (i, off) in offsets(pattern, block, bytes, 9).into_iter().enumerate() {
                let want = 0x5a ^ (i % depth) as u8;
                let got = &data[off as usize..off as usize + block];
                assert!(got.iter().all(|&b| b == want), "{pattern} op {i}");
            }
            // Reads move every block too (an error otherwise).
            let read = if pattern.is_random() {
                Pattern::RandRead
            } else {
                Pattern::SeqRead
            };
            assert!(run_loop(&file, read, block, depth, bytes, 9).unwrap() > 0.0);
        }
    }
}
