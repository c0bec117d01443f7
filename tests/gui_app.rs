//! The real app, driven headless through egui_kittest (no GPU, no display): pick a preset and
//! a quantization, profile, read the comparison; cancel mid-run; a bad model file shows the
//! error banner and the next run succeeds; a dropped session reopens.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use egui::accesskit::Role;
use egui_kittest::kittest::{NodeT, Queryable};
use egui_kittest::Harness;
use vramscope::app::gui::{verify_cell, BannerKind, VramscopeApp};
use vramscope::base::units::fmt_i;
use vramscope::profile::formulas::FormulaId;
use vramscope::{ProfileRequest, Report};

fn harness() -> Harness<'static, VramscopeApp> {
    Harness::builder()
        .with_size(egui::vec2(1600.0, 1000.0))
        .build_eframe(|cc| VramscopeApp::new(cc))
}

/// Steps frames (as the window would) until the run ends or `limit` passes.
fn wait_for_run(h: &mut Harness<'static, VramscopeApp>, limit: Duration) {
    let t = Instant::now();
    h.step();
    while h.state().is_running() {
        assert!(t.elapsed() < limit, "run did not finish within {limit:?}");
        std::thread::sleep(Duration::from_millis(10));
        h.step();
    }
    // A few frames so the panels lay out with the report.
    h.run_steps(3);
}

/// Steps frames until the app's background file jobs (save, open) are done.
fn wait_for_files(h: &mut Harness<'static, VramscopeApp>) {
    let t = Instant::now();
    h.step();
    while h.state().file_job_pending() {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "file job did not finish"
        );
        std::thread::sleep(Duration::from_millis(10));
        h.step();
    }
    h.run_steps(2);
}

/// The same request profiled off the UI thread, outside the app.
fn profile_directly(req: ProfileRequest) -> Report {
    std::thread::spawn(move || {
        vramscope::profile::run(&req, None, Arc::new(AtomicBool::new(false))).unwrap()
    })
    .join()
    .unwrap()
}

/// A file dropped on the window, as a real drop event carries it.
#[derive(Debug)]
struct Dropped(std::path::PathBuf);

impl egui::DroppedFile for Dropped {
    fn path(&self) -> &std::path::Path {
        &self.0
    }
    fn bytes(&self) -> Result<Vec<u8>, String> {
        Ok(Vec::new())
    }
}

/// Clicks a button of the setup panel's Export section, scrolled into view first (the panel
/// scrolls; at 1600x1000 the section is below its fold).
fn click_export(h: &mut Harness<'static, VramscopeApp>, label: &str) {
    h.get_by_label(label).scroll_to_me();
    h.run_steps(3);
    h.get_by_label(label).click();
}

fn shows(h: &Harness<'static, VramscopeApp>, text: &str) -> bool {
    h.query_all_by_label(text).next().is_some()
}

#[test]
fn profile_shows_the_reports_numbers_for_the_chosen_preset_and_quant() {
    let mut h = harness();
    h.run_steps(2);
    h.get_by_role_and_label(Role::ComboBox, "Preset model")
        .click();
    h.run_steps(2);
    h.get_by_label("mistral-7b").click();
    h.run_steps(2);
    h.get_by_label("int8").click();
    h.run_steps(2);
    h.get_by_label("Profile").click();
    wait_for_run(&mut h, Duration::from_secs(120));

    assert!(h.state().banner().is_none(), "{:?}", h.state().banner());
    let r = h.state().report().expect("a report").clone();
    assert_eq!(r.model.name, "mistral-7b");
    assert_eq!(r.quant.label(), "int8");

    // The numbers on screen are the report's, and the report is what profile::run computes.
    let direct = profile_directly(r.settings.clone());
    for id in [FormulaId::Pr9352, FormulaId::Pr9516] {
        let shown = r.formula(id).unwrap();
        let want = direct.formula(id).unwrap();
        assert_eq!(shown.kv_bytes, want.kv_bytes, "{id:?}");
        assert_eq!(shown.non_kv_bytes, want.non_kv_bytes, "{id:?}");
        for text in [
            fmt_i(shown.kv_bytes),
            fmt_i(shown.torch_peak_bytes),
            fmt_i(shown.non_torch_bytes),
            fmt_i(shown.non_kv_bytes),
            fmt_i(shown.error_bytes),
            shown.kv_blocks.to_string(),
            format!("{:.2}x", shown.max_concurrency),
            verify_cell(&shown.verify),
        ] {
            assert!(shows(&h, &text), "{id:?}: '{text}' is not on screen");
        }
    }
    assert_eq!(r.truth.kv_bytes, direct.truth.kv_bytes);
    assert!(shows(&h, &fmt_i(r.truth.kv_bytes)));
    assert!(shows(&h, &r.old_vs_new_explanation()));
    // int8 keeps its state alive after the pass: the old budget is the smaller one.
    assert!(
        r.formula(FormulaId::Pr9352).unwrap().kv_bytes
            < r.formula(FormulaId::Pr9516).unwrap().kv_bytes
    );

    // The other formulas appear only when asked for.
    let v063 = fmt_i(r.formula(FormulaId::V0_6_3).unwrap().non_kv_bytes);
    assert!(!shows(&h, "v0.6.3"));
    h.get_by_label_contains("Show vLLM's other formulas")
        .click();
    h.run_steps(2);
    assert!(shows(&h, "v0.6.3"));
    assert!(shows(&h, &v063));

    // All profiling happened on the worker: this (UI) thread never created a Runtime.
    assert_eq!(
        vramscope::engine::runtime::runtimes_created_on_this_thread(),
        0
    );
}

#[test]
fn cancel_stops_a_run_mid_way_and_the_app_can_profile_again() {
    let mut h = harness();
    h.run_steps(2);
    h.get_by_role_and_label(Role::ComboBox, "Preset model")
        .click();
    h.run_steps(2);
    h.get_by_label("smollm2-135m").click();
    h.run_steps(2);
    // Real math on the CPU: long enough to cancel in the middle.
    h.get_by_label("compute (CPU math)").click();
    h.state_mut().setup.tokens = 512;
    // The max_model_len vLLM needs to start with this batch (chunked prefill off).
    h.state_mut().setup.max_model_len = 512;
    h.run_steps(2);
    assert!(!h.state().setup.dry);
    assert_eq!(h.state().setup.preset, "smollm2-135m");
    h.get_by_label("Profile").click();
    h.step();
    let t = Instant::now();
    let mut slowest = Duration::ZERO;
    while h.state().timeline_events().len() < 50 {
        assert!(
            h.state().is_running(),
            "run ended before it could be cancelled: {:?}",
            h.state().banner()
        );
        assert!(t.elapsed() < Duration::from_secs(60), "no events arrived");
        std::thread::sleep(Duration::from_millis(10));
        let frame = Instant::now();
        h.step();
        slowest = slowest.max(frame.elapsed());
    }
    // The UI kept drawing frames while the worker computed: it never waited on the run.
    assert!(
        slowest < Duration::from_millis(500),
        "a frame took {slowest:?}"
    );
    assert!(h.state().is_running());
    h.key_press(egui::Key::Escape);
    let cancelled_at = Instant::now();
    wait_for_run(&mut h, Duration::from_secs(30));
    let took = cancelled_at.elapsed();
    assert!(took < Duration::from_secs(10), "cancel took {took:?}");
    let b = h.state().banner().expect("a banner").clone();
    assert_eq!(b.kind, BannerKind::Info);
    assert!(b.text.contains("Cancelled"), "{}", b.text);
    assert!(h.state().report().is_none());
    assert!(shows(&h, "Cancelled; nothing of the run is kept."));

    // Back to a quick dry run: it completes.
    h.get_by_label("dry (shapes only)").click();
    h.run_steps(2);
    h.get_by_label("Profile").click();
    wait_for_run(&mut h, Duration::from_secs(60));
    assert!(h.state().report().is_some(), "{:?}", h.state().banner());
    assert!(h.state().banner().is_none());
}

