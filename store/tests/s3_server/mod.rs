//! A local S3 server for tests: `moto` in server mode (from PyPI; `.ci/run`
//! installs it in `/var/cache/ucm/moto-venv`), on a port of its own on
//! loopback, in memory, killed on drop. Without it the tests skip with the
//! reason, unless `UCM_REQUIRE_S3=1` (set by `.ci/run`), which makes that a
//! failure. Objects are read and written behind the tier's back by a client
//! of the test's own.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Once;
use std::time::{Duration, Instant};

/// The bucket every test uses.
pub const BUCKET: &str = "ucm-test";

/// A running server.
pub struct S3Server {
    port: u16,
    child: Option<Child>,
}

fn required() -> bool {
    std::env::var("UCM_REQUIRE_S3").is_ok_and(|v| v == "1")
}

fn binary() -> Option<PathBuf> {
    let candidates = [
        std::env::var_os("UCM_MOTO_SERVER").map(PathBuf::from),
        Some(PathBuf::from("/var/cache/ucm/moto-venv/bin/moto_server")),
    ];
    candidates
        .into_iter()
        .flatten()
        .find(|p| p.is_file())
        .or_else(|| {
            Command::new("moto_server")
                .arg("--help")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
                .then(|| PathBuf::from("moto_server"))
        })
}

/// Credentials for the client (moto takes any); set once, before any tier.
pub fn credentials() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        for (k, v) in [
            ("AWS_ACCESS_KEY_ID", "ucm-test"),
            ("AWS_SECRET_ACCESS_KEY", "ucm-test"),
        ] {
            if std::env::var_os(k).is_none() {
                std::env::set_var(k, v);
            }
        }
    });
}

/// One plain HTTP/1.1 request; the status and body.
pub fn http(port: u16, method: &str, path: &str, body: &[u8]) -> Option<(u16, Vec<u8>)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).ok()?;
    s.write_all(body).ok()?;
    let mut out = Vec::new();
    s.read_to_end(&mut out).ok()?;
    let text_end = out.windows(4).position(|w| w == b"\r\n\r\n")?;
    let status: u16 = std::str::from_utf8(&out[..text_end])
        .ok()?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    let head = String::from_utf8_lossy(&out[..text_end]).to_ascii_lowercase();
    let mut body = out[text_end + 4..].to_vec();
    if head.contains("transfer-encoding: chunked") {
        body = dechunk(&body);
    }
    Some((status, body))
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let Some(eol) = b.windows(2).position(|w| w == b"\r\n") else {
            return out;
        };
        let n = usize::from_str_radix(std::str::from_utf8(&b[..eol]).unwrap_or("0").trim(), 16)
            .unwrap_or(0);
        if n == 0 {
            return out;
        }
        out.extend_from_slice(&b[eol + 2..eol + 2 + n]);
        b = &b[eol + 2 + n + 2..];
    }
}

impl S3Server {
    /// Starts a server with the test bucket, or says why it cannot (a
    /// skip) and returns `None`; with `UCM_REQUIRE_S3=1` that panics.
    pub fn start() -> Option<S3Server> {
        let Some(bin) = binary() else {
            let why = "moto_server is not installed (pip install 'moto[server]')";
            if required() {
                panic!("UCM_REQUIRE_S3=1 but {why}");
            }
            eprintln!("skipped: {why}");
            return None;
        };
        credentials();
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port on loopback");
        let child = Command::new(&bin)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{}: {e}", bin.display()));
        let mut s = S3Server {
            port,
            child: Some(child),
        };
        let end = Instant::now() + Duration::from_secs(30);
        while Instant::now() < end {
            if http(port, "PUT", &format!("/{BUCKET}"), b"").is_some_and(|(st, _)| st == 200) {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        s.kill();
        panic!("moto_server on port {port} did not serve within 30 s");
    }

    /// The tier URL of the test bucket under `prefix`.
    pub fn url(&self, prefix: &str) -> String {
        format!(
            "s3://{BUCKET}/{prefix}?endpoint=http://127.0.0.1:{}",
            self.port
        )
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A client of its own, behind the tier's back.
    fn raw<T>(
        &self,
        f: impl FnOnce(
            object_store::aws::AmazonS3,
        ) -> std::pin::Pin<Box<dyn std::future::Future<Output = T>>>,
    ) -> T {
        let store = object_store::aws::AmazonS3Builder::new()
            .with_bucket_name(BUCKET)
            .with_endpoint(format!("http://127.0.0.1:{}", self.port))
            .with_region("us-east-1")
            .with_access_key_id("ucm-test")
            .with_secret_access_key("ucm-test")
            .with_allow_http(true)
            .build()
            .expect("a test client");
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime")
            .block_on(f(store))
    }

    /// Keys under `prefix`.
    pub fn keys(&self, prefix: &str) -> Vec<String> {
        use futures::TryStreamExt;
        use object_store::ObjectStore;
        let prefix = object_store::path::Path::from(prefix);
        self.raw(|s| {
            Box::pin(async move {
                let metas: Vec<object_store::ObjectMeta> = s
                    .list(Some(&prefix))
                    .try_collect()
                    .await
                    .expect("a listing");
                metas.into_iter().map(|m| m.location.to_string()).collect()
            })
        })
    }

    /// Overwrites an object behind the tier's back.
    pub fn put(&self, key: &str, bytes: &[u8]) {
        use object_store::ObjectStoreExt;
        let (key, bytes) = (object_store::path::Path::from(key), bytes.to_vec());
        self.raw(|s| {
            Box::pin(async move {
                s.put(&key, bytes.into()).await.expect("a PUT");
            })
        })
    }

    /// Reads an object.
    pub fn get(&self, key: &str) -> Option<Vec<u8>> {
        use object_store::ObjectStoreExt;
        let key = object_store::path::Path::from(key);
        self.raw(|s| {
            Box::pin(async move {
                match s.get(&key).await {
                    Ok(r) => Some(r.bytes().await.expect("a body").to_vec()),
                    Err(_) => None,
                }
            })
        })
    }

    /// Deletes an object behind the tier's back (a lifecycle expiry).
    pub fn delete(&self, key: &str) {
        use object_store::ObjectStoreExt;
        let key = object_store::path::Path::from(key);
        self.raw(|s| {
            Box::pin(async move {
                s.delete(&key).await.expect("a DELETE");
            })
        })
    }

    /// Kills the server (a store that goes away).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        self.kill();
    }
}
