//! Build script of ucm-device.
//!
//! With feature `ascend` it
//! 1. runs bindgen over ACL's runtime API: the real `acl/acl.h` when a CANN
//!    toolkit is found (`ASCEND_TOOLKIT_HOME`, `ASCEND_HOME_PATH`, or
//!    `/usr/local/Ascend/ascend-toolkit/latest`, each checked for its include
//!    directory), else the vendored `ascend/acl_vendored.h`. The output is a
//!    libloading-backed table (`dynamic_library_name`), so nothing links
//!    against libascendcl at build time. `UCM_ACL_VENDORED=1` forces the
//!    vendored header.
//! 2. builds the host-memory test double `libucm_acl_double.so` from
//!    `ascend/acl_double.c` and exports its path as `UCM_ACL_DOUBLE_PATH`.
//!
//! With feature `cuda` it builds the host-memory test double of the CUDA
//! driver, `libucm_cuda_double.so` (soname `libcuda.so`) from
//! `cuda/cuda_double.c`, and exports its path as `UCM_CUDA_DOUBLE_PATH`.
//!
//! A missing toolkit never fails the build.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    #[cfg(feature = "ascend")]
    ascend::build();
    #[cfg(feature = "cuda")]
    double::build(
        "cuda/cuda_double.c",
        "libucm_cuda_double.so",
        &["-Wl,-soname,libcuda.so"],
        "UCM_CUDA_DOUBLE_PATH",
    );
}

/// Builds a host-memory stand-in of a driver library as a shared library and
/// exports its path to the crate as `env` (empty when it cannot be built:
/// the double only serves tests, which then fail saying so).
#[cfg(any(feature = "cuda", feature = "ascend"))]
mod double {
    use std::env;
    use std::path::PathBuf;
    use std::process::Command;

    pub fn build(src: &str, name: &str, extra: &[&str], var: &str) {
        let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
        let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets it"));
        let src = manifest.join(src);
        println!("cargo:rerun-if-changed={}", src.display());
        let shared = manifest.join("doubles").join("stream_queue.h");
        println!("cargo:rerun-if-changed={}", shared.display());
        let so = out.join(name);
        let compiler = cc::Build::new().get_compiler();
        let include = src
            .parent()
            .map(|d| format!("-I{}", d.display()))
            .unwrap_or_default();
        let status = Command::new(compiler.path())
            .args(["-O2", "-shared", "-fPIC", "-Wall", "-o"])
            .arg(&so)
            .arg(&src)
            .arg(include)
            .args(extra)
            .args(["-lpthread", "-lm"])
            .output();
        match status {
            Ok(o) if o.status.success() => {
                println!("cargo:rustc-env={var}={}", so.display());
            }
            other => {
                let why = match other {
                    Ok(o) => String::from_utf8_lossy(&o.stderr).replace('\n', " "),
                    Err(e) => e.to_string(),
                };
                println!("cargo:warning=ucm-device: cannot build {name}: {why}");
                println!("cargo:rustc-env={var}=");
            }
        }
    }
}

#[cfg(feature = "ascend")]
mod ascend {
    use std::env;
    use std::path::{Path, PathBuf};

    /// The ACL functions the backend calls (all others are left out).
    const FUNCTIONS: &[&str] = &[
        "aclInit",
        "aclFinalize",
        "aclGetRecentErrMsg",
        "aclrtSetDevice",
        "aclrtResetDevice",
        "aclrtGetDeviceCount",
        "aclrtSynchronizeDevice",
        "aclrtMalloc",
        "aclrtFree",
        "aclrtMallocHost",
        "aclrtFreeHost",
        "aclrtHostRegister",
        "aclrtHostUnregister",
        "aclrtCreateStream",
        "aclrtCreateStreamWithConfig",
        "aclrtDestroyStream",
        "aclrtSynchronizeStream",
        "aclrtLaunchHostFunc",
        "aclrtCreateEvent",
        "aclrtDestroyEvent",
        "aclrtRecordEvent",
        "aclrtQueryEventStatus",
        "aclrtSynchronizeEvent",
        "aclrtStreamWaitEvent",
        "aclrtMemcpyAsync",
        "aclrtMemcpyBatchAsync",
    ];

    fn toolkit_include() -> Option<PathBuf> {
        if env::var("UCM_ACL_VENDORED").is_ok_and(|v| v == "1") {
            return None;
        }
        let roots = [
            env::var("ASCEND_TOOLKIT_HOME").ok(),
            env::var("ASCEND_HOME_PATH").ok(),
            Some("/usr/local/Ascend/ascend-toolkit/latest".to_string()),
        ];
        roots
            .into_iter()
            .flatten()
            .map(|r| Path::new(&r).join("include"))
            .find(|inc| inc.join("acl").join("acl.h").is_file())
    }

    pub fn build() {
        for var in [
            "ASCEND_TOOLKIT_HOME",
            "ASCEND_HOME_PATH",
            "UCM_ACL_VENDORED",
        ] {
            println!("cargo:rerun-if-env-changed={var}");
        }
        let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
        let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets it"));
        let vendored = manifest.join("ascend").join("acl_vendored.h");
        println!("cargo:rerun-if-changed={}", vendored.display());

        let mut builder = bindgen::Builder::default()
            .dynamic_library_name("AclLib")
            .dynamic_link_require_all(false)
            .prepend_enum_name(false)
            .layout_tests(false)
            .derive_default(true)
            .allowlist_type("aclrtMemcpyKind|aclrtMemMallocPolicy|aclrtEventRecordedStatus")
            .allowlist_type("aclrtHostRegisterType|aclrtMemcpyBatchAttr|aclrtMemLocation.*")
            .allowlist_type("aclrtHostFunc|aclrtStream|aclrtEvent|aclError")
            .allowlist_var("ACL_STREAM_FAST_LAUNCH|ACL_STREAM_FAST_SYNC");
        for f in FUNCTIONS {
            builder = builder.allowlist_function(f);
        }
        let source = match toolkit_include() {
            Some(inc) => {
                println!(
                    "cargo:warning=ucm-device: bindgen over the CANN toolkit in {}",
                    inc.display()
                );
                builder = builder
                    .header(inc.join("acl").join("acl.h").display().to_string())
                    .clang_arg(format!("-I{}", inc.display()));
                "toolkit"
            }
            None => {
                builder = builder.header(vendored.display().to_string());
                "vendored"
            }
        };
        println!("cargo:rustc-env=UCM_ACL_HEADER_SOURCE={source}");
        let bindings = builder
            .generate()
            .expect("bindgen over the ACL header failed (is libclang-dev installed?)");
        bindings
            .write_to_file(out.join("acl_sys.rs"))
            .expect("cannot write acl_sys.rs");

        super::double::build(
            "ascend/acl_double.c",
            "libucm_acl_double.so",
            &[],
            "UCM_ACL_DOUBLE_PATH",
        );
    }
}
