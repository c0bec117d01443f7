//! Host memory and time a run will take, estimated before it starts, and the refusal when the
//! memory is more than the machine has. Compute mode keeps every weight and activation in
//! host RAM (f32 for float tensors), so an 8B model needs ~32 GiB; a dry run keeps only the
//! event log and the batch. The user can insist (`--allow-host-memory`, or
//! `VRAMSCOPE_ALLOW_HOST_MEMORY=1` for the app).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use super::formulas::FormulaId;
use super::request::ProfileRequest;
use crate::base::error::{Error, Result};
use crate::base::units::fmt_u;
use crate::device::DeviceSpec;
use crate::model::{self, ModelConfig, ModelSource};
use crate::quant::Quant;

/// Set once by the CLI's `--allow-host-memory`: the user insists on running above the budget.
static INSISTED: AtomicBool = AtomicBool::new(false);

/// Lets runs exceed the host-memory budget for the rest of the process.
pub fn insist(yes: bool) {
    INSISTED.store(yes, Ordering::Relaxed);
}

fn insisted() -> bool {
    INSISTED.load(Ordering::Relaxed)
        || std::env::var("VRAMSCOPE_ALLOW_HOST_MEMORY").is_ok_and(|v| v == "1")
}

/// In-memory bytes of one timeline event (the struct, its op and tensor names, the log's
/// growth slack), measured on dry runs of the presets.
const EVENT_BYTES: u64 = 224;
/// Events per layer of one pass (allocs and frees of ~15 activations, segment maps), plus a
/// pass's fixed ones.
const EVENTS_PER_LAYER: u64 = 40;
const EVENTS_PER_PASS: u64 = 64;
/// What a process needs besides the run (code, allocator, threads).
const BASE_BYTES: u64 = 64 << 20;
/// Address space each thread reserves without using it: its stack (8 MiB) and glibc's malloc
/// arena (64 MiB on 64-bit). RSS never shows it, `ulimit -v` counts it.
const THREAD_STACK_BYTES: u64 = 8 << 20;
const ARENA_BYTES: u64 = 64 << 20;
/// Lifetime analysis (CSV summary, PNG) per event: one lifetime record per allocation.
const ANALYSIS_BYTES_PER_EVENT: u64 = 96;
/// A PNG report while it is drawn and encoded (the bitmap and its encoder).
const PNG_BYTES: u64 = 64 << 20;
/// A `--torch-snapshot` export's end state (segments and blocks) per event, at most.
const TORCH_SNAPSHOT_BYTES_PER_EVENT: u64 = 64;

/// The exports a run will write after it ends: the JSON, the CSV timeline and the PyTorch
/// snapshot stream to disk entry by entry; the rest is held in memory while written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Exports {
    pub json: bool,
    pub csv: bool,
    pub png: bool,
    pub torch_snapshot: bool,
}

/// The estimate, by part, in bytes; `compute_s` is the CPU time of compute mode's passes.
#[derive(Clone, Debug, PartialEq)]
pub struct HostEstimate {
    pub weights_bytes: u64,
    pub activations_bytes: u64,
    pub event_log_bytes: u64,
    pub batch_bytes: u64,
    /// Exports held in memory while written (`with_exports`).
    pub exports_bytes: u64,
    /// Address space reserved by the threads (counted against `ulimit -v` only).
    pub reserved_bytes: u64,
    /// Tensor-parallel ranks counted (each keeps its own event log; the instance's report
    /// holds a copy of the binding rank's).
    pub ranks: u64,
    pub total_bytes: u64,
    /// Forward passes the run makes (profile passes plus verify passes).
    pub passes: u64,
    /// Estimated seconds of CPU math (compute mode only).
    pub compute_s: Option<f64>,
}

