//! The `ucm` command line.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod cli;

use cli::admin::*;
use cli::bench::*;
use cli::replay::*;

/// UCM: a KV-cache storage engine for hybrid LLMs.
#[derive(Parser)]
#[command(name = "ucm", version, about)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Report which device backends and I/O engines work on this machine.
    Info {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// Directory where the I/O engines are probed (O_DIRECT depends on
        /// the file system). Defaults to the system temp directory.
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Instead: list the deployments' identities this store directory
        /// holds, with their bytes and idle time.
        #[arg(long)]
        store: Option<PathBuf>,
    },
    /// Replay a workload end to end on the host device (simulated engine,
    /// content oracle) in every mode, and report.
    Replay(Box<ReplayArgs>),
    /// What a public trace (Mooncake format) allows by itself: its size, the
    /// ideal prefix hit rate and a plain block-LRU's over a capacity sweep.
    Trace(TraceArgs),
    /// Why did (or didn't) a prompt hit? Materialises a scenario in a real
    /// store on the host device and runs the real resolve_hit.
    Explain(ExplainArgs),
    /// Measure throughput against a baseline taken in the same run.
    Bench {
        #[command(subcommand)]
        what: BenchCmd,
    },
    /// Remove what killed runs left behind: `--stale` removes the scratch
    /// stores (`ucm-<kind>.<writer>.<n>`) of `replay`, `explain` and the
    /// benches whose writer process is gone, in `--dir`. `--store DIR`
    /// removes deployments' identities (`--identity D`, or those idle
    /// longer than `--max-idle DAYS`) with their stores.
    Gc(GcArgs),
}

/// Logs warnings and errors to stderr (`UCM_LOG=info` or `debug` for more).
struct StderrLogger;

impl log::Log for StderrLogger {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.level() <= log::max_level()
    }

    fn log(&self, r: &log::Record<'_>) {
        if self.enabled(r.metadata()) {
            eprintln!("[{}] {}", r.level(), r.args());
        }
    }

    fn flush(&self) {}
}

fn init_logging() {
    static LOGGER: StderrLogger = StderrLogger;
    let level = match std::env::var("UCM_LOG").as_deref() {
        Ok("debug") => log::LevelFilter::Debug,
        Ok("info") => log::LevelFilter::Info,
        Ok("error") => log::LevelFilter::Error,
        _ => log::LevelFilter::Warn,
    };
    if log::set_logger(&LOGGER).is_ok() {
        log::set_max_level(level);
    }
}

fn main() -> ExitCode {
    init_logging();
    let cli = Cli::parse();
    let result = match cli.cmd {
        Cmd::Info {
            json,
            store: Some(store),
            ..
        } => identities_info(json, &store),
        Cmd::Info {
            json,
            dir,
            store: None,
        } => info(json, dir),
        Cmd::Gc(args) => gc(args),
        Cmd::Explain(args) => explain(args),
        Cmd::Trace(args) => trace(args),
        Cmd::Replay(args) => replay(*args),
        Cmd::Bench {
            what: BenchCmd::Io(args),
        } => bench_io(args),
        Cmd::Bench {
            what: BenchCmd::Device(args),
        } => bench_device(args),
        Cmd::Bench {
            what: BenchCmd::Store(args),
        } => bench_store(args),
        Cmd::Bench {
            what: BenchCmd::Hash(args),
        } => bench_hash(args),
        Cmd::Bench {
            what: BenchCmd::Layerwise(args),
        } => bench_layerwise(args),
        Cmd::Bench {
            what: BenchCmd::Remote(args),
        } => bench_remote(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ucm: {e}");
            ExitCode::FAILURE
        }
    }
}
