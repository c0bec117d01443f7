//! vLLM's KV-cache budget formulas as pure functions of measured numbers (../FORMULAS.md).
//! Each yields `non_kv`, the memory kept away from the KV cache; KV = T·u − non_kv.

use serde::{Deserialize, Serialize};

/// Device and framework-allocator numbers at one checkpoint.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    pub time_us: u64,
    /// F(t): device-wide free memory.
    pub free: u64,
    /// T.
    pub total: u64,
    /// A(t).
    pub allocated: u64,
    /// Â since the last reset.
    pub allocated_peak: u64,
    /// R(t).
    pub reserved: u64,
    pub reserved_peak: u64,
    /// This process's device memory.
    pub process_used: u64,
}

impl Checkpoint {
    /// U(t) = T − F(t).
    pub fn used(&self) -> u64 {
        self.total - self.free
    }
}

/// t0: instance created; t1: before the profile pass (after load, empty_cache, reset_peak);
/// t2: after the pass(es), synchronized; t3: after empty_cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoints {
    pub t0: Checkpoint,
    pub t1: Checkpoint,
    pub t2: Checkpoint,
    pub t3: Checkpoint,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FormulaId {
    V0_6_3,
    Pr9352,
    Pr9516,
    Pr10511,
    Pr12126,
    /// Not in `ALL`: listed only in a report of a release that applies it (0.27 on), so the
    /// reports of every earlier release keep their five formulas.
    Pr49208,
}

impl FormulaId {
    pub const ALL: [FormulaId; 5] = [
        FormulaId::V0_6_3,
        FormulaId::Pr9352,
        FormulaId::Pr9516,
        FormulaId::Pr10511,
        FormulaId::Pr12126,
    ];

    pub fn key(self) -> &'static str {
        match self {
            FormulaId::V0_6_3 => "v0_6_3",
            FormulaId::Pr9352 => "pr9352",
            FormulaId::Pr9516 => "pr9516",
            FormulaId::Pr10511 => "pr10511",
            FormulaId::Pr12126 => "pr12126",
            FormulaId::Pr49208 => "pr49208",
        }
    }

    pub fn title(self) -> &'static str {
        match self {
            FormulaId::V0_6_3 => "v0.6.3 free-memory drop",
            FormulaId::Pr9352 => "#9352 activation-release (old)",
            FormulaId::Pr9516 => "#9516 total-minus-torch (new)",
            FormulaId::Pr10511 => "#10511 per-instance",
            FormulaId::Pr12126 => "#12126 reserved-based (V1)",
            FormulaId::Pr49208 => "#49208 consumed + transient headroom (V1, 0.27 on)",
        }
    }

    pub fn short(self) -> &'static str {
        match self {
            FormulaId::V0_6_3 => "v0.6.3",
            FormulaId::Pr9352 => "#9352 old",
            FormulaId::Pr9516 => "#9516 new",
            FormulaId::Pr10511 => "#10511",
            FormulaId::Pr12126 => "#12126",
            FormulaId::Pr49208 => "#49208",
        }
    }

    /// Whether the budget is ceil(T·u) (V1's `request_memory`) rather than floored.
    pub fn ceils_budget(self) -> bool {
        matches!(self, FormulaId::Pr12126 | FormulaId::Pr49208)
    }
}

/// The terms a formula computes (bytes; signed where a difference can go negative).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Terms {
    /// Framework peak term (Â, or its increase over A(t1)).
    pub torch_peak_bytes: i64,
    /// Non-framework term.
    pub non_torch_bytes: i64,
    /// Weights counted separately (#10511, #12126), else 0 (already inside Â).
    pub weights_term_bytes: i64,
    pub non_kv_bytes: i64,
    /// KV budget: T·u − non_kv (ceil(T·u) for #12126).
    pub kv_bytes: i64,
}

fn i(x: u64) -> i64 {
    x as i64
}

