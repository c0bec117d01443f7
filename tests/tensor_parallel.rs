//! Tensor parallel (`--tp N`) on the simulated device: each rank holds exactly vLLM's shard of
//! the weights, the collectives compute the same logits as one device, NCCL's memory appears
//! per rank, the engine takes the fewest blocks over the ranks, and bad settings fail clearly.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use vramscope::device::DeviceSpec;
use vramscope::model::ModelSource;
use vramscope::profile::{self, ProfileRequest, Report};
use vramscope::quant::Quant;
use vramscope::Error;

fn run(model: &str, quant: Quant, device: &str, tp: u32, verify: bool) -> Result<Report, Error> {
    let req = ProfileRequest {
        model: ModelSource::parse(model).unwrap(),
        quant,
        device: DeviceSpec::parse(device).unwrap(),
        tp,
        verify,
        ..ProfileRequest::default()
    };
    profile::run(&req, None, Arc::new(AtomicBool::new(false)))
}

/// Llama-3-70B's fp16 weights on one of `n` ranks, shard by shard as vLLM cuts them
/// (config: hidden 8192, MLP 28672, 80 layers, 64 heads, 8 KV heads of 128, vocabulary
/// 128256, 8192 positions, lm_head untied).
fn llama_3_70b_rank_bytes(n: u64) -> u64 {
    let (h, i, layers, heads, kv, hd, vocab, pos): (u64, u64, u64, u64, u64, u64, u64, u64) =
        (8192, 28672, 80, 64, 8, 128, 128256, 8192);
    let kv_local = if kv >= n { kv / n } else { 1 };
    let qkv = (heads / n + 2 * kv_local) * hd * h;
    let o = h * (heads / n) * hd;
    let gate_up = 2 * (i / n) * h;
    let down = h * (i / n);
    let norms = 2 * h;
    let per_layer = qkv + o + gate_up + down + norms;
    let vocab_rows = vocab.div_ceil(64) * 64 / n;
    let params = layers * per_layer + 2 * vocab_rows * h + h + pos * hd;
    2 * params
}

#[test]
fn each_rank_holds_exactly_its_shards_and_replicates_the_norms() {
    // One GPU would need 141 GB for the weights alone: the reason for tensor parallel.
    for n in [2u32, 4, 8] {
        let r = run(
            "preset:llama-3-70b",
            Quant::F16,
            "sim:h100-80gb:dry",
            n,
            false,
        )
        .unwrap();
        let ranks: Vec<&Report> = r.ranks.iter().collect();
        assert_eq!(ranks.len(), n as usize);
        assert_eq!(r.tp, n);
        for (k, rank) in ranks.iter().enumerate() {
            assert_eq!(rank.rank as usize, k);
            let shards = llama_3_70b_rank_bytes(n as u64);
            assert_eq!(rank.weights_tensor_bytes, shards, "tp {n}, rank {k}");
            // What the allocator counts: the same, except that with 4 ranks the embedding and
            // lm_head shards (32064 rows, 501 MiB each) sit in segments rounded up to 2 MiB
            // with 1 MiB left over, which PyTorch does not split off (it splits a large block
            // only when more than 1 MiB would remain): 1 MiB more each.
            let rounding = if n == 4 { 2 << 20 } else { 0 };
            assert_eq!(rank.weights_bytes, shards + rounding, "tp {n}, rank {k}");
            // The norms are whole on every rank: 161 of them, 8192 wide, two bytes each.
            let norm_bytes: u64 = rank
                .events
                .iter()
                .filter(|e| {
                    e.kind == vramscope::memory::EventKind::Alloc
                        && e.tensor.ends_with("norm.weight")
                })
                .map(|e| e.bytes)
                .sum();
            assert_eq!(norm_bytes, 161 * 8192 * 2, "tp {n}, rank {k}");
            // Each rank caches only its KV heads.
            assert_eq!(rank.kv_geometry.num_kv_heads, (8 / n as u64).max(1));
        }
    }
}

fn relative_l2(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum();
    (num / den).sqrt()
}

