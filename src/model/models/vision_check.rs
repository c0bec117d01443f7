//! What the vision families' checks share (tests/siglip_reference.rs,
//! tests/pixtral_reference.rs and the towers' unit tests): the seeded test images, a runtime on
//! a simulated device with a load's options, and one CPU run of a tower over the test images.

use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use crate::base::error::{Error, Result};
use crate::device::{Device, DeviceSpec};
use crate::engine::ops;
use crate::engine::runtime::Runtime;
use crate::engine::tensor::{DType, Tensor};
use crate::memory::Category;
use crate::model::config::ModelConfig;
use crate::model::loader::LoadOptions;
use crate::model::weights::WeightSource;
use crate::quant::Quant;

/// The test images of the reference scripts (`scripts/siglip_reference.py`,
/// `scripts/pixtral_reference.py`): image `n`, channel `c`, row `y`, column `x` holds
/// `sin(0.013 · ((c · S + y) · S + x) + 0.5 · n)`.
pub fn test_pixels(channels: usize, size: usize, images: usize) -> Vec<f32> {
    let per = channels * size * size;
    (0..images * per)
        .map(|i| (0.013 * (i % per) as f64 + 0.5 * (i / per) as f64).sin() as f32)
        .collect()
}

/// A preset's config, a runtime on a simulated H100 with a bf16 load's options, and the
/// preset opened as a weight source: what the towers' weight tests start from.
#[cfg(test)]
pub(crate) fn preset_on_h100(
    preset: &str,
) -> (ModelConfig, Runtime, LoadOptions, crate::model::OpenedModel) {
    let cfg = crate::model::presets::preset(preset).unwrap();
    let (rt, opts) = sim_runtime("sim:h100-sxm:dry", Quant::BF16).unwrap();
    let source = crate::model::ModelSource::parse(&format!("preset:{preset}")).unwrap();
    let src = crate::model::open(&source, 0).unwrap();
    (cfg, rt, opts, src)
}

/// A runtime on the simulated `device` and the options of a `quant` load on it (no int8
/// outliers, no attention scalars, the default Marlin kernel).
pub(crate) fn sim_runtime(device: &str, quant: Quant) -> Result<(Runtime, LoadOptions)> {
    let device = Device::open(&DeviceSpec::parse(device)?)?;
    let int8_layout = device.int8_tile_layout();
    let rt = Runtime::new(device, Arc::new(AtomicBool::new(false)), None);
    let opts = LoadOptions {
        quant,
        int8_threshold: 0.0,
        int8_layout,
        attn_scalars: 0,
        marlin: Default::default(),
    };
    Ok((rt, opts))
}

/// A family's tower loader: the tower and its activation dtype.
pub(crate) type LoadTower<V> =
    fn(&Runtime, &ModelConfig, &dyn WeightSource, &LoadOptions) -> Result<(V, DType)>;

/// How a family's tower runs over the test images: `shape` gives the config's image channels
/// and size (None: not this family's checkpoint, named `family`), `load` builds the tower and
/// its activation dtype, `encode` runs it over `[N, C, S, S]` pixels.
pub(crate) struct TestTower<'a, V> {
    pub family: &'a str,
    pub shape: fn(&ModelConfig) -> Option<(usize, usize)>,
    pub load: LoadTower<V>,
    pub encode: fn(&V, &Runtime, &Tensor, usize) -> Result<Tensor>,
}

/// The image embeddings of `images` test images through the tower and projector of the
/// checkpoint at `dir`, computed on the CPU (fp32) by the same load and ops a profile runs.
pub(crate) fn encode_test_images<V>(
    dir: &Path,
    images: usize,
    tower: &TestTower<'_, V>,
) -> Result<Vec<f32>> {
    let source = crate::model::ModelSource::Path {
        path: dir.to_path_buf(),
    };
    let opened = crate::model::open(&source, 0)?;
    let (channels, size) = (tower.shape)(&opened.config).ok_or_else(|| {
        Error::Request(format!(
            "{}: not a {} (multimodal) checkpoint",
            dir.display(),
            tower.family
        ))
    })?;
    let (rt, opts) = sim_runtime("sim:h100-80gb", Quant::F16)?;
    let (v, act) = (tower.load)(&rt, &opened.config, opened.source.as_ref(), &opts)?;
    let px = rt.tensor_with_values(
        "pixel_values",
        Category::Activation,
        &[images, channels, size, size],
        act,
        test_pixels(channels, size, images),
    )?;
    let out = (tower.encode)(&v, &rt, &px, images)?;
    ops::read_f32(&rt, &out)?
        .ok_or_else(|| Error::Request("the embeddings were not computed (a dry device)".into()))
}
