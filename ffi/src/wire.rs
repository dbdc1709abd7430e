//! The step metadata on the wire: the scheduler side encodes a
//! [`ConnectorMeta`] into bytes that an engine can pickle or send to its
//! worker processes, and the worker side decodes them, checking every
//! length and index against the spec table. Requests with nothing to load
//! or save in the step are left out (a worker does nothing for them).
//!
//! Little-endian; a 4-byte magic and a version first.

use std::collections::HashMap;
use std::sync::Arc;

use ucm_coordinator::adapter::{Allocation, ConnectorMeta, ReqMeta, StateSave};
use ucm_coordinator::hash::Id;
use ucm_coordinator::retention::{Priority, MAX_LEVEL};
use ucm_coordinator::{CoordError, RequestHashes, SpecTable};

use crate::error::{FfiError, Result, WireError};

const MAGIC: &[u8; 4] = b"UCMM";
/// 2: each saved state carries its retention priority (a byte: [`SURE`],
/// or a speculative level up to [`MAX_LEVEL`]).
/// 3: the step carries the speculative share after its number (a u32 of
/// millionths, [`NO_SHARE`] for none).
const VERSION: u32 = 3;
/// The share word of a step that leaves the share as it is.
const NO_SHARE: u32 = u32::MAX;
/// The share word of a share of 1.
const WHOLE_SHARE: u32 = 1_000_000;
/// The priority byte of a sure checkpoint.
const SURE: u8 = 255;

struct Writer(Vec<u8>);

impl Writer {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn len(&mut self, n: usize) {
        self.u32(n as u32);
    }
    fn ids(&mut self, ids: &[Id]) {
        self.len(ids.len());
        for id in ids {
            self.0.extend_from_slice(id);
        }
    }
}

/// Whether a request does anything on the workers this step.
fn has_work(r: &ReqMeta) -> bool {
    r.load.is_some()
        || r.save_blocks.iter().any(|(_, b)| !b.is_empty())
        || !r.save_states.is_empty()
}

/// Encodes a step's metadata.
pub fn encode(meta: &ConnectorMeta) -> Vec<u8> {
    let mut w = Writer(Vec::new());
    w.0.extend_from_slice(MAGIC);
    w.u32(VERSION);
    w.u64(meta.step);
    w.u32(match meta.speculative_share {
        Some(share) => (share.clamp(0.0, 1.0) * f64::from(WHOLE_SHARE)).round() as u32,
        None => NO_SHARE,
    });
    let reqs: Vec<&ReqMeta> = meta.requests.iter().filter(|r| has_work(r)).collect();
    w.len(reqs.len());
    for r in reqs {
        w.len(r.id.len());
        w.0.extend_from_slice(r.id.as_bytes());
        w.len(r.tokens.len());
        for t in r.tokens.iter() {
            w.u32(*t);
        }
        w.len(r.hashes.chains.len());
        for per_rank in &r.hashes.chains {
            w.len(per_rank.len());
            for ids in per_rank {
                w.ids(ids);
            }
        }
        w.len(r.hashes.seeds.len());
        for seeds in &r.hashes.seeds {
            w.ids(seeds);
        }
        let mut blocks: Vec<_> = r.alloc.blocks.iter().collect();
        blocks.sort_by_key(|(g, _)| **g);
        w.len(blocks.len());
        for (g, b) in blocks {
            w.len(*g);
            w.len(b.len());
            for x in b {
                w.u32(*x);
            }
        }
        let mut slots: Vec<_> = r.alloc.state_slots.iter().collect();
        slots.sort_by_key(|(g, _)| **g);
        w.len(slots.len());
        for (g, s) in slots {
            w.len(*g);
            w.u32(*s);
        }
        match r.load {
            Some((p, have)) => {
                w.u8(1);
                w.u64(p);
                w.u64(have);
            }
            None => w.u8(0),
        }
        w.len(r.save_blocks.len());
        for (g, range) in &r.save_blocks {
            w.len(*g);
            w.u64(range.start as u64);
            w.u64(range.end as u64);
        }
        w.len(r.save_states.len());
        for st in &r.save_states {
            w.len(st.group);
            w.u64(st.position);
            w.u8(match st.priority {
                Priority::Sure => SURE,
                Priority::Speculative(level) => level.min(MAX_LEVEL),
            });
        }
    }
    w.0
}

struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

fn bad(why: WireError) -> FfiError {
    FfiError::Wire(why)
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8]> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or_else(|| bad(WireError::Truncated { at: self.at }))?;
        let s = &self.buf[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self) -> Result<u64> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }
    /// A count of items of at least `item` bytes each: never more than the
    /// bytes left could hold, so a corrupt count cannot allocate.
    fn count(&mut self, item: usize) -> Result<usize> {
        let n = self.u32()? as usize;
        let left = self.buf.len() - self.at;
        if n.saturating_mul(item.max(1)) > left {
            return Err(bad(WireError::CountExceeds { count: n, left }));
        }
        Ok(n)
    }
    fn group(&mut self, spec: &SpecTable) -> Result<usize> {
        let g = self.u32()? as usize;
        if g >= spec.groups().len() {
            return Err(bad(WireError::UnknownGroup { group: g }));
        }
        Ok(g)
    }
    fn ids(&mut self) -> Result<Vec<Id>> {
        let n = self.count(16)?;
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            let mut id = [0u8; 16];
            id.copy_from_slice(self.take(16)?);
            v.push(id);
        }
        Ok(v)
    }
}

/// Decodes a step's metadata for `spec`.
pub fn decode(spec: &SpecTable, buf: &[u8]) -> Result<Arc<ConnectorMeta>> {
    let mut r = Reader { buf, at: 0 };
    if r.take(4)? != MAGIC {
        return Err(bad(WireError::BadMagic));
    }
    let v = r.u32()?;
    if v != VERSION {
        return Err(bad(WireError::Version {
            found: v,
            reads: VERSION,
        }));
    }
    let step = r.u64()?;
    let speculative_share = match r.u32()? {
        NO_SHARE => None,
        ppm if ppm <= WHOLE_SHARE => Some(f64::from(ppm) / f64::from(WHOLE_SHARE)),
        ppm => return Err(bad(WireError::Share { ppm })),
    };
    let n = r.count(8)?;
    let groups = spec.groups().len();
    let mut requests = Vec::with_capacity(n);
    for _ in 0..n {
        let len = r.count(1)?;
        let id = std::str::from_utf8(r.take(len)?)
            .map_err(|_| bad(WireError::IdNotUtf8))?
            .to_owned();
        let nt = r.count(4)?;
        let mut tokens = Vec::with_capacity(nt);
        for _ in 0..nt {
            tokens.push(r.u32()?);
        }
        let ng = r.count(4)?;
        if ng != groups {
            return Err(bad(WireError::GroupCount {
                what: "hashes",
                got: ng,
                groups,
            }));
        }
        let mut chains = Vec::with_capacity(ng);
        for _ in 0..ng {
            let nr = r.count(4)?;
            let mut per_rank = Vec::with_capacity(nr);
            for _ in 0..nr {
                per_rank.push(r.ids()?);
            }
            chains.push(per_rank);
        }
        let ns = r.count(4)?;
        if ns != groups {
            return Err(bad(WireError::GroupCount {
                what: "seeds",
                got: ns,
                groups,
            }));
        }
        let mut seeds = Vec::with_capacity(ns);
        for _ in 0..ns {
            seeds.push(r.ids()?);
        }
        let mut alloc = Allocation::default();
        for _ in 0..r.count(8)? {
            let g = r.group(spec)?;
            let nb = r.count(4)?;
            let mut b = Vec::with_capacity(nb);
            for _ in 0..nb {
                b.push(r.u32()?);
            }
            alloc.blocks.insert(g, b);
        }
        let mut slots = HashMap::new();
        for _ in 0..r.count(8)? {
            let g = r.group(spec)?;
            slots.insert(g, r.u32()?);
        }
        alloc.state_slots = slots;
        let load = match r.u8()? {
            0 => None,
            1 => Some((r.u64()?, r.u64()?)),
            f => {
                return Err(bad(WireError::Flag {
                    what: "load flag",
                    value: f,
                }))
            }
        };
        let mut save_blocks = Vec::new();
        for _ in 0..r.count(20)? {
            let g = r.group(spec)?;
            let (a, b) = (r.u64()? as usize, r.u64()? as usize);
            if a > b || b > tokens.len() {
                return Err(bad(WireError::SaveRange {
                    request: id,
                    start: a,
                    end: b,
                }));
            }
            save_blocks.push((g, a..b));
        }
        let mut save_states = Vec::new();
        for _ in 0..r.count(13)? {
            let g = r.group(spec)?;
            let p = r.u64()?;
            if p > tokens.len() as u64 {
                return Err(bad(WireError::SavePosition {
                    request: id,
                    position: p,
                }));
            }
            let priority = match r.u8()? {
                SURE => Priority::Sure,
                level if level <= MAX_LEVEL => Priority::Speculative(level),
                f => {
                    return Err(bad(WireError::Flag {
                        what: "state priority",
                        value: f,
                    }))
                }
            };
            save_states.push(StateSave {
                group: g,
                position: p,
                priority,
            });
        }
        let meta = ReqMeta {
            id,
            tokens: Arc::new(tokens),
            hashes: Arc::new(RequestHashes { chains, seeds }),
            alloc: Arc::new(alloc),
            load,
            save_blocks,
            save_states,
        };
        meta.validate(spec).map_err(|e| match e {
            CoordError::BadRequest(r) => bad(WireError::Request(r)),
            other => FfiError::Coord(other),
        })?;
        requests.push(meta);
    }
    if r.at != buf.len() {
        return Err(bad(WireError::Trailing {
            bytes: buf.len() - r.at,
        }));
    }
    Ok(Arc::new(ConnectorMeta {
        step,
        requests,
        speculative_share,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ucm_coordinator::adapter::{Allocation, ConnectorMeta, ReqMeta, StateSave};
    use ucm_coordinator::retention::Priority;
    use ucm_coordinator::{Deployment, RequestKeys};

    const SPEC: &str = r#"
model = "wire"
num_layers = 2
[[group]]
name = "attn"
kind = "chain"
block_size = 4
layers = "0"
bytes_per_token = 64
[[group]]
name = "ssm"
kind = "snapshot"
grid = 4
state_bytes = 4096
layers = "1"
"#;

    fn sample(spec: &SpecTable) -> ConnectorMeta {
        let tokens: Vec<u32> = (0..10).collect();
        let hashes = RequestHashes::compute(
            spec,
            Deployment { tp_size: 1 },
            &tokens,
            &RequestKeys::default(),
        )
        .unwrap();
        let mut alloc = Allocation::default();
        alloc.blocks.insert(0, vec![7, 3]);
        alloc.state_slots.insert(1, 2);
        let req = |id: &str, load| ReqMeta {
            id: id.into(),
            tokens: Arc::new(tokens.clone()),
            hashes: Arc::new(hashes.clone()),
            alloc: Arc::new(alloc.clone()),
            load,
            save_blocks: vec![(0, 0..2)],
            save_states: vec![StateSave {
                group: 1,
                position: 8,
                priority: Priority::Speculative(3),
            }],
        };
        let idle = ReqMeta {
            save_blocks: vec![],
            save_states: vec![],
            ..req("idle", None)
        };
        ConnectorMeta {
            step: 5,
            requests: vec![req("a", Some((8, 0))), idle, req("b", None)],
            speculative_share: Some(0.25),
        }
    }

    #[test]
    fn round_trips_and_leaves_out_idle_requests() {
        let spec = SpecTable::from_toml(SPEC).unwrap();
        let m = sample(&spec);
        let d = decode(&spec, &encode(&m)).unwrap();
        assert_eq!(d.step, 5);
        assert_eq!(d.speculative_share, Some(0.25));
        let none = ConnectorMeta {
            speculative_share: None,
            ..m.clone()
        };
        assert_eq!(
            decode(&spec, &encode(&none)).unwrap().speculative_share,
            None
        );
        let ids: Vec<&str> = d.requests.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(ids, ["a", "b"]);
        let (a, orig) = (&d.requests[0], &m.requests[0]);
        assert_eq!(a.tokens, orig.tokens);
        assert_eq!(a.hashes.chains, orig.hashes.chains);
        assert_eq!(a.hashes.seeds, orig.hashes.seeds);
        assert_eq!(a.alloc.blocks, orig.alloc.blocks);
        assert_eq!(a.alloc.state_slots, orig.alloc.state_slots);
        assert_eq!(a.load, Some((8, 0)));
        assert_eq!(a.save_blocks, orig.save_blocks);
        assert_eq!(a.save_states, orig.save_states);
    }

    #[test]
    fn a_share_above_one_is_refused() {
        let spec = SpecTable::from_toml(SPEC).unwrap();
        let mut bytes = encode(&sample(&spec));
        // The share word follows the magic, the version and the step.
        bytes[16..20].copy_from_slice(&(WHOLE_SHARE + 1).to_le_bytes());
        match decode(&spec, &bytes) {
            Err(FfiError::Wire(WireError::Share { ppm })) => assert_eq!(ppm, WHOLE_SHARE + 1),
            other => panic!("{other:?}"),
        }
        bytes[16..20].copy_from_slice(&WHOLE_SHARE.to_le_bytes());
        assert_eq!(decode(&spec, &bytes).unwrap().speculative_share, Some(1.0));
    }

    #[test]
    fn every_truncation_and_byte_flip_is_an_error_or_a_valid_meta_never_a_panic() {
        let spec = SpecTable::from_toml(SPEC).unwrap();
        let bytes = encode(&sample(&spec));
        for n in 0..bytes.len() {
            assert!(decode(&spec, &bytes[..n]).is_err(), "truncated at {n}");
        }
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let mut b = bytes.clone();
            let i = (x as usize) % b.len();
            b[i] ^= (x >> 32) as u8 | 1;
            let _ = decode(&spec, &b);
        }
        let mut wrong = bytes.clone();
        wrong[0] = b'X';
        assert!(decode(&spec, &wrong).is_err());
    }

    /// Each failure is a case a caller can match, with its fields.
    #[test]
    fn decoding_failures_are_typed() {
        let spec = SpecTable::from_toml(SPEC).unwrap();
        let bytes = encode(&sample(&spec));
        let wire = |b: &[u8]| match decode(&spec, b) {
            Err(FfiError::Wire(w)) => w,
            other => panic!("{:?}", other.map(|_| ())),
        };
        let mut wrong = bytes.clone();
        wrong[0] = b'X';
        assert_eq!(wire(&wrong), WireError::BadMagic);
        assert_eq!(wire(&bytes[..6]), WireError::Truncated { at: 4 });
        let mut version = bytes.clone();
        version[4] = 99;
        assert_eq!(
            wire(&version),
            WireError::Version {
                found: 99,
                reads: VERSION
            }
        );
        let mut long = bytes.clone();
        long.extend_from_slice(&[0, 0, 0]);
        assert_eq!(wire(&long), WireError::Trailing { bytes: 3 });
        assert!(FfiError::Wire(WireError::BadMagic).status() == crate::status::UCM_ERR_INVALID);
    }
}
