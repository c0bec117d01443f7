//! The Llama-family forwards (Llama, Qwen2 with its qkv bias, Qwen3 with its per-head q/k
//! RMSNorm, Phi-3 with its fused checkpoint tensors, Gemma 2 with its soft-caps and sliding
//! window, Gemma 3 with its local/global rotary bases, Mixtral and Qwen3-MoE with their routers
//! and experts) against Hugging Face transformers in fp32 on small checkpoints this test writes:
//! the reference logits come from `scripts/hf_reference.py` (its docstring says how) and are
//! stored below with their provenance.

use std::path::Path;

use vramscope::app::bench::{self, relative_l2, BenchRequest};
use vramscope::device::DeviceSpec;
use vramscope::model::weights::StoredDtype;
use vramscope::model::{gen_model_config, GenOptions, ModelConfig, ModelSource};
use vramscope::quant::Quant;

/// The batch: `Batch::dummy(TOKENS, SEQS, vocab)` (ids `(i·7919 + 13) mod vocab`, lengths 6
/// and 5), each sequence's positions from 0, as the script builds it.
const TOKENS: usize = 11;
const SEQS: usize = 2;
/// The logits compared: every 16th id below the vocabulary (1024), of each sequence's last
/// token.
fn ids() -> Vec<usize> {
    (3..1024).step_by(16).collect()
}

/// The three small configurations (model_type, what each exercises).
fn config(name: &str) -> ModelConfig {
    let mut v = serde_json::json!({
        "hidden_size": 128,
        "intermediate_size": 384,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 1024,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 2048,
    });
    let o = v.as_object_mut().unwrap();
    match name {
        // Untied lm_head, rope_theta 500000 (Llama-3's).
        "llama" => {
            o.insert("model_type".into(), "llama".into());
            o.insert("rope_theta".into(), 500000.0.into());
            o.insert("tie_word_embeddings".into(), false.into());
        }
        // q/k/v biases, tied embeddings (Qwen2.5-0.5B's layout).
        "qwen2" => {
            o.insert("model_type".into(), "qwen2".into());
            o.insert("rope_theta".into(), 1000000.0.into());
            o.insert("tie_word_embeddings".into(), true.into());
        }
        // q_norm/k_norm per head, head_dim 64 (not hidden / heads = 32), no bias.
        "qwen3" => {
            o.insert("model_type".into(), "qwen3".into());
            o.insert("head_dim".into(), 64.into());
            o.insert("rope_theta".into(), 1000000.0.into());
            o.insert("tie_word_embeddings".into(), true.into());
        }
        // q/k/v and gate/up stored fused (qkv_proj, gate_up_proj), untied lm_head.
        "phi3" => {
            o.insert("model_type".into(), "phi3".into());
            o.insert("rope_theta".into(), 10000.0.into());
            o.insert("tie_word_embeddings".into(), false.into());
        }
        // GemmaRMSNorm (1 + w) four times a layer, GeGLU, √hidden embedding scale, head_dim 64
        // with query_pre_attn_scalar 32 (not 64), a 4-token window on layer 0 (the 6- and
        // 5-token sequences run past it), soft-caps small enough to bite on these weights
        // (attention scores here are ~0.3, logits ~0.5).
        "gemma2" => {
            o.insert("model_type".into(), "gemma2".into());
            o.insert("head_dim".into(), 64.into());
            o.insert("query_pre_attn_scalar".into(), 32.into());
            o.insert("sliding_window".into(), 4.into());
            o.insert("attn_logit_softcapping".into(), 0.25.into());
            o.insert("final_logit_softcapping".into(), 0.4.into());
            o.insert("rope_theta".into(), 10000.0.into());
        }
        // Per-head q_norm/k_norm (Gemma style), layer 0 sliding (window 4, rotary base 10000),
        // layer 1 global (rope_theta 1e6 with linear scaling 8), query_pre_attn_scalar 48, no
        // soft-caps (Gemma 3's).
        "gemma3" => {
            o.insert("model_type".into(), "gemma3_text".into());
            o.insert("head_dim".into(), 64.into());
            o.insert("query_pre_attn_scalar".into(), 48.into());
            o.insert("sliding_window".into(), 4.into());
            o.insert("sliding_window_pattern".into(), 2.into());
            o.insert("rope_theta".into(), 1000000.0.into());
            o.insert("rope_local_base_freq".into(), 10000.0.into());
            o.insert(
                "rope_scaling".into(),
                serde_json::json!({"rope_type": "linear", "factor": 8.0}),
            );
        }
        // 4 experts of width 96, 2 per token, renormalised (Mixtral always renormalises).
        "mixtral" => {
            o.insert("model_type".into(), "mixtral".into());
            o.insert("intermediate_size".into(), 96.into());
            o.insert("num_local_experts".into(), 4.into());
            o.insert("num_experts_per_tok".into(), 2.into());
            o.insert("rope_theta".into(), 1000000.0.into());
            o.insert("tie_word_embeddings".into(), false.into());
        }
        // 8 experts of width 64, 3 per token, not renormalised (norm_topk_prob false); layer 1
        // dense (mlp_only_layers) with the 384-wide MLP; per-head q/k norms, head_dim 64.
        "qwen3_moe" => {
            o.insert("model_type".into(), "qwen3_moe".into());
            o.insert("head_dim".into(), 64.into());
            o.insert("num_experts".into(), 8.into());
            o.insert("num_experts_per_tok".into(), 3.into());
            o.insert("moe_intermediate_size".into(), 64.into());
            o.insert("norm_topk_prob".into(), false.into());
            o.insert("decoder_sparse_step".into(), 1.into());
            o.insert("mlp_only_layers".into(), serde_json::json!([1]));
            o.insert("rope_theta".into(), 1000000.0.into());
            o.insert("tie_word_embeddings".into(), false.into());
        }
        // 6 experts of width 64 (not a power of two: topk_softmax's workspace), 2 per token,
        // not renormalised, a shared expert of width 96 behind its sigmoid gate; q/k/v biases.
        // Written for scripts/hf_reference.py; its reference logits are not taken yet (the
        // block is checked against its model file written out by hand in tests/moe.rs).
        "qwen2_moe" => {
            o.insert("model_type".into(), "qwen2_moe".into());
            o.insert("num_experts".into(), 6.into());
            o.insert("num_experts_per_tok".into(), 2.into());
            o.insert("moe_intermediate_size".into(), 64.into());
            o.insert("shared_expert_intermediate_size".into(), 96.into());
            o.insert("norm_topk_prob".into(), false.into());
            o.insert("rope_theta".into(), 1000000.0.into());
            o.insert("tie_word_embeddings".into(), false.into());
        }
        _ => unreachable!(),
    }
    ModelConfig::from_hf_json(&v).unwrap()
}

