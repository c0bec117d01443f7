//! `explain` takes the GPU and the topology from what the log's lines say, where they say it:
//! the device name in the fused MoE config file vLLM looked for, and the custom all-reduce's
//! warning about how the GPUs reach each other. Run through the binary on the fixture logs
//! with those lines added.

use std::path::Path;

mod common;
use common::cli::vramscope;

fn fixture(name: &str) -> String {
    std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/vllm-logs")
            .join(name),
    )
    .unwrap()
}

/// The log with `line` inserted after its line `after` (1-based), written to a temporary file.
fn with_line(log: &str, after: usize, line: &str, dir: &Path) -> String {
    let mut lines: Vec<&str> = log.lines().collect();
    lines.insert(after, line);
    let path = dir.join("start.log");
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    path.display().to_string()
}

fn explain(path: &str) -> String {
    let out = vramscope(&["explain", path]);
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{text}");
    text
}

/// Q1's total (79.19 GiB) is as near the H100 PCIe's as the SXM board's, and the total alone
/// takes the SXM board; a fused MoE config line naming `NVIDIA_H100_PCIe` takes the PCIe
/// board. A name no preset has is said, and the total decides.
#[test]
fn the_moe_config_lines_device_name_picks_the_gpu() {
    let q1 = fixture("q1-0.19-llama-3.1-8b-h100.log");
    let dir = tempfile::tempdir().unwrap();
    let plain = explain(&with_line(&q1, 0, "", dir.path()));
    assert!(
        plain.contains("GPU sim:h100-sxm: the preset nearest the log's 79.19 GiB"),
        "{plain}"
    );
    let moe = "(EngineCore_DP0 pid=4127) WARNING 04-14 16:02:50 [fused_moe.py:1092] Using default \
               MoE config. Performance might be sub-optimal! Config file not found at \
               ['/opt/vllm/model_executor/layers/fused_moe/configs/E=64,N=1024,device_name=NVIDIA_H100_PCIe.json']";
    let named = explain(&with_line(&q1, 5, moe, dir.path()));
    assert!(
        named.contains("GPU sim:h100-pcie: line 6 names it (device_name=NVIDIA_H100_PCIe"),
        "{named}"
    );
    assert!(!named.contains("the preset nearest"), "{named}");
    let unknown = explain(&with_line(
        &q1,
        5,
        &moe.replace("NVIDIA_H100_PCIe", "NVIDIA_H100_NVL"),
        dir.path(),
    ));
    assert!(
        unknown.contains("line 6 names the GPU device_name=NVIDIA_H100_NVL, which is no preset's")
            && unknown.contains("GPU sim:h100-sxm: the preset nearest"),
        "{unknown}"
    );
}

/// P4 (Qwen2.5-32B on two L40S under 0.7.1) runs on the L40S's default topology, PCIe with
/// peer-to-peer, and lands on its 0.30 GiB of non-torch memory; the custom all-reduce's
/// warning that the platform lacks peer-to-peer makes it PCIe without (NCCL's buffers in host
/// memory, no custom all-reduce buffers): less non-torch memory, a larger KV cache. The
/// other topology is one of the what-ifs.
#[test]
fn the_custom_all_reduces_warning_sets_the_topology() {
    let p4 = fixture("p4-0.7.1-qwen2.5-32b-2xl40s.log");
    let dir = tempfile::tempdir().unwrap();
    let non_torch = |text: &str| -> f64 {
        text.lines()
            .find(|l| l.starts_with("non-torch"))
            .and_then(|l| l.split_whitespace().nth(3))
            .unwrap_or_else(|| panic!("no non-torch row in:\n{text}"))
            .parse()
            .unwrap()
    };
    let plain = explain(&with_line(&p4, 0, "", dir.path()));
    assert!(!plain.contains("assumed: topology"), "{plain}");
    assert!(plain.contains("  --topology nvlink "), "{plain}");
    let warning = "(VllmWorkerProcess pid=1) WARNING 02-02 10:00:00 custom_all_reduce.py:134] \
                   Custom allreduce is disabled because your platform lacks GPU P2P capability \
                   or P2P test failed. To silence this warning, specify \
                   disable_custom_all_reduce=True explicitly.";
    let no_p2p = explain(&with_line(&p4, 3, warning, dir.path()));
    assert!(
        no_p2p.contains("assumed: topology pcie-no-p2p: line 4 (the custom all-reduce's check)"),
        "{no_p2p}"
    );
    assert!(no_p2p.contains("  --topology pcie "), "{no_p2p}");
    assert!(
        non_torch(&no_p2p) < non_torch(&plain) - 0.05,
        "{} against {}",
        non_torch(&no_p2p),
        non_torch(&plain)
    );
}
