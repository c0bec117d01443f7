//! Phi (`model_type: phi`: microsoft/phi-1_5, phi-2) as vLLM runs it
//! (`vllm/model_executor/models/phi.py`, op-identical in 0.6.4, 0.8.5 and 0.19): the token
//! embedding with no scaling and no residual stream, then layers of one `nn.LayerNorm` whose
//! output feeds attention and the MLP one after the other, summed with the layer's input in
//! two new tensors; q, k, v, dense, fc1 and fc2 with biases; rotary on the first
//! `rotary_dim` dimensions of each head; `gelu_new`; a final LayerNorm; an lm_head with a bias.
//! Every intermediate is allocated through the framework allocator and dropped where Python
//! drops it in phi.py (a local lives until its function returns or it is rebound).

use std::cell::Cell;

use crate::base::error::{Error, Result};
use crate::engine::runtime::Runtime;
use crate::engine::tensor::{DType, Tensor};
use crate::engine::{ops, ops_opt, ops_phi, ops_tp};
use crate::model::batch::Batch;
use crate::model::config::{ModelConfig, PhiShape};
use crate::model::layers::linear::BiasedLinear;
use crate::model::layers::norm::LayerNorm;
use crate::model::layers::rotary::rotary_cache;
use crate::model::layers::tp::TpShard;
use crate::model::loader::{LoadOptions, LoadStats, Loader};
use crate::model::weights::WeightSource;
use crate::quant::{FusedLinear, Quant};

/// `PhiLayer` (phi.py L173-203 at 0.19) with `PhiAttention` and `PhiMLP`.
pub struct PhiLayer {
    pub input_layernorm: LayerNorm,
    /// `QKVParallelLinear` (L92-98): q, k and v stacked, one bias `[3·hidden / tp]`.
    pub qkv: FusedLinear,
    pub qkv_bias: Tensor,
    pub dense: BiasedLinear,
    pub fc1: BiasedLinear,
    pub fc2: BiasedLinear,
}

impl PhiLayer {
    pub fn weight_bytes(&self) -> u64 {
        self.input_layernorm.bytes()
            + self.qkv.weight_bytes()
            + self.qkv_bias.nbytes()
            + [&self.dense, &self.fc1, &self.fc2]
                .iter()
                .map(|l| l.weight_bytes())
                .sum::<u64>()
    }
}

pub struct PhiModel {
    pub cfg: ModelConfig,
    /// The shape this rank computes (heads and the MLP width divided over the
    /// tensor-parallel ranks; `cfg` itself with one GPU).
    pub local: ModelConfig,
    /// This rank's first row of the padded vocabulary (0 with one GPU).
    pub vocab_first_row: usize,
    pub shape: PhiShape,
    pub quant: Quant,
    pub act: DType,
    /// `[Vp / tp, hidden]`
    pub embed: Tensor,
    pub layers: Vec<PhiLayer>,
    /// `cos_sin_cache [max_position_embeddings, rotary_dim]`, made with layer 0's attention.
    pub rope_cache: Tensor,
    pub final_layernorm: LayerNorm,
    /// `ParallelLMHead(bias=True)`: `[Vp / tp, hidden]` and `[Vp / tp]`.
    pub lm_head: Tensor,
    pub lm_head_bias: Tensor,
    /// Every attention layer's 0-dim f32 scale tensors (`LoadOptions::attn_scalars` each).
    pub attn_scalars: Vec<Tensor>,
    pub load_stats: LoadStats,
    /// vLLM V1's profile run: attention returns zeros without running.
    pub skip_attention: Cell<bool>,
    generation: Cell<u32>,
}