fn write(dir: &Path, name: &str) {
    let opts = GenOptions {
        dtype: StoredDtype::F16,
        seed: 11,
        shards: 1,
        bnb_int8: false,
    };
    gen_model_config(&config(name), name, dir, &opts).unwrap();
}

/// The product's own forward (`bench` with no timed pass) in compute mode on the CPU.
fn logits(dir: &Path) -> Vec<f32> {
    let req = BenchRequest {
        model: ModelSource::Path {
            path: dir.to_path_buf(),
        },
        quant: Quant::F16,
        device: DeviceSpec::parse("sim:h100-80gb").unwrap(),
        tokens: TOKENS,
        seqs: SEQS,
        iters: 0,
        fast_weights: false,
        int8_threshold: 0.0,
        seed: 0,
        op_times: false,
        sampler_rows: 0,
        sampler_seqs: 256,
        tp: 1,
    };
    bench::run(&req).unwrap().logits
}

fn check(name: &str, reference: &[[f64; 64]; 2]) {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), name);
    let ours = logits(dir.path());
    assert_eq!(ours.len(), SEQS * 1024);
    let picked: Vec<f32> = (0..SEQS)
        .flat_map(|s| ids().into_iter().map(move |i| (s, i)))
        .map(|(s, i)| ours[s * 1024 + i])
        .collect();
    let theirs: Vec<f32> = reference.iter().flatten().map(|&v| v as f32).collect();
    let e = relative_l2(&picked, &theirs);
    eprintln!("{name}: relative L2 against transformers {e:.3e}");
    assert!(e < 1e-3, "{name}: relative L2 {e:.3e}");
    // The logits are not trivially small (a forward that lost a layer would still be close
    // to nothing).
    let norm = theirs.iter().map(|v| v * v).sum::<f32>().sqrt();
    assert!(norm > 1e-2, "{name}: reference norm {norm}");
}

/// Writes the fixtures `scripts/hf_reference.py` reads (set VRAMSCOPE_HF_FIXTURES).
#[test]
#[ignore]
fn write_fixtures() {
    let root = std::path::PathBuf::from(std::env::var("VRAMSCOPE_HF_FIXTURES").unwrap());
    for name in [
        "llama",
        "qwen2",
        "qwen3",
        "phi3",
        "gemma2",
        "gemma3",
        "mixtral",
        "qwen3_moe",
        "qwen2_moe",
    ] {
        write(&root.join(name), name);
    }
}

#[test]
fn llama_logits_match_hugging_face() {
    check("llama", &HF_LLAMA);
}

#[test]
fn qwen2_logits_match_hugging_face() {
    check("qwen2", &HF_QWEN2);
}

#[test]
fn qwen3_logits_match_hugging_face() {
    check("qwen3", &HF_QWEN3);
}

#[test]
fn phi3_logits_match_hugging_face() {
    check("phi3", &HF_PHI3);
}

#[test]
fn gemma2_logits_match_hugging_face() {
    check("gemma2", &HF_GEMMA2);
}

#[test]
fn gemma3_logits_match_hugging_face() {
    check("gemma3", &HF_GEMMA3);
}

#[test]
fn mixtral_logits_match_hugging_face() {
    check("mixtral", &HF_MIXTRAL);
}

#[test]
fn qwen3_moe_logits_match_hugging_face() {
    check("qwen3_moe", &HF_QWEN3_MOE);
}

/// The small Gemma configurations exercise what they say: the window is shorter than the
/// sequences, layer 1 of the Gemma 3 one is global with its own rotary base, and the
/// config.json written for transformers reads back as the same shape.
#[test]
fn gemma_test_configs_exercise_window_softcaps_and_rope_bases() {
    let g2 = config("gemma2");
    let s = g2.score_mods(0);
    assert_eq!(s.window, Some(4));
    assert_eq!(g2.score_mods(1).window, None);
    assert_eq!(
        (s.softcap, g2.final_logit_softcap()),
        (Some(0.25), Some(0.4))
    );
    assert_eq!(s.scale, Some(32f32.powf(-0.5)));
    let g3 = config("gemma3");
    assert!(g3.qk_norm());
    assert_eq!(g3.layer_rope(0), (10000.0, 1.0));
    assert_eq!(g3.layer_rope(1), (1e6, 8.0));
    assert_eq!(
        (g3.score_mods(0).window, g3.score_mods(1).window),
        (Some(4), None)
    );
    assert_eq!(g3.final_logit_softcap(), None);
    for c in [g2, g3] {
        let json = c.to_hf_json("float16");
        assert_eq!(ModelConfig::from_hf_json(&json).unwrap(), c);
    }
}

