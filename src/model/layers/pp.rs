//! Pipeline parallel as vLLM cuts a model into stages: which decoder layers each stage holds
//! (`get_pp_indices`, vllm/distributed/utils.py, the same in 0.11.0 L89-140, 0.15.1, 0.19 and
//! 0.21.0 L95-141) and which of the embedding, final norm and lm_head it builds
//! (model_executor/models/llama.py 0.19 L373-391 and L538-553).

use std::ops::Range;

use crate::base::error::{Error, Result};

/// vLLM's layer partition: `num_layers` over `stages`. With `given` (vLLM's
/// `VLLM_PP_LAYER_PARTITION`, one count per stage) the counts must be as many as the stages and
/// sum to the layers; without, `num_layers // stages` each, the remainder spread one by one
/// over the stages before the last, from the second-to-last backwards (utils.py L124-129:
/// `partitions[-i] += 1` for i in 2..remaining+2).
pub fn partition(num_layers: usize, stages: usize, given: Option<&[usize]>) -> Result<Vec<usize>> {
    if stages == 0 {
        return Err(Error::Request("--pp 0: it must be at least 1".into()));
    }
    let parts = match given {
        Some(p) => {
            // utils.py L113-117: vLLM's own two checks, in its words.
            if p.len() != stages {
                return Err(Error::Request(format!(
                    "VLLM_PP_LAYER_PARTITION {}: vLLM refuses it: \"ValueError: len(partitions)={} does not match pp_size={stages}.\"",
                    join(p),
                    p.len()
                )));
            }
            let sum: usize = p.iter().sum();
            if sum != num_layers {
                return Err(Error::Request(format!(
                    "VLLM_PP_LAYER_PARTITION {}: vLLM refuses it: \"ValueError: sum(partitions)={sum} does not match num_hidden_layers={num_layers}.\"",
                    join(p)
                )));
            }
            p.to_vec()
        }
        None => {
            let mut parts = vec![num_layers / stages; stages];
            let remaining = num_layers % stages;
            for i in 2..remaining + 2 {
                parts[stages - i] += 1;
            }
            parts
        }
    };
    if let Some(s) = parts.iter().position(|&n| n == 0) {
        // vLLM would build a stage of PPMissingLayer only; its KV spec is empty and the
        // engine's minimum over workers is not defined the same way: not modelled.
        return Err(Error::Request(format!(
            "--pp {stages}: stage {s} would hold none of the model's {num_layers} layers \
             (partition {}); vramscope models stages of at least one layer each",
            join(&parts)
        )));
    }
    Ok(parts)
}

/// The layers of stage `stage` under `parts` (utils.py L137-140: `start_layer =
/// sum(partitions[:pp_rank])`).
pub fn stage_layers(parts: &[usize], stage: usize) -> Range<usize> {
    let start: usize = parts[..stage].iter().sum();
    start..start + parts[stage]
}

fn join(p: &[usize]) -> String {
    p.iter().map(usize::to_string).collect::<Vec<_>>().join(",")
}

/// Reads `VLLM_PP_LAYER_PARTITION`'s text ("20,20") as vLLM does (`int()` of each part).
pub fn parse_partition(text: &str) -> Result<Vec<usize>> {
    text.split(',')
        .map(|p| {
            p.trim().parse::<usize>().map_err(|_| {
                Error::Request(format!(
                    "VLLM_PP_LAYER_PARTITION '{text}': vLLM refuses it: \"ValueError: Invalid partition string: {text}\""
                ))
            })
        })
        .collect()
}

/// The refusal for a family whose pipeline-parallel stages vramscope does not build.
pub fn refused(arch: &str) -> Error {
    Error::Request(format!(
        "--pp with model_type '{arch}': pipeline-parallel stages are modelled for the Llama-shaped families (Llama, Mistral, Qwen2, Qwen3, Phi-3, Mixtral, Qwen2-MoE, Qwen3-MoE) only so far"
    ))
}

/// What one stage builds besides its layers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StageParts {
    /// `VocabParallelEmbedding`: on the first stage, and on the last when the lm_head is tied
    /// to it (llama.py L373-382: `is_first_rank or (tie_word_embeddings and is_last_rank)`).
    pub embedding: bool,
    /// The final norm, the lm_head (`ParallelLMHead`, or the tied embedding) and the
    /// sampler: the last stage's only (llama.py L388-391, L538-553; gpu_model_runner.py
    /// `profile_run`: `_dummy_sampler_run` on the last rank only).
    pub last: bool,
    /// Receives the previous stage's hidden states and residual (`intermediate_tensors`).
    pub receives: bool,
}

impl StageParts {
    pub fn of(stage: usize, stages: usize, tied: bool) -> Self {
        let last = stage + 1 == stages;
        StageParts {
            embedding: stage == 0 || (tied && last),
            last,
            receives: stage > 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn even_layers_split_evenly() {
        assert_eq!(partition(40, 2, None).unwrap(), vec![20, 20]);
        assert_eq!(partition(80, 4, None).unwrap(), vec![20, 20, 20, 20]);
        assert_eq!(stage_layers(&[20, 20], 1), 20..40);
    }

    #[test]
    fn the_remainder_goes_to_the_stages_before_the_last() {
        // utils.py: 32 over 3 is [11, 11, 10]; 30 over 4 is [7, 8, 8, 7].
        assert_eq!(partition(32, 3, None).unwrap(), vec![11, 11, 10]);
        assert_eq!(partition(30, 4, None).unwrap(), vec![7, 8, 8, 7]);
        assert_eq!(partition(29, 4, None).unwrap(), vec![7, 7, 8, 7]);
        assert_eq!(partition(3, 2, None).unwrap(), vec![2, 1]);
    }

    #[test]
    fn a_given_partition_is_checked_as_vllm_checks_it() {
        assert_eq!(partition(40, 2, Some(&[24, 16])).unwrap(), vec![24, 16]);
        let e = partition(40, 2, Some(&[20, 19])).unwrap_err().to_string();
        assert!(
            e.contains("sum(partitions)=39 does not match num_hidden_layers=40"),
            "{e}"
        );
        let e = partition(40, 2, Some(&[40])).unwrap_err().to_string();
        assert!(
            e.contains("len(partitions)=1 does not match pp_size=2"),
            "{e}"
        );
        assert!(parse_partition("20, x").is_err());
        assert_eq!(parse_partition("24,16").unwrap(), vec![24, 16]);
        assert!(partition(1, 2, None).is_err());
    }

    #[test]
    fn embedding_on_the_first_stage_and_on_the_last_when_tied() {
        assert!(StageParts::of(0, 2, false).embedding);
        assert!(!StageParts::of(1, 2, false).embedding);
        assert!(StageParts::of(1, 2, true).embedding);
        assert!(!StageParts::of(1, 3, true).embedding);
        assert!(StageParts::of(2, 3, false).last);
        assert!(StageParts::of(1, 3, false).receives);
    }
}
