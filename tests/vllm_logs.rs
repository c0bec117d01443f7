//! Public vLLM log lines (../shared/VLLM_LOGS_PUBLIC.md), each reproduced with its own release
//! (`--vllm`), GPU total, model and settings on a dry simulated device. Prints the table
//! (`cargo test --test vllm_logs -- --nocapture`) and holds the activation peak within 3 % and
//! the KV blocks within 3 % (5 % with tensor parallel), except the lines whose residual stays
//! after reading that release's source; those are listed in `OUTSIDE` with what was found.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use vramscope::device::DeviceSpec;
use vramscope::model::ModelSource;
use vramscope::profile::{self, ProfileRequest};
use vramscope::quant::Quant;

const GIB: f64 = (1u64 << 30) as f64;

/// What the log's "activation" is: 0.6.4's single line prints the absolute peak
/// (`peak_torch_memory`, weights included); 0.6.5 on print the increase over A(t1).
#[derive(Clone, Copy)]
enum Activation {
    PeakMinusWeights,
    Increase,
}

struct Line {
    id: &'static str,
    vllm: &'static str,
    model: &'static str,
    quant: Quant,
    /// The GPU's simulated preset (its context and cuBLAS workspace; the total is the log's).
    /// The GTX 1080 of P5 has none: a T4's, the nearest generation.
    device: &'static str,
    /// `total_gpu_memory` as the log prints it (GiB, two decimals).
    total_gib: f64,
    util: f64,
    max_model_len: u64,
    tp: u32,
    chunked: Option<bool>,
    /// Memory the log says another process held before the instance started.
    outside_gib: f64,
    activation: Activation,
    logged_activation_gib: f64,
    /// Blocks as logged, or from the logged KV GiB over the block bytes.
    logged_blocks: u64,
}

fn lines() -> Vec<Line> {
    // KV blocks from a logged KV size: GiB (two decimals) over the block bytes.
    let blocks = |kv_gib: f64, block_bytes: f64| (kv_gib * GIB / block_bytes) as u64;
    let llama8_block = 2.0 * 16.0 * 32.0 * 8.0 * 128.0 * 2.0;
    vec![
        Line {
            id: "P1",
            vllm: "0.6.5",
            model: "preset:llama-3-8b",
            quant: Quant::BF16,
            device: "sim:h100-sxm:dry",
            total_gib: 79.22,
            util: 0.9,
            max_model_len: 8192,
            tp: 1,
            chunked: None,
            outside_gib: 0.0,
            activation: Activation::Increase,
            logged_activation_gib: 1.26,
            logged_blocks: blocks(53.29, llama8_block),
        },
        Line {
            id: "P2",
            vllm: "0.6.5",
            model: "preset:llama-3-8b",
            quant: Quant::BF16,
            device: "sim:h100-sxm:dry",
            total_gib: 79.22,
            util: 0.9,
            max_model_len: 8192,
            tp: 2,
            chunked: None,
            outside_gib: 0.0,
            activation: Activation::Increase,
            logged_activation_gib: 1.26,
            // Not logged: T·u less the logged weights, non-torch and activation, per rank.
            logged_blocks: blocks(79.22 * 0.9 - 7.48 - 3.58 - 1.26, llama8_block / 2.0),
        },
        Line {
            id: "P3",
            vllm: "0.7",
            model: "preset:qwen2.5-1.5b",
            quant: Quant::F16,
            device: "sim:t4:dry",
            total_gib: 14.56,
            util: 0.5,
            max_model_len: 32768,
            tp: 1,
            chunked: Some(false),
            outside_gib: 0.0,
            activation: Activation::Increase,
            logged_activation_gib: 2.02,
            logged_blocks: 5517,
        },
        Line {
            id: "P4",
            vllm: "0.7",
            model: "preset:qwen2.5-32b",
            quant: Quant::BF16,
            device: "sim:l40s:dry",
            total_gib: 44.42,
            util: 0.9,
            max_model_len: 10000,
            tp: 2,
            chunked: Some(false),
            outside_gib: 0.0,
            activation: Activation::Increase,
            logged_activation_gib: 1.26,
            logged_blocks: 3947,
        },
        Line {
            id: "P5",
            vllm: "0.6.4",
            model: "preset:opt-125m",
            quant: Quant::F16,
            device: "sim:t4:dry",
            total_gib: 7.92,
            util: 0.9,
            max_model_len: 2048,
            tp: 1,
            chunked: None,
            // The log's initial_memory_usage (0.37 GiB) less its weights (0.24) leaves 0.13 GiB
            // for the context and the desktop together: nothing more is held outside.
            outside_gib: 0.0,
            activation: Activation::PeakMinusWeights,
            logged_activation_gib: 0.71 - 0.2389,
            logged_blocks: 11422,
        },
        Line {
            id: "P6",
            vllm: "0.6.4",
            model: "preset:llama-3.1-8b",
            quant: Quant::BF16,
            device: "sim:rtx3090:dry",
            total_gib: 23.58,
            util: 0.9,
            max_model_len: 20000,
            tp: 1,
            chunked: None,
            outside_gib: 0.0,
            activation: Activation::PeakMinusWeights,
            logged_activation_gib: 17.06 - 14.9888,
            logged_blocks: 1952,
        },
    ]
}

/// Which bound a line stays outside of.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Bound {
    Activation,
    Blocks,
}