#[test]
fn sharded_ranks_compute_the_logits_of_one_device() {
    let one = run("preset:tiny", Quant::F16, "sim:h100-80gb", 1, false).unwrap();
    let top = |r: &Report| -> Vec<f32> {
        r.logits
            .iter()
            .flat_map(|t| t.top.iter().map(|&(_, v)| v))
            .collect()
    };
    let ids = |r: &Report| -> Vec<u32> {
        r.logits
            .iter()
            .flat_map(|t| t.top.iter().map(|&(i, _)| i))
            .collect()
    };
    assert!(!one.logits.is_empty());
    // tiny has 4 heads and 2 KV heads: tp 4 replicates each KV head over two ranks.
    for n in [2u32, 4] {
        let r = run("preset:tiny", Quant::F16, "sim:h100-80gb", n, false).unwrap();
        assert_eq!(ids(&r), ids(&one), "tp {n}");
        let e = relative_l2(&top(&r), &top(&one));
        assert!(e < 1e-3, "tp {n}: relative L2 {e}");
        assert_eq!(r.sampled_tokens, one.sampled_tokens, "tp {n}");
    }
}

/// Phi-3 stores q/k/v and gate/up fused: each rank cuts its q, k and v rows (and its gate and
/// up rows) out of the one stored tensor, as QKVParallelLinear's loader does without a shard
/// id; the logits are one device's.
#[test]
fn phi3_ranks_cut_the_fused_checkpoint_tensors() {
    let dir = tempfile::tempdir().unwrap();
    let v = serde_json::json!({
        "model_type": "phi3", "hidden_size": 128, "intermediate_size": 256,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "vocab_size": 512, "max_position_embeddings": 256, "rope_theta": 10000.0,
        "rms_norm_eps": 1e-5, "tie_word_embeddings": false,
    });
    let cfg = vramscope::model::ModelConfig::from_hf_json(&v).unwrap();
    let opts = vramscope::model::GenOptions {
        dtype: vramscope::model::weights::StoredDtype::F16,
        seed: 3,
        shards: 1,
        bnb_int8: false,
        bnb_skip_modules: Vec::new(),
    };
    vramscope::model::gen_model_config(&cfg, "phi3-small", dir.path(), &opts).unwrap();
    let run = |tp: u32| {
        let req = ProfileRequest {
            model: ModelSource::Path {
                path: dir.path().to_path_buf(),
            },
            device: DeviceSpec::parse("sim:h100-80gb").unwrap(),
            tokens: 64,
            max_model_len: 64,
            seqs: 2,
            tp,
            verify: false,
            ..ProfileRequest::default()
        };
        profile::run(&req, None, Arc::new(AtomicBool::new(false))).unwrap()
    };
    let one = run(1);
    let values = |r: &Report| -> Vec<f32> {
        r.logits
            .iter()
            .flat_map(|t| t.top.iter().map(|&(_, v)| v))
            .collect()
    };
    assert!(!one.logits.is_empty());
    for n in [2u32, 4] {
        let r = run(n);
        let e = relative_l2(&values(&r), &values(&one));
        assert!(e < 1e-3, "tp {n}: relative L2 {e}");
        assert_eq!(r.sampled_tokens, one.sampled_tokens, "tp {n}");
    }
}

/// OPT as vLLM's opt.py splits it: biases of the column-parallel layers cut with their rows,
/// the row-parallel layers' whole bias added by rank 0 only, the embedding tied to the lm_head.
#[test]
fn opt_ranks_compute_the_logits_of_one_device() {
    let small = |tp: u32| {
        let req = ProfileRequest {
            model: ModelSource::parse("preset:opt-125m").unwrap(),
            device: DeviceSpec::parse("sim:h100-80gb").unwrap(),
            tokens: 64,
            max_model_len: 64,
            seqs: 2,
            tp,
            verify: false,
            ..ProfileRequest::default()
        };
        profile::run(&req, None, Arc::new(AtomicBool::new(false))).unwrap()
    };
    let one = small(1);
    let values = |r: &Report| -> Vec<f32> {
        r.logits
            .iter()
            .flat_map(|t| t.top.iter().map(|&(_, v)| v))
            .collect()
    };
    for n in [2u32, 4] {
        let r = small(n);
        let e = relative_l2(&values(&r), &values(&one));
        assert!(e < 1e-3, "tp {n}: relative L2 {e}");
        assert_eq!(r.sampled_tokens, one.sampled_tokens, "tp {n}");
        // Each rank holds its shards plus the whole positions, norms and row-parallel
        // biases: less than a full copy, more than 1/n of it.
        for k in &r.ranks {
            assert!(k.weights_tensor_bytes < one.weights_tensor_bytes);
            assert!(k.weights_tensor_bytes * n as u64 > one.weights_tensor_bytes);
        }
    }
}