impl PhiModel {
    /// Loads every weight through the framework allocator in the order vLLM's constructors
    /// make them: the embedding; per layer `input_layernorm`, `qkv_proj`, `dense`, the rotary
    /// cache (layer 0; `get_rope` shares it), the attention layer's scalars, `fc1`, `fc2`
    /// (L87-117, L146-164, L176-187); `final_layernorm` (L225-227); the lm_head and its bias
    /// (L326-332). 16-bit weights only.
    pub fn load(
        rt: &Runtime,
        cfg: &ModelConfig,
        src: &dyn WeightSource,
        opts: &LoadOptions,
    ) -> Result<Self> {
        let shape = cfg.phi.clone().ok_or_else(|| {
            Error::Request(format!(
                "model_type '{}' is not phi; load it with its own model file",
                cfg.arch
            ))
        })?;
        opts.require_16bit(
            src,
            "phi",
            "its quantized linear layers (with biases) are not modelled yet",
        )?;
        let started = std::time::Instant::now();
        // vLLM's phi is tensor parallel as its Llama (QKVParallelLinear, RowParallelLinear
        // dense and fc2, ColumnParallelLinear fc1, vocab-parallel embedding and lm_head);
        // the LayerNorms are whole.
        let shard = TpShard::of(rt, cfg)?;
        let local = shard.local_config(cfg);
        let mut ld = Loader::new(rt, src, opts, cfg.tensor_shapes().len());
        let act = ld.act;
        rt.set_op("load");
        rt.set_layer(None);
        let (h, f, v, vp) = (
            cfg.hidden_size,
            cfg.intermediate_size,
            cfg.vocab_size,
            cfg.padded_vocab(),
        );
        let (v_first, v_len) = shard.vocab_rows(vp);
        let embed = ld.vocab_shard("model.embed_tokens.weight", v, h, vp, v_first, v_len)?;
        let norm = |ld: &mut Loader, name: &str| -> Result<LayerNorm> {
            Ok(LayerNorm {
                w: ld.dense(&format!("{name}.weight"), &[h])?,
                b: ld.dense(&format!("{name}.bias"), &[h])?,
            })
        };
        let (q_first, q_len) = shard.q_rows(cfg);
        let (f_first, f_len) = shard.mlp_rows(cfg);
        let mut layers = Vec::with_capacity(cfg.num_layers);
        let mut attn_scalars = Vec::new();
        let mut rope_cache = None;
        for l in 0..cfg.num_layers {
            rt.set_layer(Some(l as u32));
            let p = format!("model.layers.{l}");
            let a = format!("{p}.self_attn");
            let input_layernorm = norm(&mut ld, &format!("{p}.input_layernorm"))?;
            let proj = |x: &str| ["q_proj", "k_proj", "v_proj"].map(|n| format!("{a}.{n}.{x}"));
            let part = [(q_first, q_len); 3];
            let qkv = ld.fused_parts(
                &proj("weight"),
                &[h; 3],
                &part,
                h,
                &format!("{a}.qkv_proj.weight"),
            )?;
            let qkv_bias = ld.dense_concat_parts(
                &proj("bias"),
                &[h; 3],
                &part,
                &format!("{a}.qkv_proj.bias"),
            )?;
            // RowParallelLinear: this rank's columns, the whole bias, added on rank 0.
            let row = |ld: &mut Loader, name: &str, k: usize, first: usize, len: usize| {
                BiasedLinear::load_row(ld, name, (h, k), (first, len), shard.rank)
            };
            let dense = row(&mut ld, &format!("{a}.dense"), h, q_first, q_len)?;
            if rope_cache.is_none() {
                rope_cache = Some(rotary_cache(rt, cfg, act, (cfg.rope_theta, 1.0))?);
            }
            attn_scalars.extend(crate::model::loader::attention_scalars(
                rt,
                &format!("{a}.attn"),
                opts.attn_scalars,
            )?);
            // ColumnParallelLinear fc1: this rank's rows of the weight and of the bias.
            let fc1_name = format!("{p}.mlp.fc1");
            let fc1 = BiasedLinear::load_column(&mut ld, &fc1_name, (f, h), (f_first, f_len))?;
            let fc2 = row(&mut ld, &format!("{p}.mlp.fc2"), f, f_first, f_len)?;
            layers.push(PhiLayer {
                input_layernorm,
                qkv,
                qkv_bias,
                dense,
                fc1,
                fc2,
            });
        }
        rt.set_layer(None);
        let final_layernorm = norm(&mut ld, "model.final_layernorm")?;
        let lm_head = ld.vocab_shard("lm_head.weight", v, h, vp, v_first, v_len)?;
        let lm_head_bias = ld.vocab_bias_shard("lm_head.bias", v, vp, (v_first, v_len))?;
        let rope_cache = match rope_cache {
            Some(c) => c,
            None => rotary_cache(rt, cfg, act, (cfg.rope_theta, 1.0))?,
        };
        Ok(PhiModel {
            cfg: cfg.clone(),
            local,
            vocab_first_row: v_first,
            shape,
            quant: opts.quant,
            act,
            embed,
            layers,
            rope_cache,
            final_layernorm,
            lm_head,
            lm_head_bias,
            attn_scalars,
            load_stats: LoadStats {
                total_seconds: started.elapsed().as_secs_f64(),
                ..ld.stats
            },
            skip_attention: Cell::new(false),
            generation: Cell::new(0),
        })
    }

