//! Mixture of experts under vLLM 0.29-0.33, where Model Runner V2 runs every model
//! (0.29.0 config/vllm.py L645-677). Read in the 0.29.0-0.33.0 wheels
//! (docs/reading/vllm-v1-fused-moe.md §10): V2's profile pass reaches the same Triton experts
//! as 0.28's V1 runner with the same buffers, so Mixtral and Qwen3-MoE answer there with
//! 0.28's MoE allocations plus V2's own terms (its sampler state, sampler and graph estimate).
//! FlashInfer's experts (Blackwell), data or expert parallel, Qwen2-MoE and DeepSeek on V2
//! stay refused, each in one line.

mod common;

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use vramscope::device::DeviceSpec;
use vramscope::model::ModelSource;
use vramscope::profile::{self, ProfileRequest, Report};
use vramscope::quant::Quant;

const GIB: f64 = (1u64 << 30) as f64;

/// `vramscope plan -q --csv FILE --device DEVICE --vllm V -- vllm serve preset:qwen3-30b-a3b`:
/// the first rank's timeline rows as (pass, kind, op, layer, tensor, bytes).
type Row = (u32, String, String, String, String, u64);

fn plan_csv(device: &str, vllm: &str) -> Vec<Row> {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("t.csv");
    let out = common::cli::vramscope(&[
        "plan",
        "-q",
        "--csv",
        csv.to_str().unwrap(),
        "--device",
        device,
        "--vllm",
        vllm,
        "--",
        "vllm",
        "serve",
        "preset:qwen3-30b-a3b",
    ]);
    common::cli::ok(&out);
    std::fs::read_to_string(&csv)
        .unwrap()
        .lines()
        .skip(1)
        .map(fields)
        .filter(|f| f.last().is_some_and(|r| r == "0"))
        .map(|f| {
            // seq,time_us,pass,kind,op,layer,tensor,category,bytes,…
            (
                f[2].parse().unwrap(),
                f[3].clone(),
                f[4].clone(),
                f[5].clone(),
                f[6].clone(),
                f[8].parse().unwrap(),
            )
        })
        .collect()
}

/// One CSV row's fields, a double-quoted field taken whole.
fn fields(line: &str) -> Vec<String> {
    let (mut out, mut cur, mut quoted) = (Vec::new(), String::new(), false);
    for c in line.chars() {
        match c {
            '"' => quoted = !quoted,
            ',' if !quoted => out.push(std::mem::take(&mut cur)),
            c => cur.push(c),
        }
    }
    out.push(cur);
    out
}

/// The allocations and frees of one MoE layer in the profile pass (pass 1).
fn layer_moe(rows: &[Row], layer: usize) -> Vec<(bool, String, u64)> {
    let prefix = format!("layers.{layer}.moe.");
    rows.iter()
        .filter(|r| r.0 == 1 && r.4.starts_with(&prefix))
        .filter(|r| r.1 == "alloc" || r.1 == "free")
        .map(|r| (r.1 == "alloc", r.4.clone(), r.5))
        .collect()
}

fn r256(v: u64) -> u64 {
    v.div_ceil(256) * 256
}

fn request(model: &str, device: &str, vllm: &str, tp: u32) -> ProfileRequest {
    ProfileRequest {
        model: ModelSource::parse(model).unwrap(),
        quant: Quant::BF16,
        device: DeviceSpec::parse(device).unwrap(),
        vllm: vllm.into(),
        tp,
        tokens: 0,
        seqs: 0,
        verify: false,
        ..ProfileRequest::default()
    }
}

fn run(req: &ProfileRequest) -> Result<Report, String> {
    profile::run(req, None, Arc::new(AtomicBool::new(false))).map_err(|e| e.to_string())
}