#[test]
fn nccl_memory_and_the_custom_all_reduce_buffers_appear_per_rank() {
    use vramscope::device::group::CommSetup;
    use vramscope::device::nccl_model::{NcclModel, NcclRules, Topology};
    // The default release keeps vramscope's own measured NCCL; h100-80gb is an H100 SXM.
    let nccl = NcclModel::new(
        Topology::Nvlink,
        NcclRules::Nccl228Measured,
        "Hopper",
        132 * 2048,
    );
    let r = run(
        "preset:llama-3-8b",
        Quant::F16,
        "sim:h100-80gb:dry",
        2,
        false,
    )
    .unwrap();
    for rank in &r.ranks {
        let outside: Vec<(&str, u64)> = rank
            .events
            .iter()
            .filter(|e| e.kind == vramscope::memory::EventKind::OutsideAlloc)
            .map(|e| (e.tensor.as_str(), e.bytes))
            .collect();
        let k = rank.rank as usize;
        for setup in [
            CommSetup::PyncclInit,
            CommSetup::DeviceGroup,
            CommSetup::GatherP2p,
        ] {
            let want = nccl.bytes(setup, k, 2);
            assert!(
                outside.contains(&(setup.label(), want)),
                "rank {k}: {setup:?} {want} not in {outside:?}"
            );
        }
        // vLLM's custom all-reduce takes three buffers from the caching allocator at start.
        let ca: u64 = rank
            .events
            .iter()
            .filter(|e| {
                e.kind == vramscope::memory::EventKind::Alloc
                    && e.tensor.starts_with("custom_all_reduce.")
            })
            .map(|e| e.bytes)
            .sum();
        assert_eq!(
            ca,
            (3456u64 + (8 << 20)).next_multiple_of(512) + 2 * (8 << 20)
        );
    }
    // The sampler and the gathered logits live on rank 0 only.
    let sampler_bytes = |rank: &Report| -> u64 {
        rank.events
            .iter()
            .filter(|e| {
                e.kind == vramscope::memory::EventKind::Alloc
                    && e.category == vramscope::memory::Category::Sampler
            })
            .map(|e| e.bytes)
            .sum()
    };
    assert!(sampler_bytes(&r.ranks[0]) > 10 * sampler_bytes(&r.ranks[1]));
}

#[test]
fn the_engine_takes_the_fewest_blocks_and_names_the_rank() {
    let r = run(
        "preset:llama-3-8b",
        Quant::Int8,
        "sim:h100-80gb:dry",
        2,
        true,
    )
    .unwrap();
    assert!(!r.engine.is_empty());
    for e in &r.engine {
        let own: Vec<u64> = r
            .ranks
            .iter()
            .map(|k| {
                if e.key == "truth" {
                    k.truth.kv_blocks
                } else {
                    k.formulas
                        .iter()
                        .find(|f| f.id.key() == e.key)
                        .unwrap()
                        .kv_blocks
                }
            })
            .collect();
        assert_eq!(e.rank_blocks, own, "{}", e.key);
        assert_eq!(e.kv_blocks, *own.iter().min().unwrap(), "{}", e.key);
        assert_eq!(own[e.binding_rank as usize], e.kv_blocks, "{}", e.key);
    }
    // Rank 0 runs the sampler, so it binds #9516's budget and is the report's top level.
    let new = r.engine.iter().find(|e| e.key == "pr9516").unwrap();
    assert_eq!(new.binding_rank, 0);
    assert_eq!(r.rank, 0);
    // Every rank verifies the engine's block count, not its own.
    for k in &r.ranks {
        let f = k.formulas.iter().find(|f| f.id.key() == "pr9516").unwrap();
        let v = f.verify.as_ref().unwrap();
        assert_eq!(
            v.kv_allocated_bytes,
            new.kv_blocks * k.kv_geometry.block_bytes()
        );
    }
}