impl HostEstimate {
    /// One line for the CLI and the app.
    pub fn summary(&self) -> String {
        let mut s = format!(
            "estimated host memory {} (weights {}, activations {}, event log {}, batch {}, exports {}, thread reservations {}; {} rank(s))",
            fmt_u(self.total_bytes),
            fmt_u(self.weights_bytes),
            fmt_u(self.activations_bytes),
            fmt_u(self.event_log_bytes),
            fmt_u(self.batch_bytes),
            fmt_u(self.exports_bytes),
            fmt_u(self.reserved_bytes),
            self.ranks
        );
        if let Some(t) = self.compute_s {
            s.push_str(&format!(
                "; compute time about {} for {} passes on this CPU",
                fmt_seconds(t),
                self.passes
            ));
        }
        s
    }
}

fn fmt_seconds(t: f64) -> String {
    if t < 1.0 {
        "under a second".into()
    } else if t < 120.0 {
        format!("{t:.0} s")
    } else if t < 7200.0 {
        format!("{:.0} min", t / 60.0)
    } else {
        format!("{:.1} h", t / 3600.0)
    }
}

/// Host bytes of one weight element as compute mode stores it: floats as f32; LLM.int8 as
/// i8 plus its row scales; NF4 and FP4 as packed nibbles plus one absmax per 64 (NF4's is
/// a u8 after double quantization, FP4's an f32; the f32 counted for both, the larger); fp8
/// as floats at its load's peak.
fn host_bytes_per_weight(quant: Quant, two_d: bool) -> f64 {
    match (quant, two_d) {
        (Quant::Int8, true) => 1.0 + 0.05,
        (Quant::Nf4 | Quant::Fp4, true) => 0.5 + 4.0 / 64.0,
        // In flight, fp8 first holds every weight in 16 bits (f32 here), then keeps 1-byte
        // codes: the load's peak is the f32 model.
        (Quant::Fp8, _) => 4.0,
        _ => 4.0,
    }
}

