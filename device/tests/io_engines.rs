//! One test body for every I/O engine (io_uring, libaio, POSIX): random
//! aligned offsets and sizes against a shadow model, concurrent batches,
//! reads past EOF, rule violations, vectored writes, and injected faults
//! that must reach exactly the operation they name.

use std::path::Path;
use std::sync::Arc;

use ucm_device::io::faults::{self, FaultOp, FaultRule};
use ucm_device::io::{self, IoOp, DIRECT_IO_ALIGN};
use ucm_device::{
    DeviceError, IoBuf, IoEngine, IoEngineConfig, IoEngineKind, IoFile, IoRequest, OpenOptions,
};

const PAGE: usize = DIRECT_IO_ALIGN;

/// Small deterministic PRNG (splitmix64), so failures reproduce.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let v = self.next().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
}

/// Engines that run here. io_uring and libaio are expected on this kernel;
/// where one is refused the test says so and goes on with the rest.
fn engines() -> Vec<(IoEngineKind, Box<dyn IoEngine>)> {
    let mut out = Vec::new();
    for kind in IoEngineKind::CONCRETE {
        let mut cfg = IoEngineConfig::new(kind);
        cfg.queue_depth = 32;
        match cfg.build() {
            Ok(e) => out.push((kind, e)),
            Err(DeviceError::Unsupported { reason, .. }) => {
                eprintln!("skipping {kind}: {reason}");
                assert_ne!(kind, IoEngineKind::Posix, "posix must always work");
            }
            Err(e) => panic!("building {kind}: {e}"),
        }
    }
    out
}

fn open_rw(path: &Path) -> Arc<IoFile> {
    Arc::new(IoFile::open(path, OpenOptions::read_write()).unwrap())
}

fn wait_all(engine: &dyn IoEngine, reqs: Vec<IoRequest>) -> Vec<io::IoOutput> {
    engine.submit(reqs).into_iter().map(|t| t.wait()).collect()
}

/// Random writes of random multiple-of-4K sizes at random aligned offsets,
/// in concurrent batches from several threads (each thread owns a region),
/// checked against a shadow copy by random reads.
fn random_io_matches_model(engine: &dyn IoEngine, dir: &Path, seed: u64) {
    const REGION: usize = 4 << 20;
    const THREADS: usize = 4;
    let file = open_rw(&dir.join(format!("model-{}", engine.name())));
    file.set_len((REGION * THREADS) as u64).unwrap();
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let file = Arc::clone(&file);
            s.spawn(move || {
                let mut rng = Rng(seed ^ (t as u64 * 7919));
                let base = (t * REGION) as u64;
                let mut model = vec![0u8; REGION];
                for _round in 0..6 {
                    // A batch of non-overlapping writes: pick pages in order.
                    let mut reqs = Vec::new();
                    let mut pos = 0usize;
                    let mut spans = Vec::new();
                    while pos < REGION {
                        pos += PAGE * rng.below(16) as usize;
                        let len = PAGE * (1 + rng.below(32) as usize);
                        if pos + len > REGION {
                            break;
                        }
                        let mut buf = IoBuf::new(len);
                        rng.fill(buf.as_mut_slice());
                        spans.push((pos, buf.as_slice().to_vec()));
                        reqs.push(IoRequest::write(Arc::clone(&file), base + pos as u64, buf));
                        pos += len;
                    }
                    for out in wait_all(engine, reqs) {
                        let n = out.result.unwrap();
                        assert_eq!(n, out.buf.as_ref().unwrap().len());
                    }
                    for (pos, data) in spans {
                        model[pos..pos + data.len()].copy_from_slice(&data);
                    }
                    // Random reads, one concurrent batch.
                    let mut reqs = Vec::new();
                    let mut where_ = Vec::new();
                    for _ in 0..24 {
                        let len = PAGE * (1 + rng.below(64) as usize);
                        let pos = PAGE * rng.below(((REGION - len) / PAGE + 1) as u64) as usize;
                        where_.push((pos, len));
                        reqs.push(IoRequest::read(
                            Arc::clone(&file),
                            base + pos as u64,
                            IoBuf::new(len),
                        ));
                    }
                    for (out, (pos, len)) in wait_all(engine, reqs).into_iter().zip(where_) {
                        assert_eq!(out.result.unwrap(), len);
                        let got = out.buf.unwrap();
                        assert!(
                            got.as_slice() == &model[pos..pos + len],
                            "{}: read at {pos:#x}+{len:#x} differs from the model",
                            engine.name()
                        );
                    }
                }
            });
        }
    });
}

