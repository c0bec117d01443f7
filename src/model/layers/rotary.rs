//! Rotary embeddings as vLLM builds them (`model_executor/layers/rotary_embedding.py`): the
//! `cos_sin_cache` made on the device when the model is built, one per distinct base and
//! scaling (`get_rope` caches them).

use crate::base::error::Result;
use crate::engine::runtime::Runtime;
use crate::engine::tensor::{DType, Tensor};
use crate::memory::Category;
use crate::model::config::ModelConfig;

/// vLLM's `RotaryEmbedding._compute_cos_sin_cache` then `.to(dtype)` (rotary_embedding.py at
/// 380e1863), run on the device as the model is built: inv_freq (arange, divide, power,
/// reciprocal), t, the outer product, cos, sin, their concatenation in f32, then the cast; the
/// f32 intermediates die, the cast stays.
///
/// With linear scaling (Gemma 3's global layers) the cache has `max_position · factor` rows
/// (`LinearScalingRotaryEmbedding._compute_cos_sin_cache`, rotary_embedding.py L404-430 at
/// 0.8.5: `t = arange(max_len) / factor`); the `t / factor` and the `torch.cat` of its one-entry
/// list are modelled as the plain cache's steps.
pub fn rotary_cache(
    rt: &Runtime,
    cfg: &ModelConfig,
    act: DType,
    (_theta, factor): (f64, f64),
) -> Result<Tensor> {
    // A scaled embedding's own length: `max_position · factor` (linear, dynamic), YaRN's
    // `original · factor`, Llama 3's `max_position` (`RopeScaling::cache_rows`).
    let rows = match &cfg.rope_scaling {
        Some(r) => r.cache_rows(cfg.max_position_embeddings.max(1)),
        None => (cfg.max_position_embeddings.max(1) as f64 * factor.max(1.0)) as usize,
    };
    // `rotary_dim` columns: the head size but for Phi's partial rotary (base.py L83-92 at 0.19).
    rotary_cache_sized(rt, rows, cfg.rotary_dim(), act)
}

/// `rotary_cache`'s steps for a cache of `pos` positions and `rot` columns: also DeepSeek's
/// (`DeepseekScalingRotaryEmbedding._compute_cos_sin_cache`, deepseek_scaling_rope.py
/// L103-114 at 0.19: `original_max_position · factor` rows of `qk_rope_head_dim`, cos and sin
/// times mscale, which is 1 for every published model, modelled as the plain cache's steps).
pub fn rotary_cache_sized(rt: &Runtime, pos: usize, rot: usize, act: DType) -> Result<Tensor> {
    rt.set_op("rotary_emb.cos_sin_cache");
    let t32 = |name: &str, shape: &[usize]| {
        rt.tensor(
            format!("rotary_emb.{name}"),
            Category::Weight,
            shape,
            DType::F32,
        )
    };
    let inv_freq = {
        let a = t32("arange", &[rot / 2])?;
        let b = t32("arange_div", &[rot / 2])?;
        drop(a);
        let c = t32("pow", &[rot / 2])?;
        drop(b);
        let inv = t32("inv_freq", &[rot / 2])?;
        drop(c);
        inv
    };
    let t = t32("t", &[pos])?;
    let freqs = t32("freqs", &[pos, rot / 2])?;
    let cos = t32("cos", &[pos, rot / 2])?;
    let sin = t32("sin", &[pos, rot / 2])?;
    let cache32 = t32("cache_f32", &[pos, rot])?;
    drop((inv_freq, t, freqs, cos, sin));
    let cache = rt.tensor(
        "rotary_emb.cos_sin_cache",
        Category::Weight,
        &[pos, rot],
        act,
    )?;
    drop(cache32);
    rt.set_op("load");
    Ok(cache)
}
