//! The app's messages in the app's words: a message from the profiler or the request names
//! the CLI's flags (`--util 0.99`, `--tp 2`, `--vllm 0.19`); in the window the same setting is
//! the field the user sees (gpu_memory_utilization, tensor parallel, vLLM release).

/// The setup field each of `vramscope profile`'s flags sets, as the setup panel labels it.
const FIELDS: &[(&str, &str)] = &[
    ("util", "gpu_memory_utilization"),
    ("gpu-memory-utilization", "gpu_memory_utilization"),
    ("tp", "tensor parallel"),
    ("tensor-parallel-size", "tensor parallel"),
    ("pp", "pipeline stages"),
    ("pipeline-parallel-size", "pipeline stages"),
    ("vllm", "vLLM release"),
    ("quant", "Quantization"),
    ("quantization", "Quantization"),
    ("passes", "passes"),
    ("true-max", "find the true maximum"),
    ("max-model-len", "max_model_len"),
    ("max-num-batched-tokens", "max_num_batched_tokens"),
    ("tokens", "max_num_batched_tokens"),
    ("max-num-seqs", "max_num_seqs"),
    ("seqs", "max_num_seqs"),
    ("enable-chunked-prefill", "chunked prefill"),
    ("kv-cache-memory", "kv_cache_memory"),
    ("kv-cache-dtype", "kv_cache_dtype"),
    ("block-size", "block_size"),
    ("enforce-eager", "enforce eager"),
    ("no-sampler", "vLLM's sampler step (off)"),
    ("int8-threshold", "int8 threshold"),
    ("device", "Device"),
    ("total", "total"),
    ("topology", "GPU links"),
    ("seed", "seed"),
];

/// `text` with every flag of `vramscope profile` named by its setup field; other text (and
/// any other `--word`) as it was.
pub fn in_app_words(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("--") {
        out.push_str(&rest[..at]);
        let after = &rest[at + 2..];
        let len = after
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
            .unwrap_or(after.len());
        let flag = &after[..len];
        let preceded_by_word = out
            .chars()
            .last()
            .is_some_and(|c| c.is_alphanumeric() || c == '-');
        match FIELDS.iter().find(|(f, _)| *f == flag) {
            Some((_, field)) if !preceded_by_word => out.push_str(field),
            _ => {
                out.push_str("--");
                out.push_str(flag);
            }
        }
        rest = &after[len..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::in_app_words;

    #[test]
    fn flags_become_the_fields_the_window_shows() {
        assert_eq!(
            in_app_words("--util 1.5 must be in (0, 1]"),
            "gpu_memory_utilization 1.5 must be in (0, 1]"
        );
        assert_eq!(
            in_app_words("--pp 2 with --vllm 0.7: pipeline parallel is modelled for the V1 releases"),
            "pipeline stages 2 with vLLM release 0.7: pipeline parallel is modelled for the V1 releases"
        );
        assert_eq!(
            in_app_words("give --max-num-batched-tokens, a smaller --max-model-len, or --enable-chunked-prefill true"),
            "give max_num_batched_tokens, a smaller max_model_len, or chunked prefill true"
        );
        // Not a flag of ours, or not a flag at all: as it was.
        assert_eq!(
            in_app_words("--port 8000 --tpx a--tp"),
            "--port 8000 --tpx a--tp"
        );
        assert_eq!(in_app_words("6.50 GiB -- counted"), "6.50 GiB -- counted");
    }
}