/// `T·u`, floored as vLLM's `int(total * util)` (or ceiled where #12126 does).
pub fn budget(total: u64, util: f64, ceil: bool) -> i64 {
    let b = total as f64 * util;
    (if ceil { b.ceil() } else { b.floor() }) as i64
}

pub fn evaluate(id: FormulaId, c: &Checkpoints, weights: u64, util: f64) -> Terms {
    let (t0, t1, t2, t3) = (&c.t0, &c.t1, &c.t2, &c.t3);
    let total = t0.total;
    let (torch, non_torch, w, ceil) = match id {
        // v0.6.3 (before #9352): the drop in free memory from instance start to after the pass,
        // read before empty_cache, so cached blocks count.
        FormulaId::V0_6_3 => (0, i(t0.free) - i(t2.free), 0, false),
        // #9352: non-torch = drop in free memory across the pass, after empty_cache; anything of
        // the framework that survives the pass is in Â *and* in that drop (double count).
        FormulaId::Pr9352 => (
            i(t3.allocated_peak),
            (i(t1.free) - i(t3.free)).max(0),
            0,
            false,
        ),
        // #9516: non-torch = device used − framework allocated, at the end.
        FormulaId::Pr9516 => (
            i(t3.allocated_peak),
            (i(t3.used()) - i(t3.allocated)).max(0),
            0,
            false,
        ),
        // #10511: increases over this instance's own baseline B = T − F(t0).
        FormulaId::Pr10511 => {
            let baseline = i(total) - i(t0.free);
            let non_torch_inc =
                i(t3.used()) - baseline - i(weights) - (i(t3.allocated) - i(t1.allocated));
            (
                i(t3.allocated_peak) - i(t1.allocated),
                non_torch_inc,
                i(weights),
                false,
            )
        }
        // #12126 / V1: non-torch(t) = U(t) − R(t), its increase from t0 to t3.
        FormulaId::Pr12126 => {
            let nt = |c: &Checkpoint| i(c.used()) - i(c.reserved);
            (
                i(t3.allocated_peak) - i(t1.allocated),
                nt(t3) - nt(t0),
                i(weights),
                true,
            )
        }
        // #49208 (0.27.1 utils/mem_utils.py:314-326): total consumed = free memory at the
        // baseline minus after the profile (weights, every tensor that survives, the
        // allocator's cached segments, memory outside PyTorch), plus the transient headroom
        // Â − A(t3). Held as weights + the rest, so the terms add up as the others do.
        FormulaId::Pr49208 => {
            let consumed = i(t0.free) - i(t3.free);
            (
                i(t3.allocated_peak) - i(t3.allocated),
                consumed - i(weights),
                i(weights),
                true,
            )
        }
    };
    let non_kv = torch + non_torch + w;
    Terms {
        torch_peak_bytes: torch,
        non_torch_bytes: non_torch,
        weights_term_bytes: w,
        non_kv_bytes: non_kv,
        kv_bytes: budget(total, util, ceil) - non_kv,
    }
}

/// KV-cache geometry (vLLM's `CacheEngine.get_cache_block_size`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvGeometry {
    pub block_size: u64,
    pub num_layers: u64,
    pub num_kv_heads: u64,
    pub head_dim: u64,
    pub dtype_bytes: u64,
    pub max_model_len: u64,
    /// V1's hybrid KV cache manager, for a model with sliding-window and full-attention
    /// layers (absent: every layer holds every block, as V0 and V1 without sliding layers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hybrid: Option<HybridKv>,
    /// Multi-head latent attention (DeepSeek, Kimi): a page holds one latent per token
    /// (`num_kv_heads` 1, `head_dim` the latent's width) and no separate V
    /// (`MLAAttentionSpec`, 0.19 v1/kv_cache_interface.py L191-206).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub latent: bool,
}

