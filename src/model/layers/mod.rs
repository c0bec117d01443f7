//! The layer kinds the family files compose, as vLLM's `model_executor/layers/` holds them:
//! linear layers and their tensor-parallel cuts, attention, the gated MLP, the sparse
//! mixture-of-experts block, norms and rotary embeddings. Each allocates through
//! `engine::ops` in the order vLLM's layer does, so a dry run's trace equals the GPU's.

pub mod attention;
pub mod attention_llama4;
pub mod decoder;
pub mod gdn;
pub mod linear;
pub mod mla;
pub mod mlp;
pub mod moe;
pub mod moe_deepseek;
pub mod moe_llama4;
pub mod norm;
pub mod pp;
pub mod rotary;
pub mod tp;
