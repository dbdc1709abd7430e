//! Which device a store or a cache runs on, named as a string: `host`
//! (also `cpu`), `cuda[:N]`, `npu[:N]` (also `ascend[:N]`). One parser for
//! the command line and the foreign interfaces; which backends a build
//! carries is a separate question ([`DeviceSpec::built`]).

use std::fmt;
use std::str::FromStr;

/// A device by kind and ordinal.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeviceSpec {
    /// Host memory: the host device.
    Host,
    /// An NVIDIA GPU by ordinal (feature `cuda`).
    Cuda(u32),
    /// A Huawei Ascend NPU by ordinal (feature `ascend`).
    Npu(u32),
}

/// Why a device name is not one.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("device `{name}`: {why} (host, cpu, cuda[:N], npu[:N] or ascend[:N])")]
pub struct DeviceNameError {
    /// The name as given (cut to 64 characters).
    pub name: String,
    /// What is wrong with it.
    pub why: DeviceNameProblem,
}

/// What is wrong with a device name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DeviceNameProblem {
    /// A kind no backend has (perhaps a device this code does not know).
    #[error("unknown kind")]
    UnknownKind,
    /// The text after `:` is not a number.
    #[error("the ordinal is not a number")]
    BadOrdinal,
    /// The host with an ordinal other than 0.
    #[error("the host has only ordinal 0")]
    HostOrdinal,
}

impl FromStr for DeviceSpec {
    type Err = DeviceNameError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |why| DeviceNameError {
            name: s.chars().take(64).collect(),
            why,
        };
        let (kind, index) = match s.split_once(':') {
            Some((k, i)) => {
                let n = i
                    .parse::<u32>()
                    .map_err(|_| bad(DeviceNameProblem::BadOrdinal))?;
                (k, Some(n))
            }
            None => (s, None),
        };
        match (kind, index) {
            ("host" | "cpu", None | Some(0)) => Ok(DeviceSpec::Host),
            ("host" | "cpu", Some(_)) => Err(bad(DeviceNameProblem::HostOrdinal)),
            ("cuda", i) => Ok(DeviceSpec::Cuda(i.unwrap_or(0))),
            ("npu" | "ascend", i) => Ok(DeviceSpec::Npu(i.unwrap_or(0))),
            _ => Err(bad(DeviceNameProblem::UnknownKind)),
        }
    }
}

impl fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceSpec::Host => write!(f, "host"),
            DeviceSpec::Cuda(i) => write!(f, "cuda:{i}"),
            DeviceSpec::Npu(i) => write!(f, "npu:{i}"),
        }
    }
}

impl DeviceSpec {
    /// The ordinal (0 for the host).
    pub fn ordinal(self) -> u32 {
        match self {
            DeviceSpec::Host => 0,
            DeviceSpec::Cuda(i) | DeviceSpec::Npu(i) => i,
        }
    }

    /// Whether this build carries the device's backend (the host always;
    /// CUDA with feature `cuda`, Ascend with feature `ascend`). Whether a
    /// driver and a device are present is asked of the backend at open.
    pub fn built(self) -> bool {
        match self {
            DeviceSpec::Host => true,
            DeviceSpec::Cuda(_) => cfg!(feature = "cuda"),
            DeviceSpec::Npu(_) => cfg!(feature = "ascend"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_print_back() {
        for (s, d) in [
            ("host", DeviceSpec::Host),
            ("cpu", DeviceSpec::Host),
            ("cpu:0", DeviceSpec::Host),
            ("cuda", DeviceSpec::Cuda(0)),
            ("cuda:3", DeviceSpec::Cuda(3)),
            ("npu:1", DeviceSpec::Npu(1)),
            ("ascend", DeviceSpec::Npu(0)),
        ] {
            assert_eq!(s.parse::<DeviceSpec>(), Ok(d), "{s}");
            assert_eq!(d.to_string().parse::<DeviceSpec>(), Ok(d));
        }
        assert_eq!(DeviceSpec::Cuda(2).to_string(), "cuda:2");
        assert_eq!(DeviceSpec::Npu(5).ordinal(), 5);
        assert!(DeviceSpec::Host.built());
    }

    #[test]
    fn bad_names_say_why() {
        for (s, why) in [
            ("gpu", DeviceNameProblem::UnknownKind),
            ("cuda:x", DeviceNameProblem::BadOrdinal),
            ("cuda:-1", DeviceNameProblem::BadOrdinal),
            ("cpu:1", DeviceNameProblem::HostOrdinal),
            ("", DeviceNameProblem::UnknownKind),
        ] {
            let e = s.parse::<DeviceSpec>().unwrap_err();
            assert_eq!(e.why, why, "{s}");
            assert!(e.to_string().contains("cuda[:N]"), "{e}");
        }
        let long = "x".repeat(1000);
        assert_eq!(long.parse::<DeviceSpec>().unwrap_err().name.len(), 64);
    }
}
