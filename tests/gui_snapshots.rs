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
    // A dry run's clock readings change from run to run; the band details print a lifetime
    // in ms. One microsecond per event keeps the pictures the same every time.
    for (i, e) in report.events.iter_mut().enumerate() {
        e.time_us = i as u64;
    }
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

/// A presenter's window: 1280x720 with Present on, in both themes: the lifetime view and the
/// budget (no column cut), a clicked band's details (in the strip above the plot), and the
/// memory lines (scaled to the profile, no legend over them).
#[test]
fn present_mode_at_720p_matches_its_snapshots_in_both_themes() {
    let report = first_launch_report();
    // The band details print a lifetime in ms from the dry run's clock, which changes from run
    // to run: those pictures read a copy with one microsecond per event. The memory lines
    // read the run as it was.
    let mut fixed_times = report.clone();
    for (i, e) in fixed_times.events.iter_mut().enumerate() {
        e.time_us = i as u64;
    }
    let (w, h) = (1280.0, 720.0);
    let opts = options(w, h);
    let mut failed: Vec<String> = Vec::new();
    for (theme, theme_name) in [(egui::Theme::Light, "light"), (egui::Theme::Dark, "dark")] {
        let mut harness = Harness::builder()
            .with_size(egui::vec2(w, h))
            .with_theme(theme)
            .wgpu()
            .build_eframe(|cc| VramscopeApp::new(cc));
        harness
            .state_mut()
            .without_gpus("no GPU in this picture (snapshot test)");
        harness.state_mut().show_report(fixed_times.clone());
        harness.run_steps(2);
        harness.get_by_label("Present").click();
        harness.run_steps(4);
        let mut snap = |harness: &mut Harness<'_, VramscopeApp>, name: &str| {
            failed.extend(
                harness
                    .try_snapshot_options(format!("present_{name}_1280x720_{theme_name}"), &opts)
                    .err()
                    .map(|e| e.to_string()),
            );
        };
        snap(&mut harness, "lifetime_budget");

        // Click the middle of the kept CxB band alive just before t3.
        let pos = {
            let app = harness.state();
            let (r, a) = (app.report().unwrap(), app.analysis().unwrap());
            let t3 = a.lifetimes.checkpoint("t3").unwrap();
            let mut y = 0u64;
            let mut at = None;
            for id in a.lifetimes.live_after(t3 - 1) {
                let l = &a.lifetimes.items[id as usize];
                if at.is_none()
                    && l.kept
                    && r.events[l.alloc_event as usize].tensor.ends_with(".CxB")
                {
                    at = Some((y + l.bytes / 2) as f64);
                }
                y += l.bytes;
            }
            app.lifetime_view()
                .screen_pos((t3 - 1) as f64 - 0.5, at.expect("a kept band"))
                .unwrap()
        };
        harness
            .input_mut()
            .events
            .push(egui::Event::PointerMoved(pos));
        harness.step();
        for pressed in [true, false] {
            harness.input_mut().events.push(egui::Event::PointerButton {
                pos,
                button: egui::PointerButton::Primary,
                pressed,
                modifiers: egui::Modifiers::NONE,
            });
            harness.step();
        }
        // Move the pointer off the plot (no hover marks in the picture).
        harness
            .input_mut()
            .events
            .push(egui::Event::PointerMoved(egui::pos2(2.0, h - 2.0)));
        harness.run_steps(3);
        assert!(harness.state().lifetime_view().selected.is_some());
        snap(&mut harness, "band_details");

        harness.state_mut().show_report(report.clone());
        harness.run_steps(3);
        harness.get_by_label("Memory lines").click();
        harness.run_steps(2);
        // Event order, not time: a dry run's timings change from run to run.
        harness.get_by_label("x: event order").click();
        harness.run_steps(4);
        snap(&mut harness, "memory_lines");
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}
