//! Frame time of the timeline with a report of about a million events (a real dry-run profile of
//! llama-3-70b on a simulated H200, 620 passes): layout + plot + tessellation, the CPU work of
//! one frame. `static`: the view does not move (cached reduction); `zoom`: the view changes
//! every frame (the visible range is reduced again).

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion};
use vramscope::device::DeviceSpec;
use vramscope::gui::{TimelineInput, TimelineView};
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
                vec![egui::Event::PointerMoved(centre), egui::Event::Zoom(f)],
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
            vec![egui::Event::PointerMoved(centre), egui::Event::Zoom(1.25)],
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