// Gemma 2 and Gemma 3 (text): Hugging Face transformers in fp32 on the CPU
// (scripts/hf_reference.py DIR gemma2,gemma3, run on the GPU machine 2026-12-02 ~08:00 UTC on
// fixtures written by `write_fixtures` on branch gemma): torch 2.11.0+cu130, transformers
// 5.17.0, python 3.12.3. transformers read the configs as written: gemma2 sliding_window 4,
// layer_types [sliding, full], query_pre_attn_scalar 32, soft-caps 0.25 / 0.4; gemma3
// query_pre_attn_scalar 48, rope sliding 10000 default, full 1e6 linear x8.
// gemma2: Gemma2ForCausalLM, gemma3: Gemma3ForCausalLM
const HF_GEMMA2: [[f64; 64]; 2] = [
    [
        -4.41725589e-02,
        1.28258035e-01,
        3.51402432e-01,
        3.20816338e-01,
        -3.26754600e-01,
        -3.19661260e-01,
        -2.81816900e-01,
        3.59935254e-01,
        8.52854252e-02,
        2.16642171e-01,
        -3.71311724e-01,
        1.53855070e-01,
        -3.62554759e-01,
        3.38695258e-01,
        -3.48901659e-01,
        -1.78947508e-01,
        3.78274858e-01,
        -3.50292213e-02,
        -3.81305695e-01,
        -3.89926165e-01,
        2.29675159e-01,
        -3.07148278e-01,
        -3.44300598e-01,
        -3.55126828e-01,
        2.33730227e-01,
        -8.20265636e-02,
        -2.06413910e-01,
        3.06405753e-01,
        5.66487983e-02,
        2.95593917e-01,
        3.72007906e-01,
        -2.05539092e-01,
        3.64858598e-01,
        1.78460494e-01,
        7.57243205e-03,
        1.85449466e-01,
        -3.85830015e-01,
        6.17337301e-02,
        -3.96648943e-01,
        2.61499733e-01,
        1.33508742e-01,
        2.51032442e-01,
        -2.08681226e-01,
        -1.37439653e-01,
        2.17959508e-02,
        3.36959571e-01,
        -3.65980476e-01,
        -3.73280466e-01,
        2.26000696e-02,
        -2.46907666e-01,
        1.35754630e-01,
        -3.12356442e-01,
        -3.75888973e-01,
        1.94265336e-01,
        3.43347967e-01,
        3.88411909e-01,
        -3.11875552e-01,
        2.51866132e-01,
        -2.69343823e-01,
        -3.48538369e-01,
        3.50330174e-01,
        -3.37750256e-01,
        -1.92385539e-01,
        -2.35169716e-02,
    ],
    [
        1.96346611e-01,
        -1.25123978e-01,
        3.62472415e-01,
        -3.01570743e-01,
        -1.60603091e-01,
        -1.91231206e-01,
        -2.06617504e-01,
        -3.90771359e-01,
        -3.06778431e-01,
        -2.26307437e-01,
        3.73943418e-01,
        1.71807051e-01,
        1.17131710e-01,
        3.91769230e-01,
        2.59204477e-01,
        -1.17630117e-01,
        2.00000569e-01,
        -2.49398142e-01,
        -2.72023201e-01,
        -7.90828019e-02,
        2.42054924e-01,
        -3.14716786e-01,
        1.22878611e-01,
        3.57862443e-01,
        -5.42512070e-03,
        7.75463134e-02,
        1.93186924e-01,
        -3.20840478e-01,
        -2.32247829e-01,
        3.27178687e-01,
        -3.57495636e-01,
        -2.81315655e-01,
        3.66151482e-01,
        3.27365994e-01,
        2.00320017e-02,
        -3.94497812e-02,
        3.57293695e-01,
        1.00602262e-01,
        -6.06514402e-02,
        -4.61465158e-02,
        1.24547862e-01,
        5.04813797e-04,
        3.42319697e-01,
        2.01798037e-01,
        -2.29319006e-01,
        3.97299379e-01,
        -3.68433595e-02,
        1.25181094e-01,
        3.70750308e-01,
        -3.39577377e-01,
        -3.80050242e-01,
        3.08536869e-02,
        -1.85994312e-01,
        3.97815436e-01,
        3.11908096e-01,
        -3.78124684e-01,
        3.65228176e-01,
        -1.67163655e-01,
        1.79556593e-01,
        1.59366712e-01,
        -3.23046058e-01,
        1.60688832e-01,
        3.29613298e-01,
        3.89602333e-01,
    ],
];
const HF_GEMMA3: [[f64; 64]; 2] = [
    [
        2.63883680e-01,
        3.06007832e-01,
        -1.58767015e-01,
        -6.05274081e-01,
        -4.89448041e-01,
        -3.93167496e-01,
        -4.17449087e-01,
        7.60364652e-01,
        -5.16813174e-02,
        -1.25756904e-01,
        -3.17778647e-01,
        6.72333002e-01,
        -3.13514739e-01,
        -3.90194029e-01,
        -2.37621427e-01,
        1.72040954e-01,
        1.96838602e-01,
        7.86527634e-01,
        -1.05936337e+00,
        -2.60787278e-01,
        -1.70173392e-01,
        1.49117410e-02,
        -1.60586521e-01,
        2.20205098e-01,
        3.52299780e-01,
        -3.51284444e-01,
        -4.32831764e-01,
        1.16171300e+00,
        2.48635277e-01,
        4.90276605e-01,
        3.05283368e-01,
        -1.66393921e-01,
        4.34619993e-01,
        -4.51857150e-01,
        -3.60089451e-01,
        6.26244307e-01,
        -9.35486138e-01,
        2.99017131e-01,
        -2.93071866e-01,
        4.58801627e-01,
        -6.60793334e-02,
        2.73608536e-01,
        -5.97048461e-01,
        -2.35720173e-01,
        4.82079774e-01,
        3.27027172e-01,
        -7.63014078e-01,
        -2.43477732e-01,
        -8.29890192e-01,
        2.97309041e-01,
        1.02775082e-01,
        7.62110427e-02,
        -2.82810349e-02,
        -7.38058090e-01,
        4.24213171e-01,
        4.88767266e-01,
        -4.20460731e-01,
        1.48074716e-01,
        -1.05804741e+00,
        -1.01108837e+00,
        -2.14819565e-01,
        2.81006217e-01,
        -4.78160053e-01,
        3.52926046e-01,
    ],
    [
        -3.22188199e-01,
        2.23884225e-01,
        1.06733799e+00,
        4.52018380e-01,
        -1.00307181e-01,
        1.66874766e-01,
        -2.93619037e-02,
        -6.15098357e-01,
        -5.58924973e-01,
        -1.61243498e-01,
        2.78200805e-01,
        -1.05404019e-01,
        2.63616383e-01,
        1.49607241e-01,
        4.16616976e-01,
        -3.06387067e-01,
        -5.05290926e-02,
        -4.35467243e-01,
        9.15140510e-02,
        -9.14365351e-02,
        -1.98947310e-01,
        -9.20707285e-02,
        3.51073034e-02,
        5.25390431e-02,
        5.11504054e-01,
        -1.88390017e-01,
        1.83026716e-01,
        -3.13324332e-01,
        5.30095458e-01,
        -9.73203480e-02,
        -8.30322802e-01,
        -2.97734559e-01,
        6.55417800e-01,
        6.03732347e-01,
        7.03494787e-01,
        -7.07382560e-01,
        -4.97660846e-01,
        1.32411361e-01,
        2.69220978e-01,
        4.85663950e-01,
        -2.08282009e-01,
        3.47926579e-02,
        1.89057454e-01,
        -6.90650344e-01,
        1.61708295e-01,
        6.67025805e-01,
        -5.03442362e-02,
        -5.54723799e-01,
        -2.14533821e-01,
        4.10930574e-01,
        -6.59286678e-01,
        3.30977887e-02,
        -9.30253267e-02,
        8.23463082e-01,
        7.07853854e-01,
        -5.46638310e-01,
        2.00126961e-01,
        -5.90640008e-01,
        -9.65115353e-02,
        3.62445980e-01,
        1.20656490e-02,
        -1.83090270e-01,
        7.36816823e-01,
        6.55433297e-01,
    ],
];

