//! What would fit, checked: for a run that vLLM could not start (out of memory while loading
//! or profiling, no KV block left, too little KV cache for one request), the settings that
//! would start it, each found by a dry run of it before it is shown. Runs on the worker
//! thread after the failing run; the candidates after a run are `diagnose::candidates` (what
//! `vramscope plan` tries), those after an out-of-memory load are smaller weights and more
//! GPUs, alone and then together.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::device::DeviceSpec;
use crate::profile::diagnose::{self, Outcome, StartFailure};
use crate::profile::{ProfileRequest, Report};
use crate::quant::Quant;

/// At most this many settings are shown.
const SHOWN: usize = 3;

/// A change of the setup that starts, with the release's answer for it.
#[derive(Clone, Debug)]
pub struct Fit {
    /// The change, in the setup's words ("tensor parallel 8", "nf4 weights").
    pub change: String,
    /// The whole request with the change (simulated devices run dry).
    pub request: ProfileRequest,
    /// The release's answer for it ("KV 3.21 GiB, 10,512 tokens").
    pub answer: String,
}

/// The checked fits for `req`'s run, which ended in `result`; `None` (nothing tried) where
/// the run started, failed for another reason or is not on a simulated device (a real GPU
/// cannot be tried dry).
pub fn checked(
    req: &ProfileRequest,
    result: &crate::Result<Report>,
    cancel: &Arc<AtomicBool>,
) -> Option<Vec<Fit>> {
    let DeviceSpec::Sim { .. } = &req.device else {
        return None;
    };
    let candidates = match result {
        Ok(r) => after_a_run(req, r, &diagnose::after_profile(r)?),
        Err(e) if is_out_of_memory(&e.to_string()) => after_an_oom(req),
        Err(_) => return None,
    };
    Some(first_that_start(req, candidates, cancel))
}

/// Of each group of candidates, the first that starts (at most `SHOWN` in all).
fn first_that_start(
    req: &ProfileRequest,
    candidates: Vec<Vec<ProfileRequest>>,
    cancel: &Arc<AtomicBool>,
) -> Vec<Fit> {
    let mut out: Vec<Fit> = Vec::new();
    let kind = |change: &str| {
        change
            .split_whitespace()
            .next()
            .unwrap_or_default()
            .to_string()
    };
    for group in candidates {
        // A kind of change already found (more GPUs) is not tried again.
        if group.first().is_some_and(|c| {
            out.iter()
                .any(|f| kind(&f.change) == kind(&change_words(req, c)))
        }) {
            continue;
        }
        for r in group {
            if cancel.load(Ordering::Relaxed) || out.len() >= SHOWN {
                return out;
            }
            let dry = as_dry(&r);
            if let Some(o) = starts(&dry, cancel) {
                out.push(Fit {
                    change: change_words(req, &r),
                    request: r,
                    answer: o.kv_words(),
                });
                // One per group: the smallest change of its kind.
                break;
            }
        }
    }
    out
}

/// An error that is an out-of-memory (the device's or the allocator's words).
pub fn is_out_of_memory(msg: &str) -> bool {
    msg.contains("out of memory")
}

/// The request on a dry simulated device (shapes only: what a fit needs).
fn as_dry(r: &ProfileRequest) -> ProfileRequest {
    let mut r = r.clone();
    if let DeviceSpec::Sim { dry, .. } = &mut r.device {
        *dry = true;
    }
    r
}

/// The release's answer where vLLM would start with `r`.
fn starts(r: &ProfileRequest, cancel: &Arc<AtomicBool>) -> Option<Outcome> {
    let report = crate::profile::run(r, None, cancel.clone()).ok()?;
    diagnose::outcome(&report).filter(Outcome::starts)
}

/// After a run that vLLM would not start: what `vramscope plan` tries for its failure, one
/// change each, in its order, each its own group.
fn after_a_run(req: &ProfileRequest, r: &Report, f: &StartFailure) -> Vec<Vec<ProfileRequest>> {
    let total = r.checkpoints.t0.total as f64;
    let gib = (1u64 << 30) as f64;
    let shortfall = match f {
        StartFailure::NoCacheBlocks => r
            .vllm_answer()
            .map(|a| (a.formula.non_kv_bytes as f64 - total * r.settings.util) / gib),
        _ => None,
    };
    let mut groups: Vec<Vec<ProfileRequest>> = Vec::new();
    for (_, c) in diagnose::candidates(req, f, shortfall, total / gib) {
        // Candidates of one kind (the utilizations) form one group: the first that starts.
        match groups.last_mut() {
            Some(g) if same_kind(&g[0], &c, req) => g.push(c),
            _ => groups.push(vec![c]),
        }
    }
    // More GPUs than twice as many: a model far over one GPU.
    groups.push(more_gpus(req, &[4, 8]));
    groups
}

