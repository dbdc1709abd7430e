//! `ucm bench`: throughput measured against a baseline taken in the same
//! run, reported as ratios (never as absolute goals in timed tests).

pub mod device;
pub mod hash;
pub mod io;
pub mod layerwise;
pub mod remote;
pub mod store;
pub mod tiers;

/// The median of `v` (0 for an empty slice).
pub fn median(v: &[f64]) -> f64 {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if s.is_empty() {
        return 0.0;
    }
    s.sort_by(|a, b| a.total_cmp(b));
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

/// The largest finite value of `v` (0 for an empty slice).
pub fn best(v: &[f64]) -> f64 {
    v.iter()
        .copied()
        .filter(|x| x.is_finite())
        .fold(0.0, f64::max)
}

/// Bytes per second as GiB/s.
pub fn gib_s(bytes: u64, secs: f64) -> f64 {
    if secs <= 0.0 {
        return 0.0;
    }
    bytes as f64 / secs / (1u64 << 30) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_even_and_empty() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(&[]), 0.0);
        assert_eq!(best(&[1.0, 3.0, 2.0]), 3.0);
        assert_eq!(best(&[]), 0.0);
        assert_eq!(gib_s(1 << 30, 2.0), 0.5);
    }
}