fn expect_request_error(model: &str, device: &str, tp: u32, must_contain: &[&str]) {
    let e = run(model, Quant::F16, device, tp, false)
        .unwrap_err()
        .to_string();
    for m in must_contain {
        assert!(e.contains(m), "{e:?} should contain {m:?}");
    }
}

#[test]
fn settings_that_cannot_split_are_refused_before_any_work() {
    // tiny has 4 attention heads: 8 GPUs cannot split them.
    expect_request_error(
        "preset:tiny",
        "sim:h100-80gb:dry",
        8,
        &["--tp 8", "4 attention heads"],
    );
    expect_request_error(
        "preset:opt-125m",
        "sim:h100-80gb:dry",
        8,
        &["--tp 8", "12 attention heads"],
    );
    expect_request_error(
        "preset:llama-3-8b",
        "sim:h100-80gb:dry",
        16,
        &["--tp 16", "between 1 and 8"],
    );
    // No GPU here (CI) or too few: the error says how many GPUs the run needs and sees.
    let e = run("preset:llama-3-8b", Quant::F16, "cuda:0", 8, false)
        .unwrap_err()
        .to_string();
    assert!(e.contains("--tp 8") && e.contains("cuda:0..cuda:7"), "{e}");
}

#[test]
fn a_rank_out_of_memory_is_named() {
    // 70B in fp16 over two 24 GB cards: each rank's 35 GB of weights cannot fit.
    let e = run(
        "preset:llama-3-70b",
        Quant::F16,
        "sim:l4-24gb:dry",
        2,
        false,
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("out of memory") && e.contains("tensor-parallel rank"),
        "{e}"
    );
    assert!(e.contains("load"), "{e}");
}

#[test]
fn a_torch_snapshot_of_a_tensor_parallel_run_has_one_device_per_rank() {
    let r = run("preset:tiny", Quant::F16, "sim:h100-80gb:dry", 2, false).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tp.pickle");
    vramscope::report::snapshot::write(&r, &path).unwrap();
    let back = vramscope::report::snapshot::read(&path, None).unwrap();
    assert_eq!(back.devices.len(), 2);
    for k in &r.ranks {
        let d = back.device(k.rank).expect("a device per rank");
        assert_eq!(d.events.len(), k.events.len(), "rank {}", k.rank);
        let peak = k.events.iter().map(|e| e.allocated).max().unwrap();
        assert_eq!(d.peak_allocated, peak, "rank {}", k.rank);
    }
}

#[test]
fn the_csvs_carry_every_rank_and_the_engine_rows() {
    let r = run("preset:tiny", Quant::F16, "sim:h100-80gb:dry", 2, false).unwrap();
    let timeline =
        String::from_utf8(vramscope::report::export::csv::timeline_bytes(&r).unwrap()).unwrap();
    let header: Vec<&str> = timeline.lines().next().unwrap().split(',').collect();
    assert_eq!(header.last(), Some(&"rank"));
    let rows_of = |rank: &str| {
        timeline
            .lines()
            .skip(1)
            .filter(|l| l.rsplit(',').next() == Some(rank))
            .count()
    };
    assert_eq!(rows_of("0"), r.ranks[0].events.len());
    assert_eq!(rows_of("1"), r.ranks[1].events.len());
    let summary =
        String::from_utf8(vramscope::report::export::csv::summary_bytes(&r).unwrap()).unwrap();
    let new = r.engine.iter().find(|e| e.key == "pr9516").unwrap();
    let row = summary
        .lines()
        .find(|l| l.starts_with("engine_pr9516,"))
        .expect("an engine row");
    let cells: Vec<&str> = row.split(',').collect();
    assert_eq!(cells.last(), Some(&new.binding_rank.to_string().as_str()));
    assert!(cells.contains(&new.kv_blocks.to_string().as_str()), "{row}");
}

