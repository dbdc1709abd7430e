//! Cache identity: what a deployment's K/V and states depend on besides the
//! tokens, so that two deployments that differ in any of it never share a
//! hit.
//!
//! A spec table may carry an `[identity]` table. Its fields, together with
//! the layout of every group that the table itself defines, are written in
//! one canonical text and hashed (md5) into a 16-byte **identity digest**
//! that goes into every group seed ([`crate::hash`]). A table without
//! `[identity]` keeps the seeds it always had (the golden vectors of the
//! shipped specs are unchanged); any field given changes every id.
//!
//! ```toml
//! [identity]
//! revision = "5b7d2c1"                 # the model's commit, when known
//! weights = "md5:…"                    # else a hash of config and index files
//! quantization = "fp8 (dynamic, per-tensor)"
//! position = "rope theta=1e6 scaling=none"
//! extra = { tokenizer = "v3" }         # anything else a user adds
//! [identity.groups.attn]
//! kv_dtype = "fp8_e4m3"
//! layout = "[blocks, 2, 16, 8, 128] per rank"
//! ```
//!
//! **Canonical text** (UTF-8, one `key=value` line each, `\n` after each,
//! in this order; a value's `\` is written `\\` and its line feed `\n`;
//! an absent field is written with an empty value):
//!
//! ```text
//! ucm-identity
//! schema={SPEC_SCHEMA}
//! model={S.model}
//! dtype={S.dtype}
//! revision=…
//! weights=…
//! quantization=…
//! position=…
//! for each group g of the table, in table order:
//!   group={g.name}
//!   kind={chain|snapshot|sidecar|none}
//!   source={the source group's name, or empty}
//!   block={block size or grid}
//!   hash_block={hash block}
//!   unit_bytes={bytes per token per layer, or state bytes per layer}
//!   window={window, or empty}
//!   layers={the layers, comma-separated}
//!   rank_rule={all_union|intersection}
//!   kv_dtype={[identity.groups.g].kv_dtype, or empty}
//!   layout={[identity.groups.g].layout, or empty}
//! for each extra key k, in byte order of the keys:
//!   extra.{k}=…
//! ```
//!
//! `digest = md5(canonical text)`. The text is kept ([`Identity::text`]) so
//! that an operator can see what a digest stands for.

use std::collections::BTreeMap;

use md5::{Digest, Md5};
use serde::Deserialize;

use crate::error::{CoordError, Result};
use crate::group::{Group, Kind, RankRule};
use crate::id::Id;

/// The version of the spec table's own format, part of every identity:
/// a change in what a table means changes every digest.
pub const SPEC_SCHEMA: u32 = 1;

/// Longest value of an identity field, in bytes.
pub const MAX_FIELD: usize = 4096;

/// The `[identity]` table of a spec file, as written.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct IdentityRow {
    /// The model's revision (a commit hash or tag), when the engine knows it.
    #[serde(default)]
    pub revision: Option<String>,
    /// A fingerprint of the weights: for example a hash of the checkpoint's
    /// config and weight index files (never of the weights themselves).
    #[serde(default)]
    pub weights: Option<String>,
    /// The quantization method and its parameters.
    #[serde(default)]
    pub quantization: Option<String>,
    /// The position-encoding configuration (RoPE theta and scaling, ...).
    #[serde(default)]
    pub position: Option<String>,
    /// Per group name: its KV dtype and the layout of its bytes.
    #[serde(default)]
    pub groups: BTreeMap<String, GroupIdentity>,
    /// Anything else the user adds (plain keys, free values).
    #[serde(default)]
    pub extra: BTreeMap<String, String>,
}

/// What of one group's bytes the spec table does not say by itself.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct GroupIdentity {
    /// The KV-cache dtype of the group (`fp8_e4m3`, `bf16`, ...).
    #[serde(default)]
    pub kv_dtype: Option<String>,
    /// The layout of a block's bytes (heads and head size per rank, the
    /// order of its dimensions).
    #[serde(default)]
    pub layout: Option<String>,
}