#[test]
fn bad_model_file_shows_the_error_banner_and_the_next_run_succeeds() {
    let dir = tempfile::tempdir().unwrap();
    // A real config.json beside weights that are not a safetensors file.
    let files = vramscope::model::gen_model(
        "tiny",
        dir.path(),
        vramscope::model::weights::StoredDtype::F16,
        0,
    )
    .unwrap();
    let bad = files.weights;
    std::fs::write(&bad, b"this is not a safetensors file").unwrap();

    let mut h = harness();
    h.run_steps(2);
    h.get_by_label("File").click();
    h.run_steps(2);
    let field = h.get_by_role_and_label(Role::TextInput, "Model file");
    field.focus();
    h.run_steps(1);
    h.get_by_role_and_label(Role::TextInput, "Model file")
        .type_text(&bad.display().to_string());
    h.run_steps(2);
    assert_eq!(h.state().setup.path, bad.display().to_string());
    h.get_by_label("Profile").click();
    wait_for_run(&mut h, Duration::from_secs(60));

    let b = h.state().banner().expect("an error banner").clone();
    assert_eq!(b.kind, BannerKind::Error);
    assert!(
        b.text.contains("model.safetensors"),
        "banner names the file: {}",
        b.text
    );
    assert!(h.state().report().is_none());
    assert!(h
        .query_all_by_label_contains("model.safetensors")
        .next()
        .is_some());

    // The app is still alive: back to a preset, and the next run succeeds.
    h.get_by_label("Preset").click();
    h.run_steps(2);
    h.key_press_modifiers(egui::Modifiers::COMMAND, egui::Key::R);
    wait_for_run(&mut h, Duration::from_secs(60));
    assert!(h.state().banner().is_none(), "{:?}", h.state().banner());
    assert_eq!(h.state().report().unwrap().model.name, "llama-3-8b");
}

#[test]
fn a_dropped_session_reopens_without_running_and_a_dropped_model_becomes_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let req = ProfileRequest {
        passes: 1,
        ..ProfileRequest::default()
    };
    let report = profile_directly(req);
    let session = dir.path().join("run.json");
    vramscope::report::export::json::write(&report, &session).unwrap();

    let mut h = harness();
    h.run_steps(2);
    h.state_mut().use_file(session.clone());
    wait_for_files(&mut h);
    assert!(!h.state().is_running());
    assert_eq!(h.state().report().unwrap().formulas, report.formulas);
    assert!(shows(
        &h,
        &fmt_i(report.formula(FormulaId::Pr9516).unwrap().kv_bytes)
    ));

    // A real drop event goes through the same path.
    let model = dir.path().join("config.json");
    h.input_mut()
        .dropped_files
        .push(Arc::new(Dropped(model.clone())));
    h.run_steps(2);
    assert_eq!(h.state().setup.path, model.display().to_string());
    assert_eq!(h.state().setup.recent.first(), Some(&model));
}

#[test]
fn csv_and_session_exports_are_written_where_the_export_field_says() {
    let dir = tempfile::tempdir().unwrap();
    let mut h = harness();
    h.run_steps(2);
    // Nothing to save before a run: the buttons are disabled.
    assert!(h.get_by_label("Save CSV").accesskit_node().is_disabled());
    h.get_by_label("Profile").click();
    wait_for_run(&mut h, Duration::from_secs(60));
    let stem = dir.path().join("out");
    h.state_mut().export_path = stem.display().to_string();
    h.run_steps(1);
    click_export(&mut h, "Save session");
    wait_for_files(&mut h);
    click_export(&mut h, "Save CSV");
    wait_for_files(&mut h);
    let session = dir.path().join("out.json");
    let reread = vramscope::report::export::json::read(&session).unwrap();
    assert_eq!(&reread, h.state().report().unwrap());
    let rows = csv::Reader::from_path(dir.path().join("out.csv"))
        .unwrap()
        .records()
        .count();
    assert_eq!(rows, reread.events.len(), "one row per event");
    assert!(dir.path().join("out.summary.csv").is_file());
    let b = h.state().banner().unwrap();
    assert_eq!(b.kind, BannerKind::Info, "{}", b.text);
}

/// Clicks the primary button at `pos` (a real pointer press and release).
fn click_at(h: &mut Harness<'static, VramscopeApp>, pos: egui::Pos2) {
    h.input_mut().events.push(egui::Event::PointerMoved(pos));
    h.step();
    for pressed in [true, false] {
        h.input_mut().events.push(egui::Event::PointerButton {
            pos,
            button: egui::PointerButton::Primary,
            pressed,
            modifiers: egui::Modifiers::NONE,
        });
        h.step();
    }
    h.run_steps(2);
}

