//! The ClockPool: round trips, the exact CLOCK victim order (second chance
//! included), pins, failed loads, shared memory across processes (one load
//! for all) and recovery when the loading owner is killed.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::SystemTime;
use std::time::{Duration, Instant};

use ucm_store::pool::{rank_order, Acquire, ClockPool, Key, PoolConfig, PoolMode};
use ucm_store::{ConfigError, StoreError};

const SLOT: usize = 4096;

fn key(n: u8) -> Key {
    ([n; 16], u32::from(n) * 3)
}

fn private(slots: usize, ways: usize) -> ClockPool {
    ClockPool::open(PoolConfig {
        shard_bytes: SLOT,
        slots,
        ways,
        mode: PoolMode::Private,
        load_timeout: Duration::from_millis(200),
        dirty_timeout: Duration::from_secs(60),
    })
    .unwrap()
}

/// Loads `k` with bytes `fill` if missing; returns the slot it lives in.
fn fill(pool: &ClockPool, k: Key, fill: u8) -> usize {
    match pool.acquire(k).unwrap().expect("a slot") {
        Acquire::Load(mut g) => {
            g.data_mut().fill(fill);
            g.complete().slot()
        }
        Acquire::Hit(r) => r.slot(),
        Acquire::Failed(c) => panic!("failed {c}"),
    }
}

fn slot_of(pool: &ClockPool, k: Key) -> Option<usize> {
    match pool.acquire(k).unwrap()? {
        Acquire::Hit(r) => Some(r.slot()),
        Acquire::Load(g) => {
            g.fail(libc::ENOENT);
            None
        }
        Acquire::Failed(_) => None,
    }
}

#[test]
fn loads_then_hits_return_the_same_bytes() {
    let pool = private(16, 4);
    let s = fill(&pool, key(1), 0xab);
    assert!(pool.contains(&key(1)));
    match pool.acquire(key(1)).unwrap().unwrap() {
        Acquire::Hit(r) => {
            assert_eq!(r.slot(), s);
            assert!(r.data().iter().all(|&b| b == 0xab));
        }
        _ => panic!("expected a hit"),
    }
    assert!(!pool.contains(&key(2)));
}

#[test]
fn clock_evicts_in_exact_order_with_second_chance_and_never_a_pinned_slot() {
    // One bucket of four ways: one global CLOCK.
    let pool = private(4, 4);
    for (k, b) in [(1, 1), (2, 2), (3, 3), (4, 4)] {
        fill(&pool, key(k), b);
    }
    // All four have their access bit set: the hand clears them all, then
    // takes slot 0 (key 1).
    fill(&pool, key(5), 5);
    assert!(!pool.contains(&key(1)));
    // Key 3 is hit: it gets a second chance; key 2 goes next, then 4, then 3.
    pool.touch(&key(3));
    fill(&pool, key(6), 6);
    assert!(!pool.contains(&key(2)));
    pool.touch(&key(3));
    fill(&pool, key(7), 7);
    assert!(!pool.contains(&key(4)), "4 before the touched 3");
    assert!(pool.contains(&key(3)));
    fill(&pool, key(8), 8);
    assert!(!pool.contains(&key(3)));
    // A pinned slot is never a victim, however often the hand passes it.
    let pinned = match pool.acquire(key(8)).unwrap().unwrap() {
        Acquire::Hit(r) => r,
        _ => panic!("expected a hit"),
    };
    for k in 20..40 {
        fill(&pool, key(k), k);
    }
    assert!(pool.contains(&key(8)));
    assert!(pinned.data().iter().all(|&b| b == 8));
    drop(pinned);
}

#[test]
fn a_full_bucket_of_pins_is_a_miss_not_a_wait() {
    let pool = private(2, 2);
    let a = match pool.acquire(key(1)).unwrap().unwrap() {
        Acquire::Load(g) => g.complete(),
        _ => panic!(),
    };
    let b = match pool.acquire(key(2)).unwrap().unwrap() {
        Acquire::Load(g) => g.complete(),
        _ => panic!(),
    };
    assert!(pool.acquire(key(3)).unwrap().is_none());
    drop((a, b));
    assert!(pool.acquire(key(3)).unwrap().is_some());
}