/// A read that crosses EOF is short; one past EOF reads nothing.
fn reads_past_eof(engine: &dyn IoEngine, dir: &Path) {
    let file = open_rw(&dir.join(format!("eof-{}", engine.name())));
    let data: Vec<u8> = (0..3 * PAGE).map(|i| (i % 253) as u8).collect();
    let out = wait_all(
        engine,
        vec![IoRequest::write(
            Arc::clone(&file),
            0,
            IoBuf::from_slice(&data),
        )],
    );
    out.into_iter().for_each(|o| {
        o.result.unwrap();
    });
    let outs = wait_all(
        engine,
        vec![
            IoRequest::read(Arc::clone(&file), 2 * PAGE as u64, IoBuf::new(4 * PAGE)),
            IoRequest::read(Arc::clone(&file), 8 * PAGE as u64, IoBuf::new(PAGE)),
        ],
    );
    let mut it = outs.into_iter();
    let cross = it.next().unwrap();
    assert_eq!(
        cross.result.unwrap(),
        PAGE,
        "{}: crossing EOF",
        engine.name()
    );
    assert_eq!(&cross.buf.unwrap().as_slice()[..PAGE], &data[2 * PAGE..]);
    let past = it.next().unwrap();
    assert_eq!(past.result.unwrap(), 0, "{}: past EOF", engine.name());
}

/// Rule violations are errors on exactly the offending requests; the rest
/// of the batch completes normally.
fn violations_are_errors(engine: &dyn IoEngine, dir: &Path) {
    let path = dir.join(format!("rules-{}", engine.name()));
    let file = open_rw(&path);
    let direct = file.is_direct();
    let mut unaligned = IoBuf::new(2 * PAGE);
    unaligned.set_window(512, PAGE).unwrap();
    let mut odd_len = IoBuf::new(PAGE);
    odd_len.set_window(0, 1000).unwrap();
    let outs = wait_all(
        engine,
        vec![
            IoRequest::write(Arc::clone(&file), 0, IoBuf::from_slice(&[1u8; PAGE])),
            IoRequest::write(Arc::clone(&file), PAGE as u64, unaligned),
            IoRequest::write(Arc::clone(&file), PAGE as u64, odd_len),
            IoRequest::write(Arc::clone(&file), 100, IoBuf::new(PAGE)),
            IoRequest::write(Arc::clone(&file), u64::MAX - 10, IoBuf::new(PAGE)),
            IoRequest {
                op: IoOp::Read,
                file: Arc::clone(&file),
                offset: 0,
                buf: None,
                gather: Vec::new(),
            },
            IoRequest::write(
                Arc::clone(&file),
                2 * PAGE as u64,
                IoBuf::from_slice(&[2u8; PAGE]),
            ),
        ],
    );
    let r: Vec<_> = outs.into_iter().map(|o| o.result).collect();
    assert_eq!(r[0].as_ref().unwrap(), &PAGE);
    if direct {
        assert!(
            matches!(
                r[1],
                Err(DeviceError::Misaligned {
                    what: "buffer address",
                    ..
                })
            ),
            "{:?}",
            r[1]
        );
        assert!(
            matches!(
                r[2],
                Err(DeviceError::Misaligned {
                    what: "buffer length",
                    ..
                })
            ),
            "{:?}",
            r[2]
        );
        assert!(
            matches!(
                r[3],
                Err(DeviceError::Misaligned {
                    what: "file offset",
                    ..
                })
            ),
            "{:?}",
            r[3]
        );
    }
    assert!(
        matches!(r[4], Err(DeviceError::OutOfBounds { .. })),
        "{:?}",
        r[4]
    );
    assert!(
        matches!(r[5], Err(DeviceError::InvalidArgument(_))),
        "{:?}",
        r[5]
    );
    assert_eq!(r[6].as_ref().unwrap(), &PAGE);

    // Written through a read-only handle: refused before the kernel.
    let ro = Arc::new(IoFile::open(&path, OpenOptions::read_only()).unwrap());
    let outs = wait_all(
        engine,
        vec![IoRequest::write(Arc::clone(&ro), 0, IoBuf::new(PAGE))],
    );
    let o = outs.into_iter().next().unwrap();
    assert!(
        matches!(o.result, Err(DeviceError::ReadOnly { .. })),
        "{:?}",
        o.result
    );
    assert!(o.buf.is_some(), "the buffer comes back with the error");
    let mut got = wait_all(engine, vec![IoRequest::read(ro, 0, IoBuf::new(PAGE))]);
    let got = got.pop().unwrap();
    assert_eq!(got.result.unwrap(), PAGE);
    assert_eq!(got.buf.unwrap().as_slice(), &[1u8; PAGE]);
}

