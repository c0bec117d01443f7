//! Writers for small model files (GGUF, safetensors) used by the model-file and hostile-file
//! tests, written from the format descriptions, independently of the parsers under test; and
//! the small checkpoints the transformers and GPU checks share.
#![allow(dead_code)]

pub mod cli;

/// A GGUF metadata value.
pub enum Kv {
    U32(u32),
    F32(f32),
    Str(String),
    /// Array of strings.
    Strs(Vec<String>),
}

pub struct GgufTensorSpec {
    pub name: String,
    /// Innermost first.
    pub dims: Vec<u64>,
    pub ggml_type: u32,
    pub data: Vec<u8>,
    /// Written instead of the packed offset (for hostile files).
    pub offset: Option<u64>,
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// Header bytes up to the aligned data start, with the data offsets each tensor is given
/// (packed in order, each aligned to 32).
pub fn gguf_header(kvs: &[(&str, Kv)], tensors: &[GgufTensorSpec]) -> (Vec<u8>, Vec<u64>) {
    let mut out = b"GGUF".to_vec();
    out.extend_from_slice(&3u32.to_le_bytes());
    out.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    out.extend_from_slice(&(kvs.len() as u64).to_le_bytes());
    for (k, v) in kvs {
        put_str(&mut out, k);
        match v {
            Kv::U32(x) => {
                out.extend_from_slice(&4u32.to_le_bytes());
                out.extend_from_slice(&x.to_le_bytes());
            }
            Kv::F32(x) => {
                out.extend_from_slice(&6u32.to_le_bytes());
                out.extend_from_slice(&x.to_le_bytes());
            }
            Kv::Str(s) => {
                out.extend_from_slice(&8u32.to_le_bytes());
                put_str(&mut out, s);
            }
            Kv::Strs(v) => {
                out.extend_from_slice(&9u32.to_le_bytes());
                out.extend_from_slice(&8u32.to_le_bytes());
                out.extend_from_slice(&(v.len() as u64).to_le_bytes());
                for s in v {
                    put_str(&mut out, s);
                }
            }
        }
    }
    let mut offsets = Vec::new();
    let mut off = 0u64;
    for t in tensors {
        put_str(&mut out, &t.name);
        out.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
        for d in &t.dims {
            out.extend_from_slice(&d.to_le_bytes());
        }
        out.extend_from_slice(&t.ggml_type.to_le_bytes());
        out.extend_from_slice(&t.offset.unwrap_or(off).to_le_bytes());
        offsets.push(off);
        off = (off + t.data.len() as u64).div_ceil(32) * 32;
    }
    while !out.len().is_multiple_of(32) {
        out.push(0);
    }
    (out, offsets)
}

/// A whole GGUF file.
pub fn gguf_file(kvs: &[(&str, Kv)], tensors: &[GgufTensorSpec]) -> Vec<u8> {
    let (mut out, offsets) = gguf_header(kvs, tensors);
    let base = out.len() as u64;
    for (t, off) in tensors.iter().zip(offsets) {
        out.resize((base + off) as usize, 0);
        out.extend_from_slice(&t.data);
    }
    out
}

pub fn f16_bytes(x: f32) -> [u8; 2] {
    half::f16::from_f32(x).to_le_bytes()
}

/// Q8_0 blocks for `vals` (a multiple of 32): scale absmax/127, values rounded.
pub fn q8_0(vals: &[f32]) -> Vec<u8> {
    let mut out = Vec::new();
    for b in vals.chunks(32) {
        let amax = b.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = half::f16::from_f32(amax / 127.0).to_f32();
        out.extend_from_slice(&f16_bytes(d));
        for v in b {
            let q = if d == 0.0 { 0.0 } else { (v / d).round() };
            out.push(q.clamp(-127.0, 127.0) as i8 as u8);
        }
    }
    out
}

/// Q4_1 blocks: scale (max-min)/15, min; element j in the low nibble of byte j, j+16 high.
pub fn q4_1(vals: &[f32]) -> Vec<u8> {
    let mut out = Vec::new();
    for b in vals.chunks(32) {
        let mn = b.iter().cloned().fold(f32::INFINITY, f32::min);
        let mx = b.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let d = half::f16::from_f32((mx - mn) / 15.0).to_f32();
        let m = half::f16::from_f32(mn).to_f32();
        out.extend_from_slice(&f16_bytes(d));
        out.extend_from_slice(&f16_bytes(m));
        let q = |v: f32| -> u8 {
            if d == 0.0 {
                0
            } else {
                ((v - m) / d).round().clamp(0.0, 15.0) as u8
            }
        };
        for j in 0..16 {
            out.push(q(b[j]) | (q(b[j + 16]) << 4));
        }
    }
    out
}

/// Q4_0 blocks: scale absmax/8 (signed as ggml picks it), q = round(v/d) + 8.
pub fn q4_0(vals: &[f32]) -> Vec<u8> {
    let mut out = Vec::new();
    for b in vals.chunks(32) {
        let max = b
            .iter()
            .cloned()
            .fold(0f32, |m, v| if v.abs() > m.abs() { v } else { m });
        let d = half::f16::from_f32(max / -8.0).to_f32();
        out.extend_from_slice(&f16_bytes(d));
        let q = |v: f32| -> u8 {
            if d == 0.0 {
                8
            } else {
                ((v / d).round() + 8.0).clamp(0.0, 15.0) as u8
            }
        };
        for j in 0..16 {
            out.push(q(b[j]) | (q(b[j + 16]) << 4));
        }
    }
    out
}

pub fn f32_bytes(vals: &[f32]) -> Vec<u8> {
    vals.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// A safetensors file from (name, dtype, shape, data_offsets, header-only) entries and raw data:
/// the header is written exactly as given, so it may lie.
pub fn safetensors_raw(header_json: &str, data: &[u8]) -> Vec<u8> {
    let mut out = (header_json.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header_json.as_bytes());
    out.extend_from_slice(data);
    out
}

/// Deterministic pseudo-random values in [-scale, scale).
pub fn values(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

/// llama.cpp's converter permutation of Q/K rows (HF → GGUF), for building test files.
pub fn permute_rows(w: &[f32], rows: usize, cols: usize, head_dim: usize) -> Vec<f32> {
    let half = head_dim / 2;
    let mut out = vec![0f32; w.len()];
    for r in 0..rows {
        let (h, within) = (r / head_dim, r % head_dim);
        let (s, i) = (within / half, within % half);
        let dst = h * head_dim + 2 * i + s;
        out[dst * cols..(dst + 1) * cols].copy_from_slice(&w[r * cols..(r + 1) * cols]);
    }
    out
}

/// A small llama GGUF: hidden 64, 2 layers, 4 heads (2 kv), ffn 128, vocab 96, tied.
/// Q/K in Q4_1 (permuted as llama.cpp writes them), V/O in Q8_0, MLP in Q4_0, norms F32,
/// embedding F16. Returns the file and the Hugging Face-layout values of every tensor.
/// (Hugging Face name, shape, values) of each tensor.
pub type HfTensors = Vec<(String, Vec<usize>, Vec<f32>)>;

pub fn tiny_gguf() -> (Vec<u8>, HfTensors) {
    let (kvs, tensors, hf) = tiny_gguf_parts();
    (gguf_file(&kvs, &tensors), hf)
}

type Parts = (Vec<(&'static str, Kv)>, Vec<GgufTensorSpec>, HfTensors);

/// The metadata and tensors of `tiny_gguf`, to be altered before writing.
pub fn tiny_gguf_parts() -> Parts {
    let (h, ffn, vocab, heads, kv_heads, layers) =
        (64usize, 128usize, 96usize, 4usize, 2usize, 2usize);
    let hd = h / heads;
    let kvs = vec![
        ("general.architecture", Kv::Str("llama".into())),
        ("llama.block_count", Kv::U32(layers as u32)),
        ("llama.context_length", Kv::U32(256)),
        ("llama.embedding_length", Kv::U32(h as u32)),
        ("llama.feed_forward_length", Kv::U32(ffn as u32)),
        ("llama.attention.head_count", Kv::U32(heads as u32)),
        ("llama.attention.head_count_kv", Kv::U32(kv_heads as u32)),
        ("llama.rope.freq_base", Kv::F32(10000.0)),
        ("llama.attention.layer_norm_rms_epsilon", Kv::F32(1e-5)),
        (
            "tokenizer.ggml.tokens",
            Kv::Strs((0..vocab).map(|i| format!("t{i}")).collect()),
        ),
    ];
    let mut tensors = Vec::new();
    let mut hf = Vec::new();
    let mut seed = 1u64;
    let mut add = |gname: &str, hname: &str, rows: usize, cols: usize, ty: u32, permute: bool| {
        seed += 1;
        let is_norm = gname.ends_with("norm.weight");
        let mut v = values(rows * cols, seed, 0.5);
        if is_norm {
            v.iter_mut().for_each(|x| *x = 1.0 + *x * 0.1);
        }
        let (data, deq): (Vec<u8>, Vec<f32>) = {
            let stored = if permute {
                permute_rows(&v, rows, cols, hd)
            } else {
                v.clone()
            };
            let data = match ty {
                0 => f32_bytes(&stored),
                1 => stored.iter().flat_map(|x| f16_bytes(*x)).collect(),
                2 => q4_0(&stored),
                3 => q4_1(&stored),
                8 => q8_0(&stored),
                _ => unreachable!(),
            };
            (data, v)
        };
        let dims = if rows == 1 {
            vec![cols as u64]
        } else {
            vec![cols as u64, rows as u64]
        };
        tensors.push(GgufTensorSpec {
            name: gname.into(),
            dims,
            ggml_type: ty,
            data,
            offset: None,
        });
        let shape = if rows == 1 {
            vec![cols]
        } else {
            vec![rows, cols]
        };
        hf.push((hname.to_string(), shape, deq));
    };
    add(
        "token_embd.weight",
        "model.embed_tokens.weight",
        vocab,
        h,
        1,
        false,
    );
    for l in 0..layers {
        let g = |s: &str| format!("blk.{l}.{s}");
        let m = |s: &str| format!("model.layers.{l}.{s}");
        add(
            &g("attn_norm.weight"),
            &m("input_layernorm.weight"),
            1,
            h,
            0,
            false,
        );
        add(
            &g("attn_q.weight"),
            &m("self_attn.q_proj.weight"),
            h,
            h,
            3,
            true,
        );
        add(
            &g("attn_k.weight"),
            &m("self_attn.k_proj.weight"),
            kv_heads * hd,
            h,
            3,
            true,
        );
        add(
            &g("attn_v.weight"),
            &m("self_attn.v_proj.weight"),
            kv_heads * hd,
            h,
            8,
            false,
        );
        add(
            &g("attn_output.weight"),
            &m("self_attn.o_proj.weight"),
            h,
            h,
            8,
            false,
        );
        add(
            &g("ffn_norm.weight"),
            &m("post_attention_layernorm.weight"),
            1,
            h,
            0,
            false,
        );
        add(
            &g("ffn_gate.weight"),
            &m("mlp.gate_proj.weight"),
            ffn,
            h,
            2,
            false,
        );
        add(
            &g("ffn_up.weight"),
            &m("mlp.up_proj.weight"),
            ffn,
            h,
            2,
            false,
        );
        add(
            &g("ffn_down.weight"),
            &m("mlp.down_proj.weight"),
            h,
            ffn,
            2,
            false,
        );
    }
    add("output_norm.weight", "model.norm.weight", 1, h, 0, false);
    (kvs, tensors, hf)
}

/// The small checkpoints tests/hf_reference.rs compares with transformers (and tests/cuda.rs
/// runs on the GPU): hidden 128, two layers, vocabulary 1024, one per model_type (the comments
/// say what each exercises).
pub fn hf_test_config(name: &str) -> vramscope::model::ModelConfig {
    let mut v = serde_json::json!({
        "hidden_size": 128,
        "intermediate_size": 384,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 1024,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 2048,
    });
    let o = v.as_object_mut().unwrap();
    match name {
        // Untied lm_head, rope_theta 500000 (Llama-3's).
        "llama" => {
            o.insert("model_type".into(), "llama".into());
            o.insert("rope_theta".into(), 500000.0.into());
            o.insert("tie_word_embeddings".into(), false.into());
        }
        // Llama 3.1's rope scaling on a short original length, so that the sequences' few
        // positions meet every band: kept, blended and divided frequencies (head_dim 32, base
        // 10000: wavelengths from 6.3 to about 35,000 against 2 and 8).
        "llama_llama3" => {
            o.insert("model_type".into(), "llama".into());
            o.insert("rope_theta".into(), 10000.0.into());
            o.insert("tie_word_embeddings".into(), false.into());
            o.insert("max_position_embeddings".into(), 32.into());
            o.insert(
                "rope_scaling".into(),
                serde_json::json!({"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0, "original_max_position_embeddings": 8}),
            );
        }
        // YaRN as Qwen's instructions add it (factor 4 over an original length of 8, so the
        // interpolated and extrapolated dimensions and the cos/sin multiplier all show).
        "qwen2_yarn" => {
            o.insert("model_type".into(), "qwen2".into());
            o.insert("rope_theta".into(), 10000.0.into());
            o.insert("tie_word_embeddings".into(), true.into());
            o.insert("max_position_embeddings".into(), 32.into());
            o.insert(
                "rope_scaling".into(),
                serde_json::json!({"rope_type": "yarn", "factor": 4.0,
                    "original_max_position_embeddings": 8}),
            );
        }
        // q/k/v biases, tied embeddings (Qwen2.5-0.5B's layout).
        "qwen2" => {
            o.insert("model_type".into(), "qwen2".into());
            o.insert("rope_theta".into(), 1000000.0.into());
            o.insert("tie_word_embeddings".into(), true.into());
        }
        // q_norm/k_norm per head, head_dim 64 (not hidden / heads = 32), no bias.
        "qwen3" => {
            o.insert("model_type".into(), "qwen3".into());
            o.insert("head_dim".into(), 64.into());
            o.insert("rope_theta".into(), 1000000.0.into());
            o.insert("tie_word_embeddings".into(), true.into());
        }
        // q/k/v and gate/up stored fused (qkv_proj, gate_up_proj), untied lm_head.
        "phi3" => {
            o.insert("model_type".into(), "phi3".into());
            o.insert("rope_theta".into(), 10000.0.into());
            o.insert("tie_word_embeddings".into(), false.into());
        }
        // GemmaRMSNorm (1 + w) four times a layer, GeGLU, √hidden embedding scale, head_dim 64
        // with query_pre_attn_scalar 32 (not 64), a 4-token window on layer 0 (the 6- and
        // 5-token sequences run past it), soft-caps small enough to bite on these weights
        // (attention scores here are ~0.3, logits ~0.5).
        "gemma2" => {
            o.insert("model_type".into(), "gemma2".into());
            o.insert("head_dim".into(), 64.into());
            o.insert("query_pre_attn_scalar".into(), 32.into());
            o.insert("sliding_window".into(), 4.into());
            o.insert("attn_logit_softcapping".into(), 0.25.into());
            o.insert("final_logit_softcapping".into(), 0.4.into());
            o.insert("rope_theta".into(), 10000.0.into());
        }
        // Per-head q_norm/k_norm (Gemma style), layer 0 sliding (window 4, rotary base 10000),
        // layer 1 global (rope_theta 1e6 with linear scaling 8), query_pre_attn_scalar 48, no
        // soft-caps (Gemma 3's).
        "gemma3" => {
            o.insert("model_type".into(), "gemma3_text".into());
            o.insert("head_dim".into(), 64.into());
            o.insert("query_pre_attn_scalar".into(), 48.into());
            o.insert("sliding_window".into(), 4.into());
            o.insert("sliding_window_pattern".into(), 2.into());
            o.insert("rope_theta".into(), 1000000.0.into());
            o.insert("rope_local_base_freq".into(), 10000.0.into());
            o.insert(
                "rope_scaling".into(),
                serde_json::json!({"rope_type": "linear", "factor": 8.0}),
            );
        }
        // Gemma 1: one KV head (gemma-2b's MQA), head_dim 64 over 4 heads (256 wide, not the
        // hidden 128, as gemma-7b's 4096 against 3072), scale 64^-0.5, no window or soft-cap.
        "gemma" => {
            o.insert("model_type".into(), "gemma".into());
            o.insert("head_dim".into(), 64.into());
            o.insert("num_key_value_heads".into(), 1.into());
            o.insert("rope_theta".into(), 10000.0.into());
        }
        // Granite's four multipliers, each far enough from 1 to bite: the embedding x3, each
        // branch x0.5 before its residual add, softmax scale 0.05 (not 32^-0.5 = 0.177),
        // logits / 4; tied embeddings (every published Granite 3.x).
        "granite" => {
            o.insert("model_type".into(), "granite".into());
            o.insert("rope_theta".into(), 10000.0.into());
            o.insert("tie_word_embeddings".into(), true.into());
            o.insert("embedding_multiplier".into(), 3.0.into());
            o.insert("residual_multiplier".into(), 0.5.into());
            o.insert("attention_multiplier".into(), 0.05.into());
            o.insert("logits_scaling".into(), 4.0.into());
        }
        // 4 experts of width 96, 2 per token, renormalised (Mixtral always renormalises).
        "mixtral" => {
            o.insert("model_type".into(), "mixtral".into());
            o.insert("intermediate_size".into(), 96.into());
            o.insert("num_local_experts".into(), 4.into());
            o.insert("num_experts_per_tok".into(), 2.into());
            o.insert("rope_theta".into(), 1000000.0.into());
            o.insert("tie_word_embeddings".into(), false.into());
        }
        // 8 experts of width 64, 3 per token, not renormalised (norm_topk_prob false); layer 1
        // dense (mlp_only_layers) with the 384-wide MLP; per-head q/k norms, head_dim 64.
        "qwen3_moe" => {
            o.insert("model_type".into(), "qwen3_moe".into());
            o.insert("head_dim".into(), 64.into());
            o.insert("num_experts".into(), 8.into());
            o.insert("num_experts_per_tok".into(), 3.into());
            o.insert("moe_intermediate_size".into(), 64.into());
            o.insert("norm_topk_prob".into(), false.into());
            o.insert("decoder_sparse_step".into(), 1.into());
            o.insert("mlp_only_layers".into(), serde_json::json!([1]));
            o.insert("rope_theta".into(), 1000000.0.into());
            o.insert("tie_word_embeddings".into(), false.into());
        }
        // 6 experts of width 64 (not a power of two: topk_softmax's workspace), 2 per token,
        // not renormalised, a shared expert of width 96 behind its sigmoid gate; q/k/v biases.
        // Written for scripts/hf_reference.py; its reference logits are not taken yet (the
        // block is checked against its model file written out by hand in tests/moe.rs).
        "qwen2_moe" => {
            o.insert("model_type".into(), "qwen2_moe".into());
            o.insert("num_experts".into(), 6.into());
            o.insert("num_experts_per_tok".into(), 2.into());
            o.insert("moe_intermediate_size".into(), 64.into());
            o.insert("shared_expert_intermediate_size".into(), 96.into());
            o.insert("norm_topk_prob".into(), false.into());
            o.insert("rope_theta".into(), 1000000.0.into());
            o.insert("tie_word_embeddings".into(), false.into());
        }
        // phi-2's layout scaled down: LayerNorm with bias, q/k/v/dense/fc1/fc2 and lm_head with
        // biases, MLP 4 × hidden (vLLM's phi.py ignores intermediate_size), multi-head (4 of
        // 32), rotary on half of each head (16 dims), gelu_new.
        "phi" => {
            o.insert("model_type".into(), "phi".into());
            o.insert("intermediate_size".into(), 512.into());
            o.insert("num_key_value_heads".into(), 4.into());
            o.insert("partial_rotary_factor".into(), 0.5.into());
            o.insert("layer_norm_eps".into(), 1e-5.into());
            o.insert("rope_theta".into(), 10000.0.into());
            o.insert("tie_word_embeddings".into(), false.into());
        }
        // Multi-head latent attention with DeepSeek-V2-Lite's layout at a small shape: one
        // q_proj, a 64-wide latent, 32 + 16 query/key dims, 32-wide values, YaRN (factor 4
        // over 512 positions, V2-Lite's mscales), a dense first layer, then MoE layers of 8
        // softmax-routed experts (2 a token, unnormalised) beside 2 shared ones.
        "deepseek_v2" | "deepseek_v2_dense" => {
            o.insert("model_type".into(), "deepseek_v2".into());
            o.insert("num_hidden_layers".into(), 3.into());
            o.insert("num_key_value_heads".into(), 4.into());
            o.insert("q_lora_rank".into(), serde_json::Value::Null);
            o.insert("kv_lora_rank".into(), 64.into());
            o.insert("qk_nope_head_dim".into(), 32.into());
            o.insert("qk_rope_head_dim".into(), 16.into());
            o.insert("v_head_dim".into(), 32.into());
            o.insert("n_routed_experts".into(), 8.into());
            o.insert("num_experts_per_tok".into(), 2.into());
            o.insert("moe_intermediate_size".into(), 64.into());
            o.insert("n_shared_experts".into(), 2.into());
            let dense = if name == "deepseek_v2_dense" { 3 } else { 1 };
            o.insert("first_k_dense_replace".into(), dense.into());
            o.insert("topk_method".into(), "greedy".into());
            o.insert("scoring_func".into(), "softmax".into());
            o.insert("norm_topk_prob".into(), false.into());
            o.insert("routed_scaling_factor".into(), 1.0.into());
            o.insert("rope_theta".into(), 10000.0.into());
            o.insert(
                "rope_scaling".into(),
                serde_json::json!({"type": "yarn", "factor": 4.0,
                    "original_max_position_embeddings": 512, "beta_fast": 32.0,
                    "beta_slow": 1.0, "mscale": 0.707, "mscale_all_dim": 0.707}),
            );
        }
        // DeepSeek-V3's layout: the low-rank query (96), sigmoid scores chosen with a
        // correction bias within the best 2 of 4 groups, renormalised and scaled by 2.5, one
        // shared expert.
        "deepseek_v3" | "deepseek_v3_dense" => {
            o.insert("model_type".into(), "deepseek_v3".into());
            o.insert("num_hidden_layers".into(), 3.into());
            o.insert("num_key_value_heads".into(), 4.into());
            o.insert("q_lora_rank".into(), 96.into());
            o.insert("kv_lora_rank".into(), 64.into());
            o.insert("qk_nope_head_dim".into(), 32.into());
            o.insert("qk_rope_head_dim".into(), 16.into());
            o.insert("v_head_dim".into(), 32.into());
            o.insert("n_routed_experts".into(), 8.into());
            o.insert("num_experts_per_tok".into(), 2.into());
            o.insert("moe_intermediate_size".into(), 64.into());
            o.insert("n_shared_experts".into(), 1.into());
            let dense = if name == "deepseek_v3_dense" { 3 } else { 1 };
            o.insert("first_k_dense_replace".into(), dense.into());
            o.insert("topk_method".into(), "noaux_tc".into());
            o.insert("scoring_func".into(), "sigmoid".into());
            o.insert("n_group".into(), 4.into());
            o.insert("topk_group".into(), 2.into());
            o.insert("norm_topk_prob".into(), true.into());
            o.insert("routed_scaling_factor".into(), 2.5.into());
            o.insert("rope_theta".into(), 10000.0.into());
            o.insert(
                "rope_scaling".into(),
                serde_json::json!({"type": "yarn", "factor": 4.0,
                    "original_max_position_embeddings": 512, "beta_fast": 32.0,
                    "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}),
            );
        }
        // gpt-oss's layout at a small shape: 4 layers (even ones sliding over a 4-token
        // window, which the 6- and 5-token sequences run past), head_dim 32 over 4 heads and
        // 2 KV heads, q/k/v/o biases, sinks, YaRN (factor 4 over 512 positions, untruncated),
        // 8 experts of 96 (2 a token) with a swiglu limit of 0.05 small enough to clamp these
        // weights' activations.
        "gpt_oss" => {
            o.insert("model_type".into(), "gpt_oss".into());
            o.insert("num_hidden_layers".into(), 4.into());
            o.insert("head_dim".into(), 32.into());
            o.insert("intermediate_size".into(), 96.into());
            o.insert("num_local_experts".into(), 8.into());
            o.insert("num_experts_per_tok".into(), 2.into());
            o.insert("sliding_window".into(), 4.into());
            o.insert("rms_norm_eps".into(), 1e-5.into());
            o.insert("swiglu_limit".into(), 0.05.into());
            o.insert("rope_theta".into(), 150000.0.into());
            o.insert(
                "rope_scaling".into(),
                serde_json::json!({"rope_type": "yarn", "factor": 4.0,
                    "original_max_position_embeddings": 512, "beta_fast": 32.0,
                    "beta_slow": 1.0, "truncate": false}),
            );
        }
        // Llama 4's text model at a small shape with every mechanism in reach of 6- and
        // 5-token sequences: 4 layers, MoE in every 2nd (Maverick's interleave: dense layers
        // of width 192, experts of 64) with a shared expert, 4 experts routed top-1 by
        // sigmoid; RoPE layers 0 and 2 attending in chunks of 4 positions with the L2 q/k norm
        // and Llama 3's rope scaling (Scout's, over 64 positions); NoPE layers 1 and 3 global
        // with the attention temperature at floor_scale 2 (scale 0.5).
        "llama4" => {
            o.insert("model_type".into(), "llama4_text".into());
            o.insert("num_hidden_layers".into(), 4.into());
            o.insert("intermediate_size".into(), 64.into());
            o.insert("intermediate_size_mlp".into(), 192.into());
            o.insert("num_local_experts".into(), 4.into());
            o.insert("num_experts_per_tok".into(), 1.into());
            o.insert("interleave_moe_layer_step".into(), 2.into());
            o.insert("no_rope_layers".into(), serde_json::json!([1, 0, 1, 0]));
            o.insert("attention_chunk_size".into(), 4.into());
            o.insert("use_qk_norm".into(), true.into());
            o.insert("attn_temperature_tuning".into(), true.into());
            o.insert("floor_scale".into(), 2.into());
            o.insert("attn_scale".into(), 0.5.into());
            o.insert("rope_theta".into(), 500000.0.into());
            o.insert(
                "rope_scaling".into(),
                serde_json::json!({"rope_type": "llama3", "factor": 8.0,
                    "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 64}),
            );
            o.insert("tie_word_embeddings".into(), false.into());
        }
        // Qwen3-Next's layout at a small shape: three Gated DeltaNet layers (2 key heads and
        // 4 value heads of 32, a 4-tap conv) and one gated full-attention layer (heads of 64,
        // a quarter of each rotated), MoE layers of 8 experts (2 a token, renormalised) beside
        // a gated shared expert, layer 1 a dense MLP.
        "qwen3_next" => {
            o.insert("model_type".into(), "qwen3_next".into());
            o.insert("num_hidden_layers".into(), 4.into());
            o.insert("head_dim".into(), 64.into());
            o.insert("rope_theta".into(), 10000.0.into());
            o.insert("partial_rotary_factor".into(), 0.25.into());
            o.insert("tie_word_embeddings".into(), false.into());
            o.insert("full_attention_interval".into(), 4.into());
            o.insert("linear_num_key_heads".into(), 2.into());
            o.insert("linear_num_value_heads".into(), 4.into());
            o.insert("linear_key_head_dim".into(), 32.into());
            o.insert("linear_value_head_dim".into(), 32.into());
            o.insert("linear_conv_kernel_dim".into(), 4.into());
            o.insert("num_experts".into(), 8.into());
            o.insert("num_experts_per_tok".into(), 2.into());
            o.insert("moe_intermediate_size".into(), 64.into());
            o.insert("shared_expert_intermediate_size".into(), 64.into());
            o.insert("norm_topk_prob".into(), true.into());
            o.insert("mlp_only_layers".into(), serde_json::json!([1]));
        }
        _ => unreachable!(),
    }
    vramscope::model::ModelConfig::from_hf_json(&v).unwrap()
}

/// `hf_test_config(name)` written into `dir` as f16 safetensors with seed 11.
pub fn write_hf_test_model(dir: &std::path::Path, name: &str) {
    let opts = vramscope::model::GenOptions {
        dtype: vramscope::model::weights::StoredDtype::F16,
        seed: 11,
        shards: 1,
        bnb_int8: false,
        bnb_skip_modules: Vec::new(),
    };
    vramscope::model::gen_model_config(&hf_test_config(name), name, dir, &opts).unwrap();
}

/// Qwen/Qwen1.5-MoE-A2.7B's config.json (Qwen2MoeForCausalLM: 60 experts of 1408, top 4, a
/// shared expert of 5632 with its sigmoid gate; the keys vLLM's qwen2_moe.py reads).
pub fn qwen1_5_moe_config() -> serde_json::Value {
    serde_json::json!({
        "architectures": ["Qwen2MoeForCausalLM"],
        "model_type": "qwen2_moe",
        "hidden_size": 2048,
        "intermediate_size": 5632,
        "num_hidden_layers": 24,
        "num_attention_heads": 16,
        "num_key_value_heads": 16,
        "vocab_size": 151936,
        "max_position_embeddings": 8192,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": false,
        "num_experts": 60,
        "num_experts_per_tok": 4,
        "moe_intermediate_size": 1408,
        "shared_expert_intermediate_size": 5632,
        "norm_topk_prob": false,
        "decoder_sparse_step": 1,
        "torch_dtype": "bfloat16"
    })
}

/// `qwen1_5_moe_config` written as a folder's config.json.
pub fn qwen1_5_moe_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let config = qwen1_5_moe_config();
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    dir
}

/// Mistral 3's tiny config.json (a one-layer mistral language model of 128 with two heads
/// and two KV heads of 64, a two-block Pixtral tower of 32 over 28-pixel images), for the
/// tests that plan or load it.
pub fn mistral3_wide_json() -> serde_json::Value {
    serde_json::json!({
        "architectures": ["Mistral3ForConditionalGeneration"], "model_type": "mistral3",
        "image_token_index": 10, "multimodal_projector_bias": true,
        "projector_hidden_act": "gelu", "spatial_merge_size": 2, "vision_feature_layer": -1,
        "text_config": {"model_type": "mistral", "hidden_size": 128, "intermediate_size": 256,
            "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2,
            "head_dim": 64, "vocab_size": 1024, "max_position_embeddings": 256,
            "rms_norm_eps": 1e-5, "rope_theta": 1000000000.0, "sliding_window": null},
        "vision_config": {"model_type": "pixtral", "hidden_size": 32, "intermediate_size": 48,
            "num_hidden_layers": 2, "num_attention_heads": 4, "head_dim": 8,
            "image_size": 28, "patch_size": 7, "num_channels": 3, "rope_theta": 10000.0,
            "hidden_act": "silu"}
    })
}