/// After an out-of-memory while loading or profiling: smaller weights, then more GPUs, then
/// both.
fn after_an_oom(req: &ProfileRequest) -> Vec<Vec<ProfileRequest>> {
    let quants = smaller_weights(req.quant);
    let with_quant = |q: Quant, r: &ProfileRequest| ProfileRequest {
        quant: q,
        ..r.clone()
    };
    let mut both = Vec::new();
    for r in more_gpus(req, &[2, 4, 8]) {
        both.extend(quants.iter().rev().map(|q| with_quant(*q, &r)));
    }
    vec![
        quants.iter().map(|q| with_quant(*q, req)).collect(),
        more_gpus(req, &[2, 4, 8]),
        both,
    ]
}

/// Quantizations with smaller weights than `q`, largest first.
fn smaller_weights(q: Quant) -> Vec<Quant> {
    match q {
        Quant::F32 => vec![Quant::BF16, Quant::Fp8, Quant::Int8, Quant::Nf4],
        Quant::F16 | Quant::BF16 => vec![Quant::Fp8, Quant::Int8, Quant::Nf4],
        Quant::Int8 | Quant::Fp8 => vec![Quant::Nf4],
        Quant::Nf4 | Quant::Fp4 => Vec::new(),
    }
}

/// `req` over `factors` times its GPUs, as far as tensor parallel goes.
fn more_gpus(req: &ProfileRequest, factors: &[u32]) -> Vec<ProfileRequest> {
    factors
        .iter()
        .map(|k| req.tp * k)
        .filter(|tp| tp * req.pp <= crate::profile::request::MAX_TP)
        .map(|tp| ProfileRequest { tp, ..req.clone() })
        .collect()
}

/// Two candidates that change the same setting of `req`.
fn same_kind(a: &ProfileRequest, b: &ProfileRequest, req: &ProfileRequest) -> bool {
    let words = |r: &ProfileRequest| {
        change_words(req, r)
            .split_whitespace()
            .next()
            .unwrap_or_default()
            .to_string()
    };
    words(a) == words(b)
}

/// What `to` changes of `from`, in the setup panel's words.
pub fn change_words(from: &ProfileRequest, to: &ProfileRequest) -> String {
    let mut out = Vec::new();
    if to.quant != from.quant {
        out.push(format!("{} weights", to.quant.label()));
    }
    if to.tp != from.tp {
        out.push(format!("tensor parallel {}", to.tp));
    }
    if to.util != from.util {
        out.push(format!("gpu_memory_utilization {:.2}", to.util));
    }
    if to.max_model_len != from.max_model_len {
        out.push(format!("max_model_len {}", to.max_model_len));
    }
    if to.seqs != from.seqs {
        out.push(format!("max_num_seqs {}", to.seqs));
    }
    if to.kv_cache_dtype != from.kv_cache_dtype {
        out.push(format!("kv_cache_dtype {}", to.kv_cache_dtype.name()));
    }
    if to.enforce_eager != from.enforce_eager {
        out.push("enforce eager".into());
    }
    if to.kv_cache_memory != from.kv_cache_memory {
        out.push(format!(
            "kv_cache_memory {}",
            to.kv_cache_memory
                .map_or("profiled".into(), crate::base::units::fmt_u)
        ));
    }
    out.join(" with ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_is_said_in_the_setup_panels_words() {
        let from = ProfileRequest::default();
        let to = ProfileRequest {
            quant: Quant::Nf4,
            tp: 4,
            ..from.clone()
        };
        assert_eq!(
            change_words(&from, &to),
            "nf4 weights with tensor parallel 4"
        );
        let util = ProfileRequest {
            util: 0.95,
            ..from.clone()
        };
        assert_eq!(change_words(&from, &util), "gpu_memory_utilization 0.95");
    }
}