/// Estimates the host memory (and, in compute mode, the time) of `req` on model `cfg`
/// (`None` for a synthetic workload).
pub fn estimate(req: &ProfileRequest, cfg: Option<&ModelConfig>) -> HostEstimate {
    // The request the run will use: vLLM's defaults for what was left open (the batch of a
    // "vLLM default" max_num_batched_tokens is max_model_len's, not zero).
    let req = &req.resolved(cfg.map_or(0, |c| c.derived_max_model_len() as usize));
    let compute = matches!(req.device, DeviceSpec::Sim { dry: false, .. })
        && !matches!(req.model, ModelSource::Synthetic { .. });
    let verify = if req.verify {
        req.release()
            .map_or(FormulaId::ALL.len(), |r| r.listed_formulas().len()) as u64
            + 1
    } else {
        0
    };
    // A true-maximum search takes about 20 probes of its serving passes.
    let search = if req.true_max {
        20 * u64::from(super::request::TRUE_MAX_SERVING_PASSES)
    } else {
        0
    };
    let passes = req.passes as u64 + verify + search;
    let tokens = req.tokens as u64;
    let seqs = req.seqs as u64;
    let layers = cfg.map_or(0, |c| c.num_layers as u64);
    // Every rank keeps its own log; with more than one, the instance's report copies the
    // binding rank's at its top level.
    let ranks = u64::from(req.tp.max(1)) * u64::from(req.pp.max(1));
    let logs = if ranks > 1 { ranks + 1 } else { 1 };
    let events = passes * (layers * EVENTS_PER_LAYER + EVENTS_PER_PASS);
    let event_log_bytes = (events * EVENT_BYTES + (1 << 20)).saturating_mul(logs);
    // Ids and positions per token (the Batch, and the positions each pass builds).
    let batch_bytes = tokens * 12;
    let (weights_bytes, activations_bytes, compute_s) = match (compute, cfg) {
        (true, Some(c)) => {
            let weights: f64 = c
                .tensor_shapes()
                .iter()
                .map(|(_, s)| {
                    s.iter().product::<usize>() as f64
                        * host_bytes_per_weight(req.quant, s.len() == 2)
                })
                .sum();
            // Live at the peak of a layer: the residual stream and its norm, q/k/v and the
            // attention output, gate/up/act of the MLP (f32 each), the last tokens' logits.
            let (h, i, q, kv) = (
                c.hidden_size as u64,
                c.intermediate_size as u64,
                c.q_dim() as u64,
                c.kv_dim() as u64,
            );
            let per_token = 3 * h + 2 * q + 2 * kv + 3 * i;
            let activations = tokens * per_token * 4 + seqs * c.vocab_size as u64 * 12;
            let t = model_timing(
                c,
                (req.tokens, req.seqs),
                matches!(req.model, ModelSource::Preset { .. }),
            );
            // The layers' GEMMs, elementwise work and attention, lm_head on each sequence's
            // last token, the sampler; the weights are made (or converted) once. V1's profile
            // run skips attention (its serving passes attend).
            let lm_head = 2.0 * (seqs * c.hidden_size as u64 * c.vocab_size as u64) as f64;
            let v1 = req
                .release()
                .is_ok_and(|r| matches!(r.engine, super::vllm::Engine::V1 { .. }));
            let layer = |attend: bool| {
                tokens as f64 * (t.gemm_s_per_token + t.elementwise_s_per_token)
                    + if attend { t.attention_s } else { 0.0 }
            };
            let pass = |attend: bool| {
                layers as f64 * layer(attend)
                    + lm_head / t.lm_head_rate
                    + if req.sampler { t.sampler_s } else { 0.0 }
            };
            let profile_passes = req.passes as u64;
            let per_pass_total = profile_passes as f64 * pass(!v1)
                + passes.saturating_sub(profile_passes) as f64 * pass(true);
            let secs = c.param_count() as f64 * t.setup_s_per_weight + per_pass_total;
            // Each rank holds its shard of the weights and its own activations.
            (
                weights as u64,
                activations.saturating_mul(ranks),
                Some(secs),
            )
        }
        _ => (0, 0, None),
    };
    // Threads: the CPU kernels' pool (one per core) and one per rank, each with its stack;
    // glibc gives threads their own malloc arena, up to MALLOC_ARENA_MAX when it is set.
    let threads = std::thread::available_parallelism().map_or(4, |n| n.get() as u64) + ranks;
    let arenas = std::env::var("MALLOC_ARENA_MAX")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(threads)
        .min(threads);
    let reserved_bytes = threads * THREAD_STACK_BYTES + arenas * ARENA_BYTES;
    let mut e = HostEstimate {
        weights_bytes,
        activations_bytes,
        event_log_bytes,
        batch_bytes,
        exports_bytes: 0,
        reserved_bytes,
        ranks,
        total_bytes: 0,
        passes,
        compute_s,
    };
    e.total_bytes = e.resident_bytes();
    e
}

impl HostEstimate {
    /// Memory the run touches (what MemAvailable and a cgroup limit are compared with).
    fn resident_bytes(&self) -> u64 {
        [
            BASE_BYTES,
            self.weights_bytes,
            self.activations_bytes,
            self.event_log_bytes,
            self.batch_bytes,
            self.exports_bytes,
        ]
        .into_iter()
        .fold(0u64, u64::saturating_add)
    }

    /// The estimate with the exports the run will write counted: the lifetime analysis the
    /// CSV summary and the PNG make, the PNG bitmap, a `--torch-snapshot`'s end state. The
    /// JSON, the CSV timeline and the snapshot's trace stream to disk and add nothing.
    pub fn with_exports(mut self, x: Exports) -> Self {
        let events = self.event_log_bytes / EVENT_BYTES;
        let mut bytes = 0u64;
        if x.csv || x.png {
            bytes += events * ANALYSIS_BYTES_PER_EVENT;
        }
        if x.png {
            bytes += PNG_BYTES;
        }
        if x.torch_snapshot {
            bytes += events * TORCH_SNAPSHOT_BYTES_PER_EVENT;
        }
        self.exports_bytes = bytes;
        self.total_bytes = self.resident_bytes();
        self
    }
}

