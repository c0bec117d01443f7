//! Pictures of the main views, rendered on the CPU (lavapipe, Mesa's software Vulkan, through
//! wgpu; .ci/run installs it), compared with the images in tests/snapshots/: the setup panel,
//! the lifetime view and the budget table, then the waterfall, in both themes at 1280x720 and
//! 1920x1080. A pixel counts as changed past a colour tolerance, and a few hundred changed pixels
//! (rasteriser noise between Mesa versions) still pass; a moved label or band does not.
//! After a deliberate change: `UPDATE_SNAPSHOTS=1 cargo test --test gui_snapshots`.
//! On a machine with no Vulkan or GL driver wgpu finds no adapter: the tests then skip with
//! one line saying what to install, unless `VRAMSCOPE_REQUIRE_GPU_SNAPSHOTS=1` (CI sets it)
//! makes that a failure.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, OnceLock};

use egui_kittest::kittest::Queryable;
use egui_kittest::{Harness, SnapshotOptions};
use vramscope::app::gui::{SetupForm, VramscopeApp};
use vramscope::Report;

/// The default preset (llama-3-8b int8, dry, simulated H100), as the app profiles it on first
/// launch, with the wall time (the only number that changes from run to run) fixed.
fn first_launch_report() -> Report {
    let req = SetupForm::default().request().expect("default request");
    let mut r = std::thread::spawn(move || {
        vramscope::profile::run(&req, None, Arc::new(AtomicBool::new(false))).expect("profile")
    })
    .join()
    .expect("profile thread");
    r.wall_time_s = 0.25;
    r
}

/// Whether wgpu finds an adapter to render on (lavapipe, llvmpipe or a GPU), probed once with
/// the panic message silenced; without one, a skip line (or a failure when CI requires it).
fn renderer_available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    let ok = *AVAILABLE.get_or_init(|| {
        let hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        let ok =
            std::panic::catch_unwind(|| drop(egui_kittest::wgpu::WgpuTestRenderer::new())).is_ok();
        std::panic::set_hook(hook);
        ok
    });
    if ok {
        return true;
    }
    let required = std::env::var("VRAMSCOPE_REQUIRE_GPU_SNAPSHOTS").is_ok_and(|v| v == "1");
    assert!(
        !required,
        "VRAMSCOPE_REQUIRE_GPU_SNAPSHOTS=1 but wgpu finds no adapter: install mesa-vulkan-drivers and libvulkan1 (lavapipe)"
    );
    // Once, past the test harness's capture (it captures `eprintln!`, not the handle).
    static SAID: OnceLock<()> = OnceLock::new();
    SAID.get_or_init(|| {
        use std::io::Write;
        let _ = std::io::stderr().write_all(
            b"gui_snapshots skipped: no Vulkan or GL driver to render on; install mesa-vulkan-drivers and libvulkan1 (apt) to run them\n",
        );
    });
    false
}

/// Per-pixel colour tolerance as kittest's default; changed pixels allowed: 1 in 2000.
fn options(w: f32, h: f32) -> SnapshotOptions {
    SnapshotOptions::new()
        .threshold(0.6)
        .max_failed_pixels((w * h) as usize / 2000)
}

#[test]
fn main_views_match_their_snapshots_in_both_themes_at_720p_and_1080p() {
    if !renderer_available() {
        return;
    }
    let report = first_launch_report();
    let mut failed: Vec<String> = Vec::new();
    for (w, h) in [(1280.0, 720.0), (1920.0, 1080.0)] {
        for (theme, theme_name) in [(egui::Theme::Light, "light"), (egui::Theme::Dark, "dark")] {
            let mut harness = Harness::builder()
                .with_size(egui::vec2(w, h))
                .with_theme(theme)
                .wgpu()
                .build_eframe(|cc| VramscopeApp::new(cc));
            harness
                .state_mut()
                .without_gpus("no GPU in this picture (snapshot test)");
            harness.state_mut().show_report(report.clone());
            harness.run_steps(4);
            let opts = options(w, h);
            let size = format!("{w}x{h}_{theme_name}");
            failed.extend(
                harness
                    .try_snapshot_options(format!("lifetime_budget_{size}"), &opts)
                    .err()
                    .map(|e| e.to_string()),
            );
            harness.get_by_label("Where it goes").click();
            harness.run_steps(3);
            failed.extend(
                harness
                    .try_snapshot_options(format!("waterfall_{size}"), &opts)
                    .err()
                    .map(|e| e.to_string()),
            );
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// A tensor-parallel run (Llama-3-70B fp16 over two simulated H100s): the ranks' row and their
/// small multiples above the views, at 1280x720 where room is scarcest.
#[test]
fn tensor_parallel_ranks_match_their_snapshot() {
    if !renderer_available() {
        return;
    }
    let req = vramscope::ProfileRequest {
        tp: 2,
        quant: vramscope::quant::Quant::F16,
        model: vramscope::model::ModelSource::parse("preset:llama-3-70b").unwrap(),
        ..SetupForm::default().request().expect("default request")
    };
    let mut report = std::thread::spawn(move || {
        vramscope::profile::run(&req, None, Arc::new(AtomicBool::new(false))).expect("profile")
    })
    .join()
    .expect("profile thread");
    report.wall_time_s = 0.25;
    let (w, h) = (1280.0, 720.0);
    let mut harness = Harness::builder()
        .with_size(egui::vec2(w, h))
        .with_theme(egui::Theme::Light)
        .wgpu()
        .build_eframe(|cc| VramscopeApp::new(cc));
    harness
        .state_mut()
        .without_gpus("no GPU in this picture (snapshot test)");
    harness.state_mut().show_report(report);
    harness.run_steps(4);
    harness.snapshot_options("tensor_parallel_1280x720_light", &options(w, h));
}
