//! The byte-moving check of the capacity-only replay: the first requests
//! of a trace through the engine harness (`ucm` mode: real stores on the
//! host device, poisoned engine memory, the content oracle, decode
//! retention), set beside the capacity-only `ucm` on the same requests
//! with no engine cache and tiers that never evict (the harness's disk
//! tier does not evict at sample sizes, and a memory-tier eviction falls
//! back to the disk without changing a hit). Every request must be served
//! the same tokens in both, with no wrong hit.

use std::path::Path;
use std::sync::Arc;

use serde::Serialize;

use super::units::Model;
use super::{Sim, SimConfig, SimMode, SimRequest};
use crate::trace::{output_tokens, prompt_tokens, TraceRequest};
use crate::{ReplayError, SabotageKind};
use ucm_coordinator::adapter::StoreSetConfig;
use ucm_coordinator::{RequestKeys, SpecTable};
use ucm_harness::{Engine, EngineConfig, Request};

/// Most requests a byte-moving sample takes.
pub const MAX_SAMPLE: usize = 2000;
// The refusal of `--limit` states the bound in words.
const _: () = assert!(MAX_SAMPLE == 2000);

/// What the sample found.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SampleReport {
    /// Requests replayed.
    pub requests: usize,
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Tokens served with bytes moved (the harness).
    pub served_moving: u64,
    /// Tokens served in the capacity-only model.
    pub served_capacity_only: u64,
    /// Requests whose served tokens differ (must be 0).
    pub disagreements: usize,
    /// The first few disagreements: request index, moving, capacity-only.
    pub first_disagreements: Vec<(usize, u64, u64)>,
    /// Loaded items the oracle checked.
    pub checked_items: u64,
    /// Wrong hits and lost saves the oracle found (must be 0).
    pub wrong: u64,
    /// Bytes loaded (at the run's scale).
    pub bytes_loaded: u64,
}

/// Runs the first requests of `trace` both ways. `spec` is the full-size
/// table; the harness runs it with byte sizes divided by `bytes_scale`
/// (hits do not depend on sizes) in a scratch directory under `dir`.
/// `sabotage` (tests only) plants a bug in the harness's adapter, which
/// the oracle or the agreement must then report.
pub fn run_sample(
    trace: &[TraceRequest],
    spec: &SpecTable,
    cfg: &SimConfig,
    bytes_scale: u64,
    dir: &Path,
    sabotage: Option<SabotageKind>,
    progress: &dyn Fn(&str),
) -> Result<SampleReport, ReplayError> {
    if trace.len() > MAX_SAMPLE {
        return Err(ReplayError::Option {
            flag: "--limit",
            value: trace.len().to_string(),
            expected: "at most 2,000 requests for a byte-moving sample",
        });
    }
    let model = Model::new(spec.clone());
    let unlimited = SimConfig {
        pool_tokens: u64::MAX,
        disk_tokens: u64::MAX,
        ..cfg.clone()
    };
    let mut sim = Sim::new(&model, SimMode::Ucm, 0, &unlimited);
    let scratch =
        ucm_harness::scratch::Scratch::new(dir, "replay-sample").map_err(crate::io_err(dir))?;
    let max_tokens = trace
        .iter()
        .map(|r| (r.input_length + r.output_length) as usize)
        .max()
        .unwrap_or(0);
    let mut ec = EngineConfig::new(
        Arc::new(spec.scaled(bytes_scale.max(1))),
        scratch.path(),
        max_tokens,
    );
    ec.stores = StoreSetConfig {
        pool_slots: 4096,
        ways: 64,
        ..StoreSetConfig::default()
    };
    ec.seed = cfg.seed;
    SabotageKind::plant(sabotage, &mut ec)?;
    let mut engine = Engine::open(ec)?;
    let mut rep = SampleReport {
        requests: trace.len(),
        ..SampleReport::default()
    };
    for (k, t) in trace.iter().enumerate() {
        let prompt = prompt_tokens(cfg.seed, t);
        let output = if cfg.decode_retention {
            output_tokens(cfg.seed, k, t)
        } else {
            Vec::new()
        };
        let want = sim
            .step(&model, &SimRequest::from_tokens(&model, &prompt, &output)?)?
            .served;
        let req = Request {
            id: format!("trace-{k}"),
            tokens: Arc::new(prompt),
            keys: RequestKeys::default(),
            dead_rank: None,
            output: Arc::new(output),
        };
        let out = engine.run(&req)?;
        for w in out.wrong.iter().map(ToString::to_string) {
            eprintln!("\n{w}");
        }
        for l in out.lost.iter().map(ToString::to_string) {
            eprintln!("\n{l}");
        }
        rep.wrong += (out.wrong.len() + out.lost.len()) as u64;
        rep.checked_items += out.checked;
        rep.bytes_loaded += out.bytes_loaded;
        rep.prompt_tokens += t.input_length;
        rep.served_moving += out.served;
        rep.served_capacity_only += want;
        if out.served != want {
            rep.disagreements += 1;
            if rep.first_disagreements.len() < 8 {
                rep.first_disagreements.push((k, out.served, want));
            }
        }
        progress(&format!(
            "byte-moving sample: {}/{} requests, {} tokens served (capacity-only {}), {} \
             disagreements, {} wrong",
            k + 1,
            trace.len(),
            rep.served_moving,
            rep.served_capacity_only,
            rep.disagreements,
            rep.wrong
        ));
    }
    // The stores close before their directory goes.
    drop(engine);
    drop(scratch);
    Ok(rep)
}