/// V1's hybrid KV cache manager (on by default on a GPU since it exists; 0.15.1 and 0.19.0
/// vllm/config/vllm.py L1190-1240) for a model whose layers are sliding-window and
/// full attention of one page size (Gemma 2 and 3). The layers of each attention type are
/// split into KV cache groups of `group_size` layers (0.19.0 v1/core/kv_cache_utils.py
/// L1043-1078: the fewest layers of one type, or the most when those are under 1.5 times the
/// fewest; the last group of a type padded); `group_size` tensors of `num_blocks` pages are
/// allocated, each shared by one layer of every group (L1119-1144), so a block is
/// `group_size` pages, and one block of every group holds `block_size` tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HybridKv {
    pub group_size: u64,
    pub full_groups: u64,
    pub sliding_groups: u64,
    pub sliding_window: u64,
    /// The scheduler's `max_num_batched_tokens` (a sliding group's most blocks per request).
    pub max_num_batched_tokens: u64,
    /// Groups of chunked local attention layers (`ChunkedLocalAttentionSpec`, Llama 4's RoPE
    /// layers), each a separate type from the full ones (0.19.0 v1/core/kv_cache_utils.py
    /// L1043-1078): Scout's 36 chunked and 12 full layers make groups of 12, three chunked
    /// and one full (the grouping #21761 describes). 0 for sliding-window models.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub chunked_groups: u64,
    /// `attention_chunk_size`: a chunked group holds at most `chunk + max_num_batched_tokens`
    /// tokens of a request (`ChunkedLocalAttentionSpec.max_memory_usage_bytes`, 0.19.0
    /// v1/kv_cache_interface.py L229-244; no extra block, unlike a window).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub attention_chunk_size: u64,
    /// Groups of state layers (mamba-like: Qwen3-Next's Gated DeltaNet), each layer's page
    /// one sequence's conv and recurrent state padded to the attention page
    /// (`MambaSpec`, 0.10.2 v1/kv_cache_interface.py L192-213): a request holds one block of
    /// each such group whatever its length.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub mamba_groups: u64,
    /// The state layers' cache mode is "align" (prefix caching on, 0.28 on): a request holds
    /// two pages of each state group (`MambaSpec.max_memory_usage_bytes`, 0.28.0
    /// v1/kv_cache_interface.py L687-696).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub mamba_align: bool,
}

fn is_zero(x: &u64) -> bool {
    *x == 0
}

impl HybridKv {
    /// The groups of a model of `full` full-attention and `sliding` sliding-window layers
    /// (`None` unless both kinds are there: a uniform model has one group).
    pub fn of_layers(
        full: u64,
        sliding: u64,
        sliding_window: u64,
        max_num_batched_tokens: u64,
    ) -> Option<HybridKv> {
        if full == 0 || sliding == 0 {
            return None;
        }
        let (fewest, most) = (full.min(sliding), full.max(sliding));
        // `max_num_layers < min_num_layers * 1.5`, in integers.
        let group_size = if 2 * most < 3 * fewest { most } else { fewest };
        Some(HybridKv {
            group_size,
            full_groups: full.div_ceil(group_size),
            sliding_groups: sliding.div_ceil(group_size),
            sliding_window,
            max_num_batched_tokens,
            chunked_groups: 0,
            attention_chunk_size: 0,
            mamba_groups: 0,
            mamba_align: false,
        })
    }

    /// The groups of a model of `full` full-attention and `chunked` chunked local attention
    /// layers (Llama 4), by the same rule as `of_layers`; `None` unless both kinds are there.
    pub fn of_chunked_layers(
        full: u64,
        chunked: u64,
        attention_chunk_size: u64,
        max_num_batched_tokens: u64,
    ) -> Option<HybridKv> {
        let h = HybridKv::of_layers(full, chunked, 1, max_num_batched_tokens)?;
        Some(HybridKv {
            chunked_groups: h.sliding_groups,
            sliding_groups: 0,
            sliding_window: 0,
            attention_chunk_size,
            ..h
        })
    }

