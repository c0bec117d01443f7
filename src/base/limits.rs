//! Stated bounds on every count and size that comes from the command line, the app, a
//! config.json or a file header, checked before anything is allocated or multiplied by them.
//! Each bound is far above any real model or run and low enough that products of them fit in
//! a u64 and that no allocation sized by them can exhaust the host.

use crate::base::error::{Error, Result};

/// Tokens in one batch (vLLM's `max_num_batched_tokens`); 2^20 is 8× the largest profile
/// batch vLLM configures.
pub const MAX_TOKENS: u64 = 1 << 20;
/// Context length (`--max-model-len`): 16M tokens.
pub const MAX_MODEL_LEN: u64 = 1 << 24;
/// Byte sizes typed by a user (`--outside-before`, `synthetic:W:S`): 1 PiB, more than any
/// device holds, and far enough below 2^64 that page rounding cannot wrap.
pub const MAX_BYTES: u64 = 1 << 50;
/// Timed passes of `bench`.
pub const MAX_ITERS: u64 = 10_000;
/// Tensors in one weights file (safetensors header or GGUF): the largest published
/// checkpoints hold under 100k across all shards.
pub const MAX_TENSORS: u64 = 100_000;
/// Metadata pairs in one GGUF header (real files: a few dozen).
pub const MAX_GGUF_KEYS: u64 = 65_536;

/// Checks `value` of the setting `what` lies in `min..=max`; the message names the setting,
/// the value found and the range expected.
pub fn count(what: &str, value: u64, min: u64, max: u64) -> Result<u64> {
    if value < min || value > max {
        return Err(Error::Request(format!(
            "{what} is {value}, expected {min} to {max}"
        )));
    }
    Ok(value)
}

/// `count` for a `usize` setting.
pub fn count_usize(what: &str, value: usize, min: u64, max: u64) -> Result<usize> {
    count(what, value as u64, min, max).map(|v| v as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_count_outside_its_range_names_setting_value_and_range() {
        assert_eq!(count("--tokens", 5, 1, MAX_TOKENS).unwrap(), 5);
        let e = count("--tokens", u64::MAX, 1, MAX_TOKENS).unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid setting: --tokens is 18446744073709551615, expected 1 to 1048576"
        );
        assert!(count("--iters", 0, 1, MAX_ITERS).is_err());
    }

    #[test]
    fn bounds_multiply_without_overflow() {
        // tokens × model length × bytes: the largest product a run forms from them.
        assert!(MAX_TOKENS.checked_mul(MAX_MODEL_LEN).is_some());
        assert!(MAX_BYTES.checked_mul(1 << 13).is_some());
    }
}