/// Qwen3-30B-A3B bf16, `vllm serve` defaults, on an A100 80GB and an H100 SXM under 0.29 and
/// 0.33. The oracle keeps Triton on both (0.29.0 and 0.33.0 fused_moe/oracle/unquantized.py:
/// FlashInfer's backends moved behind Triton on the 9.x family, neither takes compute
/// capability 8.0), and V2's profile pass runs `TritonExperts` as 0.28 does. By hand, k = 8,
/// I = 768 (N = 2I = 1536), H = 2048, E = 128, bf16:
/// - `workspace_shapes` (experts/triton_moe.py, 0.29.0 L218-233, 0.33.0 L240-255):
///   ws13 (M, k, max(N/2, H)), ws2 (M, k, max(N, H)), out (M, H); `_allocate_buffers`
///   (modular_kernel.py, 0.29.0 L1120-1181, 0.33.0 L1174-1221) takes one region of
///   max(ws13, out) and ws2 from the manager, each rounded to 256 B (`get_simultaneous`):
///   r256(2·M·8·2048) + r256(2·M·8·2048) bytes, made once in layer 0 and kept;
/// - an A100 profiles 2048 tokens (`vllm serve` below 70 GiB or on an A100): 134,217,728 B
///   (128 MiB); an H100 8192: 536,870,912 B (512 MiB);
/// - per layer: sorted ids over M·k + E·(BSM − 1) slots, BSM 128 (no E=128,N=768 16-bit file
///   for either GPU in the wheels: `get_default_config`, 128 above 512 tokens).
///
/// The same layer's allocations as 0.28 on V1's runner, byte for byte; V2's sampler state is
/// there (`output_bin_counts` [max_num_seqs, V] int32).
#[test]
fn qwen3_30b_under_0_29_and_0_33_runs_triton_on_model_runner_v2() {
    let (k, i, h, e) = (8u64, 768u64, 2048u64, 128u64);
    for (device, m, seqs) in [
        ("sim:a100-80gb:dry", 2048u64, 256u64),
        ("sim:h100-sxm:dry", 8192, 1024),
    ] {
        let want = r256(2 * m * k * i.max(h)) + r256(2 * m * k * (2 * i).max(h));
        let rows28 = plan_csv(device, "0.28");
        for vllm in ["0.29", "0.30", "0.31", "0.32", "0.33"] {
            let rows = plan_csv(device, vllm);
            let ws: Vec<(u32, String, u64)> = rows
                .iter()
                .filter(|r| r.4 == "moe.workspace" && r.1 == "alloc")
                .map(|r| (r.0, r.3.clone(), r.5))
                .collect();
            assert_eq!(ws, [(1, "0".to_string(), want)], "{device} {vllm}");
            let l5 = layer_moe(&rows, 5);
            assert_eq!(l5, layer_moe(&rows28, 5), "{device} {vllm}");
            let sorted: Vec<u64> = l5
                .iter()
                .filter(|(a, n, _)| *a && n.ends_with(".sorted_ids"))
                .map(|x| x.2)
                .collect();
            assert_eq!(sorted, [r256((m * k + e * 127) * 4)], "{device} {vllm}");
            let outputs: Vec<u64> = l5
                .iter()
                .filter(|(a, n, _)| *a && n.ends_with(".output"))
                .map(|x| x.2)
                .collect();
            assert_eq!(outputs, [m * h * 2], "{device} {vllm}");
            // Model Runner V2: its sampler state, made after the weights.
            // [seqs, 151936] int32, its block: the allocator leaves a remainder of 1 MiB or
            // less in the block rather than splitting it off (an H100's 1024 rows: 593.5 MiB
            // asked, 594 MiB given).
            let want = seqs * 151_936 * 4;
            assert!(
                rows.iter().any(|r| r.1 == "alloc"
                    && r.4 == "penalties.output_bin_counts"
                    && (want..=want + (1 << 20)).contains(&r.5)),
                "{device} {vllm}"
            );
            assert!(
                !rows28.iter().any(|r| r.4 == "penalties.output_bin_counts"),
                "0.28 runs Qwen3-MoE on V1's runner"
            );
        }
    }
    assert_eq!(
        r256(2 * 2048 * 8 * 2048) * 2,
        134_217_728,
        "the A100's workspace"
    );
    assert_eq!(
        r256(2 * 8192 * 8 * 2048) * 2,
        536_870_912,
        "the H100's workspace"
    );
}

