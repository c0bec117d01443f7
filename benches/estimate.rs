//! The compute-time estimate a compute run prints before it starts (`host_memory::estimate`,
//! the CLI's "about N s" and the app's banner), against the time the run then takes, with the
//! batch left at vLLM's default (max_model_len's, as the run resolves it), for three presets.
//! Issue 25 asks for within 2x either way; the run exits 1 when a preset is outside that.
//!
//! `cargo bench --bench estimate` (a quiet machine gives the fairest ratio; the estimate times
//! the same kernels on pass-like shapes first, so a loaded machine skews both sides alike).

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

use vramscope::device::DeviceSpec;
use vramscope::model::ModelSource;
use vramscope::profile::{host_memory, run, ProfileRequest};
use vramscope::quant::Quant;

fn main() {
    let mut off = Vec::new();
    println!("| preset | default batch | estimate (s) | measured (s) | measured / estimate |");
    println!("|---|---|---|---|---|");
    for name in ["tiny", "opt-125m", "smollm2-135m"] {
        let req = ProfileRequest {
            model: ModelSource::Preset { name: name.into() },
            quant: Quant::F16,
            device: DeviceSpec::parse("sim:h100-80gb").unwrap(),
            // vLLM's default batch: left open, resolved by the run (and by the estimate).
            tokens: 0,
            verify: false,
            ..ProfileRequest::default()
        };
        let est = host_memory::estimate_request(&req)
            .expect("estimate")
            .compute_s
            .expect("a compute run has a time estimate");
        // The median of three runs: a shared machine's neighbours move single runs by 50 %.
        let mut times = Vec::new();
        let mut tokens = 0;
        for _ in 0..3 {
            let t = Instant::now();
            let r = run(&req, None, Arc::new(AtomicBool::new(false))).expect("run");
            times.push(t.elapsed().as_secs_f64());
            tokens = r.settings.tokens;
        }
        times.sort_by(f64::total_cmp);
        let measured = times[1];
        let ratio = measured / est;
        println!("| {name} | {tokens} tokens | {est:.2} | {measured:.2} | {ratio:.2} |");
        if !(0.5..=2.0).contains(&ratio) {
            off.push(format!("{name}: {ratio:.2}"));
        }
    }
    if !off.is_empty() {
        eprintln!("estimates off by more than 2x: {}", off.join(", "));
        std::process::exit(1);
    }
}