/// What one layer of a model costs on this CPU, measured on the model's own shapes.
#[derive(Clone, Copy, Debug)]
struct ModelTiming {
    /// Seconds per token of one layer's GEMMs.
    gemm_s_per_token: f64,
    /// Seconds per token of one layer's elementwise work: the norms, the rotary embedding,
    /// the activation, and the fresh activation buffers the pass allocates and fills.
    elementwise_s_per_token: f64,
    /// FLOP/s of lm_head's GEMM.
    lm_head_rate: f64,
    /// Seconds of one layer's attention over the batch's sequences.
    attention_s: f64,
    /// Seconds of the sampler's softmax, sort and cumulative sum over the sequences' logits.
    sampler_s: f64,
    /// Seconds to make one weight (a preset's synthetic values, rounded to the dtype) or to
    /// convert one read from a file, and to upload it.
    setup_s_per_weight: f64,
}

/// Largest side of a calibration GEMM, and its FLOPs: big models' shapes run at the rate of
/// this size (the kernel is compute-bound there), small ones are timed whole.
const CALIBRATION_SIDE: usize = 2048;
const CALIBRATION_FLOPS: usize = 800_000_000;
/// Rows of the elementwise calibration.
const CALIBRATION_ROWS: usize = 256;

/// One layer's GEMMs as `(k, n)` (in features, out features): its 2-D weights, with q/k/v and
/// gate/up fused as vLLM fuses them (`QKVParallelLinear`, `MergedColumnParallelLinear`).
fn layer_gemms(c: &ModelConfig) -> Vec<(usize, usize)> {
    let group = |name: &str| {
        ["q_proj.weight", "k_proj.weight", "v_proj.weight"]
            .iter()
            .any(|s| name.ends_with(s))
            .then_some(1)
            .or_else(|| {
                ["gate_proj.weight", "up_proj.weight"]
                    .iter()
                    .any(|s| name.ends_with(s))
                    .then_some(2)
            })
    };
    let mut out: Vec<(usize, usize, Option<u8>)> = Vec::new();
    for (name, shape) in c.tensor_shapes() {
        if shape.len() != 2 || !name.contains("layers.0.") {
            continue;
        }
        let (n, k, g) = (shape[0], shape[1], group(&name));
        match out.last_mut() {
            Some(last) if g.is_some() && last.2 == g && last.0 == k => last.1 += n,
            _ => out.push((k, n, g)),
        }
    }
    out.into_iter().map(|(k, n, _)| (k, n)).collect()
}

/// The median of three timed runs of `f` after a warm-up run: the run it estimates shares
/// the machine with the same neighbours, so the typical time, not the best, predicts it.
fn median_of_three(f: &mut dyn FnMut()) -> f64 {
    f();
    let mut t: Vec<f64> = (0..3)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed().as_secs_f64()
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[1].max(1e-9)
}

