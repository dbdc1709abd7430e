//! `ucm replay --instances N`: N engine instances, each its own process
//! with its own memory pool, scheduler and checkpoint directory, over one
//! shared configuration.
//!
//! - **Placement.** The workload's requests are dealt to instances by
//!   `(session + turn) mod N`, so that each turn of a session runs on
//!   another instance than the turn before: whatever a request reuses of its
//!   session was computed elsewhere. Instances run at once, so a request
//!   may also arrive before its predecessor was stored: a miss, not an
//!   error.
//! - **Sharing.** Without `--remote` or `--cold` every instance opens the
//!   same disk-tier directory (instances of one machine or of a shared
//!   filesystem). With either, each instance has a disk directory of its
//!   own and they share only the remote tiers (instances on separate
//!   machines).
//! - **What is reported.** Per instance: its requests, the tokens served,
//!   and the tokens served **from another instance's work**: for each
//!   request, what it was served beyond what this instance's own earlier
//!   requests could have given it (the longest prefix shared with one of
//!   them, on the chain grid, less the last token). Wrong hits are checked
//!   by each instance's content oracle (content is a function of the block
//!   id, so an instance checks bytes another one wrote); any wrong hit or
//!   lost save fails the run.
//!
//! The parent spawns its own executable once per instance with the same
//! arguments plus a hidden `--instance K --instance-dir DIR`; each child
//! runs `ucm` mode on its share and prints an [`InstanceReport`] as JSON.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::report::{ratio, ModeReport};
use super::{
    bad_option, io_err, prepare, reusable, run_mode, workload, Mode, ReplayConfig, ReplayError,
    Result,
};

/// At most this many instances.
pub const MAX_INSTANCES: usize = 64;
// The refusal of `--instances` states the bound in words.
const _: () = assert!(MAX_INSTANCES == 64);

/// This process's part in a multi-instance replay.
#[derive(Clone, Debug)]
pub struct InstanceRole {
    /// This instance, `0..count`.
    pub index: usize,
    /// Instances in the run.
    pub count: usize,
    /// The directory the parent made for the run.
    pub dir: PathBuf,
}

/// What one instance reports to the parent.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct InstanceReport {
    /// The instance.
    pub index: usize,
    /// Its `ucm` mode over its share of the requests.
    pub report: ModeReport,
    /// Tokens this instance's own earlier requests could have served
    /// (on the chain grid, without the last token).
    pub own_reusable_tokens: u64,
    /// Tokens served beyond that: another instance's work.
    pub from_other_instances: u64,
}

/// The multi-instance report.
#[derive(Clone, Debug, Serialize)]
pub struct InstancesReport {
    /// Instances.
    pub instances: usize,
    /// How they share: `directory` or `remote`.
    pub sharing: &'static str,
    /// Per instance.
    pub per_instance: Vec<InstanceReport>,
    /// Requests over all instances.
    pub requests: usize,
    /// Tokens served over all instances.
    pub cached_tokens: u64,
    /// Tokens reusable at all (against every earlier request of the
    /// workload, whichever instance ran it).
    pub reusable_tokens: u64,
    /// `cached_tokens / reusable_tokens`.
    pub hit_rate: f64,
    /// Tokens served from another instance's work.
    pub from_other_instances: u64,
    /// Wrong hits over all instances (must be 0).
    pub wrong_hits: u64,
    /// Saves reported good that no tier held (must be 0).
    pub lost_saves: u64,
    /// Items the oracles checked.
    pub checked_items: u64,
}