// Hugging Face transformers in fp32 on the CPU (scripts/hf_reference.py, run on the GPU machine
// 2026-12-02 04:38 UTC on fixtures written by `write_fixtures` at commit 4cd048a's tree):
// torch 2.11.0+cu130, transformers 5.17.0, python 3.12.3

// llama: LlamaForCausalLM
const HF_LLAMA: [[f64; 64]; 2] = [
    [
        4.85577881e-01,
        -1.55470401e-01,
        9.34792012e-02,
        8.37963074e-02,
        -1.04103394e-01,
        -8.12100768e-02,
        -3.00008535e-01,
        -3.27412844e-01,
        -1.50802076e-01,
        1.89424410e-01,
        -1.41892344e-01,
        -8.56479481e-02,
        2.36716092e-01,
        -3.23215336e-01,
        2.07755603e-02,
        8.99071321e-02,
        -3.00682992e-01,
        2.42821518e-02,
        2.58289963e-01,
        -5.30650377e-01,
        -4.05031592e-01,
        1.54806301e-01,
        1.99859887e-01,
        -4.20311987e-02,
        -4.86264259e-01,
        -2.93149296e-02,
        6.96753561e-02,
        1.65153980e-01,
        4.55420136e-01,
        -3.67379212e-03,
        3.42380889e-02,
        -3.98136377e-02,
        -1.26512855e-01,
        -1.74747810e-01,
        -5.02049267e-01,
        3.86045069e-01,
        1.32010311e-01,
        1.98391769e-02,
        5.65485209e-02,
        8.23984370e-02,
        -8.46952870e-02,
        1.42768726e-01,
        -1.34813532e-01,
        1.46858722e-01,
        -3.10938451e-02,
        3.08300614e-01,
        -2.30596781e-01,
        -2.73611426e-01,
        -1.10924609e-01,
        -3.62568758e-02,
        -5.97464070e-02,
        -1.87680256e-02,
        2.10173190e-01,
        -2.44631872e-01,
        2.26015002e-01,
        9.90202874e-02,
        -7.07943812e-02,
        7.27089867e-02,
        -1.49599493e-01,
        -1.23936059e-02,
        -5.21655157e-02,
        9.32296291e-02,
        3.74218374e-02,
        2.56872803e-01,
    ],
    [
        -3.67722332e-01,
        -3.93017381e-02,
        7.68976137e-02,
        -1.55761361e-01,
        -1.67344511e-01,
        1.00534558e-01,
        -4.35611308e-01,
        -1.14661679e-01,
        -1.59747779e-01,
        1.35337144e-01,
        -3.45623493e-01,
        4.51488853e-01,
        -7.99959600e-02,
        3.48179549e-01,
        -8.42515379e-02,
        5.14231443e-01,
        1.33975506e-01,
        1.90288812e-01,
        -2.62792468e-01,
        -3.06630701e-01,
        3.51512432e-03,
        3.70233387e-01,
        -9.96674448e-02,
        2.16410980e-02,
        1.53139099e-01,
        -2.91159093e-01,
        -1.39683127e-01,
        -2.30492145e-01,
        1.36446118e-01,
        1.04499072e-01,
        2.73991913e-01,
        -1.00092657e-01,
        -1.00281663e-01,
        -1.81912452e-01,
        2.60606289e-01,
        -8.84616375e-02,
        -2.32211635e-01,
        -3.27104896e-01,
        3.72308791e-02,
        2.91334838e-03,
        -5.14400005e-02,
        3.54060233e-02,
        2.69630969e-01,
        1.62422836e-01,
        1.32639647e-01,
        -4.35545743e-02,
        1.99109599e-01,
        6.28821254e-02,
        -2.02220500e-01,
        3.50707114e-01,
        3.86191040e-01,
        2.41309106e-02,
        2.54964709e-01,
        -4.84532043e-02,
        -9.43747833e-02,
        -2.21266910e-01,
        4.99626175e-02,
        -4.23236012e-01,
        1.54403090e-01,
        2.59288400e-01,
        -2.35535800e-01,
        1.22493938e-01,
        -5.20935953e-02,
        -2.58894682e-01,
    ],
];