/// `ModelTiming` of `c`, measured once per shape for the process (~50 ms): each GEMM of a
/// layer on the pass's own path at up to `CALIBRATION_SIDE`, the layer's elementwise kernels
/// on `CALIBRATION_ROWS` rows with fresh buffers, and the making of 2²⁰ weights.
fn model_timing(c: &ModelConfig, (tokens, seqs): (usize, usize), synthetic: bool) -> ModelTiming {
    use crate::device::cpu;
    use std::collections::HashMap;
    use std::sync::Mutex;
    static CACHE: Mutex<Option<HashMap<String, ModelTiming>>> = Mutex::new(None);
    let gemms = layer_gemms(c);
    let (h, i, q, kv) = (c.hidden_size, c.intermediate_size, c.q_dim(), c.kv_dim());
    // The pass multiplies all its tokens at once; small shapes run slower on fewer rows, so
    // the calibration takes the pass's own row count where its FLOPs allow.
    let rows_for = |kc: usize, nc: usize, m: usize| {
        (CALIBRATION_FLOPS / (2 * kc * nc).max(1))
            .clamp(128, 16384)
            .min(m.max(1))
    };
    let key = format!(
        "{gemms:?} {h} {i} {q} {kv} {} {tokens} {seqs} {synthetic}",
        c.vocab_size
    );
    if let Some(t) = CACHE
        .lock()
        .ok()
        .and_then(|m| m.as_ref()?.get(&key).copied())
    {
        return t;
    }
    let never = AtomicBool::new(false);
    // FLOP/s of the pass's GEMM path on a `(k, n)` weight.
    let rate_of = |k: usize, n: usize, m: usize| {
        let (kc, nc) = (k.min(CALIBRATION_SIDE), n.min(CALIBRATION_SIDE));
        let rows = rows_for(kc, nc, m);
        let x = vec![0.5f32; rows * kc];
        let w = vec![0.25f32; nc * kc];
        let mut out = vec![0f32; rows * nc];
        let secs = median_of_three(&mut || {
            let _ = cpu::matmul_nt_cancellable(&x, &w, &mut out, (rows, kc, nc), &never);
        });
        (2 * rows * kc * nc) as f64 / secs
    };
    let gemm_s_per_token = gemms
        .iter()
        .map(|&(k, n)| 2.0 * (k * n) as f64 / rate_of(k, n, tokens))
        .sum();
    let lm_head_rate = rate_of(h, c.vocab_size, seqs);
    // One layer's attention over the batch's sequences (vLLM's dummy batch: equal lengths,
    // the remainder spread one token each): as many sequences as the calibration's FLOPs
    // allow, timed and scaled to all; a sequence longer than that is timed at the length
    // that fits and scaled by the square of the lengths (the causal pairs).
    let attention_s = {
        let shape = c.attn_shape();
        let len = tokens.div_ceil(seqs.max(1)).max(1);
        let per_seq_flops = |l: usize| 4.0 * c.q_dim() as f64 * (l * (l + 1) / 2) as f64;
        let budget = CALIBRATION_FLOPS as f64;
        let (l, scale_len) = if per_seq_flops(len) <= budget {
            (len, 1.0)
        } else {
            let l = ((2.0 * budget / (4.0 * c.q_dim() as f64)).sqrt() as usize).clamp(1, len);
            (l, per_seq_flops(len) / per_seq_flops(l))
        };
        let n = ((budget / per_seq_flops(l)) as usize).clamp(1, seqs.max(1));
        let lens = vec![l; n];
        let rows = l * n;
        let q = vec![0.01f32; rows * shape.heads * shape.head_dim];
        let kv = vec![0.02f32; rows * shape.kv_heads * shape.head_dim];
        let mut o = vec![0f32; q.len()];
        let secs = median_of_three(&mut || {
            let _ = cpu::attention(&q, &kv, &kv, &lens, shape, &mut o, &never);
        });
        secs * scale_len * seqs.max(1) as f64 / n as f64
    };
    // The sampler on a few rows of logits, scaled to every sequence.
    let sampler_s = {
        let v = c.vocab_size.max(1);
        let rows = seqs.clamp(1, 8);
        let logits: Vec<f32> = (0..rows * v).map(|j| ((j * 7919) % 1009) as f32).collect();
        let mut probs = vec![0f32; rows * v];
        let mut sorted = vec![0f32; rows * v];
        let mut idx = vec![0i32; rows * v];
        let mut cum = vec![0f32; rows * v];
        let secs = median_of_three(&mut || {
            crate::device::cpu_sampler::softmax_rows(&logits, v, &mut probs, false);
            crate::device::cpu_sampler::sort_rows(&probs, v, &mut sorted, &mut idx);
            crate::device::cpu_sampler::cumsum_rows(&sorted, v, &mut cum);
        });
        secs * seqs.max(1) as f64 / rows as f64
    };
    // A layer's elementwise work on `r` rows, each output in a fresh buffer as the pass
    // allocates its activations (page faults and zeroing included).
    let r = CALIBRATION_ROWS;
    let mut x = vec![0.5f32; r * h];
    let mut residual = vec![0.25f32; r * h];
    let norm_w = vec![1.0f32; h];
    let gate = vec![0.5f32; r * i];
    let up = vec![0.25f32; r * i];
    let positions: Vec<usize> = (0..r).collect();
    let elementwise = median_of_three(&mut || {
        cpu::add_rms_norm(&mut x, &mut residual, &norm_w, 1e-5);
        let mut qkv = vec![0f32; r * (q + 2 * kv)];
        qkv.iter_mut().for_each(|v| *v = 0.5);
        cpu::rope(
            &mut qkv[..r * q],
            &positions,
            c.num_heads,
            c.head_dim,
            10000.0,
        );
        let mut attn = vec![0f32; r * q];
        attn.copy_from_slice(&qkv[..r * q]);
        let mut o = vec![0f32; r * h];
        o.copy_from_slice(&x);
        cpu::add_rms_norm(&mut o, &mut residual, &norm_w, 1e-5);
        let mut act = vec![0f32; r * i];
        cpu::silu_mul_into(&gate, &up, &mut act);
        let mut down = vec![0f32; r * h];
        down.copy_from_slice(&o);
        std::hint::black_box((&attn, &act, &down));
    }) / r as f64;
    // Making (or converting) weights, and the upload's rounding. The run keeps every weight,
    // so each lands in memory never touched before: the samples are kept until all are
    // timed, or the allocator would hand the first one's pages back warm.
    let sample = 1usize << 21;
    let mut kept = Vec::new();
    let setup = median_of_three(&mut || {
        let mut v = if synthetic {
            model::weights::SyntheticWeights {
                preset: String::new(),
                seed: 0,
                dtype: model::weights::StoredDtype::F16,
            }
            .generate("calibration.weight", sample)
        } else {
            let mut v = vec![0f32; sample];
            v.iter_mut().enumerate().for_each(|(j, x)| *x = j as f32);
            v
        };
        crate::device::tensor::DType::F16.round_slice(&mut v);
        kept.push(v);
    }) / sample as f64;
    drop(kept);
    let t = ModelTiming {
        gemm_s_per_token,
        elementwise_s_per_token: elementwise,
        lm_head_rate,
        attention_s,
        sampler_s,
        setup_s_per_weight: setup,
    };
    if let Ok(mut m) = CACHE.lock() {
        m.get_or_insert_with(HashMap::new).insert(key, t);
    }
    t
}