#[test]
fn lifetime_view_of_llama_3_8b_int8_marks_cxb_kept_and_a_clicked_band_shows_its_details() {
    let mut h = harness();
    h.run_steps(2);
    // First launch: the int8 story is the default.
    assert_eq!(h.state().setup.quant.label(), "int8");
    assert_eq!(h.state().setup.preset, "llama-3-8b");
    h.get_by_label("Profile").click();
    wait_for_run(&mut h, Duration::from_secs(120));
    let r = h.state().report().expect("a report").clone();
    let a = h.state().analysis().expect("an analysis");
    // Besides CxB, what PyTorch keeps too: the cuBLAS workspace (made at the first GEMM) and
    // the sampler's SamplingTensors (replaced by the next pass's).
    let kept: Vec<_> = a
        .lifetimes
        .items
        .iter()
        .filter(|l| l.kept)
        .filter(|l| {
            let e = &r.events[l.alloc_event as usize];
            assert!(
                e.tensor.ends_with(".CxB")
                    || e.tensor == "cublas-workspace"
                    || e.tensor.starts_with("sampling."),
                "only CxB, the workspace and the sampling tensors are kept, not {}",
                e.tensor
            );
            e.tensor.ends_with(".CxB")
        })
        .collect();
    assert!(!kept.is_empty(), "int8 keeps its CxB state across passes");
    // Every layer's seven int8 linears make a CxB state in pass 1 (freed in pass 2) and in
    // pass 2 (alive at t3); pass 3 reuses pass 2's.
    let per_pass = 7 * r.model.layers;
    assert_eq!(kept.len(), per_pass * r.settings.passes.min(2) as usize);
    let headline = a.headline.clone().expect("a headline");
    assert!(
        headline.starts_with("int8 state (CxB) kept across passes: ")
            && headline.ends_with("— counted twice by #9352"),
        "{headline}"
    );
    let at_t3: u64 = a
        .kept
        .iter()
        .filter(|g| g.what.contains("CxB"))
        .map(|g| g.bytes_at_t3)
        .sum();
    assert!(
        headline.contains(&vramscope::base::units::fmt_u(at_t3)),
        "{headline}"
    );
    assert!(shows(&h, &headline), "the headline is on screen");

    // Click the middle of a CxB band alive just before t3.
    let t3 = a.lifetimes.checkpoint("t3").unwrap();
    let live = a.lifetimes.live_after(t3 - 1);
    let mut y = 0u64;
    let mut target = None;
    for id in live {
        let l = &a.lifetimes.items[id as usize];
        let cxb = r.events[l.alloc_event as usize].tensor.ends_with(".CxB");
        if l.kept && cxb && target.is_none() {
            target = Some((id, y + l.bytes / 2));
        }
        y += l.bytes;
    }
    let (id, mid) = target.expect("a kept band alive at t3");
    let name = r.events[a.lifetimes.items[id as usize].alloc_event as usize]
        .tensor
        .clone();
    let pos = h
        .state()
        .lifetime_view()
        .screen_pos((t3 - 1) as f64 + 0.2, mid as f64)
        .expect("the plot was drawn");
    click_at(&mut h, pos);
    let selected = h.state().lifetime_view().selected.expect("a band selected");
    let a = h.state().analysis().unwrap();
    assert_eq!(
        r.events[a.lifetimes.items[selected as usize].alloc_event as usize].tensor,
        name
    );
    assert!(shows(&h, &name), "details name the tensor");
    assert!(shows(&h, "kept across passes"));
    assert!(
        shows(&h, "int8.transform_CxB"),
        "details name the op that made it"
    );
}

#[test]
fn fp16_keeps_nothing_across_passes_and_compare_mode_shows_the_fp16_int8_delta() {
    let mut h = harness();
    h.run_steps(2);
    h.get_by_label("fp16").click();
    h.run_steps(1);
    h.get_by_label("Profile").click();
    wait_for_run(&mut h, Duration::from_secs(120));
    let fp16 = h.state().report().unwrap().clone();
    let a16 = h.state().analysis().unwrap();
    // fp16 keeps no activation and no quant state: only what PyTorch keeps for any model, the
    // cuBLAS workspace and the sampler's SamplingTensors.
    for l in a16.lifetimes.items.iter().filter(|l| l.kept) {
        let name = &fp16.events[l.alloc_event as usize].tensor;
        assert!(
            name == "cublas-workspace" || name.starts_with("sampling."),
            "fp16 keeps {name}"
        );
    }
    // What stays is small and PyTorch's own (vLLM's test_profile.py calls it "0.0079 GiB
    // non-torch" under #9352): the headline names it, never int8 state.
    let h16 = a16.headline.clone().unwrap_or_default();
    assert!(!h16.contains("CxB"), "{h16}");

    h.get_by_label("Compare").click();
    h.run_steps(1);
    h.get_by_label("Pin this run").click();
    h.run_steps(1);
    h.get_by_label("int8").click();
    h.run_steps(1);
    h.get_by_label("Profile").click();
    wait_for_run(&mut h, Duration::from_secs(120));
    let int8 = h.state().report().unwrap().clone();
    assert_eq!(int8.quant.label(), "int8");
    let a8 = h.state().analysis().unwrap();
    let kept8: i64 = a8.kept.iter().map(|g| g.bytes_at_t3 as i64).sum();
    assert!(kept8 > 0);
    let id = FormulaId::Pr9352;
    let delta_old = int8.formula(id).unwrap().kv_bytes - fp16.formula(id).unwrap().kv_bytes;
    for text in [
        "A (pinned): llama-3-8b fp16 on ".to_string(),
        fmt_i(kept8),
        fmt_i(delta_old),
        fmt_i(int8.weights_bytes as i64 - fp16.weights_bytes as i64),
    ] {
        assert!(
            h.query_all_by_label_contains(&text).next().is_some(),
            "'{text}' is not in the delta table"
        );
    }
}

#[test]
fn the_apps_png_report_is_the_clis_report_for_the_same_settings() {
    let dir = tempfile::tempdir().unwrap();
    let mut h = harness();
    h.run_steps(2);
    h.get_by_label("Profile").click();
    wait_for_run(&mut h, Duration::from_secs(120));
    h.state_mut().export_path = dir.path().join("app").display().to_string();
    h.run_steps(1);
    click_export(&mut h, "Save PNG report");
    wait_for_files(&mut h);
    let app_png = std::fs::read(dir.path().join("app.png")).unwrap();
    assert!(app_png.starts_with(b"\x89PNG"));
    // The app's default settings are the CLI's defaults with --quant int8.
    let cli_png = dir.path().join("cli.png");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_vramscope"))
        .args(["profile", "--quant", "int8", "--quiet", "--png"])
        .arg(&cli_png)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cli_png = std::fs::read(&cli_png).unwrap();
    assert!(
        app_png == cli_png,
        "the app's PNG report differs from the CLI's ({} vs {} bytes)",
        app_png.len(),
        cli_png.len()
    );
    // And it is the report image, not the window: the report's own size.
    let img = image::load_from_memory(&app_png).unwrap();
    assert_eq!(
        (img.width(), img.height()),
        (
            vramscope::report::export::png::WIDTH,
            vramscope::report::export::png::HEIGHT
        )
    );
}