/// A deployment's identity: its canonical text and digest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// The canonical text (module docs).
    pub text: String,
    /// `md5(text)`: goes into every group seed.
    pub digest: Id,
}

fn bad(field: &str, why: &'static str) -> CoordError {
    CoordError::Identity {
        field: field.to_string(),
        why,
    }
}

fn check_value(field: &str, v: &str) -> Result<()> {
    if v.len() > MAX_FIELD {
        return Err(bad(field, "longer than 4096 bytes"));
    }
    Ok(())
}

fn check_key(field: &str, k: &str) -> Result<()> {
    let plain = !k.is_empty()
        && k.len() <= 64
        && k.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.');
    if plain {
        Ok(())
    } else {
        Err(bad(
            field,
            "keys are 1 to 64 letters, digits, `_`, `-` or `.`",
        ))
    }
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\").replace('\n', "\\n")
}

fn kind_name(k: Kind) -> &'static str {
    match k {
        Kind::Chain => "chain",
        Kind::Snapshot => "snapshot",
        Kind::Sidecar => "sidecar",
        Kind::None => "none",
    }
}

fn rank_rule_name(r: RankRule) -> &'static str {
    match r {
        RankRule::AllUnion => "all_union",
        RankRule::Intersection => "intersection",
    }
}

impl Identity {
    /// The identity of a table (`model`, `dtype`, its `groups`) with the
    /// `[identity]` row `row`. Refuses group entries naming no group of the
    /// table, keys that are not plain, and values over [`MAX_FIELD`] bytes.
    pub fn build(model: &str, dtype: &str, groups: &[Group], row: &IdentityRow) -> Result<Self> {
        for (name, g) in &row.groups {
            if !groups.iter().any(|x| &x.name == name) {
                return Err(bad(
                    &format!("groups.{name}"),
                    "names no group of the table",
                ));
            }
            check_value(
                &format!("groups.{name}.kv_dtype"),
                g.kv_dtype.as_deref().unwrap_or(""),
            )?;
            check_value(
                &format!("groups.{name}.layout"),
                g.layout.as_deref().unwrap_or(""),
            )?;
        }
        for (k, v) in &row.extra {
            check_key("extra", k)?;
            check_value(&format!("extra.{k}"), v)?;
        }
        let fields = [
            ("revision", &row.revision),
            ("weights", &row.weights),
            ("quantization", &row.quantization),
            ("position", &row.position),
        ];
        for (f, v) in fields {
            check_value(f, v.as_deref().unwrap_or(""))?;
        }
        let mut t = String::from("ucm-identity\n");
        let mut line = |k: &str, v: &str| {
            t.push_str(k);
            t.push('=');
            t.push_str(&escape(v));
            t.push('\n');
        };
        line("schema", &SPEC_SCHEMA.to_string());
        line("model", model);
        line("dtype", dtype);
        for (f, v) in fields {
            line(f, v.as_deref().unwrap_or(""));
        }
        for g in groups {
            let gi = row.groups.get(&g.name).cloned().unwrap_or_default();
            let source = g.source.map(|s| groups[s].name.as_str()).unwrap_or("");
            let layers = g
                .layers
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(",");
            line("group", &g.name);
            line("kind", kind_name(g.kind));
            line("source", source);
            line("block", &g.block.to_string());
            line("hash_block", &g.hash_block.to_string());
            line("unit_bytes", &g.unit_bytes.to_string());
            line(
                "window",
                &g.window.map(|w| w.to_string()).unwrap_or_default(),
            );
            line("layers", &layers);
            line("rank_rule", rank_rule_name(g.rank_rule));
            line("kv_dtype", gi.kv_dtype.as_deref().unwrap_or(""));
            line("layout", gi.layout.as_deref().unwrap_or(""));
        }
        for (k, v) in &row.extra {
            line(&format!("extra.{k}"), v);
        }
        let digest = Md5::digest(t.as_bytes()).into();
        Ok(Identity { text: t, digest })
    }

    /// The digest in lowercase hex (how the store and the CLI name it).
    pub fn hex(&self) -> String {
        crate::id::hex(&self.digest)
    }
}
