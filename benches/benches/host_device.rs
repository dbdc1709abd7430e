//! Criterion bench: a scatter of 64 KiB runs through `HostDevice` against
//! one contiguous copy of the same bytes on the same device (the baseline,
//! measured in the same run).

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use ucm_device::{CopyRun, Device, HostDevice};

fn scatter_vs_contiguous(c: &mut Criterion) {
    let dev = HostDevice::new();
    let run = 64 << 10;
    let runs = 256;
    let total = run * runs;
    let host = dev.alloc_pinned(total).expect("pinned");
    let dmem = dev.alloc_device(total * 2).expect("device");
    let s = dev.create_stream().expect("stream");
    let mut g = c.benchmark_group("host_device_h2d_16MiB");
    g.throughput(Throughput::Bytes(total as u64));
    g.bench_function("contiguous", |b| {
        b.iter(|| {
            dev.copy_async(&s, &CopyRun::new(&dmem, 0, &host, 0, total))
                .expect("copy");
            dev.synchronize_stream(&s).expect("sync");
        })
    });
    let scatter: Vec<CopyRun<'_>> = (0..runs)
        .map(|i| CopyRun::new(&dmem, ((i * 97) % runs) * 2 * run, &host, i * run, run))
        .collect();
    g.bench_function("scatter_64KiB_runs", |b| {
        b.iter(|| {
            dev.copy_batch_async(&s, &scatter).expect("scatter");
            dev.synchronize_stream(&s).expect("sync");
        })
    });
    g.finish();
}

criterion_group!(benches, scatter_vs_contiguous);
criterion_main!(benches);