/// EIO and ENOSPC injected on two writes of a batch reach exactly those two;
/// short reads and writes are reported as such; an fsync can fail too.
fn injected_faults_reach_exactly_their_operation(engine: &dyn IoEngine, dir: &Path) {
    let sub = dir.join(format!("faults-{}", engine.name()));
    std::fs::create_dir_all(&sub).unwrap();
    let path = sub.join("data");
    let file = open_rw(&path);
    let eio = faults::inject(
        FaultRule::errno(&path, FaultOp::Write, libc::EIO).at_offset(5 * PAGE as u64),
    );
    let enospc = faults::inject(
        FaultRule::errno(&path, FaultOp::Write, libc::ENOSPC).at_offset(11 * PAGE as u64),
    );
    let reqs = (0..16)
        .map(|i| {
            IoRequest::write(
                Arc::clone(&file),
                (i * PAGE) as u64,
                IoBuf::from_slice(&[i as u8 + 1; PAGE]),
            )
        })
        .collect();
    let outs = wait_all(engine, reqs);
    for (i, o) in outs.iter().enumerate() {
        match i {
            5 => assert_eq!(
                o.result.as_ref().unwrap_err().raw_os_error(),
                Some(libc::EIO)
            ),
            11 => assert_eq!(
                o.result.as_ref().unwrap_err().raw_os_error(),
                Some(libc::ENOSPC)
            ),
            _ => assert_eq!(*o.result.as_ref().unwrap(), PAGE, "op {i}"),
        }
    }
    assert_eq!((eio.fired(), enospc.fired()), (1, 1));
    drop((eio, enospc));
    // The failed ranges were never written; the others read back.
    let reqs = (0..16)
        .map(|i| IoRequest::read(Arc::clone(&file), (i * PAGE) as u64, IoBuf::new(PAGE)))
        .collect();
    for (i, o) in wait_all(engine, reqs).into_iter().enumerate() {
        assert_eq!(o.result.unwrap(), PAGE);
        let want = if i == 5 || i == 11 { 0 } else { i as u8 + 1 };
        assert!(
            o.buf.unwrap().as_slice().iter().all(|&b| b == want),
            "page {i}"
        );
    }

    // Short transfers, done for real by the kernel.
    let short_r = faults::inject(FaultRule::short(&path, FaultOp::Read, PAGE).times(1));
    let out = wait_all(
        engine,
        vec![IoRequest::read(Arc::clone(&file), 0, IoBuf::new(4 * PAGE))],
    );
    assert_eq!(*out[0].result.as_ref().unwrap(), PAGE);
    assert_eq!(short_r.fired(), 1);
    let short_w = faults::inject(FaultRule::short(&sub, FaultOp::Write, PAGE).times(1));
    let out = wait_all(
        engine,
        vec![IoRequest::write(Arc::clone(&file), 0, IoBuf::new(2 * PAGE))],
    );
    match &out[0].result {
        Err(DeviceError::ShortWrite { done, expected, .. }) => {
            assert_eq!((*done, *expected), (PAGE, 2 * PAGE))
        }
        other => panic!("{}: expected a short write, got {other:?}", engine.name()),
    }
    drop((short_r, short_w));

    let bad_sync = faults::inject(FaultRule::errno(&sub, FaultOp::Fsync, libc::EIO));
    let out = wait_all(engine, vec![IoRequest::fsync(Arc::clone(&file))]);
    assert_eq!(
        out[0].result.as_ref().unwrap_err().raw_os_error(),
        Some(libc::EIO)
    );
    drop(bad_sync);
    let out = wait_all(engine, vec![IoRequest::fsync(file)]);
    assert_eq!(*out[0].result.as_ref().unwrap(), 0);

    let bad_open = faults::inject(FaultRule::errno(&sub, FaultOp::Open, libc::EACCES));
    let err = IoFile::open(sub.join("other"), OpenOptions::read_write()).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EACCES));
    drop(bad_open);
}