// qwen2: Qwen2ForCausalLM
const HF_QWEN2: [[f64; 64]; 2] = [
    [
        1.44388556e-01,
        -4.18456644e-01,
        1.48461536e-01,
        -4.45095330e-01,
        4.29777466e-02,
        -3.72690231e-01,
        5.53617030e-02,
        5.37636995e-01,
        1.39153391e-01,
        9.87810567e-02,
        1.63234800e-01,
        1.84929311e-01,
        -2.19641134e-01,
        5.25615871e-01,
        6.09483607e-02,
        -2.67071533e-03,
        7.40603283e-02,
        -2.44041774e-02,
        -1.91657126e-01,
        -2.27574065e-01,
        3.91918808e-01,
        -1.95557714e-01,
        -1.07662246e-01,
        7.73948282e-02,
        -1.01775959e-01,
        -2.97835711e-02,
        -3.79586965e-01,
        -5.48878126e-02,
        -2.53968596e-01,
        -6.84267133e-02,
        -1.11384086e-01,
        -2.82097101e-01,
        -2.31362328e-01,
        1.50137708e-01,
        2.19152361e-01,
        3.26777369e-01,
        -2.80149519e-01,
        2.44797722e-01,
        -2.06195697e-01,
        4.39117886e-02,
        3.24999601e-01,
        -7.03184307e-03,
        -2.93785661e-01,
        7.83114508e-02,
        -5.26492536e-01,
        -1.77726299e-01,
        8.20803270e-02,
        5.96987121e-02,
        -3.09150428e-01,
        -1.19092330e-01,
        2.80071229e-01,
        1.07884847e-01,
        -2.70417452e-01,
        -2.00889051e-01,
        1.53094560e-01,
        2.22311895e-02,
        1.36367500e-01,
        8.53392854e-02,
        4.09236439e-02,
        -2.55664587e-01,
        1.65906876e-01,
        1.16798870e-01,
        2.64443806e-03,
        7.48237520e-02,
    ],
    [
        -5.52251101e-01,
        1.31699312e-02,
        -4.74792004e-01,
        3.01277637e-03,
        -9.61133316e-02,
        -4.56132442e-02,
        1.42378405e-01,
        -4.29119349e-01,
        2.44574234e-01,
        5.75897098e-03,
        9.50422734e-02,
        -3.06798995e-01,
        -3.68892312e-01,
        -1.25404090e-01,
        -1.04722008e-01,
        3.89689147e-01,
        9.79715735e-02,
        3.13136101e-01,
        -1.34663790e-01,
        1.50105238e-01,
        1.60818353e-01,
        1.53627604e-01,
        7.54585505e-01,
        -1.54898793e-01,
        -9.64519829e-02,
        -1.35644674e-01,
        1.93096399e-01,
        -2.14014709e-01,
        2.49481261e-01,
        2.57133693e-03,
        6.51848912e-02,
        2.09501058e-01,
        -8.48501921e-04,
        -3.37933093e-01,
        -2.19539702e-01,
        -3.27823043e-01,
        1.83294341e-01,
        5.79220168e-02,
        2.94711381e-01,
        -5.76684996e-02,
        1.66476429e-01,
        2.20625162e-01,
        3.92983437e-01,
        1.14721656e-02,
        8.92089084e-02,
        3.26937497e-01,
        3.64915133e-02,
        2.45772555e-01,
        -7.03140274e-02,
        -2.83001542e-01,
        -2.28064761e-01,
        2.41496563e-01,
        -2.39375800e-01,
        3.58009279e-01,
        -1.19073212e-01,
        -1.64942160e-01,
        -6.20036572e-03,
        1.07292704e-01,
        3.40521395e-01,
        3.17317277e-01,
        -3.37278992e-01,
        2.08301321e-02,
        -2.33014494e-01,
        -2.02798247e-02,
    ],
];