/// The app on a real GPU, end to end: cuda:0 picked in the setup panel, Llama-3-8B int8
/// profiled through the worker thread with the NVML line drawn, one run cancelled mid-pass,
/// and the budgets equal to the CLI's `profile` on the same settings. On the H200:
/// `cargo test --release --test gui_app -- --ignored --nocapture app_on_a_real_gpu`.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn app_on_a_real_gpu_profiles_llama_3_8b_int8_cancels_mid_pass_and_matches_the_cli() {
    let (devices, why) = vramscope::device::list_devices();
    let gpu = devices
        .iter()
        .find(|d| d.spec == "cuda:0")
        .unwrap_or_else(|| panic!("no cuda:0: {why:?}"))
        .clone();
    let mut h = harness();
    h.run_steps(2);
    assert_eq!(h.state().setup.quant.label(), "int8");
    h.get_by_role_and_label(Role::ComboBox, "Device").click();
    h.run_steps(2);
    h.get_by_label(&format!(
        "{}  ({})",
        gpu.name,
        vramscope::base::units::fmt_u(gpu.total_bytes)
    ))
    .click();
    h.run_steps(2);
    assert_eq!(h.state().setup.device, "cuda:0");

    // Cancel one run in the middle of a profile pass.
    h.get_by_label("Profile").click();
    // The click starts the worker on the next frame.
    h.run_steps(2);
    let t = Instant::now();
    while !h
        .state()
        .timeline_events()
        .iter()
        .any(|e| e.pass == 1 && e.layer.is_some_and(|l| l >= 4))
    {
        assert!(h.state().is_running(), "{:?}", h.state().banner());
        assert!(
            t.elapsed() < Duration::from_secs(300),
            "pass 1 never reached layer 4"
        );
        std::thread::sleep(Duration::from_millis(20));
        h.step();
    }
    h.key_press(egui::Key::Escape);
    wait_for_run(&mut h, Duration::from_secs(60));
    let b = h.state().banner().expect("a banner").clone();
    assert!(b.text.contains("Cancelled"), "{}", b.text);
    eprintln!("cancelled mid-pass after {:?}", t.elapsed());

    // The whole run.
    let t = Instant::now();
    h.get_by_label("Profile").click();
    // The click starts the worker on the next frame.
    h.run_steps(2);
    wait_for_run(&mut h, Duration::from_secs(550));
    eprintln!("app run: {:?}", t.elapsed());
    let r = h
        .state()
        .report()
        .unwrap_or_else(|| panic!("{:?}", h.state().banner()))
        .clone();
    assert!(!r.device.simulated);
    assert!(!r.device_samples.is_empty(), "NVML readings were taken");
    h.state_mut().tab = vramscope::app::gui::CentralTab::Lines;
    h.run_steps(3);
    assert!(
        shows(&h, vramscope::report::timeline::NVML_LABEL),
        "the NVML line is drawn"
    );
    assert!(h.state().analysis().unwrap().headline.is_some());

    // The CLI on the same settings.
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("cli.json");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_vramscope"))
        .args([
            "profile", "--device", "cuda:0", "--quant", "int8", "--quiet", "--json",
        ])
        .arg(&json)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cli = vramscope::report::export::json::read(&json).unwrap();
    // This test process still holds its CUDA context while the CLI runs, so for the CLI it is
    // another process on the GPU: the formulas that charge device-wide memory (#9516, and
    // #12126's and #10511's baselines do not) charge it too (vLLM issue #10451).
    let others = |r: &vramscope::Report| {
        let t0 = &r.checkpoints.t0;
        ((t0.total - t0.free) as i64) - t0.process_used as i64
    };
    let extra = others(&cli) - others(&r);
    eprintln!("another process held {} more for the CLI", fmt_i(extra));
    for (a, b) in r.formulas.iter().zip(&cli.formulas) {
        eprintln!(
            "{:>10}: app {} ({} blocks), cli {} ({} blocks)",
            a.id.short(),
            fmt_i(a.kv_bytes),
            a.kv_blocks,
            fmt_i(b.kv_bytes),
            b.kv_blocks
        );
        // The framework's allocations are the same byte for byte; the device's own numbers
        // (context, library workspaces) may move by a few MiB between processes.
        let charged = if a.id == vramscope::profile::formulas::FormulaId::Pr9516 {
            extra
        } else {
            0
        };
        assert!(
            (a.kv_bytes - b.kv_bytes - charged).abs() <= 64 << 20,
            "{:?}: app {} vs cli {}",
            a.id,
            a.kv_bytes,
            b.kv_bytes
        );
    }
    assert_eq!(r.weights_bytes, cli.weights_bytes);
    assert_eq!(
        r.checkpoints.t3.allocated_peak,
        cli.checkpoints.t3.allocated_peak
    );
}

/// At 1280x720 and 1920x1080, in both themes: after a run, the lifetime plot has room (at
/// least 300 px tall and 500 px wide), nothing of the toolbar is cut off, and the right-hand
/// panel's tabs are all inside the window.
#[test]
fn the_window_works_at_1280x720_and_1920x1080_in_both_themes() {
    for (w, hgt) in [(1280.0, 720.0), (1920.0, 1080.0)] {
        for theme in [egui::Theme::Light, egui::Theme::Dark] {
            let mut h = Harness::builder()
                .with_size(egui::vec2(w, hgt))
                .with_theme(theme)
                .build_eframe(|cc| VramscopeApp::new(cc));
            h.run_steps(2);
            h.get_by_label("Profile").click();
            wait_for_run(&mut h, Duration::from_secs(120));
            let screen = egui::Rect::from_min_size(egui::Pos2::ZERO, egui::vec2(w, hgt));
            for label in [
                "Profile",
                "Present",
                "Setup",
                "Budget",
                "Where it goes",
                "Peak owners",
                "Compare",
                "Lifetimes",
                "Verify passes",
                "Reset view",
            ] {
                let r = h.get_by_label(label).rect();
                assert!(
                    screen.contains_rect(r),
                    "{w}x{hgt} {theme:?}: '{label}' at {r:?} is outside the window"
                );
            }
            let plot = h
                .state()
                .lifetime_view()
                .plot_rect()
                .expect("the lifetime plot was drawn");
            assert!(
                plot.height() >= 300.0 && plot.width() >= 500.0 && screen.contains_rect(plot),
                "{w}x{hgt} {theme:?}: plot {plot:?}"
            );
            // Every other view draws (with the glyphs the fonts have).
            for tab in [
                "Where it goes",
                "Peak owners",
                "Compare",
                "Verify passes",
                "Memory lines",
                "Lifetimes",
            ] {
                h.get_by_label(tab).click();
                h.run_steps(2);
            }
        }
    }
}

/// Issue 14: the app's Cancel, clicked during a 4096-token compute run (inside its profile
/// pass), ends the run within 0.5 s, measured in the app: from the frame that handles the
/// click to the frame that receives the worker's "cancelled" (frames stepped every 5 ms, as
/// a window repaints on the worker's wake-up). Prints the latencies for the notes.
#[test]
fn cancel_in_the_app_lands_within_half_a_second_in_a_4096_token_compute_run() {
    let mut worst = Duration::ZERO;
    for into_pass in [Duration::from_millis(500), Duration::from_millis(2000)] {
        let mut h = harness();
        h.run_steps(2);
        h.get_by_role_and_label(Role::ComboBox, "Preset model")
            .click();
        h.run_steps(2);
        h.get_by_label("smollm2-135m").click();
        h.run_steps(2);
        h.get_by_label("compute (CPU math)").click();
        h.state_mut().setup.tokens = 4096;
        // The max_model_len vLLM needs to start with this batch (chunked prefill off).
        h.state_mut().setup.max_model_len = 4096;
        h.run_steps(2);
        h.get_by_label("Profile").click();
        h.step();
        assert!(h.state().is_running(), "{:?}", h.state().banner());
        // Wait until the run is inside its profile pass (events of pass 1 arrive).
        let t = Instant::now();
        while !h.state().timeline_events().iter().any(|e| e.pass >= 1) {
            assert!(
                h.state().is_running(),
                "run ended: {:?}",
                h.state().banner()
            );
            assert!(t.elapsed() < Duration::from_secs(300), "no pass started");
            std::thread::sleep(Duration::from_millis(10));
            h.step();
        }
        let t = Instant::now();
        while t.elapsed() < into_pass {
            std::thread::sleep(Duration::from_millis(10));
            h.step();
        }
        assert!(h.state().is_running(), "the pass ended before Cancel");
        h.get_by_label("Cancel").click();
        let clicked = Instant::now();
        h.step();
        while h.state().is_running() {
            assert!(
                clicked.elapsed() < Duration::from_secs(60),
                "cancel never landed"
            );
            std::thread::sleep(Duration::from_millis(5));
            h.step();
        }
        let took = clicked.elapsed();
        let b = h.state().banner().expect("a banner").clone();
        assert!(b.text.contains("Cancelled"), "{}", b.text);
        eprintln!(
            "app cancel {into_pass:?} into the profile pass: worker reported cancelled after {:.3} s",
            took.as_secs_f64()
        );
        worst = worst.max(took);
    }
    assert!(
        worst < Duration::from_millis(500),
        "cancel took {:.3} s",
        worst.as_secs_f64()
    );
}

