//! IBM Granite (3.0 to 3.3) as vLLM runs it (`model_executor/models/granite.py`: the same op
//! order in 0.6.4, 0.8.5 and 0.19): Llama's weights and attention, with the embedding scaled
//! by `embedding_multiplier` in place, every norm a plain RMSNorm into a new tensor (no fused
//! add-norm, no residual stream carried between layers), each branch multiplied by
//! `residual_multiplier` into a new tensor before its residual add, `attention_multiplier` as
//! the softmax scale (in `ModelConfig::score_mods`) and the logits scaled by
//! `1 / logits_scaling` (in the sampler's logits). The weights are held by `LlamaModel`.

use crate::base::error::{Error, Result};
use crate::engine::ops;
use crate::engine::ops_granite;
use crate::engine::runtime::Runtime;
use crate::engine::tensor::Tensor;
use crate::model::config::ModelConfig;
use crate::model::layers::attention;
use crate::model::layers::decoder::{enter_layer, DecoderRun};

/// `GraniteModel.forward` (granite.py L294-323 at 0.19) from the embedding on.
pub fn forward_layers(
    rt: &Runtime,
    run: &DecoderRun,
    cfg: &ModelConfig,
    mut hidden: Tensor,
) -> Result<Tensor> {
    let final_norm = run
        .final_norm
        .ok_or_else(|| crate::model::layers::pp::refused(&cfg.arch))?;
    let g = cfg.granite.as_ref().ok_or_else(|| {
        Error::Request(format!("model_type {}: no Granite multipliers", cfg.arch))
    })?;
    let (eps, m) = (run.eps, g.residual_multiplier as f32);
    // `hidden_states *= self.config.embedding_multiplier` (L307).
    ops_granite::scale_in_place(
        rt,
        &mut hidden,
        g.embedding_multiplier as f32,
        "embed.multiplier",
    )?;
    for (li, layer) in run.layers.iter().enumerate() {
        let l = enter_layer(rt, li, run.layers.len())?;
        // GraniteDecoderLayer.forward (L233-251): `residual = hidden_states` (the model's
        // loop holds it until the layer returns), the norm into a new tensor, attention;
        // the norm's output dies as the name is rebound to the attention's.
        let n1 = ops::rms_norm(
            rt,
            &hidden,
            &layer.input_norm,
            eps,
            &format!("{l}.input_norm"),
        )?;
        let o = attention::forward(rt, &layer.attn, &n1, &(run.attention)(li), &l)?;
        drop(n1);
        // `residual + hidden_states * residual_multiplier`: the product and the sum, new; the
        // attention's output dies as the name is rebound.
        let s1 =
            ops_granite::scaled_residual_add(rt, &hidden, &o, m, &format!("{l}.residual_attn"))?;
        drop(o);
        let n2 = ops::rms_norm(
            rt,
            &s1,
            &layer.post_norm,
            eps,
            &format!("{l}.post_attention_norm"),
        )?;
        // The MLP's input dies as the name is rebound to its output.
        let d = layer.mlp.forward(rt, n2, &run.dense, &run.moe, &l)?;
        let s2 = ops_granite::scaled_residual_add(rt, &s1, &d, m, &format!("{l}.residual_mlp"))?;
        drop(d);
        // The layer returns: its `residual` (the attention's sum) dies; the model's loop
        // rebinds its hidden states, and the layer's input dies.
        drop(s1);
        hidden = s2;
    }
    rt.set_layer(None);
    // `hidden_states = self.norm(hidden_states)`: a new tensor; the last output dies.
    let out = ops::rms_norm(rt, &hidden, final_norm, eps, "final.norm")?;
    drop(hidden);
    Ok(out)
}