// qwen3: Qwen3ForCausalLM
const HF_QWEN3: [[f64; 64]; 2] = [
    [
        3.14308703e-01,
        5.82606420e-02,
        4.26133543e-01,
        7.84594268e-02,
        -1.81374177e-01,
        -4.34330016e-01,
        2.52585895e-02,
        4.98062700e-01,
        -1.18811704e-01,
        7.98956677e-03,
        -1.62121534e-01,
        1.34732723e-01,
        -1.16153933e-01,
        2.40523487e-01,
        -3.39838505e-01,
        -1.65534452e-01,
        -3.46733987e-01,
        1.96383111e-02,
        -2.60649621e-01,
        -1.70942515e-01,
        -4.30759713e-02,
        8.16548914e-02,
        -5.13047814e-01,
        -3.45166147e-01,
        2.05715954e-01,
        -8.00054744e-02,
        -3.37039295e-04,
        2.41692245e-01,
        -4.90814708e-02,
        -7.43707120e-02,
        7.35388994e-02,
        -4.28998955e-02,
        1.15773872e-01,
        3.53887796e-01,
        4.04052287e-01,
        -1.28740981e-01,
        -3.06547493e-01,
        -2.44938582e-03,
        -1.09988883e-01,
        2.79198587e-01,
        5.17884679e-02,
        -2.52417982e-01,
        -3.61038864e-01,
        -1.85595751e-01,
        -1.80700973e-01,
        -8.51932764e-02,
        -1.48886323e-01,
        9.29497704e-02,
        -1.79141372e-01,
        7.47070536e-02,
        2.52944678e-01,
        -3.02084208e-01,
        5.62439859e-02,
        -3.61556619e-01,
        2.82124043e-01,
        2.96629816e-01,
        -3.32015783e-01,
        -1.58495843e-01,
        -4.18806195e-01,
        -1.95221573e-01,
        3.67686003e-01,
        -1.34552613e-01,
        1.17313080e-01,
        -1.11890826e-02,
    ],
    [
        -2.21080333e-02,
        8.67010951e-02,
        4.38647687e-01,
        9.38163251e-02,
        -6.16262481e-02,
        7.27320313e-02,
        5.17237931e-02,
        -2.26512283e-01,
        -9.44123119e-02,
        -8.97876173e-03,
        2.03060746e-01,
        -5.54192401e-02,
        -5.32716550e-02,
        4.10886824e-01,
        7.89934844e-02,
        2.18585655e-02,
        2.78070234e-02,
        -2.17070028e-01,
        -1.11362040e-02,
        -2.86551453e-02,
        2.32550770e-01,
        -2.75263429e-01,
        5.37499666e-01,
        -3.45425084e-02,
        5.22811189e-02,
        -1.53857589e-01,
        6.87875301e-02,
        -2.91813105e-01,
        -5.42258322e-02,
        1.31825790e-01,
        -2.83461720e-01,
        -2.31429219e-01,
        1.93626687e-01,
        1.15765125e-01,
        -5.91039397e-02,
        -3.16536486e-01,
        1.86201185e-01,
        1.44963607e-01,
        -1.51980013e-01,
        -3.52641463e-01,
        -1.50013864e-01,
        6.10415451e-02,
        1.31636485e-01,
        -1.15728259e-01,
        -1.14707798e-01,
        6.56287074e-01,
        -6.63801655e-03,
        -2.54641503e-01,
        3.59440446e-01,
        8.15606862e-03,
        -3.43469858e-01,
        7.09920600e-02,
        -3.32810819e-01,
        5.91004789e-01,
        4.33347374e-01,
        -2.30796129e-01,
        1.77247569e-01,
        1.03289127e-01,
        6.50839657e-02,
        5.74252844e-01,
        -1.03290565e-01,
        -9.28410590e-02,
        -6.64383173e-02,
        8.12536180e-02,
    ],
];
// Phi-3: the same script and versions, 2026-12-02 04:52 UTC (transformers warns that the
// config's eos_token_id 32000 lies outside the 1024-token vocabulary; no forward reads it):