/// Bounds that lines stay outside of after reading their release's source, and why.
const OUTSIDE: &[(&str, Bound, &str)] = &[
    (
        "P1",
        Bound::Blocks,
        "its activation matches, but it logs 1.79 GiB of non-torch memory at TP1 where 0.6.5's \
         #10511 (worker.py:177-248, utils.py:1661-1738) counts only what appears after \
         init_device's baseline (the CUDA context is in the baseline): vramscope's #10511 \
         non-torch is 0.02 GiB, and the 1.77 GiB left follows from no code path of that release \
         (the same comment's TP2 run, P2, is within 5 %)",
    ),
    (
        "P4",
        Bound::Activation,
        "the log's 1.26 GiB is, to the hundredth, vramscope's forward peak without the sampler \
         (the MLP's down_proj all-reduce of layer 1), and both ranks log it, the driver too; \
         with vLLM 0.7.1's default of 256 sequences the driver's sampler (sort of [256, 152064] \
         fp32 logits) peaks higher, so the run must have used fewer sequences (see the line \
         below the table for how many reproduce it); its command line is not in the thread",
    ),
];

struct Row {
    activation_gib: f64,
    blocks: u64,
}

fn reproduce(l: &Line) -> Row {
    reproduce_with(l, None)
}

fn reproduce_with(l: &Line, max_num_seqs: Option<usize>) -> Row {
    let device = DeviceSpec::parse(l.device)
        .unwrap()
        .with_total(Some((l.total_gib * GIB) as u64))
        .unwrap();
    let req = ProfileRequest {
        model: ModelSource::parse(l.model).unwrap(),
        quant: l.quant,
        device,
        util: l.util,
        max_model_len: l.max_model_len,
        tp: l.tp,
        vllm: l.vllm.into(),
        chunked_prefill: l.chunked,
        outside_before: (l.outside_gib * GIB) as u64,
        verify: false,
        ..ProfileRequest::default()
    };
    let req = match max_num_seqs {
        Some(seqs) => ProfileRequest { seqs, ..req },
        None => req,
    };
    let r = profile::run(&req, None, Arc::new(AtomicBool::new(false)))
        .unwrap_or_else(|e| panic!("{}: {e}", l.id));
    let a = r.vllm_answer().expect("the release's formula");
    let activation = match l.activation {
        Activation::PeakMinusWeights => {
            (a.formula.torch_peak_bytes - r.weights_bytes as i64) as f64
        }
        Activation::Increase => a.formula.torch_peak_bytes as f64,
    };
    let blocks = r.vllm_engine_blocks().expect("the release's blocks");
    Row {
        activation_gib: activation / GIB,
        blocks,
    }
}

#[test]
fn public_log_lines_reproduce_with_their_release() {
    let mut failures = Vec::new();
    println!("| id | vLLM | activation logged / vramscope (GiB) | blocks logged / vramscope |");
    for l in lines() {
        let row = reproduce(&l);
        let act_err = row.activation_gib / l.logged_activation_gib - 1.0;
        let blk_err = row.blocks as f64 / l.logged_blocks as f64 - 1.0;
        let blk_bound = if l.tp > 1 { 0.05 } else { 0.03 };
        let outside = |b: Bound| OUTSIDE.iter().find(|(id, o, _)| *id == l.id && *o == b);
        let why: Vec<String> = [Bound::Activation, Bound::Blocks]
            .into_iter()
            .filter_map(outside)
            .map(|(_, b, why)| {
                let what = if *b == Bound::Activation {
                    "activation"
                } else {
                    "blocks"
                };
                format!(" {what} outside: {why}")
            })
            .collect();
        println!(
            "| {} | {} | {:.2} / {:.2} ({:+.1} %) | {} / {} ({:+.1} %) |{}",
            l.id,
            l.vllm,
            l.logged_activation_gib,
            row.activation_gib,
            act_err * 100.0,
            l.logged_blocks,
            row.blocks,
            blk_err * 100.0,
            why.concat()
        );
        if outside(Bound::Activation).is_none() && act_err.abs() > 0.03 {
            failures.push(format!("{} activation {:+.1} %", l.id, act_err * 100.0));
        }
        if outside(Bound::Blocks).is_none() && blk_err.abs() > blk_bound {
            failures.push(format!("{} blocks {:+.1} %", l.id, blk_err * 100.0));
        }
    }
    assert!(failures.is_empty(), "outside the bounds: {failures:?}");
}

/// P4's activation: the largest max_num_seqs whose profile run peaks at the log's 1.26 GiB
/// (the sampler then stays under the forward's peak), found by bisection; 256, vLLM's default,
/// does not.
#[test]
fn p4_logs_the_forward_peak_so_its_run_used_fewer_sequences() {
    let l = lines().into_iter().find(|l| l.id == "P4").unwrap();
    let matches = |seqs: usize| {
        let a = reproduce_with(&l, Some(seqs)).activation_gib;
        (a * 100.0).round() == (l.logged_activation_gib * 100.0).round()
    };
    assert!(!matches(256), "the default 256 sequences reproduce the log");
    assert!(matches(1));
    let (mut lo, mut hi) = (1usize, 256usize);
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if matches(mid) {
            lo = mid
        } else {
            hi = mid
        }
    }
    println!(
        "P4: max_num_seqs 1..={lo} reproduce the log's 1.26 GiB; from {hi} the sampler sets the peak"
    );
    assert!(lo < 256 && matches(lo) && !matches(hi), "{lo} {hi}");
}