/// A vectored write lands as its buffers in order, gives every buffer
/// back, is cut by an injected short transfer like any write, and breaks
/// the same rules as a plain one (plus its own: only writes gather, at
/// most `MAX_IO_BUFFERS` buffers).
fn vectored_writes_land_in_order(engine: &dyn IoEngine, dir: &Path) {
    let sub = dir.join(format!("writev-{}", engine.name()));
    std::fs::create_dir_all(&sub).unwrap();
    let path = sub.join("data");
    let file = open_rw(&path);
    assert!(
        file.is_direct(),
        "the vectored case runs on an O_DIRECT file"
    );
    let lens = [PAGE, 2 * PAGE, PAGE, 3 * PAGE];
    let mut rng = Rng(0x5eed);
    let bufs: Vec<IoBuf> = lens
        .iter()
        .map(|&n| {
            let mut b = IoBuf::new(n);
            rng.fill(b.as_mut_slice());
            b
        })
        .collect();
    let want: Vec<u8> = bufs.iter().flat_map(|b| b.as_slice().to_vec()).collect();
    let mut it = bufs.into_iter();
    let first = it.next().unwrap();
    let at = 2 * PAGE as u64;
    let out = wait_all(
        engine,
        vec![IoRequest::write_vectored(
            Arc::clone(&file),
            at,
            first,
            it.collect(),
        )],
    )
    .pop()
    .unwrap();
    assert_eq!(
        *out.result.as_ref().unwrap(),
        want.len(),
        "{}",
        engine.name()
    );
    let back: Vec<usize> = out.buf.iter().chain(&out.gather).map(IoBuf::len).collect();
    assert_eq!(back, lens, "every buffer comes back, in order");
    let on_disk = std::fs::read(&path).unwrap();
    assert_eq!(on_disk.len(), at as usize + want.len());
    assert!(on_disk[..at as usize].iter().all(|&b| b == 0));
    assert!(
        on_disk[at as usize..] == want[..],
        "{}: bytes in order",
        engine.name()
    );

    // An injected short transfer cuts the segments (here inside the second
    // buffer): a short write, and only the bytes before the cut land.
    let fresh = sub.join("short");
    let f2 = open_rw(&fresh);
    let short = faults::inject(FaultRule::short(&fresh, FaultOp::Write, 2 * PAGE).times(1));
    let gather = vec![
        IoBuf::from_slice(&[7u8; 2 * PAGE]),
        IoBuf::from_slice(&[8u8; PAGE]),
    ];
    let out = wait_all(
        engine,
        vec![IoRequest::write_vectored(
            Arc::clone(&f2),
            0,
            IoBuf::from_slice(&[6u8; PAGE]),
            gather,
        )],
    );
    match &out[0].result {
        Err(DeviceError::ShortWrite { done, expected, .. }) => {
            assert_eq!((*done, *expected), (2 * PAGE, 4 * PAGE))
        }
        other => panic!("{}: expected a short write, got {other:?}", engine.name()),
    }
    assert_eq!(short.fired(), 1);
    drop(short);
    let got = std::fs::read(&fresh).unwrap();
    assert_eq!(got.len(), 2 * PAGE, "cut inside the second buffer");
    assert!(got[..PAGE].iter().all(|&b| b == 6) && got[PAGE..].iter().all(|&b| b == 7));

    // A fault at an offset inside a vectored write (its third buffer)
    // fails that write; one past its end does not fire.
    let inside = faults::inject(
        FaultRule::errno(&fresh, FaultOp::Write, libc::EIO).at_offset(3 * PAGE as u64),
    );
    let past = faults::inject(
        FaultRule::errno(&fresh, FaultOp::Write, libc::ENOSPC).at_offset(4 * PAGE as u64),
    );
    let gather = vec![IoBuf::new(2 * PAGE), IoBuf::new(PAGE)];
    let out = wait_all(
        engine,
        vec![IoRequest::write_vectored(
            Arc::clone(&f2),
            0,
            IoBuf::new(PAGE),
            gather,
        )],
    );
    assert_eq!(
        out[0].result.as_ref().unwrap_err().raw_os_error(),
        Some(libc::EIO)
    );
    assert_eq!((inside.fired(), past.fired()), (1, 0));
    drop((inside, past));

    // The rules: a misaligned gather buffer on an O_DIRECT file, an empty
    // one, a read that gathers, too many buffers.
    let mut odd = IoBuf::new(2 * PAGE);
    odd.set_window(512, PAGE).unwrap();
    let outs = wait_all(
        engine,
        vec![
            IoRequest::write_vectored(Arc::clone(&file), 0, IoBuf::new(PAGE), vec![odd]),
            IoRequest::write_vectored(Arc::clone(&file), 0, IoBuf::new(PAGE), vec![IoBuf::new(0)]),
            IoRequest {
                op: IoOp::Read,
                file: Arc::clone(&file),
                offset: 0,
                buf: Some(IoBuf::new(PAGE)),
                gather: vec![IoBuf::new(PAGE)],
            },
            IoRequest::write_vectored(
                Arc::clone(&file),
                0,
                IoBuf::new(PAGE),
                (0..io::MAX_IO_BUFFERS).map(|_| IoBuf::new(PAGE)).collect(),
            ),
        ],
    );
    assert!(
        matches!(outs[0].result, Err(DeviceError::Misaligned { .. })),
        "{:?}",
        outs[0].result
    );
    for (i, o) in outs.iter().enumerate().skip(1) {
        assert!(
            matches!(o.result, Err(DeviceError::InvalidArgument(_))),
            "{} case {i}: {:?}",
            engine.name(),
            o.result
        );
    }
    // Nothing of the refused requests reached the file.
    assert!(std::fs::read(&path).unwrap()[at as usize..] == want[..]);
}