// phi3: Phi3ForCausalLM
const HF_PHI3: [[f64; 64]; 2] = [
    [
        -9.25555974e-02,
        -5.64975664e-02,
        -6.77265078e-02,
        -4.18038443e-02,
        -2.73537636e-01,
        -2.85065562e-01,
        -7.28903860e-02,
        -1.57715350e-01,
        6.16398305e-02,
        3.38574886e-01,
        6.29693568e-01,
        2.32323050e-01,
        1.96009696e-01,
        3.58947180e-02,
        4.43313122e-02,
        3.63491885e-02,
        -2.28494436e-01,
        -8.86401907e-02,
        6.88892826e-02,
        -6.60254732e-02,
        -9.67019945e-02,
        4.79762346e-01,
        -1.94596693e-01,
        1.44782886e-01,
        -3.18970859e-01,
        2.07534194e-01,
        2.51744986e-01,
        3.90062258e-02,
        1.84412867e-01,
        -1.63771838e-01,
        3.41649294e-01,
        -3.76492083e-01,
        -2.43597537e-01,
        -2.50747532e-01,
        -4.86467987e-01,
        5.00171073e-03,
        2.29886055e-01,
        4.65894118e-03,
        1.52678952e-01,
        -1.14003710e-01,
        1.49241909e-01,
        1.56956702e-01,
        7.68358335e-02,
        2.61837896e-02,
        5.90588972e-02,
        -4.45476398e-02,
        -6.99405894e-02,
        4.58746813e-02,
        7.82897323e-02,
        -8.95333812e-02,
        1.82517707e-01,
        1.23552203e-01,
        4.00051147e-01,
        -4.10896242e-01,
        2.32516125e-01,
        9.80884358e-02,
        3.91621083e-01,
        -2.30760291e-01,
        -1.35562360e-01,
        -1.82234123e-01,
        -2.00506434e-01,
        1.06854387e-01,
        8.14319924e-02,
        5.06310090e-02,
    ],
    [
        7.90619552e-02,
        -5.63688517e-01,
        -1.30544513e-01,
        -3.30426991e-01,
        -2.93587595e-02,
        1.18886679e-03,
        4.94421273e-02,
        4.62072492e-02,
        3.29842508e-01,
        3.23091954e-01,
        -2.48306766e-01,
        3.90856594e-01,
        -2.93907046e-01,
        4.66262639e-01,
        2.29556561e-02,
        1.12251654e-01,
        9.67090130e-02,
        1.55619085e-02,
        -1.63779914e-01,
        -1.44545585e-01,
        -2.46589452e-01,
        6.36144727e-03,
        1.39477938e-01,
        3.74258518e-01,
        -8.46609473e-02,
        -2.24836487e-02,
        -2.03420088e-01,
        2.47449726e-01,
        -6.77362084e-04,
        -1.24244601e-01,
        -3.38627368e-01,
        -1.11442178e-01,
        6.37586117e-02,
        -1.53091550e-01,
        2.63914287e-01,
        3.97475779e-01,
        1.74126744e-01,
        -1.86654806e-01,
        5.35257876e-01,
        -5.73831424e-03,
        -6.42708540e-02,
        2.03081027e-01,
        -6.30360246e-02,
        2.66515136e-01,
        -9.75000933e-02,
        -8.54234546e-02,
        3.58926326e-01,
        1.96646601e-01,
        -1.50473490e-01,
        -1.46425247e-01,
        -3.11124921e-01,
        1.24415591e-01,
        -1.53321773e-02,
        4.93585318e-03,
        -5.15046358e-01,
        -2.55386233e-02,
        2.72449017e-01,
        2.66711041e-03,
        4.76027951e-02,
        9.19421315e-02,
        8.32866505e-02,
        9.61778462e-02,
        -1.05791986e-02,
        -2.39308059e-01,
    ],
];