/// Host memory this process may still take: the least of MemAvailable, the cgroup's limit
/// less its usage (v2, then v1), and the address-space limit (`ulimit -v`) less what is
/// mapped. `None` when none can be read (not Linux).
pub fn available_bytes() -> Option<(u64, &'static str)> {
    let read = |p: &str| std::fs::read_to_string(p).ok();
    let mut best: Option<(u64, &'static str)> = None;
    let mut take = |v: u64, what: &'static str| {
        if best.is_none_or(|(b, _)| v < b) {
            best = Some((v, what));
        }
    };
    let kib_field = |text: &str, key: &str| -> Option<u64> {
        text.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|r| r.split_whitespace().next()?.parse::<u64>().ok())
            .map(|k| k * 1024)
    };
    if let Some(v) = read("/proc/meminfo").and_then(|t| kib_field(&t, "MemAvailable:")) {
        take(v, "MemAvailable in /proc/meminfo");
    }
    let num = |p: &str| read(p).and_then(|t| t.trim().parse::<u64>().ok());
    if let (Some(max), Some(cur)) = (
        num("/sys/fs/cgroup/memory.max"),
        num("/sys/fs/cgroup/memory.current"),
    ) {
        take(max.saturating_sub(cur), "the cgroup's memory.max");
    } else if let (Some(max), Some(cur)) = (
        num("/sys/fs/cgroup/memory/memory.limit_in_bytes"),
        num("/sys/fs/cgroup/memory/memory.usage_in_bytes"),
    ) {
        // v1 reports "no limit" as a huge number; the comparison ignores it.
        take(
            max.saturating_sub(cur),
            "the cgroup's memory.limit_in_bytes",
        );
    }
    if let Some((left, what)) = address_space_left() {
        take(left, what);
    }
    best
}