    /// The groups of a hybrid model of `full` full-attention and `state` state layers
    /// (Qwen3-Next: 12 and 36), the group size chosen as for sliding layers (0.10.2
    /// v1/core/kv_cache_utils.py L981: the fewest layers of one type; 0.19.0's 1.5× rule
    /// gives the same for every published hybrid) and the last group of a type padded.
    /// `None` unless both kinds are there.
    pub fn of_state_layers(full: u64, state: u64, max_num_batched_tokens: u64) -> Option<HybridKv> {
        let base = HybridKv::of_layers(full, state, 0, max_num_batched_tokens)?;
        Some(HybridKv {
            mamba_groups: base.sliding_groups,
            sliding_groups: 0,
            ..base
        })
    }

    pub fn groups(&self) -> u64 {
        self.full_groups + self.sliding_groups + self.chunked_groups + self.mamba_groups
    }
}

/// One state layer's page for one sequence as V1's `MambaSpec.page_size_bytes` counts it
/// (0.10.2 v1/kv_cache_interface.py L199-207): the conv state and the recurrent state, each
/// `elements × dtype bytes`, before any padding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MambaPage {
    pub conv_elements: u64,
    pub ssm_elements: u64,
    pub dtype_bytes: u64,
}

impl MambaPage {
    pub fn bytes(&self) -> u64 {
        (self.conv_elements + self.ssm_elements) * self.dtype_bytes
    }
}

/// What `HybridAttentionMambaModelConfig.verify_and_update_config` decides (0.10.2
/// model_executor/models/config.py L327-414; 0.11.0 L314-401): the attention block size and
/// the state page padded to the attention page.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HybridPages {
    pub block_size: u64,
    /// The block size was raised to it ("Setting attention block size to N tokens").
    pub block_size_set: bool,
    /// The attention page, which every state page is padded to.
    pub page_bytes: u64,
    /// `100 · (attention page − state page) / state page`, when they differ.
    pub padding_pct: Option<f64>,
    /// What the release logs about prefix caching for a hybrid model.
    pub prefix_caching: HybridPrefixCaching,
}

/// A hybrid model's prefix caching as the release sets it and logs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HybridPrefixCaching {
    /// 0.10.2 and 0.11 turn it off and say so (0.11.0 models/config.py L295-298).
    Disabled,
    /// 0.15 to 0.27 leave it off by default without a line (`is_prefix_caching_supported`
    /// False for hybrids, 0.19.0 config/model.py L1785-1790; 0.26.0 arg_utils L2520-2522).
    OffByDefault,
    /// 0.28 turns it on, the state layers' cache mode "align" (0.28.0 models/config.py
    /// L602-610), naming the architecture.
    Align(&'static str),
}

/// The attention block size a hybrid model runs with: the smallest multiple of 16 tokens whose
/// attention page (`attn_bytes_per_token` × tokens) holds a state page (`16 ·
/// cdiv(mamba_page, 16 · attn_page_1_token)`, L381-382; FlashAttention takes block sizes in
/// multiples of 16), taken when the block size asked (`requested`) is smaller (L387-389); then
/// the state page padded to the attention page.
pub fn hybrid_pages(attn_bytes_per_token: u64, mamba: MambaPage, requested: u64) -> HybridPages {
    hybrid_pages_aligned(attn_bytes_per_token, mamba, requested, 16)
}

/// `hybrid_pages` with the block a multiple of `align` tokens: 16 to 0.19; from 0.21
/// `Platform._align_hybrid_block_size` aligns to the larger of the backend's smallest kernel
/// block (16 for FlashAttention and FlashInfer) and the block size asked (0.21.0
/// platforms/interface.py L613-650), so `--block-size 64` gives 576 tokens where 0.19 gives 544.
pub fn hybrid_pages_aligned(
    attn_bytes_per_token: u64,
    mamba: MambaPage,
    requested: u64,
    align: u64,
) -> HybridPages {
    let m = mamba.bytes();
    let align = align.max(1);
    let per = align * attn_bytes_per_token.max(1);
    let needed = align * m.div_ceil(per);
    let block_size_set = requested < needed;
    let block_size = if block_size_set { needed } else { requested };
    let page_bytes = block_size * attn_bytes_per_token;
    HybridPages {
        block_size,
        block_size_set,
        page_bytes,
        padding_pct: (page_bytes != m && m > 0).then(|| 100.0 * (page_bytes - m) as f64 / m as f64),
        prefix_caching: HybridPrefixCaching::Disabled,
    }
}