/// Tensor parallel in the app: the setup's control runs two ranks, a row per rank appears with
/// the binding rank starred, clicking a rank shows its own report, and the views' numbers are
/// that rank's.
#[test]
fn tensor_parallel_ranks_are_shown_and_selectable() {
    let mut h = harness();
    h.run_steps(2);
    h.get_by_role_and_label(Role::ComboBox, "tensor parallel")
        .click();
    h.run_steps(2);
    h.get_by_label("2").click();
    h.run_steps(2);
    h.get_by_label("Profile").click();
    wait_for_run(&mut h, Duration::from_secs(120));
    assert!(h.state().banner().is_none(), "{:?}", h.state().banner());
    let r = h.state().report().expect("a report").clone();
    assert_eq!((r.tp, r.ranks.len()), (2, 2));
    assert_eq!(h.state().shown_rank(), r.rank);
    // One row per rank; the one that sets the engine's #9516 budget says so.
    let binding = r.engine.iter().find(|e| e.key == "pr9516").unwrap();
    let rows: Vec<String> = (0..2)
        .map(|k| {
            h.get_by_label_contains(&format!("rank {k} ("))
                .accesskit_node()
                .label()
                .unwrap_or_default()
        })
        .collect();
    for (k, row) in rows.iter().enumerate() {
        assert_eq!(
            row.ends_with("sets the budget"),
            k as u32 == binding.binding_rank,
            "{row}"
        );
    }
    let other = 1 - binding.binding_rank;
    h.get_by_label_contains(&format!("rank {other} (")).click();
    h.run_steps(3);
    assert_eq!(h.state().shown_rank(), other);
    let shown = h.state().report().unwrap().clone();
    let own = &r.ranks[other as usize];
    assert_eq!(shown.weights_bytes, own.weights_bytes);
    let new = shown.formula(FormulaId::Pr9516).unwrap();
    assert_eq!(
        new.kv_blocks,
        own.formula(FormulaId::Pr9516).unwrap().kv_blocks
    );
    assert!(
        shows(&h, &fmt_i(new.non_kv_bytes)),
        "rank {other}'s #9516 non-KV is not on screen"
    );
}

/// A dropped vLLM log takes its settings, runs them, and the "vLLM log" tab shows the log's
/// numbers beside the run's; a log that cannot be read says so in the banner and the app
/// keeps its settings.
#[test]
fn a_dropped_vllm_log_runs_its_settings_and_shows_the_comparison() {
    let log = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/vllm-logs/q1-0.19-llama-3.1-8b-h100.log");
    let mut h = harness();
    h.run_steps(2);
    wait_for_run(&mut h, Duration::from_secs(120));
    h.input_mut().dropped_files.push(Arc::new(Dropped(log)));
    // The log is read off the UI thread; its run starts on the frame after.
    wait_for_files(&mut h);
    wait_for_run(&mut h, Duration::from_secs(120));
    assert!(h.state().banner().is_none(), "{:?}", h.state().banner());
    let r = h.state().report().expect("a report").clone();
    assert_eq!(r.settings.vllm, "0.19");
    assert_eq!(r.settings.util, 0.95);
    assert_eq!(h.state().setup.preset, "llama-3.1-8b");
    assert!(shows(&h, "vLLM log: q1-0.19-llama-3.1-8b-h100.log"));
    assert!(shows(&h, "58.11 GiB"), "the log's KV cache");
    assert!(shows(&h, "476,016"), "the log's tokens");
    assert!(shows(&h, "Largest difference"));

    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("notes.txt");
    std::fs::write(&bad, "nothing vLLM printed\n").unwrap();
    h.input_mut().dropped_files.push(Arc::new(Dropped(bad)));
    wait_for_files(&mut h);
    let banner = h.state().banner().expect("an error banner");
    assert!(
        banner.text.contains("not a vLLM startup log"),
        "{}",
        banner.text
    );
    assert_eq!(h.state().setup.vllm, "0.19");
}

/// Issue 51, item 3: a dropped log that does not state max_num_seqs leaves the field at
/// "vLLM default" (it showed 1, the widget's floor under the log's 0), and profiling again
/// gives the same answer as the log's own run.
#[test]
fn a_dropped_log_without_max_num_seqs_keeps_vllms_default_and_a_second_run_agrees() {
    let log = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/vllm-logs/p3-0.7.2-qwen2.5-1.5b-t4.log");
    let mut h = harness();
    h.run_steps(2);
    h.input_mut().dropped_files.push(Arc::new(Dropped(log)));
    wait_for_files(&mut h);
    wait_for_run(&mut h, Duration::from_secs(120));
    assert!(h.state().banner().is_none(), "{:?}", h.state().banner());
    let first = h.state().report().expect("the log's run").clone();
    assert_eq!(first.settings.vllm, "0.7");
    // V0's default, 256, as the log tab's assumption says.
    assert_eq!(first.settings.seqs, 256);
    assert!(shows(
        &h,
        "assumed: max_num_seqs 256: the release's default (the log does not say)"
    ));
    // The field says "vLLM default" (drawn for some frames), not a number.
    h.run_steps(5);
    assert_eq!(h.state().setup.seqs, 0, "max_num_seqs is vLLM's default");

    h.get_by_label("Profile").click();
    wait_for_run(&mut h, Duration::from_secs(120));
    let second = h.state().report().expect("the second run").clone();
    assert_eq!(second.settings.seqs, first.settings.seqs);
    assert_eq!(second.settings.tokens, first.settings.tokens);
    for id in [FormulaId::Pr9352, FormulaId::Pr9516] {
        assert_eq!(
            second.formula(id).unwrap().kv_blocks,
            first.formula(id).unwrap().kv_blocks,
            "{id:?}"
        );
    }
    assert!(shows(&h, "Largest difference"), "the log still compares");
}

