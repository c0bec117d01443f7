//! Frame time of the timeline with a report of about a million events (a real dry-run profile of
//! llama-3-70b on a simulated H200, 740 passes: vLLM's fused layers make 1,362 events a pass), and of the lifetime view of it and of a million
//! allocations (int8, 240 passes): layout + plot + tessellation, the CPU work of
//! one frame. `static`: the view does not move (cached reduction); `zoom`: the view changes
//! every frame (the visible range is reduced again).

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion};
use vramscope::app::gui::{LifetimeView, Part, TimelineInput, TimelineView};
use vramscope::device::DeviceSpec;
use vramscope::model::ModelSource;
use vramscope::quant::Quant;
use vramscope::report::lifetimes::Analysis;
use vramscope::{ProfileRequest, Report};

const SIZE: egui::Vec2 = egui::vec2(1000.0, 700.0);

fn dry_70b_report(passes: u32, quant: Quant) -> Report {
    let req = ProfileRequest {
        model: ModelSource::Preset {
            name: "llama-3-70b".into(),
        },
        device: DeviceSpec::Sim {
            preset: "h200-141gb".into(),
            dry: true,
            total: None,
            topology: None,
        },
        passes,
        quant,
        verify: false,
        ..ProfileRequest::default()
    };
    vramscope::profile::run(&req, None, Arc::new(AtomicBool::new(false))).expect("profile")
}

fn million_event_report() -> Report {
    let r = dry_70b_report(740, Quant::F16);
    assert!(r.events.len() >= 1_000_000, "{} events", r.events.len());
    r
}

fn input(events: Vec<egui::Event>) -> egui::RawInput {
    egui::RawInput {
        screen_rect: Some(egui::Rect::from_min_size(egui::Pos2::ZERO, SIZE)),
        events,
        ..Default::default()
    }
}

/// One frame: run the UI, then tessellate what it painted.
fn frame(
    ctx: &egui::Context,
    view: &mut TimelineView,
    report: &Report,
    events: Vec<egui::Event>,
) -> usize {
    let mut out = ctx.run_ui(input(events), |ui| {
        egui::CentralPanel::default_margins().show(ui, |ui| {
            view.ui(
                ui,
                &TimelineInput {
                    events: &report.events,
                    generation: 1,
                    report: Some(report),
                },
            );
        });
    });
    // No GPU here: the font atlas upload is dropped.
    out.textures_delta.clear();
    ctx.tessellate(out.shapes, out.pixels_per_point).len()
}

/// A scroll step that zooms the event axis by `factor` (scroll zooms x; 0.004 per point).
fn wheel(factor: f32) -> egui::Event {
    egui::Event::MouseWheel {
        unit: egui::MouseWheelUnit::Point,
        delta: egui::vec2(0.0, factor.ln() / 0.004),
        phase: egui::TouchPhase::Move,
        source: egui::MouseWheelSource::Unknown,
        modifiers: egui::Modifiers::NONE,
    }
}

/// Alternately zooms in and out around `centre` by 25 %, one step per frame.
fn zoom_every_frame(
    c: &mut Criterion,
    name: &str,
    ctx: &egui::Context,
    view: &mut TimelineView,
    report: &Report,
    centre: egui::Pos2,
) {
    let mut zoom_in = true;
    c.bench_function(name, |b| {
        b.iter(|| {
            let f = if zoom_in { 1.25 } else { 0.8 };
            zoom_in = !zoom_in;
            frame(
                ctx,
                view,
                report,
                vec![egui::Event::PointerMoved(centre), wheel(f)],
            )
        })
    });
}

