//! `ucm info`, `ucm explain` and `ucm gc`.

use std::path::PathBuf;

use clap::Args;

use super::*;

#[derive(Args)]
pub(crate) struct GcArgs {
    /// Remove the scratch stores of dead processes of this host (a run
    /// killed with SIGKILL cannot remove its own).
    #[arg(long)]
    stale: bool,
    /// Where to look (default: /dev/shm when present, else the system temp
    /// directory: where the CLI puts its scratch stores).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// A store directory whose deployments' identities to remove: one
    /// (`--identity`) or the idle ones (`--max-idle`).
    #[arg(long, conflicts_with_all = ["stale", "dir"])]
    store: Option<PathBuf>,
    /// With --store: the identity (digest, as `ucm info --store` lists it)
    /// to remove with its stores.
    #[arg(long, requires = "store")]
    identity: Option<String>,
    /// With --store: remove every identity not used for more than this
    /// many days.
    #[arg(long, requires = "store", conflicts_with = "identity")]
    max_idle: Option<f64>,
}

#[derive(Args)]
pub(crate) struct ExplainArgs {
    /// The model's spec table (TOML), e.g. specs/x-hybrid-96.toml.
    #[arg(long)]
    spec: PathBuf,
    /// The scenario (JSON): {"tokens", "seed", "held", "checkpoints"}.
    #[arg(long)]
    scenario: PathBuf,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
    /// Keep the store in this directory (default: a temporary one).
    #[arg(long)]
    store: Option<PathBuf>,
    /// Reopen the kept store and resolve only (a warm restart); dumps nothing.
    #[arg(long, requires = "store")]
    resolve_only: bool,
}

pub(crate) fn explain(a: ExplainArgs) -> Result<(), String> {
    use ucm::coordinator::SpecTable;
    use ucm::explain::{ExplainOptions, Scenario};
    let spec = SpecTable::load(&a.spec).map_err(|e| e.to_string())?;
    let sc = Scenario::load(&a.scenario).map_err(|e| e.to_string())?;
    let opts = ExplainOptions {
        store: a.store,
        resolve_only: a.resolve_only,
    };
    let out = ucm::explain::explain(&spec, &sc, &opts).map_err(|e| e.to_string())?;
    if a.json {
        println!(
            "{}",
            serde_json::to_string(&out).map_err(|e| e.to_string())?
        );
    } else {
        print!("{}", out.render_text(&spec));
    }
    Ok(())
}

pub(crate) fn gc(a: GcArgs) -> Result<(), String> {
    if let Some(store) = &a.store {
        let idle = match a.max_idle {
            Some(d) if (0.0..1e6).contains(&d) => {
                Some(std::time::Duration::from_secs_f64(d * 86_400.0))
            }
            Some(d) => return Err(format!("--max-idle {d}: give days, 0 to 1e6")),
            None => None,
        };
        println!(
            "{}",
            ucm::identities::gc(store, a.identity.as_deref(), idle).map_err(|e| e.to_string())?
        );
        return Ok(());
    }
    if !a.stale {
        return Err("say what to remove: --stale (the scratch stores of killed runs)".into());
    }
    let dir = a.dir.unwrap_or_else(default_scratch_parent);
    if !dir.is_dir() {
        return Err(format!("{}: not a directory", dir.display()));
    }
    let removed = ucm::scratch::clear_stale(&dir);
    println!(
        "removed {removed} scratch stores of dead processes in {}",
        dir.display()
    );
    Ok(())
}

pub(crate) fn identities_info(json: bool, store: &std::path::Path) -> Result<(), String> {
    let rows = ucm::identities::rows(store).map_err(|e| e.to_string())?;
    if json {
        println!(
            "{}",
            serde_json::to_string(&rows).map_err(|e| e.to_string())?
        );
    } else {
        print!("{}", ucm::identities::render_text(store, &rows));
    }
    Ok(())
}

pub(crate) fn info(json: bool, dir: Option<PathBuf>) -> Result<(), String> {
    let dir = dir.unwrap_or_else(std::env::temp_dir);
    if !dir.is_dir() {
        return Err(format!("{} is not a directory", dir.display()));
    }
    let report = ucm::info::collect(&dir);
    if json {
        let s = serde_json::to_string(&report).map_err(|e| e.to_string())?;
        println!("{s}");
    } else {
        print!("{}", ucm::info::render_text(&report));
    }
    Ok(())
}