impl HybridPages {
    /// The lines vLLM logs for it, as it words them (L310-311, L390-393, L411-414).
    pub fn log_lines(&self) -> Vec<String> {
        let mut out = match self.prefix_caching {
            HybridPrefixCaching::Disabled => vec![
                "Hybrid or mamba-based model detected: disabling prefix caching since it is not yet supported.".to_string(),
            ],
            HybridPrefixCaching::OffByDefault => Vec::new(),
            HybridPrefixCaching::Align(arch) => vec![format!(
                "Mamba cache mode is set to 'align' for {arch} by default when prefix caching is enabled"
            )],
        };
        if self.block_size_set {
            out.push(format!(
                "Setting attention block size to {} tokens to ensure that attention page size is >= mamba page size.",
                self.block_size
            ));
        }
        if let Some(p) = self.padding_pct {
            out.push(format!(
                "Padding mamba page size by {p:.2}% to ensure that mamba page size and attention page size are exactly equal."
            ));
        }
        out
    }
}

impl KvGeometry {
    /// The KV cache as V1's `initialize_kv_cache` allocates it: one tensor per layer (the
    /// graph capture's, the estimator's and the warm-up's caches).
    pub(crate) fn allocate(
        &self,
        rt: &crate::engine::runtime::Runtime,
        dtype: crate::engine::tensor::DType,
        blocks: u64,
        label: &str,
    ) -> crate::base::error::Result<Vec<crate::engine::tensor::Tensor>> {
        rt.set_op("kv_cache");
        rt.set_layer(None);
        let shape = self.tensor_shape(blocks);
        (0..self.tensors().max(1))
            .map(|l| {
                rt.reserve(
                    format!("kv-cache[{label}].layer{l}"),
                    crate::memory::Category::KvCache,
                    &shape,
                    dtype,
                )
            })
            .collect()
    }

    /// One layer's page: 2 (K and V) × block_size × kv_heads × head_dim × dtype bytes; MLA's
    /// one latent plane: block_size × latent width × dtype bytes.
    pub fn page_bytes(&self) -> u64 {
        let planes = if self.latent { 1 } else { 2 };
        planes * self.block_size * self.num_kv_heads * self.head_dim * self.dtype_bytes
    }

    /// One KV cache tensor of `blocks` blocks: `[2, blocks, block_size, kv_heads, head_dim]`,
    /// or MLA's one plane `[1, blocks, block_size, 1, 576]` (0.19 mla_attention.py
    /// L1130-1137: `(blocks, block_size, 576)`).
    pub fn tensor_shape(&self, blocks: u64) -> [usize; 5] {
        [
            if self.latent { 1 } else { 2 },
            blocks as usize,
            self.block_size as usize,
            self.num_kv_heads as usize,
            self.head_dim as usize,
        ]
    }

    /// Bytes per block: a page of every layer (V0's `get_cache_block_size`), or of every
    /// layer of one group under V1's hybrid manager (`available // page // group_size`).
    pub fn block_bytes(&self) -> u64 {
        self.page_bytes() * self.tensors()
    }

    /// KV cache tensors allocated: one per layer, or one per layer of a group (hybrid).
    pub fn tensors(&self) -> u64 {
        self.hybrid.map_or(self.num_layers, |h| h.group_size)
    }

    /// Tokens `blocks` hold as vLLM logs them: under the hybrid manager each group takes a
    /// block per `block_size` tokens (`num_blocks // len(groups) * block_size`, 0.19.0
    /// kv_cache_utils.py L1300-1304).
    pub fn tokens_of_blocks(&self, blocks: u64) -> u64 {
        match self.hybrid {
            Some(h) => blocks / h.groups().max(1) * self.block_size,
            None => blocks * self.block_size,
        }
    }