fn bench(c: &mut Criterion) {
    let report = million_event_report();
    eprintln!("report: {} events", report.events.len());
    let ctx = egui::Context::default();
    let mut view = TimelineView::default();
    let t = std::time::Instant::now();
    frame(&ctx, &mut view, &report, Vec::new());
    eprintln!(
        "first frame (builds the reductions once): {:?}",
        t.elapsed()
    );

    c.bench_function("timeline_frame_1M_events_static", |b| {
        b.iter(|| frame(&ctx, &mut view, &report, Vec::new()))
    });

    let centre = egui::pos2(SIZE.x / 2.0, SIZE.y / 2.0);
    zoom_every_frame(
        c,
        "timeline_frame_1M_events_zoom_every_frame",
        &ctx,
        &mut view,
        &report,
        centre,
    );

    // Deep zoom (~1/20 of the run in view): the visible events are reduced again every frame.
    for _ in 0..14 {
        frame(
            &ctx,
            &mut view,
            &report,
            vec![egui::Event::PointerMoved(centre), wheel(1.25)],
        );
    }
    zoom_every_frame(
        c,
        "timeline_frame_1M_events_deep_zoom_every_frame",
        &ctx,
        &mut view,
        &report,
        centre,
    );

    // Opening a saved million-event session: read the JSON and make the analysis.
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("million.json");
    vramscope::report::export::json::write(&report, &path).expect("write session");
    let t = std::time::Instant::now();
    let back = vramscope::report::export::json::read(&path).expect("read session");
    let read = t.elapsed();
    let a = Analysis::of(&back);
    eprintln!(
        "session open ({} MB): read {:?}, analysis {:?}, total {:?}",
        std::fs::metadata(&path).map(|m| m.len() >> 20).unwrap_or(0),
        read,
        t.elapsed() - read,
        t.elapsed()
    );
    drop(a);

    let mut stacked = TimelineView::default();
    stacked.stacked = true;
    frame(&ctx, &mut stacked, &report, Vec::new());
    c.bench_function("timeline_frame_1M_events_stacked_static", |b| {
        b.iter(|| frame(&ctx, &mut stacked, &report, Vec::new()))
    });

    // The lifetime view of the same million events (fp16: half a million allocations), then
    // of a million allocations (int8, whose CxB state outlives each pass).
    lifetime_benches(c, &ctx, &report, "1M_events_fp16");
    drop(report);
    let report = dry_70b_report(240, Quant::Int8);
    let allocations = report
        .events
        .iter()
        .filter(|e| e.kind == vramscope::memory::EventKind::Alloc)
        .count();
    assert!(allocations >= 1_000_000, "{allocations} allocations");
    lifetime_benches(c, &ctx, &report, "1M_allocations_int8");
}

/// The lifetime view's frame: still, and zooming every frame.
fn lifetime_benches(c: &mut Criterion, ctx: &egui::Context, report: &Report, what: &str) {
    let t = std::time::Instant::now();
    let analysis = Arc::new(Analysis::of(report));
    eprintln!(
        "lifetime analysis of {} events ({} allocations): {:?}",
        report.events.len(),
        analysis.lifetimes.items.len(),
        t.elapsed()
    );
    {
        // How much a full view draws: pieces per column, and rectangles after joining.
        let end = analysis.lifetimes.profile_end(&report.events);
        let per_px = (analysis.profile_top as f64 * 1.12 / 560.0) as u64;
        let cols = analysis
            .lifetimes
            .columns(&report.events, 0, end, 940, per_px);
        let t = std::time::Instant::now();
        let stack = analysis
            .lifetimes
            .stack_rects(&report.events, 0, end, 940, per_px);
        eprintln!(
            "full view: {} columns, {} pieces, {} rectangles, {} kept edges; made in {:?}",
            cols.len(),
            cols.iter().map(|c| c.segs.len()).sum::<usize>(),
            stack.rects.len(),
            stack.edges.len(),
            t.elapsed()
        );
    }
    let mut view = LifetimeView::new(Part::Profile);
    let mut lifetime_frame = |events: Vec<egui::Event>| {
        let mut out = ctx.run_ui(input(events), |ui| {
            egui::CentralPanel::default_margins().show(ui, |ui| {
                view.ui(ui, report, &analysis, 1);
            });
        });
        out.textures_delta.clear();
        ctx.tessellate(out.shapes, out.pixels_per_point).len()
    };
    let t = std::time::Instant::now();
    lifetime_frame(Vec::new());
    eprintln!("first lifetime frame (columns made): {:?}", t.elapsed());
    c.bench_function(&format!("lifetime_frame_{what}_static"), |b| {
        b.iter(|| lifetime_frame(Vec::new()))
    });
    let centre = egui::pos2(SIZE.x / 2.0, SIZE.y / 2.0);
    let mut zoom_in = true;
    c.bench_function(&format!("lifetime_frame_{what}_zoom_every_frame"), |b| {
        b.iter(|| {
            // Scroll zooms the event axis.
            let dy = if zoom_in { 60.0 } else { -60.0 };
            zoom_in = !zoom_in;
            lifetime_frame(vec![
                egui::Event::PointerMoved(centre),
                egui::Event::MouseWheel {
                    unit: egui::MouseWheelUnit::Point,
                    delta: egui::vec2(0.0, dy),
                    modifiers: egui::Modifiers::NONE,
                    phase: egui::TouchPhase::Move,
                    source: egui::MouseWheelSource::Unknown,
                },
            ])
        })
    });
}

criterion_group! {
    name = benches;
    // No HTML plots: they need system fonts, which a headless machine may lack.
    config = Criterion::default().sample_size(30).without_plots();
    targets = bench
}
criterion_main!(benches);
