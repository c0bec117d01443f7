//! `vramscope bench`: times forward passes of a model on one device (a GPU, or the simulated
//! device in compute mode for a reference), and can write the last token's logits so two
//! devices — or PyTorch (scripts/gpu_reference.py) — can be compared on the same weights.

use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;

use crate::base::error::{Error, Result};
use crate::device::{Device, DeviceSpec};
use crate::engine::ops;
use crate::engine::runtime::Runtime;
use crate::model::batch::Batch;
use crate::model::loader::LoadOptions;
use crate::model::weights::WeightSource;
use crate::model::CausalLm;
use crate::model::{self, ModelSource};
use crate::quant::Quant;

#[derive(Clone, Debug)]
pub struct BenchRequest {
    pub model: ModelSource,
    pub quant: Quant,
    pub device: DeviceSpec,
    pub tokens: usize,
    pub seqs: usize,
    /// Timed passes after one warm-up pass.
    pub iters: u32,
    /// Fast hash-based weights instead of the preset's seeded ones (speed runs only: the
    /// values do not change the work).
    pub fast_weights: bool,
    pub int8_threshold: f32,
    pub seed: u64,
    /// After the timed passes, one more pass with the GPU time of every op recorded.
    pub op_times: bool,
    /// After the timed passes, vLLM's profile batch (`max_num_seqs` sequences) once more with
    /// the sampler, timed, bringing back this many rows of its f32 logits and probs (0: none).
    pub sampler_rows: usize,
    /// Sequences of that profile batch (vLLM's `max_num_seqs`).
    pub sampler_seqs: usize,
    /// Tensor-parallel ranks: one GPU each (`cuda:N` and the GPUs after it), or that many
    /// simulated devices; rank 0's times are reported (the collectives keep the ranks in step).
    pub tp: u32,
    /// vLLM's `--enable-expert-parallel` over the `tp` ranks: a MoE model's routed experts
    /// whole on each rank, `E / tp` of them, instead of every expert cut over the ranks.
    pub ep: bool,
}

#[derive(Clone, Debug, Serialize)]
pub struct BenchResult {
    pub model: String,
    pub quant: String,
    pub device: String,
    pub tokens: usize,
    pub seqs: usize,
    /// The model's vocabulary.
    pub vocab: usize,
    pub load_s: f64,
    /// Of `load_s`: making or reading the weights on the host (the rest is quantizing and
    /// copying to the device).
    #[serde(default)]
    pub load_read_s: f64,
    /// Of `load_s`: quantizing on the host.
    #[serde(default)]
    pub load_quantize_s: f64,
    /// Wall time of each timed pass (synchronized), milliseconds.
    pub pass_ms: Vec<f64>,
    pub median_ms: f64,
    /// Model FLOPs of one pass (linear layers, causal attention, lm_head on the last tokens).
    pub flops: f64,
    pub tflops: f64,
    pub weights_bytes: u64,
    pub peak_allocated_bytes: u64,
    pub process_peak_bytes: u64,
    /// Reads per second the NVML sampler thread reached (GPU only).
    pub nvml_rate_hz: Option<f64>,
    /// Last-token logits of every sequence, from the last pass, `[seqs, vocab]`.
    #[serde(skip)]
    pub logits: Vec<f32>,
    /// GPU milliseconds per op (and matmul projection) in one extra pass, if asked for.
    pub op_ms: Vec<(String, f64)>,
    /// Wall milliseconds of vLLM's sampler step (synchronized) on the profile batch.
    pub sampler_ms: Option<f64>,
    /// Sequences of the profile batch the sampler ran on.
    pub sampler_seqs: usize,
    /// The sampler's first rows: f32 logits it started from, probs, sampled ids.
    #[serde(skip)]
    pub sampler: Option<crate::model::sampler::SamplerOutput>,
    /// Tensor-parallel ranks (1: one device).
    pub tp: u32,
    /// With tensor parallel: every rank's weights and peaks, in rank order.
    pub rank_weights_bytes: Vec<u64>,
    pub rank_process_peak_bytes: Vec<u64>,
}

/// Seeded hash values with the spread of the synthetic weights (std about 0.02; norms near 1),
/// generated on all cores.
struct FastWeights {
    seed: u64,
}