    /// Bytes of all weights as stored on the device, with the rotary cache and the attention
    /// scalars vLLM adds.
    pub fn weight_bytes(&self) -> u64 {
        self.embed.nbytes()
            + self.layers.iter().map(PhiLayer::weight_bytes).sum::<u64>()
            + self.rope_cache.nbytes()
            + self.final_layernorm.bytes()
            + self.lm_head.nbytes()
            + self.lm_head_bias.nbytes()
            + self.attn_scalars.iter().map(|t| t.nbytes()).sum::<u64>()
    }

    /// The untied lm_head, `[Vp / tp, hidden]` (its bias is `lm_head_bias`).
    pub fn lm_head(&self) -> &Tensor {
        &self.lm_head
    }

    /// `PhiModel.forward` (phi.py L235-258 at 0.19) over every token of the batch: the
    /// hidden states `[T, hidden]` in the model dtype after `final_layernorm`.
    pub fn forward_hidden(&self, rt: &Runtime, batch: &Batch) -> Result<Tensor> {
        let cfg = &self.cfg;
        let gen = self.generation.get();
        self.generation.set(gen + 1);
        batch.check_ids(cfg.vocab_size)?;
        let positions: Vec<usize> = batch.seq_lens.iter().flat_map(|&n| 0..n).collect();
        rt.set_layer(None);
        // embed_tokens(input_ids): a new [T, H], neither scaled nor kept as a residual.
        let mut hidden = crate::engine::ops_tp::embed_tokens(
            rt,
            &batch.ids,
            &self.embed,
            self.vocab_first_row,
            cfg.vocab_size,
            self.act,
        )?;
        for (li, layer) in self.layers.iter().enumerate() {
            crate::model::layers::decoder::enter_layer(rt, li, self.layers.len())?;
            // The loop's rebinding of hidden_states frees the layer's input.
            let out = self.layer_forward(rt, layer, &hidden, li, gen, &positions, batch)?;
            drop(hidden);
            hidden = out;
        }
        rt.set_layer(None);
        let n = &self.final_layernorm;
        let eps = self.shape.layer_norm_eps as f32;
        let normed = ops_phi::layer_norm(rt, &hidden, &n.w, &n.b, eps, "final_layernorm")?;
        drop(hidden);
        Ok(normed)
    }

    /// `PhiLayer.forward` (phi.py L190-203 at 0.19) on `x`, which the caller keeps alive:
    /// LayerNorm, attention, then the MLP on the same normed input, `attn + mlp + x` in two
    /// new tensors.
    #[allow(clippy::too_many_arguments)]
    fn layer_forward(
        &self,
        rt: &Runtime,
        layer: &PhiLayer,
        x: &Tensor,
        li: usize,
        gen: u32,
        positions: &[usize],
        batch: &Batch,
    ) -> Result<Tensor> {
        let act = self.act;
        let l = format!("layers.{li}");
        let ln = &layer.input_layernorm;
        let eps = self.shape.layer_norm_eps as f32;
        // L196-197: residual = x; hidden_states = input_layernorm(x), alive until L202's sum
        // rebinds it.
        let normed =
            ops_phi::layer_norm(rt, x, &ln.w, &ln.b, eps, &format!("{l}.input_layernorm"))?;
        let attn_out = self.attention(rt, layer, &normed, &l, gen, positions, batch)?;
        // PhiMLP.forward (L166-170): fc1, gelu_new into a new tensor (fc1's output dies at
        // the rebinding), fc2 (its all-reduce inside RowParallelLinear), the activation dying
        // at the next rebinding.
        let f1 = layer
            .fc1
            .forward(rt, &normed, &format!("{l}.fc1"), gen, act)?;
        let g = ops_phi::gelu_new(rt, &f1, &format!("{l}.act"))?;
        drop(f1);
        let f2 = layer.fc2.forward(rt, &g, &format!("{l}.fc2"), gen, act)?;
        let ffn = ops_tp::all_reduce(rt, f2, &format!("{l}.fc2.all_reduce"))?;
        drop(g);
        // L202: `attn_outputs + feed_forward_hidden_states + residual`, left to right; the
        // first sum dies once the second is made, and the rebinding frees the LN output.
        let t = ops_opt::add(rt, &attn_out, &ffn, &format!("{l}.attn_plus_mlp"))?;
        let s = ops_opt::add(rt, &t, x, &format!("{l}.plus_residual"))?;
        drop(t);
        drop(normed);
        // Returning frees the locals in order: attn_outputs, then the MLP's output.
        drop(attn_out);
        drop(ffn);
        Ok(s)
    }

