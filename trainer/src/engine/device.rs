//! Where tensors live and in which precision: by default f32 on CPU and bf16 on CUDA
//! (DESIGN.md); `--precision f32|bf16` forces one (f32 on CUDA checks parity with the CPU at
//! equal precision).

use tch::{Device, Kind};

/// The device and parameter dtype of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    pub device: Device,
    pub kind: Kind,
}

/// What the user asked for on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceRequest {
    /// CUDA device 0 when available, else CPU.
    #[default]
    Auto,
    Cpu,
    Cuda(usize),
}

#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error(
        "CUDA device {0} requested, but libtorch sees {1} CUDA device(s); this build may be the CPU libtorch (see `cargo xtask setup --cuda`)"
    )]
    CudaUnavailable(usize, usize),
}

impl std::str::FromStr for DeviceRequest {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(DeviceRequest::Auto),
            "cpu" => Ok(DeviceRequest::Cpu),
            "cuda" => Ok(DeviceRequest::Cuda(0)),
            other => other
                .strip_prefix("cuda:")
                .and_then(|i| i.parse().ok())
                .map(DeviceRequest::Cuda)
                .ok_or_else(|| format!("unknown device {other:?} (expected auto, cpu, cuda or cuda:N)")),
        }
    }
}

impl std::fmt::Display for DeviceRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceRequest::Auto => f.write_str("auto"),
            DeviceRequest::Cpu => f.write_str("cpu"),
            DeviceRequest::Cuda(i) => write!(f, "cuda:{i}"),
        }
    }
}

impl serde::Serialize for DeviceRequest {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for DeviceRequest {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// The parameters' precision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// f32 on the CPU, bf16 on CUDA.
    #[default]
    Auto,
    F32,
    Bf16,
}

/// Resolve a request against the devices libtorch actually sees, in the default precision.
pub fn place(request: DeviceRequest) -> Result<Placement, DeviceError> {
    place_with(request, Precision::Auto)
}

/// Resolve a request and a precision.
pub fn place_with(request: DeviceRequest, precision: Precision) -> Result<Placement, DeviceError> {
    let mut p = place_auto(request)?;
    p.kind = match precision {
        Precision::Auto => p.kind,
        Precision::F32 => Kind::Float,
        Precision::Bf16 => Kind::BFloat16,
    };
    Ok(p)
}

fn place_auto(request: DeviceRequest) -> Result<Placement, DeviceError> {
    let cuda_count = if tch::Cuda::is_available() { tch::Cuda::device_count() as usize } else { 0 };
    let device = match request {
        DeviceRequest::Cpu => Device::Cpu,
        DeviceRequest::Auto if cuda_count > 0 => Device::Cuda(0),
        DeviceRequest::Auto => Device::Cpu,
        DeviceRequest::Cuda(i) if i < cuda_count => Device::Cuda(i),
        DeviceRequest::Cuda(i) => return Err(DeviceError::CudaUnavailable(i, cuda_count)),
    };
    let kind = if device.is_cuda() { Kind::BFloat16 } else { Kind::Float };
    Ok(Placement { device, kind })
}

/// libtorch's CPU thread pools (intra-op and inter-op), pinned to `threads` each, so that a run's
/// arithmetic (the order of its parallel reductions) does not depend on the machine's core
/// count: the same command gives the same per-step numbers on another machine. Call once, before
/// any tensor work (libtorch accepts the inter-op count only before its pool starts).
pub fn pin_threads(threads: std::num::NonZeroUsize) {
    let n = i32::try_from(threads.get()).unwrap_or(i32::MAX);
    tch::set_num_threads(n);
    tch::set_num_interop_threads(n);
}

/// What a run folder records of the machine it ran on (`machine.json`), so that a reader can tell
/// why two runs of one configuration differ.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct MachineRecord {
    /// `model name` of `/proc/cpuinfo` (empty where it cannot be read).
    pub cpu_model: String,
    pub logical_cpus: usize,
    pub intra_op_threads: i32,
    pub inter_op_threads: i32,
    pub cuda_devices: i64,
}

impl MachineRecord {
    pub fn current() -> Self {
        let cpu_model = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|t| {
                t.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split_once(':'))
                    .map(|(_, v)| v.trim().to_string())
            })
            .unwrap_or_default();
        Self {
            cpu_model,
            logical_cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
            intra_op_threads: tch::get_num_threads(),
            inter_op_threads: tch::get_num_interop_threads(),
            cuda_devices: if tch::Cuda::is_available() { tch::Cuda::device_count() } else { 0 },
        }
    }
}

#[cfg(test)]
mod machine_tests {
    use super::*;

    #[test]
    fn the_machine_record_names_the_cpu_and_the_thread_counts() {
        let m = MachineRecord::current();
        assert!(m.intra_op_threads >= 1 && m.inter_op_threads >= 1, "{m:?}");
        assert!(m.logical_cpus >= 1);
        if std::path::Path::new("/proc/cpuinfo").exists() {
            assert!(!m.cpu_model.is_empty(), "{m:?}");
        }
        let back: MachineRecord = serde_json::from_str(&serde_json::to_string(&m).unwrap()).unwrap();
        assert_eq!(back, m);
    }
}

/// Host<->device copies made through [`to_device`] and [`to_host`], counted per thread (the
/// engine runs on one tensor thread), so that a test can assert how many a decode step makes. On
/// the CPU they are copies within host memory and are counted the same way: the count is the one
/// an accelerator would see.
pub mod transfers {
    use std::cell::Cell;

    use tch::{Device, Tensor};

    thread_local! {
        static COUNT: Cell<u64> = const { Cell::new(0) };
    }

    /// Transfers this thread has made so far.
    pub fn count() -> u64 {
        COUNT.with(Cell::get)
    }

    fn tick() {
        COUNT.with(|c| c.set(c.get() + 1));
    }

    /// A host tensor copied to `device` (one transfer).
    pub fn to_device(host: &Tensor, device: Device) -> Tensor {
        tick();
        host.to_device(device)
    }

    /// A device tensor copied to the host (one transfer; it waits for the work that makes it).
    pub fn to_host(t: &Tensor) -> Tensor {
        tick();
        t.to_device(Device::Cpu)
    }
}