/// How one instance of a multi-instance run failed.
#[derive(Debug, thiserror::Error)]
pub enum InstanceFailure {
    /// Its process could not be waited for.
    #[error("instance {index}: {source}")]
    Wait {
        /// The instance.
        index: usize,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// It exited with a failure.
    #[error("instance {index} failed ({status}): {tail}")]
    Exit {
        /// The instance.
        index: usize,
        /// Its exit status.
        status: std::process::ExitStatus,
        /// The last line it wrote to stderr.
        tail: String,
    },
    /// Its report does not parse.
    #[error("instance {index}: its report does not parse: {source}")]
    Report {
        /// The instance.
        index: usize,
        /// The parser's error.
        #[source]
        source: serde_json::Error,
    },
    /// A thread reading its output panicked (a bug).
    #[error("a reader thread panicked")]
    ReaderPanicked,
}

/// The instance a request runs on.
pub fn placement(session: usize, turn: usize, count: usize) -> usize {
    (session + turn) % count.max(1)
}

fn check(cfg: &ReplayConfig, count: usize) -> Result<()> {
    if !(2..=MAX_INSTANCES).contains(&count) {
        return Err(bad_option("--instances", count, "between 2 and 64"));
    }
    if cfg.faults > 0.0 {
        return Err(ReplayError::Conflict {
            flag: "--faults",
            why: "restarts engines mid-run",
            other: "--instances",
        });
    }
    Ok(())
}

/// The store directory of instance `index` under the run's directory.
fn store_dir(cfg: &ReplayConfig, role: &InstanceRole) -> PathBuf {
    if cfg.remote.is_some() || cfg.cold.is_some() {
        role.dir.join(format!("instance-{}", role.index))
    } else {
        role.dir.clone()
    }
}

/// Runs this process's instance (the child side).
pub fn run_instance(cfg: &ReplayConfig, progress: &dyn Fn(&str)) -> Result<InstanceReport> {
    let role = cfg.instance.clone().ok_or(ReplayError::NotAnInstance)?;
    check(cfg, role.count)?;
    if role.index >= role.count {
        return Err(bad_option(
            "--instance",
            format!("{} of {}", role.index, role.count),
            "below --instance-count",
        ));
    }
    let ctx = prepare(cfg)?;
    let all = workload(cfg);
    let reuse_all = reusable(&all);
    let (mine, reuse): (Vec<_>, Vec<u64>) = all
        .iter()
        .zip(&reuse_all)
        .filter(|(w, _)| placement(w.session, w.turn, role.count) == role.index)
        .map(|(w, &r)| (w.clone(), r))
        .unzip();
    let own = reusable(&mine);
    let dir = store_dir(cfg, &role);
    std::fs::create_dir_all(&dir).map_err(io_err(&dir))?;
    let dev = std::sync::Arc::new(ucm_device::HostDevice::new());
    let report = run_mode(
        &dev,
        cfg,
        &ctx,
        &mine,
        &reuse,
        Mode::Ucm,
        Some(&dir),
        progress,
    )?;
    let grid = ctx.spec.chain_grid();
    let mut own_reusable_tokens = 0;
    let mut from_other_instances = 0;
    for ((w, &o), &served) in mine.iter().zip(&own).zip(&report.served) {
        let n = w.tokens.len() as u64;
        let possible = o.min(n.saturating_sub(1)) / grid * grid;
        own_reusable_tokens += possible;
        from_other_instances += served.saturating_sub(possible);
    }
    Ok(InstanceReport {
        index: role.index,
        report,
        own_reusable_tokens,
        from_other_instances,
    })
}

/// Removes `--json` and `--plot [FILE]` from the parent's arguments: a
/// child always prints JSON and never plots.
fn child_args(args: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--json" || a.starts_with("--plot=") {
            continue;
        }
        if a == "--plot" {
            it.next();
            continue;
        }
        out.push(a.clone());
    }
    out
}