#[test]
fn every_engine_passes_the_io_test_body() {
    let engines = engines();
    assert!(engines.len() >= 2, "at least posix and one kernel engine");
    for (i, (kind, engine)) in engines.iter().enumerate() {
        let dir = tempfile::tempdir().unwrap();
        eprintln!("io test body on {kind}");
        random_io_matches_model(engine.as_ref(), dir.path(), 0xfeed + i as u64);
        reads_past_eof(engine.as_ref(), dir.path());
        violations_are_errors(engine.as_ref(), dir.path());
        vectored_writes_land_in_order(engine.as_ref(), dir.path());
        injected_faults_reach_exactly_their_operation(engine.as_ref(), dir.path());
    }
}

/// The same body on files where O_DIRECT is refused: their writes
/// serialize in the kernel, and the POSIX engine keeps each file's writes
/// on one worker (its lane) while they are in flight.
#[test]
fn every_engine_passes_the_io_test_body_on_buffered_files() {
    for (i, (kind, engine)) in engines().iter().enumerate() {
        let dir = tempfile::tempdir().unwrap();
        let _buffered = faults::inject(FaultRule::errno(
            dir.path(),
            FaultOp::OpenDirect,
            libc::EINVAL,
        ));
        eprintln!("io test body on {kind}, buffered files");
        random_io_matches_model(engine.as_ref(), dir.path(), 0xbeef + i as u64);
        reads_past_eof(engine.as_ref(), dir.path());
    }
}