/// Issue 51, item 4: for the same settings the app asks for what the CLI asks for, under
/// every release; "vLLM default" batch fields are resolved once, by the request, as the CLI's
/// flags left out are (V1 on an H100: 8192 tokens in 1024 sequences).
#[test]
fn the_apps_request_is_the_clis_for_the_same_settings_under_every_release() {
    use clap::Parser;
    use vramscope::app::cli::{Cli, Command};
    use vramscope::app::gui::SetupForm;
    for rel in vramscope::profile::vllm::RELEASES {
        for (device, cli_device) in [
            ("sim:h100-sxm", "sim:h100-sxm:dry"),
            ("sim:h100-80gb", "sim:h100-80gb:dry"),
            ("sim:l40s", "sim:l40s:dry"),
        ] {
            let form = SetupForm {
                vllm: rel.name.to_string(),
                device: device.to_string(),
                ..SetupForm::default()
            };
            let cli = Cli::try_parse_from([
                "vramscope",
                "profile",
                "--quant",
                "int8",
                "--device",
                cli_device,
                "--vllm",
                rel.name,
            ])
            .unwrap();
            let Some(Command::Profile(args)) = cli.command else {
                panic!("not a profile command")
            };
            let (app, cli) = (form.request().unwrap(), args.request().unwrap());
            assert_eq!(app, cli, "{} on {device}", rel.name);
            assert_eq!(app.resolved(8192), cli.resolved(8192), "{}", rel.name);
        }
    }
}

/// Issue 51, item 4: the app's run under 0.21 on a simulated H100 is the CLI's (it took 256
/// sequences where `vllm serve` and the CLI take 1024: 28,147 blocks against 27,548).
#[test]
fn the_apps_v1_run_on_an_h100_takes_vllm_serves_batch_as_the_cli_does() {
    let mut h = harness();
    h.run_steps(2);
    h.state_mut().setup.vllm = "0.21".into();
    h.run_steps(2);
    h.get_by_label("Profile").click();
    wait_for_run(&mut h, Duration::from_secs(120));
    assert!(h.state().banner().is_none(), "{:?}", h.state().banner());
    let r = h.state().report().expect("a report").clone();
    assert_eq!((r.settings.tokens, r.settings.seqs), (8192, 1024));
    use clap::Parser;
    use vramscope::app::cli::{Cli, Command};
    let parsed =
        Cli::try_parse_from(["vramscope", "profile", "--quant", "int8", "--vllm", "0.21"]).unwrap();
    let Some(Command::Profile(args)) = parsed.command else {
        panic!("not a profile command")
    };
    let direct = profile_directly(args.request().unwrap());
    assert_eq!(direct.settings, r.settings);
    let (ours, cli) = (r.vllm_answer().unwrap(), direct.vllm_answer().unwrap());
    assert_eq!(ours.kv_blocks, cli.kv_blocks);
}

fn log_fixture(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/vllm-logs")
        .join(name)
}

/// Issue 51, item 8: *Open vLLM log…* sits with the model's choice, and a log typed into
/// *Model file* is read as the log it is (it got "not a model file").
#[test]
fn open_vllm_log_sits_by_the_model_and_a_log_typed_as_the_model_file_opens_as_a_log() {
    let mut h = harness();
    h.run_steps(2);
    let button = h.get_by_label("Open vLLM log…").rect();
    let model = h.get_by_label("Model").rect();
    let quant = h.get_by_label("Quantization").rect();
    assert!(
        button.top() > model.bottom() && button.bottom() < quant.top(),
        "Open vLLM log… {button:?} is not in the Model section ({model:?} .. {quant:?})"
    );
    h.get_by_label("File").click();
    h.run_steps(2);
    h.state_mut().setup.path = log_fixture("q1-0.19-llama-3.1-8b-h100.log")
        .display()
        .to_string();
    h.get_by_label("Profile").click();
    wait_for_files(&mut h);
    wait_for_run(&mut h, Duration::from_secs(120));
    assert!(h.state().banner().is_none(), "{:?}", h.state().banner());
    assert_eq!(h.state().report().unwrap().settings.vllm, "0.19");
    assert!(shows(&h, "vLLM log: q1-0.19-llama-3.1-8b-h100.log"));
    assert!(shows(&h, "58.11 GiB"), "the log's KV cache");
}

/// Issue 51, item 8: a pasted `vllm serve` line is read by the CLI's own parser (`vramscope
/// plan`, with the device and release chosen in the app) and profiled: the app's run is the
/// CLI's.
#[test]
fn a_pasted_vllm_serve_line_runs_what_vramscope_plan_runs() {
    use clap::Parser;
    use vramscope::app::cli::{plan_profile_args, Cli, Command};
    let line = "vllm serve Qwen/Qwen2.5-32B-Instruct \\\n  --tensor-parallel-size 2 --max-model-len 8192 --gpu-memory-utilization 0.95 --port 8000";
    let mut h = harness();
    h.run_steps(2);
    h.state_mut().setup.vllm = "0.19".into();
    h.get_by_label("or paste a vllm serve line").click();
    h.run_steps(2);
    h.input_mut().events.push(egui::Event::Paste(line.into()));
    h.run_steps(2);
    assert_eq!(h.state().setup.serve_line, line);
    h.get_by_label("Use line").click();
    wait_for_run(&mut h, Duration::from_secs(120));
    let banner = h.state().banner().expect("the line's note").clone();
    assert_eq!(banner.kind, BannerKind::Info, "{}", banner.text);
    assert!(banner.text.contains("--port 8000"), "{}", banner.text);
    let r = h.state().report().expect("a report").clone();

    let cli = Cli::try_parse_from([
        "vramscope",
        "plan",
        "--device",
        "sim:h100-sxm:dry", // the app's default device
        "--vllm",
        "0.19",
        "--",
        "vllm",
        "serve",
        "Qwen/Qwen2.5-32B-Instruct",
        "--tensor-parallel-size",
        "2",
        "--max-model-len",
        "8192",
        "--gpu-memory-utilization",
        "0.95",
        "--port",
        "8000",
    ])
    .unwrap();
    let Some(Command::Plan(p)) = cli.command else {
        panic!("not a plan command")
    };
    let (args, _) = plan_profile_args(&p).unwrap();
    let want = args.request().unwrap();
    assert_eq!(h.state().setup.request().unwrap(), want);
    let direct = profile_directly(want);
    assert_eq!(r.settings, direct.settings);
    assert_eq!((r.tp, r.settings.max_model_len), (2, 8192));
    assert_eq!(
        r.vllm_engine_blocks(),
        direct.vllm_engine_blocks(),
        "the app's blocks are the CLI's"
    );
}

