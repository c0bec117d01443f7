//! Frame time of the timeline with a report of about a million events (a real dry-run profile of
//! llama-3-70b on a simulated H200, 620 passes): layout + plot + tessellation, the CPU work of
//! one frame. `static`: the view does not move (cached reduction); `zoom`: the view changes
//! every frame (the visible range is reduced again).

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion};
use vramscope::device::DeviceSpec;
use vramscope::gui::{LifetimeView, Part, TimelineInput, TimelineView};
use vramscope::lifetimes::Analysis;
use vramscope::model::ModelSource;
use vramscope::{ProfileRequest, Report};

const SIZE: egui::Vec2 = egui::vec2(1000.0, 700.0);

fn million_event_report() -> Report {
    let req = ProfileRequest {
        model: ModelSource::Preset {
            name: "llama-3-70b".into(),
        },
        device: DeviceSpec::Sim {
            preset: "h200-141gb".into(),
            dry: true,
        },
        passes: 620,
        verify: false,
        ..ProfileRequest::default()
    };
    let r = vramscope::profile::run(&req, None, Arc::new(AtomicBool::new(false))).expect("profile");
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

    // The lifetime view: a million events' allocations as bands, merged below a pixel.
    let t = std::time::Instant::now();
    let analysis = Arc::new(Analysis::of(&report));
    eprintln!(
        "lifetime analysis of {} events ({} allocations): {:?}",
        report.events.len(),
        analysis.lifetimes.items.len(),
        t.elapsed()
    );
    let mut lifetimes = LifetimeView::new(Part::Profile);
    let lifetime_frame =
        |ctx: &egui::Context, view: &mut LifetimeView, events: Vec<egui::Event>| {
            let mut out = ctx.run_ui(input(events), |ui| {
                egui::CentralPanel::default_margins().show(ui, |ui| {
                    view.ui(ui, &report, &analysis, 1);
                });
            });
            out.textures_delta.clear();
            ctx.tessellate(out.shapes, out.pixels_per_point).len()
        };
    let t = std::time::Instant::now();
    lifetime_frame(&ctx, &mut lifetimes, Vec::new());
    eprintln!("first lifetime frame (columns made): {:?}", t.elapsed());
    c.bench_function("lifetime_frame_1M_events_static", |b| {
        b.iter(|| lifetime_frame(&ctx, &mut lifetimes, Vec::new()))
    });
    let mut zoom_in = true;
    c.bench_function("lifetime_frame_1M_events_zoom_every_frame", |b| {
        b.iter(|| {
            // Scroll zooms the event axis.
            let dy = if zoom_in { 60.0 } else { -60.0 };
            zoom_in = !zoom_in;
            lifetime_frame(
                &ctx,
                &mut lifetimes,
                vec![
                    egui::Event::PointerMoved(centre),
                    egui::Event::MouseWheel {
                        unit: egui::MouseWheelUnit::Point,
                        delta: egui::vec2(0.0, dy),
                        modifiers: egui::Modifiers::NONE,
                        phase: egui::TouchPhase::Move,
                        source: egui::MouseWheelSource::Unknown,
                    },
                ],
            )
        })
    });

    // Opening a saved million-event session: read the JSON and make the analysis.
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("million.json");
    vramscope::export::json::write(&report, &path).expect("write session");
    let t = std::time::Instant::now();
    let back = vramscope::export::json::read(&path).expect("read session");
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
}

criterion_group! {
    name = benches;
    // No HTML plots: they need system fonts, which a headless machine may lack.
    config = Criterion::default().sample_size(30).without_plots();
    targets = bench
}
criterion_main!(benches);