/// `--topology`: the NCCL entries of a simulated pair follow how the GPUs are connected, each
/// report says where its numbers come from, and vLLM's custom all-reduce runs only where its
/// peer-to-peer check would pass.
#[test]
fn nccl_memory_follows_the_topology_and_says_its_source() {
    use vramscope::device::group::CommSetup;
    use vramscope::device::nccl_model::{NcclModel, NcclRules, Topology};
    let on = |topology: Topology| {
        let req = ProfileRequest {
            model: ModelSource::parse("preset:llama-3-8b").unwrap(),
            quant: Quant::F16,
            device: DeviceSpec::parse("sim:h100-80gb:dry")
                .unwrap()
                .with_topology(Some(topology))
                .unwrap(),
            tp: 2,
            verify: false,
            ..ProfileRequest::default()
        };
        profile::run(&req, None, Arc::new(AtomicBool::new(false))).unwrap()
    };
    let mut totals = Vec::new();
    for topology in Topology::ALL {
        let r = on(topology);
        let model = NcclModel::new(topology, NcclRules::Nccl228Measured, "Hopper", 132 * 2048);
        for rank in &r.ranks {
            let k = rank.rank as usize;
            let nccl: Vec<(&str, u64)> = rank
                .events
                .iter()
                .filter(|e| {
                    e.kind == vramscope::memory::EventKind::OutsideAlloc
                        && e.tensor.starts_with("nccl")
                })
                .map(|e| (e.tensor.as_str(), e.bytes))
                .collect();
            let want: Vec<(&str, u64)> = [
                CommSetup::PyncclInit,
                CommSetup::DeviceGroup,
                CommSetup::GatherP2p,
            ]
            .iter()
            .map(|&s| (s.label(), model.bytes(s, k, 2)))
            .collect();
            assert_eq!(nccl, want, "{topology:?} rank {k}");
            let src = rank.nccl_source.as_deref().unwrap();
            assert!(
                src.contains(topology.name()) && src.contains(&model.source),
                "{src}"
            );
            // Custom all-reduce buffers only where vLLM's check passes for two GPUs.
            let custom = rank
                .events
                .iter()
                .any(|e| e.tensor.starts_with("custom_all_reduce."));
            assert_eq!(custom, topology != Topology::PcieNoP2p, "{topology:?}");
        }
        totals.push(r.ranks[0].nccl_bytes());
    }
    // NVLink's 24 channels take more than PCIe's, which keeps its buffers on the device; the
    // shared-memory transport keeps them in host memory.
    assert!(totals[0] > totals[1] && totals[1] > totals[2], "{totals:?}");
}

/// No V1 release sets `NCCL_CUMEM_ENABLE=0` (0.8.5's env_override.py did), so a V1 run's NCCL
/// line says its cuMem-off rules are an assumption; a V0 run's does not.
#[test]
fn a_v1_runs_nccl_line_says_its_cumem_rules_are_assumed() {
    let src = |vllm: &str| {
        let req = ProfileRequest {
            model: ModelSource::parse("preset:llama-3-8b").unwrap(),
            quant: Quant::F16,
            device: DeviceSpec::parse("sim:l40s:dry").unwrap(),
            tp: 2,
            verify: false,
            vllm: vllm.into(),
            ..ProfileRequest::default()
        };
        let r = profile::run(&req, None, Arc::new(AtomicBool::new(false))).unwrap();
        r.ranks[0].nccl_source.clone().unwrap()
    };
    let v1 = src("0.19");
    assert!(
        v1.contains("NCCL 2.21.5 with NCCL_CUMEM_ENABLE=0")
            && v1.contains("vLLM 0.19 runs PyTorch 2.10's NCCL with cuMem on")
            && v1.ends_with("these cuMem-off rules are assumed"),
        "{v1}"
    );
    let v0 = src("0.8");
    assert!(!v0.contains("cuMem on"), "{v0}");
}
