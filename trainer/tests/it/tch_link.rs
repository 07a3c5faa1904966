//! tch links against the cached libtorch 2.11.0 and computes correctly: tensor arithmetic checked
//! against values computed here in plain Rust, and AdamW fitting a small regression.

use grove_trainer::engine::device::{DeviceRequest, place};
use tch::nn::{self, Module, OptimizerConfig};
use tch::{Device, Kind, Tensor};

#[test]
fn matmul_and_softmax_match_plain_rust() {
    let a: Vec<f32> = (0..12).map(|i| (i as f32 * 0.37).sin()).collect();
    let b: Vec<f32> = (0..20).map(|i| (i as f32 * 0.11).cos()).collect();
    let ta = Tensor::from_slice(&a).reshape([3, 4]);
    let tb = Tensor::from_slice(&b).reshape([4, 5]);
    let tc = ta.matmul(&tb);
    let got: Vec<f32> = Vec::<f32>::try_from(tc.flatten(0, -1)).unwrap();
    for i in 0..3 {
        for j in 0..5 {
            let want: f32 = (0..4).map(|k| a[i * 4 + k] * b[k * 5 + j]).sum();
            assert!((got[i * 5 + j] - want).abs() < 1e-5, "c[{i}][{j}] = {} != {want}", got[i * 5 + j]);
        }
    }
    // log_softmax over a row, against the textbook formula in f64.
    let row = [1.0f64, 2.0, 3.0, -4.0];
    let ls: Vec<f64> = Vec::<f64>::try_from(Tensor::from_slice(&row).log_softmax(0, Kind::Double)).unwrap();
    let lse = row.iter().map(|x| x.exp()).sum::<f64>().ln();
    for (x, y) in row.iter().zip(&ls) {
        assert!((x - lse - y).abs() < 1e-12);
    }
}

#[test]
fn adamw_fits_a_linear_regression() {
    let guard = crate::common::TORCH_RNG.lock().unwrap_or_else(|e| e.into_inner());
    tch::manual_seed(0);
    let vs = nn::VarStore::new(Device::Cpu);
    let model = nn::linear(vs.root() / "fc", 3, 1, Default::default());
    // y = 2 x0 - 3 x1 + 0.5 x2 + 1, noiseless.
    let x = Tensor::randn([256, 3], (Kind::Float, Device::Cpu));
    drop(guard);
    let w = Tensor::from_slice(&[2.0f32, -3.0, 0.5]).reshape([3, 1]);
    let y = x.matmul(&w) + 1.0;
    let mut opt = nn::AdamW { wd: 0.0, ..Default::default() }.build(&vs, 0.05).unwrap();
    let initial = model.forward(&x).mse_loss(&y, tch::Reduction::Mean).double_value(&[]);
    let mut last = initial;
    for _ in 0..300 {
        let loss = model.forward(&x).mse_loss(&y, tch::Reduction::Mean);
        opt.backward_step(&loss);
        last = loss.double_value(&[]);
    }
    assert!(initial > 1.0, "initial loss {initial}");
    assert!(last < 1e-3, "loss {initial} -> {last}");
    let fitted: Vec<f32> = Vec::<f32>::try_from(model.ws.flatten(0, -1)).unwrap();
    for (got, want) in fitted.iter().zip([2.0f32, -3.0, 0.5]) {
        assert!((got - want).abs() < 0.05, "{fitted:?}");
    }
}

#[test]
fn device_placement_on_this_machine() {
    let cpu = place(DeviceRequest::Cpu).unwrap();
    assert_eq!((cpu.device, cpu.kind), (Device::Cpu, Kind::Float));
    let auto = place(DeviceRequest::Auto).unwrap();
    if tch::Cuda::is_available() {
        assert_eq!(auto.kind, Kind::BFloat16);
    } else {
        assert_eq!(auto.device, Device::Cpu);
        assert!(place(DeviceRequest::Cuda(0)).is_err());
    }
    assert_eq!("cuda:1".parse::<DeviceRequest>(), Ok(DeviceRequest::Cuda(1)));
    assert!("gpu".parse::<DeviceRequest>().is_err());
}