#[test]
fn dropping_an_engine_drains_its_in_flight_operations() {
    for kind in IoEngineKind::CONCRETE {
        let Ok(engine) = IoEngineConfig::new(kind).build() else {
            continue;
        };
        let dir = tempfile::tempdir().unwrap();
        let file = open_rw(&dir.path().join("drain"));
        let reqs = (0..256)
            .map(|i| {
                IoRequest::write(
                    Arc::clone(&file),
                    (i * 16 * PAGE) as u64,
                    IoBuf::from_slice(&[7u8; 16 * PAGE]),
                )
            })
            .collect();
        let tickets = engine.submit(reqs);
        drop(engine);
        for t in tickets {
            assert_eq!(t.wait().result.unwrap(), 16 * PAGE, "{kind}");
        }
    }
}

#[test]
fn o_direct_falls_back_to_buffered_where_refused() {
    // tmpfs accepts O_DIRECT on recent kernels; either way the file opens
    // and the engines work on it, and `is_direct` tells which mode it got.
    let dir = tempfile::tempdir_in("/dev/shm")
        .or_else(|_| tempfile::tempdir())
        .unwrap();
    let file = open_rw(&dir.path().join("x"));
    let engine = IoEngineConfig::new(IoEngineKind::Posix).build().unwrap();
    let out = wait_all(
        engine.as_ref(),
        vec![IoRequest::write(Arc::clone(&file), 0, IoBuf::new(PAGE))],
    );
    assert_eq!(*out[0].result.as_ref().unwrap(), PAGE);
    eprintln!("O_DIRECT in {}: {}", dir.path().display(), file.is_direct());
}

#[test]
fn refused_o_direct_falls_back_to_buffered_io() {
    let dir = tempfile::tempdir().unwrap();
    let _refuse = faults::inject(FaultRule::errno(
        dir.path(),
        FaultOp::OpenDirect,
        libc::EINVAL,
    ));
    let file = open_rw(&dir.path().join("buffered"));
    assert!(!file.is_direct());
    for (kind, engine) in engines() {
        // Buffered files take unaligned offsets and lengths.
        let out = wait_all(
            engine.as_ref(),
            vec![IoRequest::write(
                Arc::clone(&file),
                100,
                IoBuf::from_slice(b"hello"),
            )],
        );
        assert_eq!(*out[0].result.as_ref().unwrap(), 5, "{kind}");
        let out = wait_all(
            engine.as_ref(),
            vec![IoRequest::read(Arc::clone(&file), 100, IoBuf::new(5))],
        );
        assert_eq!(out[0].buf.as_ref().unwrap().as_slice(), b"hello", "{kind}");
    }
    // Another errno than EINVAL is a real failure, not a fallback.
    let _deny = faults::inject(FaultRule::errno(
        dir.path().join("denied"),
        FaultOp::OpenDirect,
        libc::EPERM,
    ));
    assert!(IoFile::open(dir.path().join("denied"), OpenOptions::read_write()).is_err());
}