    /// `PhiAttention.forward` (phi.py L127-137 at 0.19): qkv (its bias through addmm), its
    /// `chunk(3)` views, rotary in place on the first `rotary_dim` dimensions of each head of
    /// q and k, attention (scale `head_size^-0.5`), dense with its all-reduce; qkv and the
    /// attention output die as it returns.
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        rt: &Runtime,
        layer: &PhiLayer,
        x: &Tensor,
        l: &str,
        gen: u32,
        positions: &[usize],
        batch: &Batch,
    ) -> Result<Tensor> {
        let act = self.act;
        let qkv = layer
            .qkv
            .forward(rt, x, &format!("{l}.qkv_proj"), gen, act)?;
        let hd = self.local.num_heads * self.local.head_dim;
        let names = ["q", "k", "v"].map(|n| format!("{l}.{n}"));
        // The fused output holds each part as its own block here (`FusedLinear`), so each
        // view gets its share of the bias: the same one addmm as vLLM's, no allocation.
        let mut views = FusedLinear::split(&qkv, &[hd; 3], &names);
        let bias_names = ["q", "k", "v"].map(|n| format!("{l}.{n}_bias"));
        let biases = FusedLinear::split_flat(&layer.qkv_bias, &[hd; 3], &bias_names);
        for (x, b) in views.iter_mut().zip(biases) {
            ops::add_bias(rt, x, &b)?;
        }
        let mut it = views.into_iter();
        let (Some(mut q), Some(mut k), Some(v)) = (it.next(), it.next(), it.next()) else {
            return Err(Error::Request(format!("{l}: qkv split")));
        };
        let shape = self.local.attn_shape();
        ops::rope_partial(
            rt,
            &mut q,
            &mut k,
            positions,
            shape,
            (self.cfg.rope_theta, 1.0),
            self.cfg.rotary_dim(),
        )?;
        let a = if self.skip_attention.get() {
            ops::attention_skipped(rt, &q, &format!("{l}.attn"))?
        } else {
            ops::attention(rt, &q, &k, &v, &batch.seq_lens, shape, &format!("{l}.attn"))?
        };
        let o = layer
            .dense
            .forward(rt, &a, &format!("{l}.dense"), gen, act)?;
        let o = ops_tp::all_reduce(rt, o, &format!("{l}.dense.all_reduce"))?;
        drop((q, k, v));
        drop(qkv);
        drop(a);
        Ok(o)
    }
}

#[cfg(test)]
mod tests {
    use super::{Batch, LoadOptions, PhiModel};
    use crate::device::{Device, DeviceSpec};
    use crate::engine::runtime::Runtime;
    use crate::memory::EventKind;
    use crate::model::config::ModelConfig;
    use crate::model::weights::{StoredDtype, SyntheticWeights};
    use crate::quant::Quant;

    /// A small phi: hidden 128, 4 heads of 32 (rotary on 16 of them), MLP 512, 2 layers.
    fn small_phi() -> ModelConfig {
        ModelConfig::from_hf_json(&serde_json::json!({
            "model_type": "phi", "hidden_size": 128, "intermediate_size": 512,
            "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 1024,
            "max_position_embeddings": 64, "partial_rotary_factor": 0.5,
        }))
        .unwrap()
    }

