//! The real app, driven headless through egui_kittest (no GPU, no display): pick a preset and
//! a quantization, profile, read the comparison; cancel mid-run; a bad model file shows the
//! error banner and the next run succeeds; a dropped session reopens.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use egui::accesskit::Role;
use egui_kittest::kittest::{NodeT, Queryable};
use egui_kittest::Harness;
use vramscope::gui::{verify_cell, BannerKind, VramscopeApp};
use vramscope::profile::formulas::FormulaId;
use vramscope::units::fmt_i;
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
    assert_eq!(vramscope::runtime::runtimes_created_on_this_thread(), 0);
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
    vramscope::export::json::write(&report, &session).unwrap();

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
    h.get_by_label("Save session").click();
    wait_for_files(&mut h);
    h.get_by_label("Save CSV").click();
    wait_for_files(&mut h);
    let session = dir.path().join("out.json");
    let reread = vramscope::export::json::read(&session).unwrap();
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
