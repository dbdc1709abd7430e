//! `ucm info`: which device backends and I/O engines work on this machine.

use std::path::Path;

use serde::Serialize;
use ucm_device::io::probe_engines;
use ucm_device::probe_devices;

/// One device backend in the report.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct DeviceReport {
    /// `host`, `cuda` or `ascend`.
    pub name: String,
    /// Whether it can be used here.
    pub available: bool,
    /// Why not, or what was found.
    pub reason: String,
}

/// One I/O engine in the report.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct EngineReport {
    /// `io_uring`, `libaio` or `posix`.
    pub name: String,
    /// Whether it works here.
    pub available: bool,
    /// Why not, or what was checked.
    pub reason: String,
    /// Whether O_DIRECT I/O through it worked in the probed directory.
    pub o_direct: bool,
}

/// The whole `ucm info` report.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct InfoReport {
    /// Device backends.
    pub devices: Vec<DeviceReport>,
    /// I/O engines, probed in `dir`.
    pub io_engines: Vec<EngineReport>,
}

/// Probes everything; I/O engines do a small O_DIRECT round trip in `dir`.
pub fn collect(dir: &Path) -> InfoReport {
    InfoReport {
        devices: probe_devices()
            .into_iter()
            .map(|d| DeviceReport {
                name: d.name.to_string(),
                available: d.available,
                reason: d.reason,
            })
            .collect(),
        io_engines: probe_engines(dir)
            .into_iter()
            .map(|e| EngineReport {
                name: e.name.to_string(),
                available: e.available,
                reason: e.reason,
                o_direct: e.o_direct,
            })
            .collect(),
    }
}

/// Renders the report for people.
pub fn render_text(r: &InfoReport) -> String {
    let mut out = String::from("devices:\n");
    let mark = |ok: bool| if ok { "yes" } else { "no " };
    for d in &r.devices {
        out += &format!("  {:<8} {}  {}\n", d.name, mark(d.available), d.reason);
    }
    out += "io engines:\n";
    for e in &r.io_engines {
        out += &format!(
            "  {:<8} {}  o_direct={}  {}\n",
            e.name,
            mark(e.available),
            e.o_direct,
            e.reason
        );
    }
    out
}