/// The address-space limit (`ulimit -v`, RLIMIT_AS, read from /proc/self/limits) less what
/// this process has mapped already; `None` when there is no limit.
pub fn address_space_left() -> Option<(u64, &'static str)> {
    let read = |p: &str| std::fs::read_to_string(p).ok();
    let limit = read("/proc/self/limits").and_then(|t| {
        t.lines()
            .find(|l| l.starts_with("Max address space"))
            .and_then(|l| l.split_whitespace().nth(3)?.parse::<u64>().ok())
    })?;
    let mapped = read("/proc/self/status").and_then(|t| {
        t.lines()
            .find_map(|l| l.strip_prefix("VmSize:"))
            .and_then(|r| r.split_whitespace().next()?.parse::<u64>().ok())
            .map(|k| k * 1024)
    })?;
    Some((
        limit.saturating_sub(mapped),
        "the address-space limit (ulimit -v)",
    ))
}

/// Refuses a run whose estimated host memory exceeds what the machine has, unless the user
/// insisted. `cfg` is the opened model's shape (`None` for a synthetic workload).
pub fn check(req: &ProfileRequest, cfg: Option<&ModelConfig>) -> Result<()> {
    check_estimate(&estimate(req, cfg))
}

/// `check` of an estimate already made (the CLI refuses before printing it).
pub fn check_estimate(e: &HostEstimate) -> Result<()> {
    if insisted() {
        return Ok(());
    }
    if let Some((available, source)) = available_bytes() {
        if e.total_bytes > available {
            return Err(Error::Request(format!(
                "this run needs about {} of host memory (weights {}, activations {}, event log {}, exports {}; {} rank(s)) but {} leaves {}: use a dry run, fewer --tokens, --passes or --tp or a smaller model, or --allow-host-memory (VRAMSCOPE_ALLOW_HOST_MEMORY=1 in the app) to run anyway",
                fmt_u(e.total_bytes),
                fmt_u(e.weights_bytes),
                fmt_u(e.activations_bytes),
                fmt_u(e.event_log_bytes),
                fmt_u(e.exports_bytes),
                e.ranks,
                source,
                fmt_u(available)
            )));
        }
    }
    // The address-space limit counts what threads reserve as well as what the run touches.
    if let Some((left, source)) = address_space_left() {
        let need = e.total_bytes.saturating_add(e.reserved_bytes);
        if need > left {
            return Err(Error::Request(format!(
                "this run needs about {} of host memory and address space (memory {}, thread reservations {}, {} rank(s); event log {}, exports {}) but {source} leaves {}: raise the limit, use fewer --passes or --tp, or --allow-host-memory to run anyway",
                fmt_u(need),
                fmt_u(e.total_bytes),
                fmt_u(e.reserved_bytes),
                e.ranks,
                fmt_u(e.event_log_bytes),
                fmt_u(e.exports_bytes),
                fmt_u(left)
            )));
        }
    }
    Ok(())
}