    /// `cfg` loaded in fp16 with seeded weights on a dry simulated H100.
    fn dry_load(cfg: &ModelConfig) -> (Runtime, PhiModel) {
        let device = Device::open(&DeviceSpec::parse("sim:h100-80gb:dry").unwrap()).unwrap();
        let opts = LoadOptions {
            quant: Quant::F16,
            int8_threshold: 0.0,
            int8_layout: device.int8_tile_layout(),
            attn_scalars: 0,
            marlin: Default::default(),
        };
        let rt = Runtime::new(device, std::sync::Arc::default(), None);
        let src = SyntheticWeights {
            preset: "phi".into(),
            seed: 1,
            dtype: StoredDtype::F16,
        };
        let model = PhiModel::load(&rt, cfg, &src, &opts).unwrap();
        (rt, model)
    }

    /// The allocations and frees (bytes as the allocator rounds them: 512 at least) of layer 1
    /// in one dry pass of 8 tokens in 2 sequences, in fp16, as (alloc?, tensor, bytes).
    fn layer_1_trace() -> Vec<(bool, String, u64)> {
        let cfg = small_phi();
        let (rt, model) = dry_load(&cfg);
        let from = rt.event_count();
        rt.set_pass(1);
        let batch = Batch::dummy(8, 2, cfg.vocab_size);
        let out = model.forward_hidden(&rt, &batch).unwrap();
        drop(out);
        rt.events_since(from, |ev| {
            ev.iter()
                .filter(|e| {
                    e.layer == Some(1) && matches!(e.kind, EventKind::Alloc | EventKind::Free)
                })
                .map(|e| (e.kind == EventKind::Alloc, e.tensor.clone(), e.bytes))
                .collect()
        })
    }

    /// PhiLayer.forward (phi.py L190-203 at 0.19, research §3 steps 1-6): the LayerNorm's new
    /// output with its f32 mean and rstd freed at once; qkv, attention, dense, then qkv and
    /// the attention output dying; fc1, gelu_new, fc1 dying, fc2, the activation dying; the
    /// two new sums, the first dying, then the LN output, the attention output and the MLP's;
    /// then layer 0's output, rebound by the model loop.
    #[test]
    fn phi_layer_allocates_as_vllms_phi_layer() {
        let t = 8u64;
        let h = 128 * 2 * t; // [T, hidden] fp16
        let a = |n: &str, b: u64| (true, n.to_string(), b);
        let f = |n: &str, b: u64| (false, n.to_string(), b);
        let (qkv, mlp) = (3 * 128 * 2 * t, 512 * 2 * t);
        let want = vec![
            a("layers.1.input_layernorm", h),
            a("layers.1.input_layernorm.mean", 512),
            a("layers.1.input_layernorm.rstd", 512),
            f("layers.1.input_layernorm.mean", 512),
            f("layers.1.input_layernorm.rstd", 512),
            a("layers.1.qkv_proj.out", qkv),
            a("layers.1.attn", h),
            a("layers.1.attn.softmax_lse", 512),
            a("layers.1.attn.rng_state", 512),
            f("layers.1.attn.softmax_lse", 512),
            f("layers.1.attn.rng_state", 512),
            a("layers.1.dense.out", h),
            f("layers.1.qkv_proj.out", qkv),
            f("layers.1.attn", h),
            a("layers.1.fc1.out", mlp),
            a("layers.1.act", mlp),
            f("layers.1.fc1.out", mlp),
            a("layers.1.fc2.out", h),
            f("layers.1.act", mlp),
            a("layers.1.attn_plus_mlp", h),
            a("layers.1.plus_residual", h),
            f("layers.1.attn_plus_mlp", h),
            f("layers.1.input_layernorm", h),
            f("layers.1.dense.out", h),
            f("layers.1.fc2.out", h),
            f("layers.0.plus_residual", h),
        ];
        assert_eq!(layer_1_trace(), want);
    }

    /// vLLM's one `cos_sin_cache` is `[max_position_embeddings, rotary_dim]`: 16 of each
    /// head's 32 dimensions here; the lm_head carries a bias over the padded vocabulary.
    #[test]
    fn the_rotary_cache_is_rotary_dim_wide_and_the_lm_head_has_a_bias() {
        let (_rt, m) = dry_load(&small_phi());
        assert_eq!(m.rope_cache.shape, [64, 16]);
        assert_eq!(m.lm_head_bias.shape, [1024]);
        assert_eq!(m.lm_head.shape, [1024, 128]);
    }
}
