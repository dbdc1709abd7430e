//! The store's readers of files it finds on disk (block headers and the
//! geometry marker) take arbitrary bytes without panicking: a block file of
//! any content is a miss or an error, never data unless it is a block the
//! store wrote; a marker of any content is accepted only when it is the
//! store's own. `UCM_FUZZ_CASES` sets the case count (default 256).

use std::fs;
use std::sync::Arc;

use proptest::prelude::*;
use ucm_device::{IoEngine, IoEngineConfig, IoEngineKind};
use ucm_store::{DiskConfig, DiskTier, Geometry};

const GEO: Geometry = Geometry {
    shard_bytes: 4096,
    shards_per_block: 2,
};

fn cases() -> u32 {
    std::env::var("UCM_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256)
}

fn engine() -> Arc<dyn IoEngine> {
    Arc::from(IoEngineConfig::new(IoEngineKind::Posix).build().unwrap())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    #[test]
    fn any_block_file_is_a_miss_or_an_error(
        head in proptest::collection::vec(any::<u8>(), 0..128),
        fill in any::<u8>(),
        full in any::<bool>(),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let t = DiskTier::open(DiskConfig::new(dir.path(), GEO, 100), engine()).unwrap();
        let id = [7u8; 16];
        let p = t.path_of(&id);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        let len = if full { t.file_bytes() as usize } else { head.len() };
        let mut bytes = vec![fill; len];
        bytes[..head.len().min(len)].copy_from_slice(&head[..head.len().min(len)]);
        fs::write(&p, &bytes).unwrap();
        prop_assert_eq!(t.exists(&id), full);
        let r = t.read_shards(&id, &[0, 1]);
        prop_assert!(!matches!(r, Ok(Some(_))), "random bytes served as a block");
    }

    #[test]
    fn any_marker_is_refused_unless_it_is_ours(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("GEOMETRY"), &bytes).unwrap();
        let ours = String::from_utf8_lossy(&bytes).trim() == GEO.describe();
        let r = DiskTier::open(DiskConfig::new(dir.path(), GEO, 100), engine());
        prop_assert_eq!(r.is_ok(), ours);
    }
}
