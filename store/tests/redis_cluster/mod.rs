//! A Redis cluster on loopback for tests: N masters from Debian's
//! `redis-server` (ports of their own, no persistence), created with
//! `redis-cli --cluster create`, torn down on drop. Without `redis-server`
//! the tests skip with the reason, unless `UCM_REQUIRE_REDIS=1` (set by
//! `.ci/run`), which makes that a failure.

#![allow(dead_code)]

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running cluster.
pub struct Cluster {
    _dir: tempfile::TempDir,
    dir: PathBuf,
    nodes: Vec<(u16, Option<Child>)>,
}

fn required() -> bool {
    std::env::var("UCM_REQUIRE_REDIS").is_ok_and(|v| v == "1")
}

fn have(bin: &str) -> bool {
    Command::new(bin)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A port whose cluster-bus port (+10000) is free too.
fn free_port(taken: &[u16]) -> u16 {
    for _ in 0..1000 {
        let Ok(l) = TcpListener::bind("127.0.0.1:0") else {
            continue;
        };
        let Ok(addr) = l.local_addr() else { continue };
        let p = addr.port();
        if p > 55_000 || taken.contains(&p) {
            continue;
        }
        if TcpListener::bind(("127.0.0.1", p + 10_000)).is_ok() {
            return p;
        }
    }
    panic!("no free port pair on loopback");
}

fn cli(port: u16, args: &[&str]) -> Option<String> {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .stderr(Stdio::null())
        .output()
        .ok()?;
    Some(String::from_utf8_lossy(&out.stdout).to_string())
}

fn wait_until(limit: Duration, mut ok: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    ok()
}

impl Cluster {
    /// Starts a cluster of `masters` masters, or says why it cannot (a
    /// skip) and returns `None`; with `UCM_REQUIRE_REDIS=1` that panics.
    pub fn start(masters: usize) -> Option<Cluster> {
        if !have("redis-server") || !have("redis-cli") {
            let why = "redis-server and redis-cli are not installed (Debian: redis-server)";
            if required() {
                panic!("UCM_REQUIRE_REDIS=1 but {why}");
            }
            eprintln!("SKIP: {why}");
            return None;
        }
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        let mut nodes: Vec<(u16, Option<Child>)> = Vec::new();
        for _ in 0..masters {
            let taken: Vec<u16> = nodes.iter().map(|n| n.0).collect();
            let port = free_port(&taken);
            let log = std::fs::File::create(dir.join(format!("redis-{port}.log"))).unwrap();
            let child = Command::new("redis-server")
                .args([
                    "--port",
                    &port.to_string(),
                    "--bind",
                    "127.0.0.1",
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    &format!("nodes-{port}.conf"),
                    "--cluster-node-timeout",
                    "2000",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--protected-mode",
                    "no",
                ])
                .arg("--dir")
                .arg(&dir)
                .stdout(log)
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            nodes.push((port, Some(child)));
        }
        let c = Cluster {
            _dir: tmp,
            dir,
            nodes,
        };
        for &(p, _) in &c.nodes {
            let up = wait_until(Duration::from_secs(10), || {
                cli(p, &["ping"]).is_some_and(|o| o.trim() == "PONG")
            });
            assert!(up, "redis-server on port {p} did not start");
        }
        let addrs: Vec<String> = c
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.0))
            .collect();
        let mut args: Vec<&str> = vec!["--cluster", "create"];
        args.extend(addrs.iter().map(String::as_str));
        args.extend(["--cluster-replicas", "0", "--cluster-yes"]);
        let created = Command::new("redis-cli")
            .args(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap();
        assert!(created.success(), "redis-cli --cluster create failed");
        for &(p, _) in &c.nodes {
            let ok = wait_until(Duration::from_secs(20), || {
                cli(p, &["cluster", "info"]).is_some_and(|o| o.contains("cluster_state:ok"))
            });
            assert!(ok, "the cluster did not become ready on port {p}");
        }
        // Every master knows the whole slot map and serves a key of its
        // own (a write and a read through redirections on each).
        for (i, &(p, _)) in c.nodes.iter().enumerate() {
            let ok = wait_until(Duration::from_secs(20), || {
                let key = format!("ucm-ready-{i}");
                cli(p, &["-c", "set", &key, "1"]).is_some_and(|o| o.trim() == "OK")
                    && cli(p, &["-c", "get", &key]).is_some_and(|o| o.trim() == "1")
                    && cli(p, &["cluster", "slots"]).is_some_and(|o| !o.trim().is_empty())
            });
            assert!(ok, "the cluster does not serve keys through port {p}");
        }
        for (i, &(p, _)) in c.nodes.iter().enumerate() {
            cli(p, &["-c", "del", &format!("ucm-ready-{i}")]);
        }
        Some(c)
    }

    /// `redis://127.0.0.1:p1,127.0.0.1:p2,...`
    pub fn url(&self) -> String {
        let list: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.0))
            .collect();
        format!("redis://{}", list.join(","))
    }

    /// The masters' ports.
    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(|n| n.0).collect()
    }

    /// Runs `redis-cli -p <port of master i> <args>` (`-c`: follow
    /// redirections).
    pub fn cli(&self, i: usize, args: &[&str]) -> String {
        let mut a = vec!["-c"];
        a.extend_from_slice(args);
        cli(self.nodes[i].0, &a).unwrap_or_default()
    }

    /// Runs a command on every master.
    pub fn each(&self, args: &[&str]) {
        for i in 0..self.nodes.len() {
            cli(self.nodes[i].0, args);
        }
    }

    /// Kills master `i` (SIGKILL).
    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.nodes[i].1.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The directory the servers run in.
    pub fn dir(&self) -> &std::path::Path {
        &self.dir
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for n in &mut self.nodes {
            if let Some(mut c) = n.1.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}