/// Issue 51, item 8: the release popup shows every release, V1 ones included (they hid below
/// an invisible scroll), and what a release changed shows under the list, covering no
/// neighbour (it was a tooltip over the next entries).
#[test]
fn the_release_popup_shows_every_release_and_its_note_covers_no_entry() {
    let mut h = Harness::builder()
        .with_size(egui::vec2(1920.0, 1080.0))
        .build_eframe(|cc| VramscopeApp::new(cc));
    h.run_steps(2);
    h.get_by_role_and_label(Role::ComboBox, "vLLM release")
        .click();
    h.run_steps(3);
    let screen = egui::Rect::from_min_size(egui::Pos2::ZERO, h.ctx.content_rect().size());
    let combo = h
        .get_by_role_and_label(Role::ComboBox, "vLLM release")
        .rect();
    let mut entries = Vec::new();
    for r in vramscope::profile::vllm::RELEASES {
        let rect = h
            .query_all_by_label(r.name)
            .map(|n| n.rect())
            .find(|rect| *rect != combo && screen.contains_rect(*rect))
            .unwrap_or_else(|| panic!("release {} is not in view", r.name));
        entries.push((r.name, rect));
    }
    let (name, at) = entries[4];
    h.hover_at(at.center());
    h.run_steps(3);
    let rel = vramscope::profile::vllm::release(name).unwrap();
    let note = h
        .get_by_label(&format!("{}: {}", rel.name, rel.changes))
        .rect();
    for (other, rect) in &entries {
        assert!(!note.intersects(*rect), "the note of {name} covers {other}");
    }
}

/// A fit the app shows, run dry outside the app: vLLM would start it.
fn assert_starts(f: &vramscope::app::gui::Fit) {
    let mut req = f.request.clone();
    if let vramscope::device::DeviceSpec::Sim { dry, .. } = &mut req.device {
        *dry = true;
    }
    let r = profile_directly(req);
    let o = vramscope::profile::diagnose::outcome(&r).expect("an answer");
    assert!(
        o.starts(),
        "'{}' is shown but would not start: {o:?}",
        f.change
    );
}

/// Issue 51, item 6: 70B fp16 on one 24 GB card runs out of memory while loading: the app
/// says it does not fit, as a headline, and what fits, each checked by a dry run (the hint
/// "try int8 or nf4" fitted neither). For 70B int8 on an H200 (no KV block left) no
/// suggestion is a guess (`--util 0.99` left one block) and no sentence compares two negative
/// budgets.
#[test]
fn what_does_not_fit_says_so_and_every_suggestion_is_checked_by_a_run() {
    use vramscope::app::gui::SetupForm;
    let mut h = harness();
    h.run_steps(2);
    h.state_mut().setup = SetupForm {
        preset: "llama-3-70b".into(),
        quant: vramscope::quant::Quant::F16,
        device: "sim:rtx4090".into(),
        ..SetupForm::default()
    };
    h.run_steps(2);
    h.get_by_label("Profile").click();
    wait_for_run(&mut h, Duration::from_secs(600));
    let banner = h.state().banner().expect("a banner").clone();
    assert_eq!(banner.kind, BannerKind::Error);
    assert!(
        banner
            .text
            .starts_with("Does not fit: llama-3-70b in fp16 on one NVIDIA GeForce RTX 4090"),
        "{}",
        banner.text
    );
    assert!(!banner.text.contains("try int8"), "{}", banner.text);
    let fits = h.state().fits().expect("fits were tried").to_vec();
    assert!(!fits.is_empty(), "{}", banner.text);
    assert!(
        fits.iter().any(|f| f.change.contains("tensor parallel")),
        "{fits:?}"
    );
    for f in &fits {
        assert!(banner.text.contains(&f.change), "{}", banner.text);
        assert_starts(f);
    }
    assert!(h
        .query_all_by_label_contains("Does not fit: llama-3-70b")
        .any(|n| n.rect().left() > 1000.0));
    // *Use* takes the first fit into the setup and profiles it: it starts.
    h.get_all_by_label("Use").next().unwrap().click();
    h.run_steps(2);
    wait_for_run(&mut h, Duration::from_secs(600));
    let r = h.state().report().expect("the fit's run").clone();
    assert_eq!(r.settings.tp, fits[0].request.tp);
    assert_eq!(r.quant, fits[0].request.quant);
    assert!(vramscope::profile::diagnose::outcome(&r).unwrap().starts());

    // 70B int8 on an H200: no KV block left under the default release.
    h.state_mut().setup = SetupForm {
        preset: "llama-3-70b".into(),
        quant: vramscope::quant::Quant::Int8,
        device: "sim:h200".into(),
        ..SetupForm::default()
    };
    h.run_steps(2);
    h.get_by_label("Profile").click();
    wait_for_run(&mut h, Duration::from_secs(600));
    let r = h.state().report().expect("the H200 run").clone();
    assert!(r.does_not_fit().is_some(), "the case of the issue");
    assert!(h
        .query_all_by_label_contains("Does not fit. vLLM 380e1863 would not start")
        .next()
        .is_some());
    assert!(h.query_all_by_label_contains("--util").next().is_none());
    assert!(h
        .query_all_by_label_contains("so its budget is")
        .next()
        .is_none());
    assert!(h
        .query_all_by_label_contains("Neither formula leaves room for a KV cache")
        .next()
        .is_some());
    let fits = h.state().fits().expect("fits were tried").to_vec();
    assert!(!fits.is_empty());
    for f in &fits {
        assert!(shows(&h, &f.change), "{} is not shown", f.change);
        assert_starts(f);
    }
}

/// Issue 51, item 9: Compare of an auto KV cache against fp8 showed B − A = 0 on every row
/// (the budgets are bytes, which the dtype does not change); the release's blocks and tokens
/// are rows of their own, and they about double.
#[test]
fn compare_of_auto_against_fp8_kv_shows_the_blocks_and_tokens_it_gains() {
    use vramscope::app::gui::{delta_rows, SetupForm};
    use vramscope::profile::request::KvCacheDtype;
    use vramscope::report::lifetimes::Analysis;
    let base = SetupForm {
        vllm: "0.19".into(),
        ..SetupForm::default()
    }
    .request()
    .unwrap();
    let a = profile_directly(base.clone());
    let b = profile_directly(ProfileRequest {
        kv_cache_dtype: KvCacheDtype::Fp8,
        ..base
    });
    let rows = delta_rows((&a, &Analysis::of(&a)), (&b, &Analysis::of(&b)));
    for what in ["vLLM's KV blocks", "vLLM's KV tokens"] {
        let row = rows.iter().find(|r| r.what == what).expect(what);
        assert!(row.count);
        assert!(
            row.b as f64 >= 1.8 * row.a as f64,
            "{what}: {} → {}",
            row.a,
            row.b
        );
    }
    let mut h = harness();
    h.run_steps(2);
    h.state_mut().show_report(a);
    h.run_steps(2);
    h.state_mut().pin_current();
    h.state_mut().show_report(b);
    h.run_steps(2);
    h.get_by_label("Compare").click();
    h.run_steps(4);
    let tokens = rows.iter().find(|r| r.what == "vLLM's KV tokens").unwrap();
    assert!(shows(&h, "vLLM's KV tokens"));
    assert!(
        shows(
            &h,
            &vramscope::base::units::thousands(tokens.delta() as u64)
        ),
        "B − A of the tokens is not shown"
    );
}