    /// V1's "Maximum concurrency for N tokens per request": blocks over the blocks one
    /// request of `max_model_len` tokens can hold, a sliding group holding at most
    /// `window − 1 + max_num_batched_tokens` tokens plus one block (0.19.0
    /// v1/kv_cache_interface.py L113-121, L251-270; kv_cache_utils.py L802-820).
    pub fn v1_max_concurrency(&self, blocks: u64) -> f64 {
        blocks as f64 / self.v1_request_blocks().max(1) as f64
    }

    /// The blocks one request of `max_model_len` tokens takes under V1 (every group's).
    pub fn v1_request_blocks(&self) -> u64 {
        let bs = self.block_size.max(1);
        let len = self.max_model_len.max(1);
        let full = len.div_ceil(bs);
        match self.hybrid {
            None => full,
            Some(h) => {
                let sliding_tokens =
                    (h.sliding_window.saturating_sub(1) + h.max_num_batched_tokens).min(len);
                let chunked_tokens = (h.attention_chunk_size + h.max_num_batched_tokens).min(len);
                h.full_groups * full
                    + h.sliding_groups * (sliding_tokens.div_ceil(bs) + 1)
                    + h.chunked_groups * chunked_tokens.div_ceil(bs)
                    + h.mamba_groups * if h.mamba_align { 2 } else { 1 }
            }
        }
    }

