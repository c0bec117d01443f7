//! What the user asked for: one profile run.

use serde::{Deserialize, Serialize};

use crate::device::DeviceSpec;
use crate::error::{Error, Result};
use crate::model::ModelSource;
use crate::quant::Quant;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProfileRequest {
    pub model: ModelSource,
    pub quant: Quant,
    pub device: DeviceSpec,
    /// Tokens in the profile batch (vLLM's `max_num_batched_tokens`).
    pub tokens: usize,
    /// Sequences the tokens are split into (`max_num_seqs`).
    pub seqs: usize,
    pub passes: u32,
    /// gpu_memory_utilization.
    pub util: f64,
    pub block_size: u64,
    pub max_model_len: u64,
    /// LLM.int8 outlier threshold (0 = no decomposition; Hugging Face checkpoints use 6.0).
    pub int8_threshold: f32,
    /// Held by another process before the instance starts.
    pub outside_before: u64,
    /// Allocated outside the framework during the first pass (NCCL-like).
    pub outside_during: u64,
    /// Whether the during-pass allocation is freed after the passes (else it stays).
    pub outside_during_freed: bool,
    /// Run the verify pass for each budget.
    pub verify: bool,
    pub seed: u64,
}

impl Default for ProfileRequest {
    fn default() -> Self {
        ProfileRequest {
            model: ModelSource::Preset {
                name: "llama-3-8b".into(),
            },
            quant: Quant::F16,
            device: DeviceSpec::Sim {
                preset: "h100-80gb".into(),
                dry: true,
            },
            tokens: 8192,
            seqs: 1,
            passes: 3,
            util: 0.9,
            block_size: 16,
            max_model_len: 8192,
            int8_threshold: 0.0,
            outside_before: 0,
            outside_during: 0,
            outside_during_freed: false,
            verify: true,
            seed: 0,
        }
    }
}

impl ProfileRequest {
    /// Rejects settings that cannot work, naming the setting.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::Request(m));
        use crate::limits::{count, count_usize, MAX_MODEL_LEN, MAX_TOKENS};
        count_usize("--tokens", self.tokens, 1, MAX_TOKENS)?;
        count("--max-model-len", self.max_model_len, 1, MAX_MODEL_LEN)?;
        for (what, bytes) in [
            ("--outside-before", self.outside_before),
            ("--outside-during", self.outside_during),
        ] {
            count(what, bytes, 0, crate::limits::MAX_BYTES)?;
        }
        if self.seqs == 0 || self.seqs > self.tokens {
            return bad(format!(
                "--seqs {} must be between 1 and --tokens ({})",
                self.seqs, self.tokens
            ));
        }
        if self.passes == 0 || self.passes > 1000 {
            return bad(format!(
                "--passes {} must be between 1 and 1000",
                self.passes
            ));
        }
        if !(self.util > 0.0 && self.util <= 1.0) {
            return bad(format!("--util {} must be in (0, 1]", self.util));
        }
        if self.block_size == 0 || self.block_size > 4096 {
            return bad(format!(
                "--block-size {} must be between 1 and 4096",
                self.block_size
            ));
        }
        if !(self.int8_threshold >= 0.0 && self.int8_threshold.is_finite()) {
            return bad(format!(
                "--int8-threshold {} must be a finite number ≥ 0",
                self.int8_threshold
            ));
        }
        Ok(())
    }
}
