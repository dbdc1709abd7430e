//! Cache identity: every field of `[identity]` and every layout field of
//! the table goes into the digest, and so into every seed; a table without
//! `[identity]` keeps its seeds; malformed identities are refused.

use ucm_coordinator::hash::hex;
use ucm_coordinator::identity::SPEC_SCHEMA;
use ucm_coordinator::{CoordError, Deployment, RequestHashes, RequestKeys, SpecTable};

/// A chain group, a windowed chain group and a snapshot group, with every
/// identity field set.
const BASE: &str = r#"
model = "id-test"
dtype = "bf16"
num_layers = 4
[identity]
revision = "rev-1"
weights = "md5:0123"
quantization = "none"
position = "rope theta=10000"
extra = { tokenizer = "v1" }
[identity.groups.attn]
kv_dtype = "bf16"
layout = "[blocks, 2, 16, 8, 128]"
[[group]]
name = "attn"
kind = "chain"
block_size = 16
layers = "0"
bytes_per_token = 256
[[group]]
name = "swa"
kind = "chain"
block_size = 16
window = 64
layers = "1"
bytes_per_token = 256
[[group]]
name = "ssm"
kind = "snapshot"
grid = 16
state_bytes = 4096
layers = "2-3"
"#;

/// One field changed, as a replacement of a line of [`BASE`].
const VARIANTS: &[(&str, &str, &str)] = &[
    ("revision", "revision = \"rev-1\"", "revision = \"rev-2\""),
    (
        "weights",
        "weights = \"md5:0123\"",
        "weights = \"md5:4567\"",
    ),
    (
        "quantization",
        "quantization = \"none\"",
        "quantization = \"fp8\"",
    ),
    (
        "position",
        "position = \"rope theta=10000\"",
        "position = \"rope theta=500000\"",
    ),
    (
        "extra",
        "extra = { tokenizer = \"v1\" }",
        "extra = { tokenizer = \"v2\" }",
    ),
    (
        "extra key",
        "extra = { tokenizer = \"v1\" }",
        "extra = { tokenizr = \"v1\" }",
    ),
    ("kv_dtype", "kv_dtype = \"bf16\"", "kv_dtype = \"fp8_e4m3\""),
    (
        "layout",
        "layout = \"[blocks, 2, 16, 8, 128]\"",
        "layout = \"[blocks, 16, 2, 8, 128]\"",
    ),
    ("model", "model = \"id-test\"", "model = \"id-test-2\""),
    ("dtype", "dtype = \"bf16\"\nnum", "dtype = \"fp16\"\nnum"),
    (
        "bytes_per_token",
        "layers = \"0\"\nbytes_per_token = 256",
        "layers = \"0\"\nbytes_per_token = 512",
    ),
    ("window", "window = 64", "window = 128"),
    ("state_bytes", "state_bytes = 4096", "state_bytes = 8192"),
    ("grid", "grid = 16", "grid = 32"),
    ("layers", "layers = \"2-3\"", "layers = \"2\""),
    (
        "rank_rule",
        "layers = \"2-3\"",
        "layers = \"2-3\"\nrank_rule = \"intersection\"",
    ),
];

fn variant(from: &str, to: &str) -> SpecTable {
    assert!(BASE.contains(from), "{from}");
    SpecTable::from_toml(&BASE.replacen(from, to, 1)).unwrap()
}

fn digest(t: &SpecTable) -> [u8; 16] {
    t.identity.as_ref().expect("an identity").digest
}

#[test]
fn every_field_changes_the_digest_and_the_same_table_keeps_it() {
    let base = SpecTable::from_toml(BASE).unwrap();
    assert_eq!(digest(&base), digest(&SpecTable::from_toml(BASE).unwrap()));
    for (field, from, to) in VARIANTS {
        let v = variant(from, to);
        assert_ne!(digest(&base), digest(&v), "{field} is not in the identity");
    }
}

#[test]
fn a_changed_field_shares_no_id_with_the_original() {
    // Fields that change no id without an identity (the chain's block size
    // and the tokens stay): with it, not one id of any group is shared.
    let t: Vec<u32> = (0..200).collect();
    let dep = Deployment { tp_size: 1 };
    let keys = RequestKeys::default();
    let base = SpecTable::from_toml(BASE).unwrap();
    let hb = RequestHashes::compute(&base, dep, &t, &keys).unwrap();
    for (field, from, to) in VARIANTS {
        let v = variant(from, to);
        let hv = RequestHashes::compute(&v, dep, &t, &keys).unwrap();
        for g in base.groups() {
            let a: std::collections::HashSet<_> = hb.chains[g.index].iter().flatten().collect();
            let Ok(w) = v.group(&g.name) else { continue };
            let shared = hv.chains[w.index]
                .iter()
                .flatten()
                .filter(|id| a.contains(id))
                .count();
            assert_eq!(shared, 0, "{field}: group {} shares {shared} ids", g.name);
        }
    }
}

