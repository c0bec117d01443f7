//! The engine a model runs on: tensors, the runtime (a device, the framework allocator, the
//! event log, the scope of each allocation, cancel and progress), and the device-agnostic ops
//! that allocate through the framework and then compute on the CPU, on CUDA or not at all
//! (dry), so that every device makes the same allocation sequence.
//!
//! May import: `device`, `memory`, `base`.

pub(crate) mod moe_configs;
pub(crate) mod moe_configs_fp8_block;
pub(crate) mod moe_configs_fp8_tensor;
pub mod ops;
pub mod ops_gdn;
pub mod ops_gemma;
pub mod ops_gpt_oss;
pub mod ops_granite;
pub mod ops_grouped_topk;
pub mod ops_kimi_vl;
pub mod ops_llama4;
pub mod ops_llama4_vision;
pub mod ops_llava;
pub mod ops_mla;
pub mod ops_moe;
pub mod ops_moe_fp8;
pub mod ops_moe_v1;
pub mod ops_opt;
pub mod ops_phi;
pub mod ops_pixtral;
pub mod ops_qwen2_5_vl;
pub mod ops_siglip;
pub mod ops_tp;
pub mod progress;
pub mod rules;
pub mod runtime;
pub mod tensor;