#[test]
fn auto_picks_a_working_engine_and_unknown_names_are_errors() {
    // `auto` takes the first engine whose probe passes.
    let first = IoEngineKind::CONCRETE
        .into_iter()
        .find(|&k| io::probe(k).is_ok())
        .unwrap();
    let e = IoEngineConfig::default().build().unwrap();
    assert_eq!(e.name(), first.name());
    if !cfg!(feature = "io-uring") {
        // A build without io_uring refuses it clearly, and auto moves on.
        match IoEngineConfig::new(IoEngineKind::IoUring).build() {
            Err(DeviceError::Unsupported { backend, reason }) => {
                assert_eq!(backend, "io_uring");
                assert!(reason.contains("not built"), "{reason}");
            }
            other => panic!("expected Unsupported, got {other:?}"),
        }
        assert_ne!(e.name(), "io_uring");
    }
    assert!("nvme-of".parse::<IoEngineKind>().is_err());
    let mut cfg = IoEngineConfig::new(IoEngineKind::Posix);
    cfg.workers = 0;
    assert!(cfg.build().is_err());
}

/// True when `p` lies on tmpfs, asked of `df` (an independent witness).
fn on_tmpfs(p: &Path) -> bool {
    std::process::Command::new("df")
        .args(["--output=fstype"])
        .arg(p)
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).lines().nth(1) == Some("tmpfs"))
}

#[test]
fn auto_takes_posix_for_a_directory_on_tmpfs_and_keeps_a_named_engine() {
    let shm = Path::new("/dev/shm");
    if on_tmpfs(shm) {
        // The directory need not exist yet: its nearest ancestor tells.
        let dir = shm.join("ucm-for-dir-test/not/made/yet");
        assert_eq!(
            IoEngineConfig::for_dir(IoEngineKind::Auto, &dir),
            IoEngineConfig::new(IoEngineKind::Posix)
        );
        for k in IoEngineKind::CONCRETE {
            assert_eq!(IoEngineConfig::for_dir(k, &dir), IoEngineConfig::new(k));
        }
    } else {
        eprintln!("skipped the tmpfs half: /dev/shm is not tmpfs here");
    }
    let disk = tempfile::tempdir().unwrap();
    if on_tmpfs(disk.path()) {
        eprintln!("skipped the disk half: the temporary directory is on tmpfs");
        return;
    }
    for dir in [disk.path().to_path_buf(), disk.path().join("a/b")] {
        assert_eq!(
            IoEngineConfig::for_dir(IoEngineKind::Auto, &dir),
            IoEngineConfig::new(IoEngineKind::Auto)
        );
    }
    // A relative path is asked from the working directory.
    let rel = Path::new("no-such-dir-here");
    let cwd_tmpfs = on_tmpfs(Path::new("."));
    let want = if cwd_tmpfs {
        IoEngineKind::Posix
    } else {
        IoEngineKind::Auto
    };
    assert_eq!(
        IoEngineConfig::for_dir(IoEngineKind::Auto, rel),
        IoEngineConfig::new(want)
    );
}

#[test]
fn probe_reports_every_engine() {
    let dir = tempfile::tempdir().unwrap();
    let st = io::probe_engines(dir.path());
    let names: Vec<_> = st.iter().map(|s| s.name).collect();
    assert_eq!(names, ["io_uring", "libaio", "posix"]);
    let posix = &st[2];
    assert!(posix.available, "{}", posix.reason);
    // Nothing is left behind in the directory.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn long_gather_lists_are_cut_at_the_buffer_limit_in_file_order() {
    let dir = tempfile::tempdir().unwrap();
    let file = open_rw(&dir.path().join("f"));
    assert!(IoRequest::writes_vectored(&file, 0, Vec::new()).is_empty());
    let n = 2 * io::MAX_IO_BUFFERS + 1;
    let bufs: Vec<IoBuf> = (0..n).map(|_| IoBuf::new(PAGE)).collect();
    let reqs = IoRequest::writes_vectored(&file, 8 * PAGE as u64, bufs);
    let shape: Vec<(u64, usize)> = reqs
        .iter()
        .map(|r| (r.offset, 1 + r.gather.len()))
        .collect();
    let m = io::MAX_IO_BUFFERS;
    assert_eq!(
        shape,
        vec![
            (8 * PAGE as u64, m),
            ((8 + m) as u64 * PAGE as u64, m),
            ((8 + 2 * m) as u64 * PAGE as u64, 1)
        ]
    );
    assert!(reqs.iter().all(|r| r.op == IoOp::Write && r.buf.is_some()));
    // Every piece lands where it belongs.
    let engine = IoEngineConfig::new(IoEngineKind::Posix).build().unwrap();
    let mut bufs = Vec::new();
    for i in 0..n {
        bufs.push(IoBuf::from_slice(&[(i % 251) as u8; PAGE]));
    }
    for o in wait_all(engine.as_ref(), IoRequest::writes_vectored(&file, 0, bufs)) {
        o.result.unwrap();
    }
    let got = std::fs::read(dir.path().join("f")).unwrap();
    assert_eq!(got.len(), n * PAGE);
    assert!((0..n).all(|i| got[i * PAGE..(i + 1) * PAGE]
        .iter()
        .all(|&b| b == (i % 251) as u8)));
}