/// The KV cache each release grants Qwen3-30B-A3B bf16 with `vllm serve` defaults (max_model_len
/// 40,960), dry: 0.29 and 0.33 on Model Runner V2, budgeted with #49208 (consumed + the
/// transient headroom, V2's graph estimate applied). `Available KV cache memory` and `GPU KV
/// cache size` as the log prints them, and the bytes. 0.33 is above 0.29 by the cuBLAS
/// handles it makes before the baseline (v1/worker/gpu_worker.py:518-529). For comparison,
/// 0.28 (V1's runner, its sampler's fp32 logits at the peak) grants 13.45 GiB / 146,944 tokens
/// on the A100 and 10.73 GiB / 117,200 on the H100. Printed with `--nocapture`.
#[test]
fn qwen3_30b_kv_cache_under_0_29_and_0_33() {
    for (device, vllm, gib, bytes, tokens) in [
        (
            "sim:a100-80gb:dry",
            "0.29",
            "13.88",
            14_904_792_064i64,
            151_616u64,
        ),
        (
            "sim:a100-80gb:dry",
            "0.33",
            "13.90",
            14_927_860_736,
            151_840,
        ),
        ("sim:h100-sxm:dry", "0.29", "11.95", 12_832_828_056, 130_528),
        ("sim:h100-sxm:dry", "0.33", "11.98", 12_868_479_640, 130_896),
    ] {
        let r = run(&request("preset:qwen3-30b-a3b", device, vllm, 1)).unwrap();
        let a = r.vllm_answer().unwrap();
        let kv = a.kv_bytes as f64 / GIB;
        let (t, concurrency) = r.kv_tokens_and_concurrency(&a);
        println!(
            "{device} {vllm}: {} tokens, {} seqs | KV {kv:.4} GiB ({} B) | {t} tokens | {concurrency:.2}x | estimate applied {} B",
            r.settings.tokens,
            r.settings.seqs,
            a.kv_bytes,
            r.graphs_estimate_applied()
        );
        assert_eq!(
            a.formula.id,
            vramscope::profile::formulas::FormulaId::Pr49208
        );
        assert_eq!(format!("{kv:.2}"), gib, "{device} {vllm}");
        assert_eq!(a.kv_bytes, bytes, "{device} {vllm}");
        assert_eq!(t, tokens, "{device} {vllm}");
        let lines = r.vllm_log_lines().join("\n");
        assert!(
            lines.contains(&format!("Available KV cache memory: {gib} GiB"))
                && lines.contains(&format!(
                    "GPU KV cache size: {} tokens",
                    vramscope::base::units::thousands(tokens)
                )),
            "{lines}"
        );
    }
}

/// The line docs/models.md shows, as written there.
#[test]
fn the_docs_line_for_0_33_on_an_h100_runs() {
    let out = common::cli::vramscope(&[
        "plan",
        "--device",
        "sim:h100-sxm:dry",
        "--vllm",
        "0.33",
        "--",
        "vllm",
        "serve",
        "preset:qwen3-30b-a3b",
    ]);
    common::cli::ok(&out);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("GPU KV cache size: ") && text.contains("8192 tokens in 1024 seq(s)"),
        "{text}"
    );
}

/// What 0.29-0.33 still refuse, each in one line naming it: FlashInfer's experts on the B200,
/// data or expert parallel, quantized experts (fp8, bitsandbytes), Qwen2-MoE's shared expert
/// inside the op, DeepSeek on V2.
#[test]
fn what_0_29_to_0_33_refuse_is_named_in_one_line() {
    let one_line = |e: &str| assert_eq!(e.lines().count(), 1, "{e}");
    for vllm in ["0.29", "0.31", "0.33"] {
        let e = run(&request("preset:qwen3-30b-a3b", "sim:b200:dry", vllm, 1)).unwrap_err();
        assert!(
            e.contains(&format!("--vllm {vllm}")) && e.contains("FlashInfer's TRT-LLM BF16 MoE"),
            "{e}"
        );
        one_line(&e);
        let mut dp = request("preset:qwen3-30b-a3b", "sim:a100-80gb:dry", vllm, 1);
        dp.dp = 2;
        let e = run(&dp).unwrap_err();
        assert!(e.contains("with data parallel is not modelled"), "{e}");
        one_line(&e);
        let mut ep = request("preset:qwen3-30b-a3b", "sim:a100-80gb:dry", vllm, 2);
        ep.enable_expert_parallel = true;
        let e = run(&ep).unwrap_err();
        assert!(e.contains("with expert parallel is not modelled"), "{e}");
        one_line(&e);
        let e = run(&request(
            "preset:deepseek-v2-lite",
            "sim:a100-80gb:dry",
            vllm,
            1,
        ))
        .unwrap_err();
        assert!(
            e.contains("'deepseek_v2'") && e.contains("Model Runner V2"),
            "{e}"
        );
        one_line(&e);
        // Quantized experts: fp8 (Fp8MoEMethod) and bitsandbytes are not modelled.
        for quant in [Quant::Fp8, Quant::Nf4] {
            let mut q = request("preset:qwen3-30b-a3b", "sim:h100-sxm:dry", vllm, 1);
            q.quant = quant;
            let e = run(&q).unwrap_err();
            assert!(e.contains("experts"), "{quant}: {e}");
            one_line(&e);
        }
        let r = vramscope::profile::vllm::release(vllm).unwrap();
        let e = r.check_arch("qwen2_moe").unwrap_err().to_string();
        assert!(
            e.contains("'qwen2_moe'") && e.contains("SharedExperts"),
            "{e}"
        );
        one_line(&e);
    }
}
