//! One forward pass outside the profile procedure, returning the logits: what correctness
//! checks (against an f64 reference, against the GPU, against PyTorch) compare.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use crate::device::{Device, DeviceSpec};
use crate::error::{Error, Result};
use crate::model::llama::{Batch, LlamaModel, LoadOptions};
use crate::model::{self, ModelSource};
use crate::ops;
use crate::quant::Quant;
use crate::runtime::Runtime;

/// Loads `source` on `device` with `quant` and returns the logits of the last token of each
/// sequence, row-major `[seqs, vocab]`.
pub fn logits(
    source: &ModelSource,
    quant: Quant,
    int8_threshold: f32,
    device: &DeviceSpec,
    batch: &Batch,
) -> Result<Vec<f32>> {
    let opened = model::open(source, 0)?;
    let dev = Device::open(device)?;
    let layout = dev.int8_tile_layout();
    let rt = Runtime::new(dev, Arc::new(AtomicBool::new(false)), None);
    let opts = LoadOptions {
        quant,
        int8_threshold,
        int8_layout: layout,
    };
    let model = LlamaModel::load(&rt, &opened.config, opened.source.as_ref(), &opts)?;
    let out = model.forward(&rt, batch)?;
    ops::read_f32(&rt, &out)?.ok_or_else(|| {
        Error::Request(format!(
            "device {device} runs dry: there are no logits to read"
        ))
    })
}