impl WeightSource for FastWeights {
    fn origin(&self) -> String {
        format!("fast hash weights (seed {})", self.seed)
    }

    fn read_f32(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let n: usize = shape.iter().product();
        let norm = name.ends_with("norm.weight");
        let salt = name
            .bytes()
            .fold(self.seed ^ 0x9e37_79b9_7f4a_7c15, |h, b| {
                (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
            });
        let mut out = vec![0f32; n];
        let threads = std::thread::available_parallelism().map_or(4, |p| p.get());
        let per = n.div_ceil(threads).max(1 << 16);
        std::thread::scope(|s| {
            for (ci, chunk) in out.chunks_mut(per).enumerate() {
                s.spawn(move || {
                    for (i, v) in chunk.iter_mut().enumerate() {
                        let mut h = ((ci * per + i) as u64) ^ salt;
                        h = (h ^ (h >> 33)).wrapping_mul(0xff51_afd7_ed55_8ccd);
                        h = (h ^ (h >> 33)).wrapping_mul(0xc4ce_b9fe_1a85_ec53);
                        let u = ((h >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.069;
                        *v = if norm { 1.0 + u } else { u };
                    }
                });
            }
        });
        Ok(out)
    }
}

/// The weights `--fast-weights` loads: seeded hash values with the synthetic weights' spread,
/// made on all cores (for speed runs: the values do not change the work).
pub fn fast_weights(seed: u64) -> impl WeightSource {
    FastWeights { seed }
}

pub fn run(req: &BenchRequest) -> Result<BenchResult> {
    crate::base::limits::count_usize("--tokens", req.tokens, 1, crate::base::limits::MAX_TOKENS)?;
    // 0 runs only the warm-up pass (its logits, for comparisons); the CLI asks for at least
    // one timed pass, since its median would otherwise print as NaN.
    crate::base::limits::count(
        "--iters",
        req.iters as u64,
        0,
        crate::base::limits::MAX_ITERS,
    )?;
    if !(req.int8_threshold >= 0.0 && req.int8_threshold.is_finite()) {
        return Err(Error::Request(format!(
            "--int8-threshold {} must be a finite number ≥ 0",
            req.int8_threshold
        )));
    }
    if req.tokens == 0 || req.seqs == 0 || req.seqs > req.tokens {
        return Err(Error::Request(format!(
            "--tokens {} and --seqs {} must satisfy 1 ≤ seqs ≤ tokens",
            req.tokens, req.seqs
        )));
    }
    if let DeviceSpec::Sim { dry: true, .. } = req.device {
        return Err(Error::Request(
            "bench needs a device that computes: cuda:N or sim:PRESET (compute mode)".into(),
        ));
    }
    if req.op_times && matches!(req.device, DeviceSpec::Sim { .. }) {
        return Err(Error::Request(
            "--op-times times ops with CUDA events: it needs --device cuda:N".into(),
        ));
    }
    crate::base::limits::count(
        "--tp",
        req.tp as u64,
        1,
        crate::profile::request::MAX_TP as u64,
    )?;
    if req.tp <= 1 {
        return run_rank(req, None);
    }
    let n = req.tp as usize;
    let group = Arc::new(crate::device::group::RankGroup::new(n));
    let spec = |rank: usize| (rank, n, group.clone());
    let results: Vec<Result<BenchResult>> = std::thread::scope(|s| {
        let handles: Vec<_> = (1..n)
            .map(|rank| {
                let (r, n, g) = spec(rank);
                s.spawn(move || {
                    let out = run_rank(req, Some((r, n, g.clone())));
                    if let Err(e) = &out {
                        g.abort(r, &e.to_string());
                    }
                    out
                })
            })
            .collect();
        let first = run_rank(req, Some(spec(0)));
        if let Err(e) = &first {
            group.abort(0, &e.to_string());
        }
        let mut all = vec![first];
        all.extend(handles.into_iter().map(|h| {
            h.join()
                .unwrap_or_else(|_| Err(Error::Request("a tensor-parallel rank stopped".into())))
        }));
        all
    });
    let mut ok = Vec::new();
    for (rank, r) in results.into_iter().enumerate() {
        match r {
            Ok(b) => ok.push(b),
            Err(e @ Error::PeerStopped { .. }) if rank > 0 => {
                return Err(e);
            }
            Err(e) => {
                return Err(match e {
                    Error::OutOfMemory {
                        device,
                        during,
                        detail,
                        state,
                    } => Error::OutOfMemory {
                        device: format!("{device} (tensor-parallel rank {rank})"),
                        during,
                        detail,
                        state,
                    },
                    other => other,
                })
            }
        }
    }
    let mut first = ok.remove(0);
    let rest: Vec<&BenchResult> = ok.iter().collect();
    first.rank_weights_bytes = std::iter::once(first.weights_bytes)
        .chain(rest.iter().map(|r| r.weights_bytes))
        .collect();
    first.rank_process_peak_bytes = std::iter::once(first.process_peak_bytes)
        .chain(rest.iter().map(|r| r.process_peak_bytes))
        .collect();
    Ok(first)
}

/// One device, or one rank (index, size, group) of a tensor-parallel instance.
fn run_rank(
    req: &BenchRequest,
    rank: Option<(usize, usize, Arc<crate::device::group::RankGroup>)>,
) -> Result<BenchResult> {
    let opened = model::open(&req.model, req.seed)?;
    let mut spec = req.device.clone();
    if let (Some((r, _, _)), DeviceSpec::Cuda { ordinal }) = (&rank, &mut spec) {
        *ordinal = ordinal
            .checked_add(*r)
            .ok_or_else(|| crate::Error::Device {
                spec: req.device.to_string(),
                problem: format!("rank {r} has no GPU index (past 2^64)"),
            })?;
    }
    let device = {
        let _t = crate::base::timing::span("open the device (all of it)");
        Device::open(&spec)?
    };
    let device_name = device.info().name;
    let layout = device.int8_tile_layout();
    let tp = rank.map(|(rank, size, group)| crate::device::group::TpRank {
        custom_ar: device.custom_all_reduce_for(size),
        // bench runs 380e1863's passes (in-place all-reduces above the custom kernel's size).
        all_reduce_out_of_place: false,
        nccl: crate::device::nccl_model::NcclRules::Nccl228Measured,
        rank,
        size,
        group,
    });
    let rt = Runtime::new(device, Arc::new(AtomicBool::new(false)), None);
    if let Some(t) = tp {
        if req.ep {
            rt.set_moe_group(crate::device::group::MoeGroup {
                rank: t.rank,
                size: t.size,
                ep: true,
                dp: 1,
            });
        }
        rt.set_tp(t);
    }
    let fast = FastWeights { seed: req.seed };
    let src: &dyn WeightSource = if req.fast_weights {
        &fast
    } else {
        opened.source.as_ref()
    };
    let t_load = Instant::now();
    let opts = LoadOptions {
        quant: req.quant,
        int8_threshold: req.int8_threshold,
        int8_layout: layout,
        attn_scalars: 0,
        // AWQ/GPTQ as 0.6.4's Marlin (the default era); NVFP4 as 0.19 computes it (the
        // global scale kept in f32, `quant::nvfp4`).
        marlin: crate::quant::marlin::Kernel {
            minor: 19,
            ..Default::default()
        },
    };
    let model = {
        let _t = crate::base::timing::span("load the model (all of it)");
        let m = CausalLm::load(&rt, &opened.config, src, &opts)?;
        rt.synchronize()?;
        m
    };
    let load_s = t_load.elapsed().as_secs_f64();
    let weights_bytes = model.weight_bytes();
    let batch = Batch::dummy(req.tokens, req.seqs, opened.config.vocab_size);
    rt.reset_peak();
    rt.reset_process_peak();
    let mut pass_ms = Vec::new();
    let mut logits = Vec::new();
    for it in 0..=req.iters {
        rt.set_pass(it + 1);
        if it == 0 {
            crate::base::timing::add(
                "process start to the first pass",
                std::time::Duration::from_secs_f64(crate::base::timing::since_start()),
            );
        }
        let start = Instant::now();
        let out = forward_logits(&rt, &model, &batch)?;
        rt.synchronize()?;
        let ms = start.elapsed().as_secs_f64() * 1e3;
        if it > 0 {
            pass_ms.push(ms);
        }
        if let (true, Some(out)) = (it == req.iters, &out) {
            logits = ops::read_f32(&rt, out)?.unwrap_or_default();
        }
    }
    let mut op_ms = Vec::new();
    if req.op_times {
        rt.with_device(|d| d.cuda().map(|c| c.time_ops(true)));
        rt.set_pass(req.iters + 2);
        let out = forward_logits(&rt, &model, &batch);
        // The last op runs until the end event `op_times` records.
        let times = rt.with_device(|d| d.cuda().map(|c| c.op_times()));
        rt.with_device(|d| d.cuda().map(|c| c.time_ops(false)));
        drop(out?);
        op_ms = times.transpose()?.unwrap_or_default();
    }
    let (mut sampler_ms, mut sampler) = (None, None);
    if req.sampler_rows > 0 {
        use crate::model::sampler::{self as smp, Sampler};
        let seqs = req.sampler_seqs.clamp(1, req.tokens);
        let batch = Batch::dummy(req.tokens, seqs, opened.config.vocab_size);
        rt.set_pass(req.iters + 3);
        let input = smp::prepare_model_input(&rt, &batch)?;
        let hidden = model.forward_hidden(&rt, &batch)?;
        // Only rank 0 samples; the others send their shard of the logits.
        if let Some(logits) =
            smp::compute_logits(&rt, &hidden, model.logits_head()?, &input.selected_rows)?
        {
            let s = Sampler::new(req.seed);
            s.head_rows.set(req.sampler_rows);
            // Warm the kernels once, then time.
            drop(s.forward(&rt, &logits, opened.config.vocab_size, &input)?);
            rt.synchronize()?;
            let start = Instant::now();
            let out = s.forward(&rt, &logits, opened.config.vocab_size, &input)?;
            rt.synchronize()?;
            sampler_ms = Some(start.elapsed().as_secs_f64() * 1e3);
            sampler = Some(out);
        }
    }
    let mut sorted = pass_ms.clone();
    sorted.sort_by(f64::total_cmp);
    let median_ms = sorted.get(sorted.len() / 2).copied().unwrap_or(f64::NAN);
    let flops = opened.config.forward_flops(&batch.seq_lens);
    let stats = rt.stats();
    let process_peak_bytes = rt.process_peak();
    let nvml_rate_hz = rt.with_device(|d| d.cuda().map(|c| c.nvml_samples().1));
    let _ = rt.take_events();
    Ok(BenchResult {
        model: req.model.label(),
        quant: req.quant.label().into(),
        device: format!("{} ({device_name})", req.device),
        tokens: req.tokens,
        seqs: req.seqs,
        vocab: opened.config.vocab_size,
        load_s,
        load_read_s: model.load_stats().read_seconds,
        load_quantize_s: model.load_stats().quantize_seconds,
        pass_ms,
        median_ms,
        flops,
        tflops: flops / (median_ms * 1e-3) / 1e12,
        weights_bytes,
        peak_allocated_bytes: stats.allocated_peak,
        process_peak_bytes,
        nvml_rate_hz,
        logits,
        op_ms,
        sampler_ms,
        sampler_seqs: req.sampler_seqs,
        sampler,
        tp: req.tp.max(1),
        rank_weights_bytes: Vec::new(),
        rank_process_peak_bytes: Vec::new(),
    })
}

/// A forward pass and its f32 last-token logits (`None` on a tensor-parallel rank other than
/// 0, which sends its shard).
fn forward_logits(
    rt: &Runtime,
    model: &CausalLm,
    batch: &Batch,
) -> Result<Option<crate::engine::tensor::Tensor>> {
    let hidden = model.forward_hidden(rt, batch)?;
    let rows = crate::model::sampler::last_token_rows(&batch.seq_lens);
    crate::model::sampler::logits_f32(
        rt,
        &hidden,
        model.logits_head()?,
        &rows,
        model.config().vocab_size,
    )
}

/// Writes the result (and the logits) as JSON.
pub fn write_json(r: &BenchResult, path: &Path, with_logits: bool) -> Result<()> {
    let mut v = serde_json::to_value(r).map_err(|e| Error::Export {
        path: path.to_path_buf(),
        problem: e.to_string(),
    })?;
    if with_logits {
        v["logits"] = serde_json::json!(r.logits);
    }
    let text = serde_json::to_string_pretty(&v).map_err(|e| Error::Export {
        path: path.to_path_buf(),
        problem: e.to_string(),
    })?;
    crate::report::export::write_all(&[(path.to_path_buf(), text.into_bytes())])
}

/// The logits of a `--compare` file (written by `bench --json` or gpu_reference.py): a
/// bounded regular file holding `"logits": [numbers]`; a non-numeric entry is an error naming
/// its index and value, never a NaN in the comparison.
pub fn read_compare_logits(path: &Path) -> Result<Vec<f32>> {
    let v = crate::base::fsguard::read_json_object(
        path,
        "--compare file",
        crate::base::fsguard::COMPARE_LIMIT,
    )?;
    let list = match v.get("logits") {
        Some(serde_json::Value::Array(a)) => a,
        Some(other) => {
            return Err(Error::model(
                path,
                format!(
                    "\"logits\" is a {}, expected an array of numbers",
                    crate::base::fsguard::json_kind(other)
                ),
            ))
        }
        None => return Err(Error::model(path, "no \"logits\" array")),
    };
    list.iter()
        .enumerate()
        .map(|(i, x)| match x.as_f64() {
            Some(f) if f.is_finite() && f.abs() <= f32::MAX as f64 => Ok(f as f32),
            _ => Err(Error::model(
                path,
                format!("logits[{i}] is {x}, expected a finite number"),
            )),
        })
        .collect()
}

pub use crate::base::units::relative_l2;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama_3_8b_forward_flops_at_8192_tokens() {
        let cfg = crate::model::presets::preset("llama-3-8b").unwrap();
        let f = cfg.forward_flops(&[8192]);
        // 2·T·(linear params) = 1.143e14; causal attention adds 1.76e13, lm_head 1.05e9.
        let linear =
            2.0 * 8192.0 * 32.0 * (4096.0 * 6144.0 + 4096.0 * 4096.0 + 3.0 * 4096.0 * 14336.0);
        let attn = 32.0 * 4.0 * 4096.0 * 8192.0 * 8193.0 / 2.0;
        let head = 2.0 * 4096.0 * 128256.0;
        assert!((f / (linear + attn + head) - 1.0).abs() < 1e-12);
        assert!((f / 1e12 - 131.94).abs() < 0.01, "{}", f / 1e12);
    }

    #[test]
    fn fast_weights_have_the_synthetic_spread() {
        let w = FastWeights { seed: 1 }
            .read_f32("model.layers.0.mlp.up_proj.weight", &[256, 1024])
            .unwrap();
        let mean = w.iter().sum::<f32>() / w.len() as f32;
        let var = w.iter().map(|v| (v - mean).powi(2)).sum::<f32>() / w.len() as f32;
        assert!(mean.abs() < 1e-3, "{mean}");
        assert!((var.sqrt() - 0.02).abs() < 1e-3, "{}", var.sqrt());
    }

    #[test]
    fn bench_refuses_a_dry_device() {
        let req = BenchRequest {
            model: ModelSource::Preset {
                name: "tiny".into(),
            },
            quant: Quant::F16,
            device: DeviceSpec::Sim {
                preset: "h100-80gb".into(),
                dry: true,
                total: None,
                topology: None,
            },
            tokens: 4,
            seqs: 1,
            iters: 1,
            fast_weights: false,
            int8_threshold: 0.0,
            seed: 0,
            op_times: false,
            sampler_rows: 0,
            sampler_seqs: 256,
            tp: 1,
            ep: false,
        };
        assert!(matches!(run(&req), Err(Error::Request(_))));
        // Op timing is refused on the simulated device before any work.
        let req = BenchRequest {
            device: DeviceSpec::Sim {
                preset: "h100-80gb".into(),
                dry: false,
                total: None,
                topology: None,
            },
            op_times: true,
            ..req
        };
        match run(&req) {
            Err(Error::Request(m)) => assert!(m.contains("--op-times"), "{m}"),
            other => panic!(
                "expected a request error, got {:?}",
                other.map(|r| r.median_ms)
            ),
        }
    }

    #[test]
    fn relative_error_of_a_scaled_copy() {
        assert!((relative_l2(&[1.1, 2.2], &[1.0, 2.0]) - 0.1).abs() < 1e-6);
    }
}