/// An unnamed file (`O_TMPFILE`) takes writes and fsyncs through every
/// engine, is nowhere in its directory until linked, then has exactly its
/// bytes under the new name; a link never replaces a file, a named file
/// cannot be linked again, an unlinked one vanishes on close, a symbolic
/// link in place of the directory is refused, and an injected link fault
/// reaches the link.
#[test]
fn unnamed_files_appear_only_when_linked() {
    let dir = tempfile::tempdir().unwrap();
    let entries = |d: &Path| std::fs::read_dir(d).unwrap().count();
    for (kind, engine) in engines() {
        let sub = dir.path().join(kind.to_string());
        std::fs::create_dir(&sub).unwrap();
        let f = match IoFile::create_unnamed(&sub, true) {
            Ok(f) => Arc::new(f),
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => {
                eprintln!("skipping: this file system has no O_TMPFILE ({e})");
                return;
            }
            Err(e) => panic!("{e}"),
        };
        let mut buf = IoBuf::new(2 * PAGE);
        Rng(7).fill(buf.as_mut_slice());
        let want = buf.as_slice().to_vec();
        let out = wait_all(&*engine, vec![IoRequest::write(Arc::clone(&f), 0, buf)]);
        assert!(out[0].result.is_ok(), "{kind}: {:?}", out[0].result);
        let out = wait_all(&*engine, vec![IoRequest::fsync(Arc::clone(&f))]);
        assert!(out[0].result.is_ok(), "{kind}");
        assert_eq!(entries(&sub), 0, "{kind}: an unnamed file showed up");

        // A taken name is never replaced; the file can still be named.
        let taken = sub.join("taken");
        std::fs::write(&taken, b"keep").unwrap();
        let e = f.link_as(&taken).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EEXIST), "{e}");
        assert_eq!(std::fs::read(&taken).unwrap(), b"keep");
        let dst = sub.join("block");
        f.link_as(&dst).unwrap();
        assert_eq!(std::fs::read(&dst).unwrap(), want, "{kind}");
        assert!(f.link_as(sub.join("again")).is_err(), "named twice");
        assert!(!sub.join("again").exists());

        // Never named: gone when closed.
        drop(IoFile::create_unnamed(&sub, true).unwrap());
        assert_eq!(entries(&sub), 2, "{kind}: only `taken` and `block`");
    }

    // The directory must not be a symbolic link; nothing lands in its target.
    let target = dir.path().join("target");
    std::fs::create_dir(&target).unwrap();
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    assert!(IoFile::create_unnamed(&link, true).is_err());
    assert!(IoFile::create_unnamed(dir.path().join("missing"), true).is_err());

    // A fault rule on the new name fails the link and nothing appears.
    let f = IoFile::create_unnamed(&target, true).unwrap();
    let dst = target.join("x");
    {
        let _g = faults::inject(FaultRule::errno(&dst, FaultOp::Link, libc::EIO));
        let e = f.link_as(&dst).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
        assert!(!dst.exists());
    }
    f.link_as(&dst).unwrap();
    assert!(dst.exists());
}