/// Runs `count` instances as processes of `exe` (the `ucm` binary) given
/// `args` (the parent's `replay` arguments), and aggregates their reports.
/// Children's progress lines go to `progress`, prefixed with the instance.
pub fn run_parent(
    cfg: &ReplayConfig,
    count: usize,
    exe: &Path,
    args: &[String],
    progress: &(dyn Fn(&str) + Sync),
) -> Result<InstancesReport> {
    check(cfg, count)?;
    let scratch = ucm_harness::scratch::Scratch::new(&cfg.dir, "replay-instances")
        .map_err(io_err(&cfg.dir))?;
    let base = child_args(args);
    let mut children = Vec::new();
    for k in 0..count {
        let child = Command::new(exe)
            .args(&base)
            .arg("--instance")
            .arg(k.to_string())
            .arg("--instance-count")
            .arg(count.to_string())
            .arg("--instance-dir")
            .arg(scratch.path())
            .arg("--json")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(io_err(exe))?;
        children.push(child);
    }
    let started = Instant::now();
    let results: Vec<std::result::Result<InstanceReport, InstanceFailure>> =
        std::thread::scope(|s| {
            let handles: Vec<_> = children
                .into_iter()
                .enumerate()
                .map(|(k, mut child)| {
                    s.spawn(move || {
                        let err = child.stderr.take();
                        let out = child.stdout.take();
                        let (tail, json) = std::thread::scope(|s2| {
                            let t = s2.spawn(|| {
                                let mut tail = String::new();
                                if let Some(err) = err {
                                    for line in BufReader::new(err).lines().map_while(|l| l.ok()) {
                                        progress(&format!("instance {k}: {line}"));
                                        tail = line;
                                    }
                                }
                                tail
                            });
                            let mut json = String::new();
                            if let Some(mut out) = out {
                                use std::io::Read;
                                let _ = out.read_to_string(&mut json);
                            }
                            (t.join().unwrap_or_default(), json)
                        });
                        let status = child
                            .wait()
                            .map_err(|source| InstanceFailure::Wait { index: k, source })?;
                        if !status.success() {
                            return Err(InstanceFailure::Exit {
                                index: k,
                                status,
                                tail,
                            });
                        }
                        serde_json::from_str::<InstanceReport>(json.trim())
                            .map_err(|source| InstanceFailure::Report { index: k, source })
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or(Err(InstanceFailure::ReaderPanicked)))
                .collect()
        });
    progress(&format!(
        "{count} instances done in {:.1}s",
        started.elapsed().as_secs_f64()
    ));
    let mut per = Vec::new();
    let mut failures = Vec::new();
    for r in results {
        match r {
            Ok(r) => per.push(r),
            Err(e) => failures.push(e),
        }
    }
    if !failures.is_empty() {
        return Err(ReplayError::Instances(failures));
    }
    per.sort_by_key(|r| r.index);
    drop(scratch);
    Ok(aggregate(cfg, count, per))
}

/// Sums the instances' reports.
pub fn aggregate(cfg: &ReplayConfig, count: usize, per: Vec<InstanceReport>) -> InstancesReport {
    let sum = |f: &dyn Fn(&InstanceReport) -> u64| per.iter().map(f).sum::<u64>();
    let cached = sum(&|r| r.report.cached_tokens);
    let reusable = sum(&|r| r.report.reusable_tokens);
    InstancesReport {
        instances: count,
        sharing: if cfg.remote.is_some() || cfg.cold.is_some() {
            "remote"
        } else {
            "directory"
        },
        requests: per.iter().map(|r| r.report.requests).sum(),
        cached_tokens: cached,
        reusable_tokens: reusable,
        hit_rate: ratio(cached, reusable),
        from_other_instances: sum(&|r| r.from_other_instances),
        wrong_hits: sum(&|r| r.report.wrong_hits),
        lost_saves: sum(&|r| r.report.lost_saves),
        checked_items: sum(&|r| r.report.checked_items),
        per_instance: per,
    }
}

/// The report as text.
pub fn render(r: &InstancesReport) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let how = match r.sharing {
        "remote" => "own disks, shared remote tiers",
        _ => "one shared store directory",
    };
    let _ = writeln!(
        s,
        "ucm replay: {} engine instances (processes, own pools), {how}",
        r.instances
    );
    let _ = writeln!(
        s,
        "{:<9} {:>9} {:>14} {:>14} {:>22} {:>11}",
        "instance", "requests", "cached tokens", "hit rate", "from other instances", "wrong hits"
    );
    for i in &r.per_instance {
        let _ = writeln!(
            s,
            "{:<9} {:>9} {:>14} {:>13.1}% {:>22} {:>11}",
            i.index,
            i.report.requests,
            i.report.cached_tokens,
            100.0 * i.report.hit_rate,
            i.from_other_instances,
            i.report.wrong_hits
        );
    }
    let _ = writeln!(
        s,
        "{:<9} {:>9} {:>14} {:>13.1}% {:>22} {:>11}",
        "all",
        r.requests,
        r.cached_tokens,
        100.0 * r.hit_rate,
        r.from_other_instances,
        r.wrong_hits
    );
    let _ = writeln!(
        s,
        "{} items checked by the oracles, {} lost saves; hit rate over the tokens reusable \
         from any earlier request; \"from other instances\": served beyond what the \
         instance's own earlier requests could give",
        r.checked_items, r.lost_saves
    );
    if r.hit_rate > 1.0 {
        let _ = writeln!(
            s,
            "a hit rate above 100%: the shared tiers already held blocks of an earlier run \
             (ids are content addresses; every loaded byte was checked)"
        );
    }
    s
}

/// Progress of a child: one line at most every two seconds, and the last.
pub fn child_progress() -> impl Fn(&str) {
    let last = std::sync::Mutex::new(None::<Instant>);
    move |l: &str| {
        let l = l.trim();
        if l.is_empty() {
            return;
        }
        let mut t = last.lock().unwrap_or_else(|e| e.into_inner());
        if t.is_none_or(|t| t.elapsed() >= Duration::from_secs(2)) || is_last(l) {
            *t = Some(Instant::now());
            eprintln!("{l}");
        }
    }
}

/// Is a progress line the last of its mode (`k/k requests`)?
fn is_last(l: &str) -> bool {
    l.split_whitespace()
        .find(|w| w.contains('/'))
        .and_then(|w| w.split_once('/'))
        .is_some_and(|(a, b)| a == b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_turn_of_a_session_runs_on_the_next_instance() {
        assert_eq!(placement(0, 0, 2), 0);
        assert_eq!(placement(0, 1, 2), 1);
        assert_eq!(placement(3, 1, 4), 0);
        assert_eq!(placement(5, 0, 1), 0);
    }

    #[test]
    fn a_child_never_gets_the_parents_json_or_plot() {
        let a: Vec<String> = [
            "--sessions",
            "4",
            "--json",
            "--plot",
            "x.svg",
            "--plot=y.svg",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(child_args(&a), vec!["--sessions", "4"]);
    }

    #[test]
    fn the_last_progress_line_is_recognised() {
        assert!(is_last("ucm [###] 8/8 requests, 50% cached"));
        assert!(!is_last("ucm [#  ] 3/8 requests, 50% cached"));
    }
}
