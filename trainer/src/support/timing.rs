//! Timing helpers shared by the bench and the budget: a device sync, a synchronised wall-clock
//! measurement, a median.

use std::time::Instant;

use tch::Device;

/// Wait for the device to finish what was queued (a no-op on the CPU).
pub fn sync(device: Device) {
    if let Device::Cuda(i) = device {
        tch::Cuda::synchronize(i as i64);
    }
}

/// Seconds of one synchronised run of `f`.
pub fn seconds(device: Device, f: &mut dyn FnMut()) -> f64 {
    sync(device);
    let t = Instant::now();
    f();
    sync(device);
    t.elapsed().as_secs_f64()
}

/// The median (the upper middle of an even count); NaN when empty.
pub fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(|a, b| a.total_cmp(b));
    xs.get(xs.len() / 2).copied().unwrap_or(f64::NAN)
}
