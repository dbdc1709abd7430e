//! Each refusal of the runtime is its own variant, with fields, and maps to
//! the C status code it always had.

mod common;

use common::SPEC;
use ucm_coordinator::{RequestKeys, SpecTable};
use ucm_device::{DeviceNameProblem, DeviceSpec};
use ucm_ffi::status::{UCM_ERR_BUFFER, UCM_ERR_INVALID, UCM_ERR_UNSUPPORTED};
use ucm_ffi::{
    hashing, ArgProblem, Backend, Cache, CacheOptions, FfiError, RawRegion, Unsupported,
};

fn spec() -> SpecTable {
    SpecTable::from_toml(SPEC).unwrap()
}

#[test]
fn cache_options_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = CacheOptions::new(dir.path());
    opts.tp_size = 0;
    let e = Cache::open(spec(), opts).err().unwrap();
    assert!(
        matches!(&e, FfiError::Argument { name, problem: ArgProblem::OutOfRange { .. } } if name == "tp_size"),
        "{e:?}"
    );
    assert_eq!(e.status(), UCM_ERR_INVALID);
    let e = Cache::open(spec(), CacheOptions::new("")).err().unwrap();
    assert!(
        matches!(&e, FfiError::Argument { name, problem: ArgProblem::Empty } if name == "dir"),
        "{e:?}"
    );
}

#[test]
fn device_names_are_refused_by_kind() {
    let e = Backend::parse("npu:1").unwrap_err();
    assert!(matches!(
        e,
        FfiError::Unsupported(Unsupported::Device(DeviceSpec::Npu(1)))
    ));
    assert_eq!(e.status(), UCM_ERR_UNSUPPORTED);
    let e = Backend::parse("tpu:0").unwrap_err();
    assert!(matches!(
        &e,
        FfiError::Unsupported(Unsupported::UnknownDevice(n)) if n.why == DeviceNameProblem::UnknownKind
    ));
    let e = Backend::parse("cuda:x").unwrap_err();
    assert!(matches!(&e, FfiError::DeviceName(n) if n.why == DeviceNameProblem::BadOrdinal));
    assert_eq!(e.status(), UCM_ERR_INVALID);
    assert_eq!(
        Backend::parse("cuda:2").unwrap().spec(),
        DeviceSpec::Cuda(2)
    );
}

#[test]
fn hashing_refuses_rank_and_group_kind_by_variant() {
    let s = spec();
    let keys = RequestKeys::default();
    let toks: Vec<u32> = (0..64).collect();
    let e = hashing::block_ids(&s, 2, &keys, &toks, "attn", 2).unwrap_err();
    assert!(
        matches!(&e, FfiError::Argument { name, .. } if name == "rank"),
        "{e:?}"
    );
    let e = hashing::checkpoint(&s, 1, &keys, &toks, "attn", 0, 16).unwrap_err();
    assert!(
        matches!(&e, FfiError::Argument { problem: ArgProblem::NotSnapshot { group }, .. } if group == "attn"),
        "{e:?}"
    );
    assert!(hashing::checkpoint(&s, 1, &keys, &toks, "ssm", 0, 16).is_ok());
}

#[test]
fn regions_are_refused_with_their_layer_and_fault() {
    let dir = tempfile::tempdir().unwrap();
    let cache = Cache::open(spec(), CacheOptions::new(dir.path())).unwrap();
    let mem = vec![0u8; 4096 * 4];
    let good = RawRegion {
        layer: 1,
        addr: mem.as_ptr() as u64,
        len: mem.len(),
        stride: 4096,
    };
    let cases = [
        (RawRegion { addr: 0, ..good }, "null"),
        (
            RawRegion {
                addr: u64::MAX - 8,
                ..good
            },
            "wraps",
        ),
        (RawRegion { stride: 0, ..good }, "stride"),
    ];
    for (r, what) in cases {
        let mut w = cache.worker(Backend::Host, 0, 0..2).unwrap();
        // SAFETY: every case is refused before the region is used.
        let e = unsafe { w.register_kv_caches(&[r]) }.unwrap_err();
        let FfiError::Argument { name, problem } = &e else {
            panic!("{what}: {e:?}")
        };
        assert_eq!(name, "regions[layer 1]");
        let ok = match what {
            "null" => *problem == ArgProblem::Null,
            "wraps" => matches!(problem, ArgProblem::Wraps { addr, .. } if *addr == u64::MAX - 8),
            _ => matches!(problem, ArgProblem::Stride { stride: 0, .. }),
        };
        assert!(ok, "{what}: {problem:?}");
    }
}

#[test]
fn buffer_errors_carry_both_sizes() {
    let e = FfiError::Buffer {
        capacity: 2,
        needed: 5,
        unit: "ids",
    };
    assert_eq!(e.status(), UCM_ERR_BUFFER);
    assert_eq!(e.to_string(), "buffer too small: 2 ids for 5");
}
