//! Gemma 1, 2 and 3's decoder as vLLM runs it (`model_executor/models/gemma.py`, 0.6.4 to
//! 0.21; `gemma2.py`, 0.6.4 and 0.8.5; `gemma3.py`, 0.8.5 on): the embedding scaled by √hidden,
//! GemmaRMSNorm (`x · (1 + w)`) into new tensors, four norms per layer (input,
//! post-attention, pre- and post-feedforward; Gemma 1 has the first two only),
//! GeGLU, the attention's `query_pre_attn_scalar` scale, soft-cap and sliding window (in
//! `ModelConfig::score_mods`), Gemma 3's per-head q/k norms and its second rotary cache. The
//! weights are held by `LlamaModel`, as both files hold the same parameters under the same names.

use crate::base::error::Result;
use crate::engine::ops_gemma;
use crate::engine::runtime::Runtime;
use crate::engine::tensor::{DType, Tensor};
use crate::model::config::ModelConfig;
use crate::model::layers::attention;
use crate::model::layers::decoder::{enter_layer, DecoderRun};

/// `Gemma2Model.forward` (gemma2.py L260-290 at 0.6.4) from the embedding on: the scaled
/// embedding, each `Gemma2DecoderLayer`, the final norm.
pub fn forward_layers(
    rt: &Runtime,
    run: &DecoderRun,
    cfg: &ModelConfig,
    act: DType,
    residual: Tensor,
    scale_new: Option<bool>,
) -> Result<Tensor> {
    let final_norm = run
        .final_norm
        .ok_or_else(|| crate::model::layers::pp::refused(&cfg.arch))?;
    let eps = run.eps;
    // `normalizer` is a tensor in the model dtype, so √hidden is rounded to it first.
    let factor = act.round((cfg.hidden_size as f32).sqrt());
    // `None`: the runner's `inputs_embeds`, which the model takes as they are.
    let mut residual = match scale_new {
        Some(new) => ops_gemma::scale_embedding(rt, residual, factor, !new)?,
        None => residual,
    };
    // The residual-sum outputs and the first layer's input (the embedding, held by the
    // model's loop while layer 0 runs).
    let mut prev_residual: Option<Tensor> = None;
    let mut hidden: Option<Tensor> = None;
    for (li, layer) in run.layers.iter().enumerate() {
        let l = enter_layer(rt, li, run.layers.len())?;
        // Gemma2DecoderLayer.forward (gemma2.py L223-241 at 0.6.4): GemmaRMSNorm returns new
        // tensors (the residual sum too); the caller's hidden states and residual live until
        // the layer returns.
        let mut prev_hidden = None;
        let layer_in = match hidden.take() {
            None => ops_gemma::rms_norm(
                rt,
                &residual,
                &layer.input_norm,
                eps,
                &format!("{l}.input_norm"),
            )?,
            Some(h) => {
                let (out, sum) = ops_gemma::add_rms_norm(
                    rt,
                    &h,
                    &residual,
                    &layer.input_norm,
                    eps,
                    &format!("{l}.input_norm"),
                )?;
                prev_hidden = Some(h);
                prev_residual = Some(std::mem::replace(&mut residual, sum));
                out
            }
        };
        let o = attention::forward(rt, &layer.attn, &layer_in, &(run.attention)(li), &l)?;
        // The normalised input is the layer's own new tensor: it dies here.
        drop(layer_in);
        let out = match &layer.ff_norms {
            Some((pre_ff, post_ff)) => {
                // post_attention_layernorm on the attention output (a new tensor; o_proj's
                // output dies), then pre_feedforward_layernorm with the residual: two new
                // tensors, the post-attention output and the old residual sum dying (layer 0's
                // residual, the embedding, is still held by the model's loop).
                let post = ops_gemma::rms_norm(
                    rt,
                    &o,
                    &layer.post_norm,
                    eps,
                    &format!("{l}.post_attention_norm"),
                )?;
                drop(o);
                let (x, sum) = ops_gemma::add_rms_norm(
                    rt,
                    &post,
                    &residual,
                    pre_ff,
                    eps,
                    &format!("{l}.pre_feedforward_norm"),
                )?;
                drop(post);
                let old = std::mem::replace(&mut residual, sum);
                if li == 0 {
                    prev_residual = Some(old);
                } else {
                    drop(old);
                }
                let down = layer.mlp.forward(rt, x, &run.dense, &run.moe, &l)?;
                // post_feedforward_layernorm: a new tensor; down_proj's output dies.
                let out = ops_gemma::rms_norm(
                    rt,
                    &down,
                    post_ff,
                    eps,
                    &format!("{l}.post_feedforward_norm"),
                )?;
                drop(down);
                out
            }
            None => {
                // Gemma 1 (GemmaDecoderLayer.forward, gemma.py L238-258 at 0.19):
                // post_attention_layernorm is the add-norm itself, two new tensors; the unpack
                // stores the output (o_proj's dies), then the residual (the input norm's sum
                // dies; layer 0's residual, the embedding, is still held by the model's loop).
                let (x, sum) = ops_gemma::add_rms_norm(
                    rt,
                    &o,
                    &residual,
                    &layer.post_norm,
                    eps,
                    &format!("{l}.post_attention_norm"),
                )?;
                drop(o);
                let old = std::mem::replace(&mut residual, sum);
                if li == 0 {
                    prev_residual = Some(old);
                } else {
                    drop(old);
                }
                layer.mlp.forward(rt, x, &run.dense, &run.moe, &l)?
            }
        };
        // The model's loop rebinds its hidden states and residual: the previous layer's
        // output and residual sum (layer 0: the embedding) die.
        drop(prev_hidden.take());
        drop(prev_residual.take());
        hidden = Some(out);
    }
    rt.set_layer(None);
    // `hidden_states, _ = self.norm(hidden_states, residual)`: two new tensors; the last
    // layer's output dies as the name is rebound, the residual and the sum (`_`) when the
    // model returns.
    let out = match hidden {
        None => ops_gemma::rms_norm(rt, &residual, final_norm, eps, "final.norm")?,
        Some(h) => {
            let (out, sum) =
                ops_gemma::add_rms_norm(rt, &h, &residual, final_norm, eps, "final.norm")?;
            drop(h);
            drop(residual);
            drop(sum);
            return Ok(out);
        }
    };
    drop(residual);
    Ok(out)
}