/// `estimate` for a request whose model is not opened yet (the CLI and the app, before the
/// run): opens presets and config.json / GGUF headers only.
pub fn estimate_request(req: &ProfileRequest) -> Result<HostEstimate> {
    let cfg = match &req.model {
        ModelSource::Synthetic { .. } => None,
        other => Some(model::open(other, req.seed)?.config),
    };
    Ok(estimate(req, cfg.as_ref()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// With the batch left at vLLM's default, the estimate is the one of the batch the run
    /// will use (max(max_model_len, 2048)), not of an empty one.
    #[test]
    fn the_default_batch_is_estimated_as_it_will_run() {
        let cfg = crate::model::presets::preset("smollm2-135m").unwrap();
        let open = req("preset:smollm2-135m", "sim:h100-80gb", 0);
        let explicit = req("preset:smollm2-135m", "sim:h100-80gb", 8192);
        let (a, b) = (estimate(&open, Some(&cfg)), estimate(&explicit, Some(&cfg)));
        assert_eq!(a.total_bytes, b.total_bytes);
        assert_eq!(a.batch_bytes, b.batch_bytes);
        assert!(a.batch_bytes > 0);
        assert_eq!(a.compute_s, b.compute_s);
    }

    fn req(model: &str, device: &str, tokens: usize) -> ProfileRequest {
        ProfileRequest {
            model: ModelSource::parse(model).unwrap(),
            device: DeviceSpec::parse(device).unwrap(),
            tokens,
            ..ProfileRequest::default()
        }
    }

    /// One layer's GEMMs as the pass runs them: q/k/v and gate/up fused, OPT's fc1/fc2 apart.
    #[test]
    fn a_layer_has_the_fused_gemms_vllm_runs() {
        let llama = crate::model::presets::preset("smollm2-135m").unwrap();
        assert_eq!(
            layer_gemms(&llama),
            vec![
                (576, 576 + 2 * 192),
                (576, 576),
                (576, 2 * 1536),
                (1536, 576)
            ]
        );
        let opt = crate::model::presets::preset("opt-125m").unwrap();
        assert_eq!(
            layer_gemms(&opt),
            vec![(768, 3 * 768), (768, 768), (768, 3072), (3072, 768)]
        );
    }

    /// The estimate's parts follow the run: V1's profile pass skips attention (the same
    /// measured kernel times, so the estimate is lower), the sampler adds time, and a second
    /// pass adds a pass's time without a second setup.
    #[test]
    fn the_time_estimate_follows_what_the_run_does() {
        let cfg = crate::model::presets::preset("tiny").unwrap();
        let base = ProfileRequest {
            verify: false,
            ..req("preset:tiny", "sim:h100-80gb:compute", 2048)
        };
        let t = |r: &ProfileRequest| estimate(r, Some(&cfg)).compute_s.unwrap();
        let v0 = t(&base);
        let v1 = t(&ProfileRequest {
            vllm: "0.19".into(),
            ..base.clone()
        });
        assert!(v1 < v0, "{v1} < {v0}");
        let no_sampler = t(&ProfileRequest {
            sampler: false,
            ..base.clone()
        });
        assert!(no_sampler < v0, "{no_sampler} < {v0}");
        let two = t(&ProfileRequest {
            passes: 2,
            ..base.clone()
        });
        let setup = cfg.param_count() as f64
            * model_timing(&cfg, (base.tokens, base.seqs), true).setup_s_per_weight;
        assert!((two - setup - 2.0 * (v0 - setup)).abs() < 1e-9 * two);
    }

    #[test]
    fn compute_mode_counts_every_weight_as_f32() {
        let r = req("preset:llama-3-8b", "sim:h100-80gb:compute", 16);
        let cfg = crate::model::presets::preset("llama-3-8b").unwrap();
        let e = estimate(&r, Some(&cfg));
        assert_eq!(e.weights_bytes, cfg.param_count() * 4);
        assert!(e.compute_s.is_some());
    }

    #[test]
    fn a_dry_run_holds_no_weights_and_grows_only_with_the_batch() {
        let cfg = crate::model::presets::preset("llama-3-8b").unwrap();
        let small = estimate(
            &req("preset:llama-3-8b", "sim:h100-80gb:dry", 16),
            Some(&cfg),
        );
        let big = estimate(
            &req("preset:llama-3-8b", "sim:h100-80gb:dry", 16 + 1000),
            Some(&cfg),
        );
        assert_eq!(small.weights_bytes, 0);
        assert_eq!(small.compute_s, None);
        assert_eq!(big.total_bytes - small.total_bytes, 1000 * 12);
    }

    #[test]
    fn a_run_above_the_machine_is_refused_with_the_numbers() {
        let Some((avail, _)) = available_bytes() else {
            return;
        };
        let cfg = crate::model::presets::preset("llama-3-8b").unwrap();
        let r = req("preset:llama-3-8b", "sim:h100-80gb:compute", 8192);
        if estimate(&r, Some(&cfg)).total_bytes <= avail {
            return; // a machine with more than ~40 GiB free: nothing to refuse
        }
        let e = check(&r, Some(&cfg)).unwrap_err().to_string();
        assert!(e.contains("of host memory"), "{e}");
        assert!(e.contains("--allow-host-memory"), "{e}");
    }
}