#[test]
fn failed_and_abandoned_loads_wake_waiters_and_are_taken_over() {
    let pool = private(4, 4);
    std::thread::scope(|s| {
        let g = match pool.acquire(key(1)).unwrap().unwrap() {
            Acquire::Load(g) => g,
            _ => panic!(),
        };
        let waiter = s.spawn(|| match pool.acquire(key(1)).unwrap().unwrap() {
            Acquire::Failed(code) => code,
            _ => panic!("the waiter must see the failure"),
        });
        std::thread::sleep(Duration::from_millis(50));
        g.fail(libc::EIO);
        assert_eq!(waiter.join().unwrap(), libc::EIO);
    });
    // The failed slot is retried by the next request.
    assert_eq!(slot_of(&pool, key(1)), None);
    fill(&pool, key(1), 9);
    assert!(pool.contains(&key(1)));
    // A guard dropped without an outcome fails the load (ECANCELED).
    std::thread::scope(|s| {
        let g = match pool.acquire(key(2)).unwrap().unwrap() {
            Acquire::Load(g) => g,
            _ => panic!(),
        };
        let waiter = s.spawn(|| match pool.acquire(key(2)).unwrap().unwrap() {
            Acquire::Failed(code) => code,
            _ => panic!(),
        });
        std::thread::sleep(Duration::from_millis(50));
        drop(g);
        assert_eq!(waiter.join().unwrap(), libc::ECANCELED);
    });
}

#[test]
fn rank_rotation_starts_at_device_id_mod_n_with_stride_n() {
    assert_eq!(rank_order(1, 4, 10), [1, 5, 9, 2, 6, 3, 7, 0, 4, 8]);
    assert_eq!(rank_order(4, 4, 6), [0, 4, 1, 5, 2, 3]);
    let mut all = rank_order(3, 8, 100);
    all.sort();
    assert_eq!(all, (0..100).collect::<Vec<_>>());
}

#[test]
fn bad_configs_are_refused() {
    let cfg = |shard_bytes, slots, ways| PoolConfig {
        shard_bytes,
        slots,
        ways,
        mode: PoolMode::Private,
        load_timeout: Duration::from_secs(1),
        dirty_timeout: Duration::from_secs(60),
    };
    assert!(ClockPool::open(cfg(1000, 4, 4)).is_err());
    assert!(ClockPool::open(cfg(4096, 6, 4)).is_err());
    assert!(ClockPool::open(cfg(4096, 0, 1)).is_err());
    let bad_name = PoolConfig {
        mode: PoolMode::Shared {
            instance: "../etc".into(),
        },
        ..cfg(4096, 4, 4)
    };
    assert!(ClockPool::open(bad_name).is_err());
}

fn shared(instance: &str, timeout: Duration) -> ClockPool {
    ClockPool::open(PoolConfig {
        shard_bytes: SLOT,
        slots: 64,
        ways: 8,
        mode: PoolMode::Shared {
            instance: instance.to_string(),
        },
        load_timeout: timeout,
        dirty_timeout: Duration::from_secs(60),
    })
    .unwrap()
}

/// Removes a test's shared-memory segment even when the test fails.
struct Unlink(std::path::PathBuf);