    /// V1's `_check_enough_kv_cache_memory` (0.19.0 v1/core/kv_cache_utils.py L619-653): the
    /// bytes one request of `max_model_len` tokens needs, and, when `kv_bytes` holds less, the
    /// longest `max_model_len` it would hold (`estimate_max_model_len`, a search over lengths;
    /// 0 when not even one token fits).
    pub fn v1_one_request(&self, kv_bytes: i64) -> (u64, Option<u64>) {
        let blocks = self.blocks(kv_bytes);
        let fits = |len: u64| {
            KvGeometry {
                max_model_len: len,
                ..*self
            }
            .v1_request_blocks()
                <= blocks
        };
        let needed = self.v1_request_blocks() * self.block_bytes();
        if fits(self.max_model_len) {
            return (needed, None);
        }
        let (mut lo, mut hi) = (0u64, self.max_model_len);
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            if fits(mid) {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        (needed, Some(lo))
    }

    /// Blocks that fit in `kv_bytes` (0 when the budget is negative).
    pub fn blocks(&self, kv_bytes: i64) -> u64 {
        if kv_bytes <= 0 || self.block_bytes() == 0 {
            0
        } else {
            kv_bytes as u64 / self.block_bytes()
        }
    }

    pub fn tokens(&self, kv_bytes: i64) -> u64 {
        self.tokens_of_blocks(self.blocks(kv_bytes))
    }

    /// Requests of `max_model_len` tokens that fit at once (V0's tokens over length; under
    /// V1's hybrid manager, V1's count, the sliding layers holding only their window).
    pub fn max_concurrency(&self, kv_bytes: i64) -> f64 {
        match self.hybrid {
            Some(_) => self.v1_max_concurrency(self.blocks(kv_bytes)),
            None => self.tokens(kv_bytes) as f64 / self.max_model_len.max(1) as f64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;

    fn cp(total: u64, free: u64, alloc: u64, peak: u64, reserved: u64) -> Checkpoint {
        Checkpoint {
            total,
            free,
            allocated: alloc,
            allocated_peak: peak,
            reserved,
            ..Default::default()
        }
    }

    /// vLLM `test_profile.py` under #9352: a mocked 10 GiB GPU where free = 10 GiB − A, so
    /// tensors surviving the pass appear both in Â and in the free-memory drop.
    #[test]
    fn old_formula_double_counts_surviving_tensors() {
        let t = 10 * GIB;
        let w = 2 * GIB;
        let surviving = 8 * MIB;
        let peak = w + GIB;
        let c = Checkpoints {
            t0: cp(t, t, 0, 0, 0),
            t1: cp(t, t - w, w, w, w),
            t2: cp(t, t - w - surviving, w + surviving, peak, w + surviving),
            t3: cp(t, t - w - surviving, w + surviving, peak, w + surviving),
        };
        let old = evaluate(FormulaId::Pr9352, &c, w, 0.9);
        let new = evaluate(FormulaId::Pr9516, &c, w, 0.9);
        assert_eq!(old.non_torch_bytes, surviving as i64);
        assert_eq!(new.non_torch_bytes, 0);
        assert_eq!(new.kv_bytes - old.kv_bytes, surviving as i64);
        assert_eq!(new.kv_bytes, (t as f64 * 0.9) as i64 - peak as i64);
    }

    /// vLLM `test_memory_profiling` (#10511): 512 MiB held before the instance, 512 MiB weights,
    /// a 1 GiB spike, 256 MiB outside the framework during the pass.
    #[test]
    fn per_instance_formula_separates_other_processes() {
        let t = 80 * GIB;
        let before = 512 * MIB;
        let w = 512 * MIB;
        let nccl = 256 * MIB;
        let c = Checkpoints {
            t0: cp(t, t - before, 0, 0, 0),
            t1: cp(t, t - before - w, w, w, w),
            t2: cp(t, t - before - w - GIB - nccl, w, w + GIB, w + GIB),
            t3: cp(t, t - before - w - nccl, w, w + GIB, w),
        };
        let r = evaluate(FormulaId::Pr10511, &c, w, 0.9);
        assert_eq!(r.torch_peak_bytes, GIB as i64);
        assert_eq!(r.non_torch_bytes, nccl as i64);
        assert_eq!(r.non_kv_bytes, (GIB + nccl + w) as i64);
        // #9516 charges the other process's 512 MiB to this instance (vLLM issue #10451).
        let new = evaluate(FormulaId::Pr9516, &c, w, 0.9);
        assert_eq!(new.non_torch_bytes, (before + nccl) as i64);
        let v1 = evaluate(FormulaId::Pr12126, &c, w, 0.9);
        assert_eq!(v1.non_torch_bytes, nccl as i64);
        assert_eq!(
            v1.kv_bytes,
            (t as f64 * 0.9).ceil() as i64 - (GIB + nccl + w) as i64
        );
        let v063 = evaluate(FormulaId::V0_6_3, &c, w, 0.9);
        assert_eq!(v063.non_kv_bytes, (w + GIB + nccl) as i64);
    }

    #[test]
    fn kv_geometry_of_llama_3_8b() {
        let g = KvGeometry {
            block_size: 16,
            num_layers: 32,
            num_kv_heads: 8,
            head_dim: 128,
            dtype_bytes: 2,
            max_model_len: 8192,
            hybrid: None,
            latent: false,
        };
        assert_eq!(g.block_bytes(), 2 * MIB);
        assert_eq!(g.blocks(10 * GIB as i64 + 1), 5120);
        assert_eq!(g.tokens(10 * GIB as i64), 81920);
        assert_eq!(g.max_concurrency(10 * GIB as i64), 10.0);
        assert_eq!(g.blocks(-5), 0);
    }

    /// DeepSeek-V2-Lite's latent cache: 27 layers × 576 values × 2 bytes = 31,104 bytes a
    /// token (0.19 v1/kv_cache_interface.py L191-206: one plane, no V), a ninth of what 16
    /// heads of K and V at 192 would take.
    #[test]
    fn an_mla_page_holds_one_latent_per_token() {
        let g = KvGeometry {
            block_size: 64,
            num_layers: 27,
            num_kv_heads: 1,
            head_dim: 576,
            dtype_bytes: 2,
            max_model_len: 8192,
            hybrid: None,
            latent: true,
        };
        assert_eq!(g.page_bytes(), 73_728);
        assert_eq!(g.block_bytes() / g.block_size, 31_104);
    }

    /// Gemma 3 12B under V1's hybrid manager: 8 global and 40 sliding layers (pattern 6) make
    /// groups of 8 layers, 1 full and 5 sliding; a block is 8 pages of 128 KiB. The tokens
    /// logged equal V0's (every group takes a block per 16 tokens), but a 128k-token request
    /// needs 8192 full blocks and 5 × 577 sliding ones, not 48 layers' worth of 8192.
    #[test]
    fn hybrid_groups_share_blocks_and_sliding_groups_hold_only_their_window() {
        let h = HybridKv::of_layers(8, 40, 1024, 8192).unwrap();
        assert_eq!((h.group_size, h.full_groups, h.sliding_groups), (8, 1, 5));
        let g = KvGeometry {
            block_size: 16,
            num_layers: 48,
            num_kv_heads: 8,
            head_dim: 256,
            dtype_bytes: 2,
            max_model_len: 131072,
            hybrid: Some(h),
            latent: false,
        };
        assert_eq!(g.page_bytes(), 128 * 1024);
        assert_eq!(g.block_bytes(), MIB);
        assert_eq!(g.tensors(), 8);
        let kv = 10 * GIB as i64;
        assert_eq!(g.blocks(kv), 10240);
        assert_eq!(g.tokens(kv), 10240 / 6 * 16);
        let v0 = KvGeometry { hybrid: None, ..g };
        assert_eq!(v0.tokens(kv), g.tokens(kv));
        // min(1023 + 8192, 131072) = 9215 tokens: 576 blocks, plus one for the window's start.
        assert_eq!(
            g.v1_max_concurrency(10240),
            10240.0 / (8192.0 + 5.0 * 577.0)
        );
        assert_eq!(g.max_concurrency(kv), g.v1_max_concurrency(10240));
        // Without the hybrid manager the same memory serves 1706 / 8192 of such a request.
        assert_eq!(v0.blocks(kv), 1706);
        assert_eq!(v0.v1_max_concurrency(1706), 1706.0 / 8192.0);
        // Gemma 2 (21 + 21 layers) is one group of each; a uniform model has none.
        let g2 = HybridKv::of_layers(21, 21, 4096, 2048).unwrap();
        assert_eq!(
            (g2.group_size, g2.full_groups, g2.sliding_groups),
            (21, 1, 1)
        );
        // 12 + 13 layers: the most, 13, under 1.5 × 12, is the group size (gpt-oss's case).
        assert_eq!(
            HybridKv::of_layers(13, 12, 128, 8192).unwrap().group_size,
            13
        );
        assert_eq!(HybridKv::of_layers(32, 0, 4096, 8192), None);
    }

    /// Llama 4 Scout under 0.19's hybrid manager: 36 chunked and 12 full layers make four
    /// groups of 12 (three chunked, one full: #21761's listing), 12 tensors; a request of
    /// 131072 tokens takes 8192 blocks in the full group and (8192 + 8192) / 16 = 1024 in
    /// each chunked one.
    #[test]
    fn chunked_local_groups_hold_at_most_a_chunk_and_a_batch() {
        let h = HybridKv::of_chunked_layers(12, 36, 8192, 8192).unwrap();
        assert_eq!(
            (
                h.group_size,
                h.full_groups,
                h.chunked_groups,
                h.sliding_groups
            ),
            (12, 1, 3, 0)
        );
        let g = KvGeometry {
            block_size: 16,
            num_layers: 48,
            num_kv_heads: 8,
            head_dim: 128,
            dtype_bytes: 2,
            max_model_len: 131072,
            hybrid: Some(h),
            latent: false,
        };
        assert_eq!(g.tensors(), 12);
        assert_eq!(g.v1_request_blocks(), 8192 + 3 * 1024);
        assert_eq!(g.tokens_of_blocks(4000), 1000 * 16);
        // Without the manager (0.11.0) every layer holds every token.
        assert_eq!(KvGeometry { hybrid: None, ..g }.v1_request_blocks(), 8192);
        // A sliding model's groups serialize as before: no chunked keys.
        let s = serde_json::to_string(&HybridKv::of_layers(8, 40, 1024, 8192).unwrap()).unwrap();
        assert!(!s.contains("chunk"), "{s}");
    }
}