/// Issue 51, item 9: choosing tensor parallel moves no setting below it (the GPU links row
/// appeared with a second GPU and pushed every row under it down by 56 px).
#[test]
fn choosing_tensor_parallel_moves_no_setting_below() {
    let mut h = harness();
    h.run_steps(2);
    let top = |h: &Harness<'static, VramscopeApp>, label: &str| {
        h.query_all_by_label(label)
            .map(|n| n.rect().top())
            .fold(f32::INFINITY, f32::min)
    };
    let before: Vec<f32> = ["vLLM release", "block_size", "kv_cache_dtype"]
        .iter()
        .map(|l| top(&h, l))
        .collect();
    assert!(before.iter().all(|y| y.is_finite()), "{before:?}");
    for tp in [2u32, 4, 1] {
        h.state_mut().setup.tp = tp;
        h.run_steps(3);
        let after: Vec<f32> = ["vLLM release", "block_size", "kv_cache_dtype"]
            .iter()
            .map(|l| top(&h, l))
            .collect();
        assert_eq!(before, after, "tensor parallel {tp} moved the settings");
    }
}

/// Issue 51, item 8: the true maximum runs from the app (the CLI's `--true-max`): *find the
/// true maximum* under *Advanced*, and the Budget tab says how many blocks really serve.
#[test]
fn the_true_maximum_runs_from_the_app() {
    let mut h = harness();
    h.run_steps(2);
    h.get_by_label("Advanced").click();
    h.run_steps(2);
    h.get_by_label("find the true maximum").scroll_to_me();
    h.run_steps(10);
    h.get_by_label("find the true maximum").click();
    h.run_steps(3);
    assert!(h.state().setup.true_max);
    h.get_by_label("Profile").click();
    wait_for_run(&mut h, Duration::from_secs(300));
    assert!(h.state().banner().is_none(), "{:?}", h.state().banner());
    let r = h.state().report().unwrap().clone();
    let m = r.true_max.as_ref().expect("the search ran");
    assert!(m.blocks > 0);
    assert!(h
        .query_all_by_label_contains(&format!("true maximum: {} KV blocks", m.blocks))
        .next()
        .is_some());
    // With two GPUs the search does not run, and the box is greyed out rather than refused.
    h.state_mut().setup.tp = 2;
    h.run_steps(2);
    assert!(!h.state().setup.request().unwrap().true_max);
}

/// Issue 51, item 9: the key and the sentence agree. Llama-3-70B fp16 over two GPUs keeps a
/// 32 MiB workspace across passes; the key said "workspace kept across passes … counted twice
/// by #9352" beside "No framework tensor survives the pass". The sentence now names what the
/// key names, with the same bytes.
#[test]
fn the_kept_tensors_key_and_the_old_vs_new_sentence_agree() {
    use vramscope::app::gui::SetupForm;
    use vramscope::report::lifetimes::Analysis;
    let r = profile_directly(ProfileRequest {
        tp: 2,
        quant: vramscope::quant::Quant::F16,
        model: vramscope::model::ModelSource::parse("preset:llama-3-70b").unwrap(),
        ..SetupForm::default().request().expect("default request")
    });
    let a = Analysis::of(&r);
    let key = a.headline.clone().expect("a kept-tensors key");
    assert!(key.starts_with("workspace kept across passes: "), "{key}");
    assert!(key.ends_with("counted twice by #9352"), "{key}");
    let kept: u64 = a.kept.iter().map(|g| g.bytes_at_t3).sum();
    let why = r.old_vs_new_explanation();
    assert!(!why.contains("No framework tensor survives"), "{why}");
    assert!(
        why.starts_with(&format!(
            "The pass leaves {} of framework tensors (workspace the largest) alive: the old formula counts them twice",
            fmt_i(kept as i64)
        )),
        "{why}"
    );
    let mut h = harness();
    h.run_steps(2);
    h.state_mut().show_report(r);
    h.run_steps(4);
    assert!(shows(&h, &key));
    assert!(shows(&h, &why));
}

/// Issue 51, item 9: the app's messages name the app's fields, not the CLI's flags (`--pp`,
/// `--vllm`, `--util` in a banner name nothing the window shows).
#[test]
fn a_refused_setting_is_named_by_its_field_in_the_banner() {
    let mut h = harness();
    h.run_steps(2);
    wait_for_run(&mut h, Duration::from_secs(120));
    h.state_mut().setup.vllm = "0.7".into();
    h.state_mut().setup.pp = 2;
    h.run_steps(2);
    h.get_by_label("Profile").click();
    h.run_steps(2);
    wait_for_run(&mut h, Duration::from_secs(120));
    let banner = h.state().banner().expect("a refusal").clone();
    assert_eq!(banner.kind, BannerKind::Error);
    assert!(
        banner
            .text
            .contains("pipeline stages 2 with vLLM release 0.7"),
        "{}",
        banner.text
    );
    assert!(!banner.text.contains("--"), "{}", banner.text);
    h.run_steps(2);
    assert!(
        h.query_all_by_label_contains("pipeline stages 2 with vLLM release 0.7")
            .next()
            .is_some(),
        "the banner is not drawn"
    );
}

/// Issue 51, item 9: no two GPUs of the device list share a name (a preset kept from before,
/// simulating the `nvidia-smi` total, had its newer preset's name: "NVIDIA L4 (simulated)"
/// twice with two totals); the setup's device box shows which total the default simulates.
#[test]
fn every_gpu_in_the_device_list_has_its_own_name() {
    use vramscope::app::gui::device_name;
    let (devices, _) = vramscope::device::list_devices();
    let mut names: Vec<String> = devices.iter().map(device_name).collect();
    let n = names.len();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), n, "{names:?}");
    assert!(names.contains(&"NVIDIA L4 (simulated, nvidia-smi total)".to_string()));
    assert!(names.contains(&"NVIDIA L4 (simulated)".to_string()));
    let mut h = harness();
    h.run_steps(2);
    let combo = h.get_by_role_and_label(Role::ComboBox, "Device");
    // Issue 51, item 9: the first launch is the H100 as vLLM sees it (cudaMemGetInfo's
    // 79.22 GiB); nvidia-smi's 79.65 GiB stays one entry away.
    assert_eq!(
        combo.value().as_deref(),
        Some("NVIDIA H100 80GB HBM3 (simulated, vLLM's total)")
    );
    combo.click();
    h.run_steps(3);
    assert!(h
        .query_all_by_label_contains("NVIDIA H100 80GB HBM3 (simulated, nvidia-smi total)")
        .next()
        .is_some());
}

/// The key names a V1 sampler's cached buffer once bracketed ("sampler (triton_buffer
/// (cached)) kept across passes" under 0.19).
#[test]
fn the_kept_key_of_a_v1_run_brackets_once() {
    use vramscope::app::gui::SetupForm;
    use vramscope::report::lifetimes::Analysis;
    let r = profile_directly(ProfileRequest {
        vllm: "0.19".into(),
        quant: vramscope::quant::Quant::F16,
        ..SetupForm::default().request().expect("default request")
    });
    let key = Analysis::of(&r).headline.expect("a kept-tensors key");
    assert!(
        key.starts_with("sampler triton_buffer (cached) kept across passes: "),
        "{key}"
    );
    assert!(!key.contains("))"), "{key}");
}