impl Drop for Unlink {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn instance(tag: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("test-{tag}-{}-{nanos}", std::process::id())
}

#[test]
fn a_shared_pool_is_attached_and_validated() {
    let name = instance("attach");
    let a = shared(&name, Duration::from_secs(1));
    let _cleanup = Unlink(a.shm_path().unwrap().to_path_buf());
    let b = shared(&name, Duration::from_secs(1));
    fill(&a, key(1), 0x5a);
    assert!(b.contains(&key(1)));
    match b.acquire(key(1)).unwrap().unwrap() {
        Acquire::Hit(r) => assert!(r.data().iter().all(|&x| x == 0x5a)),
        _ => panic!("the other handle must hit"),
    }
    use std::os::unix::fs::PermissionsExt;
    let path = a.shm_path().unwrap().to_path_buf();
    assert_eq!(
        std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
        0o600
    );
    // Another geometry is refused.
    let other = ClockPool::open(PoolConfig {
        shard_bytes: 8192,
        slots: 64,
        ways: 8,
        mode: PoolMode::Shared { instance: name },
        load_timeout: Duration::from_secs(1),
        dirty_timeout: Duration::from_secs(60),
    });
    assert!(other.is_err());
    a.unlink().unwrap();
    assert!(!path.exists());
}

#[test]
fn a_shared_pool_shares_its_speculative_share_and_refuses_another_format() {
    let name = instance("format");
    let a = shared(&name, Duration::from_secs(1));
    let path = a.shm_path().unwrap().to_path_buf();
    let _cleanup = Unlink(path.clone());
    let b = shared(&name, Duration::from_secs(1));
    assert_eq!(b.speculative_share(), 0.0);
    a.set_speculative_share(0.25);
    assert_eq!(b.speculative_share(), 0.25, "one share for every process");
    a.set_speculative_share(3.0);
    assert_eq!(b.speculative_share(), 1.0, "clamped");
    // A segment of another pool format (the version word follows the
    // 8-byte magic) is refused by name, not as another geometry.
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[8..12].copy_from_slice(&2u32.to_le_bytes());
    std::fs::write(&path, &bytes).unwrap();
    let other = ClockPool::open(PoolConfig {
        shard_bytes: SLOT,
        slots: 64,
        ways: 8,
        mode: PoolMode::Shared { instance: name },
        load_timeout: Duration::from_secs(1),
        dirty_timeout: Duration::from_secs(60),
    });
    match other {
        Err(StoreError::Config(ConfigError::PoolVersion {
            found: 2, wanted, ..
        })) => {
            assert!(wanted > 2)
        }
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("another format was attached"),
    }
}

/// Child process body for the multi-process tests (run with `--ignored`).
#[test]
#[ignore = "child process of the multi-process pool tests"]
fn pool_child() {
    let name = std::env::var("UCM_POOL_INSTANCE").expect("run by a parent test");
    let role = std::env::var("UCM_POOL_ROLE").unwrap();
    let pool = shared(&name, Duration::from_millis(300));
    let k = key(42);
    match pool.acquire(k).unwrap().expect("a slot") {
        Acquire::Load(mut g) => {
            if role == "stall" {
                println!("OWNER");
                std::thread::sleep(Duration::from_secs(60));
            }
            println!("LOAD");
            // The "disk read": slow enough for the others to queue up.
            std::thread::sleep(Duration::from_millis(300));
            g.data_mut().fill(42);
            let r = g.complete();
            assert!(r.data().iter().all(|&b| b == 42));
        }
        Acquire::Hit(r) => {
            assert!(
                r.data().iter().all(|&b| b == 42),
                "waited for and got the data"
            );
            println!("HIT");
        }
        Acquire::Failed(c) => panic!("failed {c}"),
    };
}

fn spawn_child(name: &str, role: &str) -> std::process::Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "pool_child",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("UCM_POOL_INSTANCE", name)
        .env("UCM_POOL_ROLE", role)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

fn outcome(child: std::process::Child) -> (bool, String) {
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    (out.status.success(), text)
}

#[test]
fn three_processes_share_one_pool_and_load_a_shard_once() {
    let name = instance("once");
    let creator = shared(&name, Duration::from_millis(300));
    let _cleanup = Unlink(creator.shm_path().unwrap().to_path_buf());
    let children: Vec<_> = (0..3).map(|_| spawn_child(&name, "normal")).collect();
    let results: Vec<_> = children.into_iter().map(outcome).collect();
    let loads = results.iter().filter(|(_, t)| t.contains("LOAD")).count();
    let hits = results.iter().filter(|(_, t)| t.contains("HIT")).count();
    assert!(results.iter().all(|(ok, _)| *ok), "{results:?}");
    assert_eq!((loads, hits), (1, 2), "{results:?}");
}

#[test]
fn waiters_recover_when_the_owner_is_killed_mid_load() {
    let name = instance("kill");
    let creator = shared(&name, Duration::from_millis(300));
    let _cleanup = Unlink(creator.shm_path().unwrap().to_path_buf());
    let mut owner = spawn_child(&name, "stall");
    // Wait until the child owns the load (the harness prints lines first).
    let mut reader = BufReader::new(owner.stdout.take().unwrap());
    let mut line = String::new();
    // libtest prints "test pool_child ... " before the child's own output.
    while !line.contains("OWNER") {
        line.clear();
        assert!(
            reader.read_line(&mut line).unwrap() > 0,
            "the owner child ended early"
        );
    }
    let waiters: Vec<_> = (0..2).map(|_| spawn_child(&name, "normal")).collect();
    std::thread::sleep(Duration::from_millis(100));
    let t = Instant::now();
    owner.kill().unwrap(); // SIGKILL mid-load; not reaped yet: a zombie
    let results: Vec<_> = waiters.into_iter().map(outcome).collect();
    owner.wait().unwrap();
    let took = t.elapsed();
    assert!(results.iter().all(|(ok, _)| *ok), "{results:?}");
    let loads = results.iter().filter(|(_, t)| t.contains("LOAD")).count();
    assert_eq!(
        loads, 1,
        "exactly one waiter took the load over: {results:?}"
    );
    assert!(took < Duration::from_secs(10), "recovered in {took:?}");
}

#[test]
fn a_dirty_slot_is_passed_over_until_clean_or_timed_out() {
    let make = |dirty_timeout| {
        ClockPool::open(PoolConfig {
            shard_bytes: SLOT,
            slots: 2,
            ways: 2,
            mode: PoolMode::Private,
            load_timeout: Duration::from_secs(1),
            dirty_timeout,
        })
        .unwrap()
    };
    for (timeout, a_survives) in [(Duration::from_secs(60), true), (Duration::ZERO, false)] {
        let pool = make(timeout);
        match pool.acquire(key(1)).unwrap().unwrap() {
            Acquire::Load(g) => g.complete().set_dirty(true),
            _ => panic!(),
        }
        fill(&pool, key(2), 2);
        // The hand is at slot 0 (key 1), both access bits set: a clean
        // CLOCK would take key 1 after the second chances.
        fill(&pool, key(3), 3);
        assert_eq!(pool.contains(&key(1)), a_survives, "timeout {timeout:?}");
    }
}

/// `contains` reads fingerprints, then only the matching slots' metadata:
/// it must still be exact. Every stored key of a full 256-way bucket is
/// found, no absent key is (thousands of them share fingerprints with
/// stored ones), and an evicted key is gone.
#[test]
fn contains_is_exact_through_the_fingerprints() {
    let pool = private(256, 256);
    let k = |i: u32| -> Key {
        let mut b = [0u8; 16];
        b[..4].copy_from_slice(&i.to_le_bytes());
        (b, i % 7)
    };
    for i in 0..256 {
        fill(&pool, k(i), i as u8);
    }
    for i in 0..256 {
        assert!(pool.contains(&k(i)), "stored key {i} not found");
    }
    // 20,000 absent keys: about 80 share each fingerprint byte value, so
    // every stored slot's fingerprint is matched many times.
    for i in 256..20_256 {
        assert!(!pool.contains(&k(i)), "absent key {i} found");
    }
    // One more key evicts one stored key (CLOCK), which is then absent.
    fill(&pool, k(99_999), 1);
    assert!(pool.contains(&k(99_999)));
    let gone = (0..256).filter(|&i| !pool.contains(&k(i))).count();
    assert_eq!(gone, 1);
}
