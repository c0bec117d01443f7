//! What a vLLM release's model files do differently, as plain data the models read while
//! they run: set by the profile procedure from the release (`profile::vllm`), read through
//! the runtime. The readings behind each field are in docs/reading/.

/// What a release's MXFP4 path does beyond the backend's choice, which is the same in every
/// release from 0.11 to 0.33 (docs/reading/vllm-gpt-oss-v1.md §2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mxfp4Rules {
    /// triton_kernels swizzles on Hopper (`quant::mxfp4::hopper_swizzles`: the release pins
    /// torch 2.8.1 or later); strided otherwise.
    pub swizzle: bool,
    /// The vendored triton_kernels is 3.6's (0.19.0, 0.21.0), whose `HopperMXValueLayout`
    /// pads both dimensions of a value tensor to 64 before its tiles (hopper_value.py
    /// L128-134); 0.15.1's and 0.22.1's to 0.33.0's (3.5.1, the same files) pad only to the
    /// tiles, 16 and 32 (hopper_value.py L136-148), so gpt-oss's values keep their bytes.
    pub value_pad64: bool,
    /// From 0.25.1 the loaded u8 scales are deleted after the swizzle (oracle/mxfp4.py
    /// L1155-1156: `del layer.w13_weight_scale`, `del layer.w2_weight_scale`).
    pub frees_loaded_scales: bool,
    /// From 0.26.0 Hopper's scales are padded to a multiple of 4 along `K / 32` before the
    /// swizzle (quantization/utils/mxfp4_utils.py L89-95, "Patches #47303").
    pub scale_pad4: bool,
    /// What FlashInfer TRT-LLM rounds the intermediate size to: 256 through 0.26, 128 from
    /// 0.27.1 (oracle/mxfp4.py `mxfp4_round_up_hidden_size_and_intermediate_size`).
    pub trtllm_width_round: usize,
}

impl Mxfp4Rules {
    /// 0.19.0's rules (the runtime's default).
    pub const V0_19: Mxfp4Rules = Mxfp4Rules {
        swizzle: true,
        value_pad64: true,
        frees_loaded_scales: false,
        scale_pad4: false,
        trtllm_width_round: 256,
    };

    /// The rules of V1 release `0.minor`; `swizzle` from its torch pin
    /// (`quant::mxfp4::hopper_swizzles`).
    pub fn for_release(minor: u32, swizzle: bool) -> Mxfp4Rules {
        Mxfp4Rules {
            swizzle,
            value_pad64: matches!(minor, 19..=21),
            frees_loaded_scales: minor >= 25,
            scale_pad4: minor >= 26,
            trtllm_width_round: if minor >= 27 { 128 } else { 256 },
        }
    }
}

/// What a release's deepseek_v2.py and MLA layer do differently from 0.19's
/// (docs/reading/vllm-deepseek-v2-runner.md, read in the 0.23.0 to 0.33.0 wheels).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MlaModelRules {
    /// Layer 0 clones the embedding into the residual (`residual = hidden_states.clone()`,
    /// 0.23.0 deepseek_v2.py L1178); from 0.25.1 the embedding is the residual (L1282).
    pub layer0_clone: bool,
    /// From 0.27.1 `kv_a_layernorm` runs right after `q_a_layernorm`, before `q_b_proj` or
    /// `q_proj` (layers/mla.py L176-194).
    pub kv_norm_first: bool,
    /// From 0.27.1 a router of one group (DeepSeek-V2-Lite: `n_group` = `topk_group` = 1) is
    /// made a `FusedTopKRouter` (router/router_factory.py L148-196): `fused_topk`'s `[M, k]`
    /// f32 weights, i32 ids and i32 token indices, not the grouped chain.
    pub one_group_fused_topk: bool,
}

impl MlaModelRules {
    /// 0.11 to 0.24.
    pub const BEFORE_0_25: MlaModelRules = MlaModelRules {
        layer0_clone: true,
        kv_norm_first: false,
        one_group_fused_topk: false,
    };

    /// The rules of V1 release `0.minor`.
    pub fn for_minor(minor: u32) -> MlaModelRules {
        MlaModelRules {
            layer0_clone: minor < 25,
            kv_norm_first: minor >= 27,
            one_group_fused_topk: minor >= 27,
        }
    }
}