#[test]
fn without_identity_the_seeds_are_the_old_ones_and_with_one_they_differ() {
    let plain = SpecTable::from_toml(&BASE.replace("[identity]", "[unused]")).err();
    assert!(plain.is_some(), "unknown tables are refused");
    let cut = BASE.find("[identity]").unwrap();
    let groups = BASE.find("[[group]]").unwrap();
    let plain = SpecTable::from_toml(&format!("{}{}", &BASE[..cut], &BASE[groups..])).unwrap();
    assert!(plain.identity.is_none());
    let with = SpecTable::from_toml(BASE).unwrap();
    let t: Vec<u32> = (0..64).collect();
    let dep = Deployment { tp_size: 1 };
    let k = RequestKeys::default();
    let a = RequestHashes::compute(&plain, dep, &t, &k).unwrap();
    let b = RequestHashes::compute(&with, dep, &t, &k).unwrap();
    assert_ne!(a.seeds, b.seeds);
    // The old seed, by hand: md5(meta || 0 || name || 0 || salt).
    use md5::{Digest, Md5};
    let mut m = Md5::new();
    m.update(b"id-test:1:bf16:0");
    m.update([0]);
    m.update(b"attn");
    m.update([0]);
    let old: [u8; 16] = m.finalize().into();
    assert_eq!(a.seeds[0][0], old);
    // And with the identity: the same, then 0x00 and the digest.
    let mut m = Md5::new();
    m.update(b"id-test:1:bf16:0");
    m.update([0]);
    m.update(b"attn");
    m.update([0]);
    m.update([0]);
    m.update(digest(&with));
    let new: [u8; 16] = m.finalize().into();
    assert_eq!(b.seeds[0][0], new);
}

#[test]
fn the_canonical_text_is_as_documented() {
    let t = SpecTable::from_toml(
        r#"
model = "m"
dtype = "bf16"
[identity]
revision = "a\nb\\c"
extra = { z = "1", a = "2" }
[identity.groups.kv]
kv_dtype = "fp8"
[[group]]
name = "kv"
kind = "chain"
block_size = 16
layers = "0-1"
bytes_per_token = 64
"#,
    )
    .unwrap();
    let id = t.identity.unwrap();
    let want = format!(
        "ucm-identity\nschema={SPEC_SCHEMA}\nmodel=m\ndtype=bf16\nrevision=a\\nb\\\\c\nweights=\n\
         quantization=\nposition=\ngroup=kv\nkind=chain\nsource=\nblock=16\nhash_block=16\n\
         unit_bytes=64\nwindow=\nlayers=0,1\nrank_rule=all_union\nkv_dtype=fp8\nlayout=\n\
         extra.a=2\nextra.z=1\n"
    );
    assert_eq!(id.text, want);
    use md5::{Digest, Md5};
    let d: [u8; 16] = Md5::digest(want.as_bytes()).into();
    assert_eq!(id.digest, d);
    assert_eq!(id.hex(), hex(&d));
}

#[test]
fn malformed_identities_are_refused_with_the_field_named() {
    let cases = [
        (
            "[identity.groups.attn]",
            "[identity.groups.nope]",
            "groups.nope",
        ),
        (
            "extra = { tokenizer = \"v1\" }",
            "extra = { \"a/b\" = \"v1\" }",
            "extra",
        ),
        (
            "extra = { tokenizer = \"v1\" }",
            "extra = { \"\" = \"v1\" }",
            "extra",
        ),
    ];
    for (from, to, field) in cases {
        match SpecTable::from_toml(&BASE.replacen(from, to, 1)) {
            Err(CoordError::Identity { field: f, .. }) => assert_eq!(f, field),
            other => panic!("{to}: {other:?}"),
        }
    }
    let long = format!("revision = \"{}\"", "x".repeat(5000));
    match SpecTable::from_toml(&BASE.replacen("revision = \"rev-1\"", &long, 1)) {
        Err(CoordError::Identity { field, .. }) => assert_eq!(field, "revision"),
        other => panic!("{other:?}"),
    }
    // Unknown fields are refused (a misspelt field must not be ignored).
    assert!(SpecTable::from_toml(&BASE.replacen("revision", "revison", 1)).is_err());
    assert!(SpecTable::from_toml(&BASE.replacen("kv_dtype", "kvdtype", 1)).is_err());
}
