//! The device test body on a real Ascend NPU (feature `ascend`).
//!
//! Without libascendcl or an NPU it prints why it skips; with
//! `UCM_REQUIRE_NPU=1` it fails instead, so `scripts/npu-check.sh` cannot
//! pass by skipping.
#![cfg(feature = "ascend")]

use ucm_device::accel::ascend::{self, AscendDevice};
use ucm_device::conformance;

fn required() -> bool {
    std::env::var("UCM_REQUIRE_NPU").is_ok_and(|v| v == "1")
}

#[test]
fn device_test_body_on_a_real_npu() {
    let (available, reason) = ascend::probe();
    if !available {
        if required() {
            panic!("UCM_REQUIRE_NPU=1 but no NPU is usable: {reason}");
        }
        eprintln!("skipping the real-NPU test: {reason}");
        return;
    }
    let dev = AscendDevice::new(0).expect("open NPU 0");
    eprintln!(
        "running the device test body on NPU 0 through {}",
        dev.runtime().path().display()
    );
    conformance::run_all(&dev).unwrap();
    dev.set_batch_api(false);
    conformance::run_all(&dev).unwrap();
}