/// What a release's Gated DeltaNet (Qwen3-Next) does in V1's profile run and at load, where it
/// differs from 0.11's (docs/reading/vllm-qwen3-next-v1.md §1-3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GdnRules {
    /// From 0.15 only `gdn_attention_core` returns early without attention metadata: the
    /// layer's projections, the reordering copies, `mixed_qkv`, the zeroed `core_attn_out`,
    /// the gated norm and `out_proj` run in the profile run (0.15.1 models/qwen3_next.py
    /// L440-495; 0.19.0 layers/mamba/gdn_linear_attn.py L489-565). 0.10/0.11 return before
    /// any of it (0.11.0 qwen3_next.py L401-403).
    pub profile_projections: bool,
    /// 0.10.2 merges `in_proj_qkvz` and `in_proj_ba` into one `in_proj` (0.10.2
    /// models/qwen3_next.py L256-261, one GEMM); from 0.11 they are two weights and two GEMMs
    /// (0.11.0 L247-260, L424-427; 0.19.0 gdn_linear_attn.py L370-417, L514-515).
    pub split_in_proj: bool,
    /// 0.15.1 makes `A_log` without a dtype, so in the model dtype (qwen3_next.py L338-342);
    /// 0.11 and 0.19 in f32.
    pub a_log_in_act: bool,
    /// 0.19's prefill-kernel warm-up inside the op on the first metadata-less call of each
    /// layer (`_warmup_prefill_kernels`, gdn_linear_attn.py L567-665): `None` before 0.19.
    pub warmup: Option<GdnWarmup>,
    /// From 0.21 the warm-up is one pass of 64 tokens whose q, k, v, g and beta come from
    /// `fused_post_conv_prep` (g and beta in f32), the rule's in-kernel l2norm off (0.21.0
    /// layers/mamba/gdn_linear_attn.py L883-985); 0.19 runs three passes of 16, 32 and 64.
    pub warmup_post_conv: bool,
    /// From 0.21 the gated norm and `out_proj` run in `_output_projection`, so the zeroed
    /// `core_attn_out` stays referenced by `forward_cuda` until it returns (0.21.0
    /// gdn_linear_attn.py L665-683, L725-782); 0.15 and 0.19 rebind it at the norm.
    pub zeros_live_to_return: bool,
    /// The decoder layer's `self_attention_output = torch.empty_like(hidden_states)` that the
    /// mixers write into (0.10.2 to 0.25.1); from 0.26 the mixers return their `out_proj` /
    /// `o_proj` output (0.26.0 models/qwen3_next.py L389-400, L492-570).
    pub layer_output_buffer: bool,
    /// From 0.24 the gated attention's split, q/k norms and rotary run as one Triton kernel
    /// on CUDA for a text-only model (`fused_qk_rmsnorm_rope_gate`, 0.24.0
    /// models/qwen3_next.py L300-340; layers/fused_qk_norm_rope.py L155-162): `q_out`, `k_out`
    /// and `gate_out` replace the split's copies and the norms' outputs; `Some(true)` where
    /// the call also makes the norms' `(1 + w)` in f32 (`weight.float() + 1.0`, to 0.28).
    pub fused_qk_norm_rope_gate: Option<bool>,
    /// From 0.28 a hybrid model's prefix caching is on by default, so the state layers' cache
    /// mode is "align" (0.28.0 engine/arg_utils.py L2646-2650, config/model.py L2071-2073,
    /// models/config.py L602-610): a request holds two state pages of each state group
    /// (v1/kv_cache_interface.py L687-696).
    pub prefix_caching_align: bool,
    /// 0.33 runs FlashInfer's prefill kernel twice more after the warm-up's call, for each
    /// `use_cp` (0.33.0 layers/mamba/gdn/qwen_gdn_linear_attn.py L1414-1415, L1450-1492;
    /// docs/reading/vllm-qwen3-next-mrv2.md §4).
    pub flashinfer_variants: bool,
}

/// Which prefill kernels 0.19's warm-up runs (`ChunkGatedDeltaRule.__init__`,
/// gdn_linear_attn.py L114-151: FlashInfer on compute capability 9.0 exactly, FLA's Triton
/// kernels elsewhere).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GdnWarmup {
    /// `fi_chunk_gated_delta_rule` (L63-109).
    FlashInfer,
    /// `fla_chunk_gated_delta_rule` (fla/ops/chunk.py L24-103), whose `@triton.autotune`d
    /// kernels benchmark every config on their first call in the process.
    Triton,
}

impl GdnRules {
    /// 0.10 and 0.11 (the runtime's default).
    pub const V0_11: GdnRules = GdnRules {
        profile_projections: false,
        split_in_proj: true,
        a_log_in_act: false,
        warmup: None,
        warmup_post_conv: false,
        zeros_live_to_return: false,
        layer_output_buffer: true,
        fused_qk_norm_rope_gate: None,
        prefix_caching_align: false,
        flashinfer_variants: false,
    };

    /// The rules of V1 release `0.minor` on a GPU of compute capability `major`.minor
    /// (`sm90`: exactly 9.0).
    pub fn for_minor(minor: u32, sm90: bool) -> GdnRules {
        GdnRules {
            profile_projections: minor >= 15,
            split_in_proj: minor >= 11,
            a_log_in_act: minor == 15,
            warmup: (minor >= 19).then_some(if sm90 {
                GdnWarmup::FlashInfer
            } else {
                GdnWarmup::Triton
            }),
            warmup_post_conv: minor >= 21,
            zeros_live_to_return: minor >= 21,
            layer_output_buffer: minor < 26,
            fused_qk_norm_rope_gate: (minor >= 24).then_some(minor < 29),
            prefix_caching_align: minor >= 28,
            flashinfer_variants: minor >= 33,
        }
    }
}

/// How a release makes its online fp8 experts' scales at load (`quant::fp8_moe`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum OnlineScales {
    /// 0.19.0 to 0.27.1: each expert quantized with a dynamic scale (`scaled_fp8_quant` with
    /// `scale=None`: its codes and a `[1]` f32 scale, freed once copied).
    #[default]
    Dynamic,
    /// 0.28.0 on (online/fp8.py 0.28.0 L565-605, 0.33.0 L617-660): each stack's per-expert
    /// `weight_amax` (`aminmax`'s `lo`, `hi` `[E]`, their `abs()`, the `maximum` kept), max
    /// all-reduced over the tensor-parallel ranks, then `_fp8_scale` (an f32 cast, a 0-d 448,
    /// the `[E]` f32 scale), and each expert quantized with its static scale (codes only).
    /// `early_free`: 0.33.0's `replace_parameter` rebinds `.data`, so the 16-bit stacks go
    /// inside `_setup_kernel`, before the `[E]` amax locals (utils.py L119-139).
    Amax { early_free: bool },
}

impl OnlineScales {
    /// The scales of V1 release `0.minor`.
    pub fn for_minor(minor: u32) -> OnlineScales {
        match minor {
            ..=27 => OnlineScales::Dynamic,
            m => OnlineScales::Amax {
                early_free: m >= 33,
            },
        }
    }
}
