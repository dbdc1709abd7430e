//! Instances sharing one store directory (a shared file system): each has
//! its own cache, memory pools and checkpoint directory; a new instance's
//! checkpoint directory is rebuilt from what any instance persisted, so it
//! hits prefixes (K/V and recurrent states) that two others computed.

use std::sync::Arc;
use std::time::Duration;

use ucm_coordinator::adapter::{Allocation, Scheduled};
use ucm_coordinator::{RequestKeys, SpecTable};
use ucm_ffi::{wire, Backend, Cache, CacheOptions, RawRegion, SchedulerSide, WorkerSide};

const SPEC: &str = r#"
model = "shared"
num_layers = 2
[[group]]
name = "attn"
kind = "chain"
block_size = 16
layers = "0"
bytes_per_token = 256
[[group]]
name = "ssm"
kind = "snapshot"
grid = 16
state_bytes = 4096
layers = "1"
"#;

struct Instance {
    sched: SchedulerSide,
    worker: WorkerSide,
    _mem: Vec<Vec<u8>>,
}

fn instance(dir: &std::path::Path, fill: u8) -> Instance {
    let mut opts = CacheOptions::new(dir);
    opts.store.pool_bytes = Some(2 << 20);
    let cache = Cache::open(SpecTable::from_toml(SPEC).unwrap(), opts).unwrap();
    let mem = vec![vec![fill; 4096 * 64], vec![fill ^ 0xff; 4096 * 8]];
    let mut worker = cache.worker(Backend::Host, 0, 0..2).unwrap();
    let regions: Vec<RawRegion> = mem
        .iter()
        .enumerate()
        .map(|(l, m)| RawRegion {
            layer: l as u32,
            addr: m.as_ptr() as u64,
            len: m.len(),
            stride: 4096,
        })
        .collect();
    // SAFETY: the Vecs live in the returned Instance, after the worker in
    // field order, so they outlive it; they are never reallocated.
    unsafe { worker.register_kv_caches(&regions) }.unwrap();
    Instance {
        sched: cache.scheduler(),
        worker,
        _mem: mem,
    }
}

fn lookup(i: &mut Instance, req: &str, tokens: &[u32]) -> u64 {
    i.sched
        .get_num_new_matched_tokens(req, Arc::new(tokens.to_vec()), RequestKeys::default(), 0)
        .unwrap()
}

/// Serves `prompt` whole: allocation, one step, saves out.
fn serve(i: &mut Instance, req: &str, prompt: &[u32]) {
    assert_eq!(lookup(i, req, prompt), 0, "{req}: nothing stored yet");
    let mut a = Allocation::default();
    a.blocks
        .insert(0, (0..prompt.len().div_ceil(16) as u32).collect());
    a.state_slots.insert(1, 0);
    i.sched.update_state_after_alloc(req, a, 0).unwrap();
    let meta = i
        .sched
        .build_meta(&[Scheduled {
            req: req.into(),
            start: 0,
            end: prompt.len() as u64,
        }])
        .unwrap();
    let spec = Arc::clone(i.worker.cache().spec());
    let meta = wire::decode(&spec, &wire::encode(&meta)).unwrap();
    i.worker.start_load_kv(meta).unwrap();
    for l in 0..2 {
        i.worker.wait_for_layer_load(l).unwrap();
        i.worker.save_kv_layer(l).unwrap();
    }
    i.worker.wait_for_save().unwrap();
    for _ in 0..500 {
        if i.worker
            .get_finished(&[req.to_string()])
            .saved
            .contains(&req.to_string())
        {
            i.sched.request_finished(req);
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("{req} never saved");
}

#[test]
fn a_new_instance_rebuilds_its_checkpoints_from_what_any_instance_persisted() {
    let dir = tempfile::tempdir().unwrap();
    let p1: Vec<u32> = (0..48).collect();
    let p2: Vec<u32> = (1000..1048).collect();
    {
        // Two instances at once on the directory, each computing a prompt.
        let (mut a, mut b) = (instance(dir.path(), 1), instance(dir.path(), 2));
        serve(&mut a, "a", &p1);
        serve(&mut b, "b", &p2);
        // Each sees the other's work only once on disk: the pools are private.
    }
    // A third instance, started after both: its directory is rebuilt from
    // the disk tier, which holds the blocks and states of both.
    let mut c = instance(dir.path(), 3);
    let more = |p: &[u32]| p.iter().copied().chain(5000..5010).collect::<Vec<u32>>();
    assert_eq!(
        lookup(&mut c, "c1", &more(&p1)),
        48,
        "a's blocks and state at 48"
    );
    assert_eq!(
        lookup(&mut c, "c2", &more(&p2)),
        48,
        "b's blocks and state at 48"
    );
    // A prefix nobody computed is a miss.
    let other: Vec<u32> = (7000..7058).collect();
    assert_eq!(lookup(&mut c, "c3", &other), 0);
}
