//! Where a remote tier's servers are: the URLs `--remote` and `--cold`
//! take, parsed and checked whether or not the backend that serves them
//! is compiled in (features `redis` and `s3`), so a bad URL is the same
//! error in every build.

use super::shown;
use crate::error::{bad_value, Result};

/// The seed nodes of `redis://host:port[,host:port...]` (`valkey://` too,
/// and a scheme on each node is accepted).
pub(crate) fn nodes_from_url(url: &str) -> Result<Vec<String>> {
    let rest = url
        .strip_prefix("redis://")
        .or_else(|| url.strip_prefix("valkey://"))
        .ok_or_else(|| {
            bad_value(
                "remote tier URL",
                format!("`{}`", shown(url)),
                "redis://, valkey:// or s3://",
            )
        })?;
    let mut nodes = Vec::new();
    for part in rest.split(',').map(str::trim) {
        let part = part
            .strip_prefix("redis://")
            .or_else(|| part.strip_prefix("valkey://"))
            .unwrap_or(part);
        let ok = part.rsplit_once(':').is_some_and(|(host, port)| {
            !host.is_empty()
                && host.len() <= 253
                && host
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-._[]:".contains(c))
                && port.parse::<u16>().is_ok_and(|p| p > 0)
        });
        if !ok {
            return Err(bad_value(
                "remote tier URL node",
                format!("`{}`", shown(part)),
                "host:port",
            ));
        }
        nodes.push(format!("redis://{part}"));
    }
    Ok(nodes)
}

/// A bucket and where it is served.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct S3Location {
    /// The bucket.
    pub bucket: String,
    /// A key prefix inside the bucket (no leading or trailing `/`; may be
    /// empty).
    pub prefix: String,
    /// The endpoint (`http://host:port` for a local server); `None`: the
    /// `AWS_ENDPOINT` variable, else AWS itself.
    pub endpoint: Option<String>,
    /// The region; `None`: `AWS_REGION`, else `us-east-1`.
    pub region: Option<String>,
}

fn plain(s: &str) -> bool {
    s.chars()
        .all(|c| c.is_ascii_alphanumeric() || "-._".contains(c))
}

impl S3Location {
    /// Parses `s3://bucket[/prefix][?endpoint=URL&region=R]`.
    pub fn from_url(url: &str) -> Result<Self> {
        let bad =
            |expected: &'static str| bad_value("S3 URL", format!("`{}`", shown(url)), expected);
        let rest = url
            .strip_prefix("s3://")
            .ok_or_else(|| bad("s3://BUCKET[/PREFIX][?endpoint=URL&region=R]"))?;
        let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (bucket, prefix) = path.split_once('/').unwrap_or((path, ""));
        let prefix = prefix.trim_matches('/');
        let bucket_ok = (3..=63).contains(&bucket.len())
            && bucket
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "-.".contains(c));
        if !bucket_ok {
            return Err(bad(
                "a bucket of 3-63 lowercase letters, digits, `-` or `.`",
            ));
        }
        if prefix.len() > 256
            || !prefix
                .split('/')
                .all(|p| prefix.is_empty() || (!p.is_empty() && plain(p) && p != "." && p != ".."))
        {
            return Err(bad(
                "a prefix of `/`-separated names of letters, digits, `-`, `_` or `.`",
            ));
        }
        let mut loc = S3Location {
            bucket: bucket.to_string(),
            prefix: prefix.to_string(),
            endpoint: None,
            region: None,
        };
        for kv in query.split('&').filter(|s| !s.is_empty()) {
            match kv.split_once('=') {
                Some(("endpoint", v))
                    if (v.starts_with("http://") || v.starts_with("https://"))
                        && v.len() <= 256
                        && v.chars().all(|c| c.is_ascii_graphic()) =>
                {
                    loc.endpoint = Some(v.trim_end_matches('/').to_string());
                }
                Some(("region", v)) if !v.is_empty() && v.len() <= 64 && plain(v) => {
                    loc.region = Some(v.to_string());
                }
                _ => return Err(bad("options endpoint=http(s)://host:port and region=NAME")),
            }
        }
        Ok(loc)
    }
}