// Mixtral and Qwen3-MoE: Hugging Face transformers in fp32 on the CPU
// (scripts/hf_reference.py DIR mixtral,qwen3_moe, run on the GPU machine 2026-12-02 22:04 UTC,
// run 52 of docs/gpu-runs.md, on fixtures written by `write_fixtures` at this file's
// configurations): torch 2.11.0+cu130, transformers 5.17.0, python 3.12.3; MixtralForCausalLM
// read num_local_experts 4, num_experts_per_tok 2; Qwen3MoeForCausalLM num_experts 8,
// num_experts_per_tok 3, moe_intermediate_size 64, norm_topk_prob False, mlp_only_layers [1].
// The smallest gap between a token's k-th and (k+1)-th routing probability, per MoE layer and
// sequence (a forward whose router drifted by that much would pick other experts):
// mixtral: [0.0027665793895721436, 0.00344984233379364]; [0.023424983024597168, 0.0010998398065567017]
// qwen3_moe: [0.0007200688123703003]; [0.0005299001932144165]
const HF_MIXTRAL: [[f64; 64]; 2] = [
    [
        4.72226828e-01,
        -2.59773552e-01,
        1.35747641e-02,
        7.87633583e-02,
        -1.30324841e-01,
        -4.38984148e-02,
        -3.66712689e-01,
        -3.23439568e-01,
        -2.58526802e-01,
        1.05450302e-01,
        -2.03603372e-01,
        3.99414673e-02,
        1.83876932e-01,
        -2.86036044e-01,
        4.47665267e-02,
        -3.29327546e-02,
        -2.66949445e-01,
        2.39109211e-02,
        1.47088736e-01,
        -5.10645926e-01,
        -3.37403864e-01,
        2.08964631e-01,
        -5.20999208e-02,
        7.23953545e-02,
        -5.82511485e-01,
        -5.94229810e-02,
        -3.24983113e-02,
        2.16547921e-01,
        3.62899452e-01,
        -1.54863959e-02,
        5.61998077e-02,
        -7.51928985e-02,
        -9.83293727e-02,
        -1.69704497e-01,
        -4.32499170e-01,
        4.92593318e-01,
        2.19327390e-01,
        4.87722605e-02,
        7.71154687e-02,
        5.70696071e-02,
        -1.77046448e-01,
        1.96797356e-01,
        -9.69575793e-02,
        1.41389459e-01,
        -1.22251995e-01,
        1.32341489e-01,
        -1.13218747e-01,
        -1.90141112e-01,
        -4.82195206e-02,
        -7.65807405e-02,
        -3.78919207e-02,
        -3.69450189e-02,
        2.61578202e-01,
        -3.93253893e-01,
        1.25360742e-01,
        7.01122209e-02,
        -5.94529733e-02,
        2.62201484e-02,
        -1.60797983e-01,
        3.15778330e-02,
        -1.04832895e-01,
        1.39423292e-02,
        -1.42901719e-01,
        2.13558331e-01,
    ],
    [
        -2.42135793e-01,
        -1.16703287e-01,
        6.29955977e-02,
        -1.02388158e-01,
        -2.04424322e-01,
        1.44663796e-01,
        -3.71497512e-01,
        -2.98669189e-02,
        -6.94093704e-02,
        1.73421055e-01,
        -2.37822086e-01,
        5.52285254e-01,
        -1.27311975e-01,
        3.96112084e-01,
        -1.35769397e-02,
        5.31112373e-01,
        2.45079055e-01,
        2.39963472e-01,
        -4.56382960e-01,
        -2.60901839e-01,
        -2.80876011e-02,
        3.80404472e-01,
        5.00763953e-03,
        -6.79304823e-03,
        1.21078975e-01,
        -2.79215217e-01,
        -2.56972089e-02,
        -2.67630577e-01,
        -2.88672149e-02,
        1.24070928e-01,
        3.26433510e-01,
        3.40624116e-02,
        -1.29336461e-01,
        -1.26182288e-01,
        4.13463771e-01,
        -1.03559047e-01,
        -2.96343327e-01,
        -4.86543626e-01,
        1.69097066e-01,
        8.51025805e-02,
        -1.72956139e-01,
        7.24251419e-02,
        3.62432927e-01,
        -1.27772614e-02,
        2.46717960e-01,
        -1.23913400e-01,
        2.06679970e-01,
        1.74179226e-02,
        -1.46525383e-01,
        3.78736198e-01,
        3.64378393e-01,
        1.07914135e-01,
        2.09546506e-01,
        -1.57987028e-01,
        -1.24035828e-01,
        -1.91640824e-01,
        1.91730842e-01,
        -4.08978581e-01,
        1.69548914e-01,
        2.54097670e-01,
        -1.47934869e-01,
        1.23548605e-01,
        -4.30286415e-02,
        -2.83665419e-01,
    ],
];
const HF_QWEN3_MOE: [[f64; 64]; 2] = [
    [
        3.28970939e-01,
        -2.70933285e-02,
        -4.93729077e-02,
        4.65114951e-01,
        2.43699044e-01,
        -2.37502530e-01,
        -4.34328392e-02,
        -1.46484435e-01,
        1.54580519e-01,
        8.69916230e-02,
        -8.50165188e-02,
        -2.98214257e-01,
        -1.83713049e-01,
        -2.36552298e-01,
        1.69232786e-01,
        -2.54655451e-01,
        -4.80114631e-02,
        -7.43009374e-02,
        2.43853047e-01,
        -3.13750744e-01,
        5.68496883e-02,
        3.10262531e-01,
        4.35473651e-01,
        3.53767127e-01,
        -4.05624248e-02,
        1.39290085e-02,
        3.39655399e-01,
        1.17445454e-01,
        1.61612973e-01,
        -4.23588455e-02,
        -3.42284739e-01,
        8.70959759e-02,
        -1.05527148e-01,
        -5.28215282e-02,
        1.60915253e-04,
        -5.90808084e-03,
        3.54074091e-01,
        9.70709547e-02,
        6.85376003e-02,
        -2.94808567e-01,
        1.45893656e-02,
        2.16763377e-01,
        1.19885802e-01,
        5.88588834e-01,
        -7.10999295e-02,
        7.75207579e-02,
        -4.01608169e-01,
        3.73753496e-02,
        -5.99125735e-02,
        -2.26769850e-01,
        -5.09378254e-01,
        -3.41676801e-01,
        -3.76070380e-01,
        2.42648184e-01,
        -1.74007371e-01,
        -1.78856462e-01,
        -3.34664553e-01,
        2.20382482e-01,
        -4.35873307e-02,
        -7.81017661e-01,
        -1.13625608e-01,
        -2.39462793e-01,
        -4.92535718e-02,
        1.10927433e-01,
    ],
    [
        -1.57041401e-02,
        3.73740613e-01,
        -1.81459069e-01,
        -2.19152689e-01,
        -3.38866711e-01,
        -2.43223265e-01,
        8.23465586e-02,
        -7.68764764e-02,
        4.34965312e-01,
        3.97160649e-01,
        6.46195710e-02,
        5.64641505e-02,
        5.00473142e-01,
        3.13604355e-01,
        -1.43089116e-01,
        1.09539092e-01,
        2.94061244e-01,
        4.84938510e-02,
        -8.16327110e-02,
        1.50285885e-01,
        1.36500016e-01,
        1.13881707e-01,
        -2.17050724e-02,
        5.30005813e-01,
        -5.39583266e-02,
        9.84761715e-02,
        1.60871476e-01,
        -3.11758816e-01,
        -2.55728036e-01,
        -1.79870263e-01,
        -2.19904929e-02,
        -3.79421502e-01,
        -8.43644962e-02,
        1.07628070e-02,
        2.22541243e-02,
        -3.86387497e-01,
        -3.15954626e-01,
        -3.94480288e-01,
        1.51497602e-01,
        -7.80757815e-02,
        2.46375024e-01,
        1.05544791e-01,
        2.98621237e-01,
        1.03060231e-02,
        2.52489150e-02,
        2.24560313e-02,
        5.46370924e-01,
        1.80009782e-01,
        5.50017133e-02,
        3.73291075e-01,
        -8.97292346e-02,
        9.70782787e-02,
        3.99774849e-01,
        -2.83353180e-02,
        2.67899558e-02,
        -4.75282550e-01,
        7.89350569e-02,
        -3.35974008e-01,
        -3.41548622e-01,
        2.53502995e-01,
        -6.33018389e-02,
        -1.60026878e-01,
        9.88991410e-02,
        1.28102332e-01,
    ],
];
