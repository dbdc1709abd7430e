//! One device handle for every surface: opened from a device's name
//! ([`DeviceSpec`]: `host`, `cuda:N`, `npu:N`), it is what the command
//! line, the benches, the replay and the foreign interfaces run on. Code
//! generic over [`Device`] runs on whichever device a handle holds through
//! [`DeviceHandle::visit`]; a backend this build does not carry is a clear
//! [`DeviceError::Unsupported`] at open, never a missing code path later.

use std::sync::Arc;

use super::host::HostDevice;
use super::spec::DeviceSpec;
use super::Device;
#[cfg(not(all(feature = "cuda", feature = "ascend")))]
use crate::error::DeviceError;
use crate::error::Result;

/// An opened device.
#[derive(Clone)]
pub enum DeviceHandle {
    /// The host device.
    Host(Arc<HostDevice>),
    /// An NVIDIA GPU and its ordinal.
    #[cfg(feature = "cuda")]
    Cuda(Arc<super::cuda::CudaDevice>, u32),
    /// A Huawei Ascend NPU and its ordinal.
    #[cfg(feature = "ascend")]
    Npu(Arc<super::ascend::AscendDevice>, u32),
}

/// Code generic over the device, run by [`DeviceHandle::visit`] on the
/// device a handle holds (a closure cannot be generic; a visitor can).
pub trait DeviceVisitor {
    /// What the code returns.
    type Output;
    /// Runs on `dev`.
    fn visit<D: Device>(self, dev: &Arc<D>) -> Self::Output;
}

impl DeviceHandle {
    /// Opens the device `spec` names. A backend this build lacks (feature
    /// `cuda` or `ascend` off) is [`DeviceError::Unsupported`]; a missing
    /// driver or device is the backend's own error.
    pub fn open(spec: DeviceSpec) -> Result<DeviceHandle> {
        match spec {
            DeviceSpec::Host => Ok(DeviceHandle::Host(Arc::new(HostDevice::new()))),
            #[cfg(feature = "cuda")]
            DeviceSpec::Cuda(i) => Ok(DeviceHandle::Cuda(
                Arc::new(super::cuda::CudaDevice::new(i as usize)?),
                i,
            )),
            #[cfg(not(feature = "cuda"))]
            DeviceSpec::Cuda(_) => Err(DeviceError::Unsupported {
                backend: "cuda",
                reason: "this build has no `cuda` feature".into(),
            }),
            #[cfg(feature = "ascend")]
            DeviceSpec::Npu(i) => {
                let ordinal = i32::try_from(i).map_err(|_| {
                    crate::error::DeviceError::InvalidArgument(format!("npu ordinal {i}"))
                })?;
                Ok(DeviceHandle::Npu(
                    Arc::new(super::ascend::AscendDevice::new(ordinal)?),
                    i,
                ))
            }
            #[cfg(not(feature = "ascend"))]
            DeviceSpec::Npu(_) => Err(DeviceError::Unsupported {
                backend: "ascend",
                reason: "this build has no `ascend` feature".into(),
            }),
        }
    }

    /// The device's name.
    pub fn spec(&self) -> DeviceSpec {
        match self {
            DeviceHandle::Host(_) => DeviceSpec::Host,
            #[cfg(feature = "cuda")]
            DeviceHandle::Cuda(_, i) => DeviceSpec::Cuda(*i),
            #[cfg(feature = "ascend")]
            DeviceHandle::Npu(_, i) => DeviceSpec::Npu(*i),
        }
    }

    /// Runs `v` on the device this handle holds.
    pub fn visit<V: DeviceVisitor>(&self, v: V) -> V::Output {
        match self {
            DeviceHandle::Host(d) => v.visit(d),
            #[cfg(feature = "cuda")]
            DeviceHandle::Cuda(d, _) => v.visit(d),
            #[cfg(feature = "ascend")]
            DeviceHandle::Npu(d, _) => v.visit(d),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Name;
    impl DeviceVisitor for Name {
        type Output = &'static str;
        fn visit<D: Device>(self, dev: &Arc<D>) -> &'static str {
            dev.name()
        }
    }

    #[test]
    fn the_host_opens_and_runs_generic_code() {
        let h = DeviceHandle::open("host".parse().unwrap()).unwrap();
        assert_eq!(h.spec(), DeviceSpec::Host);
        assert_eq!(h.visit(Name), HostDevice::new().name());
    }

    #[test]
    fn a_backend_this_build_lacks_is_unsupported_at_open() {
        #[cfg(not(feature = "cuda"))]
        assert!(matches!(
            DeviceHandle::open(DeviceSpec::Cuda(0)),
            Err(DeviceError::Unsupported {
                backend: "cuda",
                ..
            })
        ));
        #[cfg(not(feature = "ascend"))]
        assert!(matches!(
            DeviceHandle::open(DeviceSpec::Npu(0)),
            Err(DeviceError::Unsupported {
                backend: "ascend",
                ..
            })
        ));
    }
}
