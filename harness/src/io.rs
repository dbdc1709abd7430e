//! The engine side's own copies into and out of its tensors: one stream
//! and one pinned staging buffer per worker, batched (one scatter-gather
//! copy per unit), so that poisoning, checking and "computing" thousands
//! of blocks per request costs a few copies, not a stream per block.

use ucm_device::{CopyRun, Device, Memory};

/// A worker's copy helper.
pub struct EngineIo<D: Device> {
    stream: D::Stream,
    staging: Option<Memory>,
}

impl<D: Device> EngineIo<D> {
    /// A helper with its own stream.
    pub fn new(dev: &D) -> ucm_device::Result<Self> {
        Ok(EngineIo {
            stream: dev.create_stream()?,
            staging: None,
        })
    }

    fn staging(&mut self, dev: &D, len: usize) -> ucm_device::Result<Memory> {
        match &self.staging {
            Some(m) if m.len() >= len => Ok(m.clone()),
            _ => {
                let m = dev.alloc_pinned(len.max(1).next_power_of_two())?;
                self.staging = Some(m.clone());
                Ok(m)
            }
        }
    }

    /// Writes `bytes` at each offset of `at` in `mem` (one batch).
    pub fn write_each(
        &mut self,
        dev: &D,
        mem: &Memory,
        at: &[usize],
        bytes: impl Fn(usize) -> Vec<u8>,
    ) -> ucm_device::Result<()> {
        if at.is_empty() {
            return Ok(());
        }
        let chunks: Vec<Vec<u8>> = (0..at.len()).map(bytes).collect();
        let total: usize = chunks.iter().map(Vec::len).sum();
        let h = self.staging(dev, total)?;
        let mut off = 0;
        let mut runs = Vec::with_capacity(at.len());
        for (c, &dst) in chunks.iter().zip(at) {
            h.write_host(off, c)?;
            runs.push(CopyRun::new(mem, dst, &h, off, c.len()));
            off += c.len();
        }
        dev.copy_batch_async(&self.stream, &runs)?;
        dev.synchronize_stream(&self.stream)
    }

    /// Reads `len` bytes at each offset of `at` in `mem` (one batch).
    pub fn read_each(
        &mut self,
        dev: &D,
        mem: &Memory,
        at: &[usize],
        len: usize,
    ) -> ucm_device::Result<Vec<Vec<u8>>> {
        if at.is_empty() {
            return Ok(Vec::new());
        }
        let h = self.staging(dev, len * at.len())?;
        let runs: Vec<CopyRun<'_>> = at
            .iter()
            .enumerate()
            .map(|(i, &src)| CopyRun::new(&h, i * len, mem, src, len))
            .collect();
        dev.copy_batch_async(&self.stream, &runs)?;
        dev.synchronize_stream(&self.stream)?;
        let mut out = Vec::with_capacity(at.len());
        for i in 0..at.len() {
            let mut v = vec![0u8; len];
            h.read_host(i * len, &mut v)?;
            out.push(v);
        }
        Ok(out)
    }
}
