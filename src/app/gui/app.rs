//! The eframe App: panels (toolbar, setup, timeline, comparison), the worker handle, exports,
//! keyboard shortcuts and the `--screenshot` mode. It never waits on the worker: each frame it
//! drains the channel and repaints while a run is in flight.

use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use egui::{Color32, Key, KeyboardShortcut, Modifiers, RichText};

use super::compare::CompareView;
use super::comparison::{self, ComparisonView};
use super::lifetime::{LifetimeView, Part};
use super::setup::{SetupAction, SetupForm};
use super::timeline::{TimelineInput, TimelineView};
use super::worker::{RunFailure, Worker, WorkerMsg};
use crate::device::DeviceListing;
use crate::engine::progress::{Phase, Progress};
use crate::memory::Event;
use crate::profile::Report;
use crate::report::export;
use crate::report::lifetimes::Analysis;
use crate::report::palette;

const SETUP_KEY: &str = "vramscope.setup";
const EXPORT_KEY: &str = "vramscope.export_path";
/// A file dialog that comes back empty this fast never showed (no portal, no zenity).
const NO_DIALOG_WITHIN: Duration = Duration::from_millis(400);

const PROFILE_KEY: KeyboardShortcut = KeyboardShortcut::new(Modifiers::COMMAND, Key::R);
const SAVE_PNG_KEY: KeyboardShortcut = KeyboardShortcut::new(Modifiers::COMMAND, Key::S);

#[derive(Clone, Debug, PartialEq)]
pub enum BannerKind {
    Error,
    Info,
}

#[derive(Clone, Debug)]
pub struct Banner {
    pub kind: BannerKind,
    pub text: String,
}

/// Where a running profile is, from its progress messages.
#[derive(Clone, Debug, Default)]
struct RunProgress {
    /// Profile passes asked for; the verify passes are counted apart.
    profile_passes: u32,
    /// The run's quantization (what an out-of-memory hint may suggest depends on it).
    quant: Option<crate::quant::Quant>,
    phase: Option<Phase>,
    load: Option<(u32, u32)>,
    pass: Option<(u32, u32, Option<String>)>,
    layer: Option<(u32, u32)>,
    started: Option<Instant>,
}

impl RunProgress {
    fn fraction(&self) -> f32 {
        let layer = self
            .layer
            .map_or(0.0, |(l, of)| (l + 1) as f32 / of.max(1) as f32);
        match self.phase {
            Some(Phase::Loading) => self
                .load
                .map_or(0.0, |(i, n)| (i + 1) as f32 / n.max(1) as f32),
            Some(Phase::Profiling) | Some(Phase::Verifying) => {
                self.pass.as_ref().map_or(0.0, |(p, of, _)| {
                    (p.saturating_sub(1) as f32 + layer) / (*of).max(1) as f32
                })
            }
            Some(Phase::Measuring) | Some(Phase::Done) => 1.0,
            _ => 0.0,
        }
    }

    fn text(&self) -> String {
        let mut s = self.phase.map_or("starting", Phase::label).to_string();
        if self.phase == Some(Phase::Loading) {
            if let Some((i, n)) = self.load {
                s += &format!(" · tensor {} of {n}", i + 1);
            }
        }
        if matches!(self.phase, Some(Phase::Profiling) | Some(Phase::Verifying)) {
            if let Some((p, of, v)) = &self.pass {
                let n = self.profile_passes.min(*of);
                s += &match v {
                    Some(f) => format!(
                        " · verify {} of {} ({f})",
                        p.saturating_sub(n),
                        of.saturating_sub(n)
                    ),
                    None => format!(" · pass {p} of {n}"),
                };
            }
            if let Some((l, of)) = self.layer {
                s += &format!(" · layer {} of {of}", l + 1);
            }
        }
        s
    }

    /// Seconds left, from the time so far and the fraction done (once there is a fraction
    /// to go on).
    fn eta_s(&self) -> Option<f32> {
        let f = self.fraction();
        let t = self.started?.elapsed().as_secs_f32();
        (f > 0.05 && f < 1.0 && t > 0.5).then(|| t / f - t)
    }
}

/// Which view the middle of the window shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CentralTab {
    /// Every allocation's lifetime (the default).
    Lifetimes,
    /// Running totals as lines (framework, device, non-framework).
    Lines,
    /// The verify passes, apart from the profile passes.
    Verify,
}

/// Which view the right-hand panel shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SideTab {
    /// Old vs new vs truth: big numbers, table, bars.
    Budget,
    /// Where T goes per formula.
    Waterfall,
    /// Who owns the peak.
    Peak,
    /// Two runs side by side.
    Compare,
    /// A dropped vLLM startup log beside the run of its settings.
    VllmLog,
}

/// `--screenshot FILE`: profile the default preset, save the window, quit.
struct ScreenshotJob {
    path: PathBuf,
    started: bool,
    frames_after_report: u32,
    requested: bool,
}

/// A window screenshot that was asked for, and where it goes.
type Shot = (PathBuf, Arc<egui::ColorImage>);

/// What a background file job (CSV, session save or open) reports back to the UI thread:
/// a report of 10⁶ events is 150 MB of JSON, seconds the UI must not wait for.
enum FileDone {
    Saved(String),
    Failed(String),
    Opened(PathBuf, crate::Result<Box<(Report, Analysis)>>),
    /// A vLLM log read (streamed: it may be large) and its settings worked out.
    VllmLog(crate::Result<Box<super::vllm_log::LoadedLog>>),
}

pub struct VramscopeApp {
    pub setup: SetupForm,
    /// Path stem for exports and sessions (`.png`, `.csv`, `.json` are added).
    pub export_path: String,
    devices: Vec<DeviceListing>,
    no_gpu: Option<String>,
    worker: Option<Worker>,
    progress: RunProgress,
    live_events: Vec<Event>,
    report: Option<Arc<Report>>,
    /// A tensor-parallel run's whole report (every rank), while `report` shows one rank.
    instance: Option<Arc<Report>>,
    /// Per rank of `instance`: this process's device memory and framework allocated over the
    /// profile (t0..t3), reduced to a few hundred points, in GiB.
    rank_lines: Vec<[Vec<[f64; 2]>; 2]>,
    /// Lifetimes, kept tensors and peak owners of `report`.
    analysis: Option<Arc<Analysis>>,
    generation: u64,
    pub tab: CentralTab,
    /// The setup panel is shown (hidden to give the views the room, as in presentation mode).
    pub show_setup: bool,
    /// Larger text for a projector.
    pub presentation: bool,
    pub side_tab: SideTab,
    compare: CompareView,
    lifetime: LifetimeView,
    verify_view: LifetimeView,
    banner: Option<Banner>,
    timeline: TimelineView,
    comparison: ComparisonView,
    screenshot: Option<ScreenshotJob>,
    shot_tx: Sender<Shot>,
    shot_rx: Receiver<Shot>,
    file_tx: Sender<FileDone>,
    file_rx: Receiver<FileDone>,
    /// File jobs in flight.
    files_pending: usize,
    /// Set when `--screenshot` fails, so the process exits non-zero.
    exit_error: Arc<Mutex<Option<String>>>,
    /// The worker in flight is the app's own first-launch run of the default case: anything
    /// the user asks for (a run, a session, a report) replaces it.
    startup_run: bool,
    /// A vLLM startup log dropped on the window.
    vllm_log: Option<super::vllm_log::LoadedLog>,
    /// A run to start on the next frame (a dropped log's settings, once read).
    run_requested: bool,
    /// What the banner says once the run in flight succeeds (a pasted line's notes).
    run_note: Option<String>,
    /// The run in flight.
    running: Option<crate::profile::ProfileRequest>,
    /// What would fit, each checked by a dry run, as the worker found it for the run in
    /// flight; then of the report shown, or of the run that did not fit (`unfit`).
    pending_fits: Option<Vec<super::fits::Fit>>,
    fits: Option<Vec<super::fits::Fit>>,
    /// The last run ran out of memory before it had a result: the headline saying so.
    unfit: Option<String>,
}

impl VramscopeApp {
    /// The app as eframe (or a test harness) creates it.
    pub fn new(cc: &eframe::CreationContext<'_>) -> Self {
        Self::with_screenshot(cc, None, Arc::new(Mutex::new(None)))
    }

    pub(crate) fn with_screenshot(
        cc: &eframe::CreationContext<'_>,
        screenshot: Option<PathBuf>,
        exit_error: Arc<Mutex<Option<String>>>,
    ) -> Self {
        // From here on, profiling on this thread is a bug (debug assertion in Runtime::new).
        crate::engine::runtime::mark_ui_thread();
        super::style::apply(&cc.egui_ctx);
        let stored = |key: &str| cc.storage.and_then(|s| s.get_string(key));
        let mut setup: SetupForm = if screenshot.is_some() {
            SetupForm::default()
        } else {
            stored(SETUP_KEY)
                .and_then(|s| serde_json::from_str(&s).ok())
                .unwrap_or_default()
        };
        setup.dialog_note = None;
        let export_path = stored(EXPORT_KEY).unwrap_or_else(|| "vramscope-report".into());
        let (devices, no_gpu) = crate::device::list_devices();
        let (shot_tx, shot_rx) = channel();
        let (file_tx, file_rx) = channel();
        VramscopeApp {
            setup,
            export_path,
            devices,
            no_gpu,
            worker: None,
            progress: RunProgress::default(),
            live_events: Vec::new(),
            report: None,
            instance: None,
            rank_lines: Vec::new(),
            analysis: None,
            generation: 0,
            tab: CentralTab::Lifetimes,
            show_setup: true,
            presentation: false,
            side_tab: SideTab::Budget,
            compare: CompareView::default(),
            lifetime: LifetimeView::new(Part::Profile),
            verify_view: LifetimeView::new(Part::Verify),
            banner: None,
            timeline: TimelineView::default(),
            comparison: ComparisonView::default(),
            screenshot: screenshot.map(|path| ScreenshotJob {
                path,
                started: false,
                frames_after_report: 0,
                requested: false,
            }),
            shot_tx,
            shot_rx,
            file_tx,
            file_rx,
            files_pending: 0,
            exit_error,
            startup_run: false,
            vllm_log: None,
            run_requested: false,
            run_note: None,
            running: None,
            pending_fits: None,
            fits: None,
            unfit: None,
        }
    }

    /// The app as the window opens it: the saved setup, if it is quick to run (a preset on a
    /// simulated device, dry: a fraction of a second), profiles by itself, so the window
    /// opens on a result rather than "No results yet". Anything the user asks for replaces
    /// that run.
    pub fn launched(cc: &eframe::CreationContext<'_>) -> Self {
        let mut app = Self::new(cc);
        if app.setup.starts_by_itself() {
            app.start_profile(&cc.egui_ctx);
            app.startup_run = app.worker.is_some();
        }
        app
    }

    /// Drops the app's own first-launch run, if it is still going: the user asked for
    /// something else.
    fn drop_startup_run(&mut self) {
        if self.startup_run {
            self.startup_run = false;
            self.worker = None;
            self.live_events = Vec::new();
        }
    }

    /// The latest finished run or opened session.
    pub fn report(&self) -> Option<&Report> {
        self.report.as_deref()
    }

    pub fn is_running(&self) -> bool {
        self.worker.is_some()
    }

    /// Whether a CSV/session save or a session open is still being written or read.
    pub fn file_job_pending(&self) -> bool {
        self.files_pending > 0
    }

    /// Runs a file job off the UI thread; its outcome arrives in `pump_file_jobs`.
    fn spawn_file_job(&mut self, job: impl FnOnce() -> FileDone + Send + 'static) {
        let tx = self.file_tx.clone();
        self.files_pending += 1;
        std::thread::spawn(move || {
            let _ = tx.send(job());
        });
    }

    fn pump_file_jobs(&mut self) {
        while let Ok(done) = self.file_rx.try_recv() {
            self.files_pending -= 1;
            match done {
                FileDone::Saved(msg) => self.info(msg),
                FileDone::Failed(msg) => self.error(msg),
                FileDone::Opened(path, Ok(r)) => {
                    let (report, analysis) = *r;
                    self.set_report(Arc::new(report), Arc::new(analysis));
                    if crate::report::snapshot::is_snapshot_path(&path) {
                        self.info(format!(
                            "Opened PyTorch snapshot {} (framework allocator only: device used, free and non-torch memory are unknown)",
                            path.display()
                        ));
                    } else {
                        self.info(format!("Opened session {}", path.display()));
                    }
                }
                FileDone::Opened(_, Err(e)) => self.error(e.to_string()),
                FileDone::VllmLog(Ok(log)) => {
                    self.setup.apply(&log.request);
                    self.side_tab = SideTab::VllmLog;
                    self.vllm_log = Some(*log);
                    self.run_requested = true;
                }
                FileDone::VllmLog(Err(e)) => self.error(super::in_app_words(&e.to_string())),
            }
        }
    }

    pub fn banner(&self) -> Option<&Banner> {
        self.banner.as_ref()
    }

    /// Events the timeline shows: the live ones while a run is in flight, else the report's.
    pub fn timeline_events(&self) -> &[Event] {
        match &self.report {
            Some(r) if self.worker.is_none() => &r.events,
            _ => &self.live_events,
        }
    }

    /// Shows a report as if a run had just produced it (sessions, benchmarks).
    pub fn show_report(&mut self, report: Report) {
        self.drop_startup_run();
        let analysis = Analysis::of(&report);
        self.set_report(Arc::new(report), Arc::new(analysis));
    }

    /// Lists only the simulated devices, with `why` as the reason, whatever GPUs this machine
    /// has: a picture of the window (the snapshot tests) must not depend on where it is taken.
    pub fn without_gpus(&mut self, why: &str) {
        self.devices.retain(|d| d.simulated);
        self.no_gpu = Some(why.into());
    }

    fn set_report(&mut self, report: Arc<Report>, analysis: Arc<Analysis>) {
        self.instance = (!report.ranks.is_empty()).then(|| report.clone());
        self.rank_lines = report.ranks.iter().map(rank_lines).collect();
        self.report = Some(report);
        self.analysis = Some(analysis);
        self.live_events = Vec::new();
        self.generation += 1;
        // The fits the worker found for this run (none for a session or a report shown).
        self.fits = std::mem::take(&mut self.pending_fits);
        self.unfit = None;
        self.explain_log();
    }

    /// What would fit for the report shown, or for the last run that did not fit, each
    /// checked by a dry run.
    pub fn fits(&self) -> Option<&[super::fits::Fit]> {
        self.fits.as_deref()
    }

    /// The dropped log against the report shown, once per report (not every frame).
    fn explain_log(&mut self) {
        if let Some(log) = &mut self.vllm_log {
            log.explain(self.report.as_deref());
        }
    }

    /// With tensor parallel: shows rank `k`'s own report in every view (the exports keep the
    /// whole instance).
    pub fn show_rank(&mut self, k: u32) {
        let Some(inst) = &self.instance else { return };
        let Some(r) = inst.ranks.iter().find(|r| r.rank == k) else {
            return;
        };
        let mut r = r.clone();
        // The rank's views still know the instance (its engine budget, how many ranks).
        r.tp = inst.tp;
        r.engine = inst.engine.clone();
        let a = Arc::new(Analysis::of(&r));
        self.report = Some(Arc::new(r));
        self.analysis = Some(a);
        self.generation += 1;
        self.explain_log();
    }

    /// The rank the views show (0 with one GPU).
    pub fn shown_rank(&self) -> u32 {
        self.report.as_ref().map_or(0, |r| r.rank)
    }

    /// What the exports write: the whole instance with tensor parallel, else the report.
    fn export_report(&self) -> Option<Arc<Report>> {
        self.instance.clone().or_else(|| self.report.clone())
    }

    /// One column per rank: its line (the rank the engine's #9516 budget comes from marked; a
    /// click shows that rank in the views) over its small multiple, all on one scale. Short
    /// windows get shorter multiples, so four ranks still leave the plot its room.
    fn ranks_ui(&mut self, ui: &mut egui::Ui) {
        let Some(inst) = self.instance.clone() else {
            return;
        };
        let shown = self.shown_rank();
        // The engine's count under the release's own formula (#9516 for the default release).
        let formula = inst
            .settings
            .release()
            .map_or(crate::profile::formulas::FormulaId::Pr9516, |r| r.formula);
        let new = inst.engine.iter().find(|e| e.key == formula.key());
        ui.label(match new {
            Some(e) => format!(
                "Tensor parallel over {} GPUs: the engine takes {} blocks on every rank · device memory (dark), framework allocated (blue), GiB",
                inst.tp, e.kv_blocks
            ),
            None => format!("Tensor parallel over {} GPUs", inst.tp),
        });
        let y_max = self
            .rank_lines
            .iter()
            .flat_map(|l| l[0].iter().chain(&l[1]).map(|p| p[1]))
            .fold(0.0f64, f64::max)
            .max(0.1);
        let n = inst.ranks.len().max(1) as f32;
        let gap = ui.spacing().item_spacing.x;
        let width = ((ui.available_width() - gap * (n - 1.0)) / n).max(60.0);
        let plot_h = if ui.ctx().content_rect().height() < 900.0 {
            44.0
        } else {
            70.0
        };
        let dark = ui.visuals().dark_mode;
        let mut clicked = None;
        ui.horizontal_top(|ui| {
            for (k, r) in inst.ranks.iter().enumerate() {
                let binds = new.is_some_and(|e| e.binding_rank == r.rank);
                let blocks = r.formula(formula).map_or(0, |f| f.kv_blocks);
                // Short enough for one line over its multiple; the rest on hover.
                let text = format!(
                    "rank {} ({} blocks){}",
                    r.rank,
                    blocks,
                    if binds { ", sets the budget" } else { "" }
                );
                let hover = format!(
                    "{}: peak {}, NCCL {}, {} {} blocks. {}",
                    r.device.spec,
                    crate::base::units::fmt_u(r.checkpoints.t2.allocated_peak),
                    crate::base::units::fmt_u(r.nccl_bytes()),
                    formula.short(),
                    blocks,
                    if binds {
                        format!("This rank has the fewest KV blocks under {}: the engine takes its count for every rank.", formula.short())
                    } else {
                        "Click to show this rank in the views.".to_string()
                    }
                );
                ui.vertical(|ui| {
                    ui.set_width(width);
                    let rt = egui::RichText::new(text).small();
                    let rt = if binds { rt.strong() } else { rt };
                    if ui
                        .selectable_label(shown == r.rank, rt)
                        .on_hover_text(hover)
                        .clicked()
                    {
                        clicked = Some(r.rank);
                    }
                    let Some(lines) = self.rank_lines.get(k) else {
                        return;
                    };
                    egui_plot::Plot::new(("rank-multiple", k))
                        .height(plot_h)
                        .width(width)
                        .show_axes([false, true])
                        .allow_drag(false)
                        .allow_zoom(false)
                        .allow_scroll(false)
                        .allow_boxed_zoom(false)
                        .include_y(0.0)
                        .include_y(y_max)
                        .show(ui, |pui| {
                            pui.line(
                                egui_plot::Line::new("device memory", lines[0].clone())
                                    .color(super::style::c32(palette::legible(
                                        palette::PROCESS_USED,
                                        dark,
                                    )))
                                    .width(1.5),
                            );
                            pui.line(
                                egui_plot::Line::new("framework allocated", lines[1].clone())
                                    .color(super::style::c32(palette::legible(
                                        palette::ALLOCATED,
                                        dark,
                                    )))
                                    .width(1.5),
                            );
                        });
                });
            }
        });
        if let Some(k) = clicked {
            self.show_rank(k);
        }
    }

    /// Lifetimes, kept tensors and peak owners of the shown report.
    pub fn analysis(&self) -> Option<&Analysis> {
        self.analysis.as_deref()
    }

    /// Pins the shown run for comparison with the next one.
    pub fn pin_current(&mut self) {
        if let (Some(r), Some(a)) = (&self.report, &self.analysis) {
            self.compare.pin(r.clone(), a.clone());
        }
    }

    /// The lifetime view of the profile passes (selection, click positions).
    pub fn lifetime_view(&self) -> &LifetimeView {
        &self.lifetime
    }

    /// The lifetime view of the verify passes.
    pub fn verify_view(&self) -> &LifetimeView {
        &self.verify_view
    }

    /// The memory-lines view (live while a run is in flight).
    pub fn timeline_view(&self) -> &TimelineView {
        &self.timeline
    }

    /// Starts a run with the form's settings (Profile / Ctrl+R).
    pub fn start_profile(&mut self, ctx: &egui::Context) {
        self.drop_startup_run();
        if self.worker.is_some() {
            return;
        }
        self.run_note = None;
        // A vLLM log typed into Model file is read as a log (it is no model file).
        if self.setup.model_kind == super::setup::ModelKind::File {
            let typed = PathBuf::from(self.setup.path.trim());
            if super::vllm_log::is_log_path(&typed) && typed.is_file() {
                self.open_vllm_log(&typed);
                return;
            }
        }
        let req = match self.setup.request() {
            Ok(r) => r,
            Err(e) => {
                self.error(super::in_app_words(&e.to_string()));
                return;
            }
        };
        self.banner = None;
        // Compute mode can take minutes: say how long (and how much host memory) up front.
        if matches!(
            req.device,
            crate::device::DeviceSpec::Sim { dry: false, .. }
        ) {
            if let Ok(e) = crate::profile::host_memory::estimate_request(&req) {
                self.info(e.summary());
            }
        }
        // The previous result stays on screen (and in the comparison) until the new one exists.
        self.live_events = Vec::new();
        self.generation += 1;
        self.progress = RunProgress {
            profile_passes: req.passes,
            quant: Some(req.quant),
            started: Some(Instant::now()),
            ..RunProgress::default()
        };
        let ctx = ctx.clone();
        self.pending_fits = None;
        self.running = Some(req.clone());
        self.worker = Some(Worker::spawn(req, move || ctx.request_repaint()));
    }

    /// Cancel / Esc: the worker stops at its next op and frees everything.
    pub fn cancel(&mut self) {
        if let Some(w) = &self.worker {
            w.cancel();
        }
    }

    fn error(&mut self, text: String) {
        self.banner = Some(Banner {
            kind: BannerKind::Error,
            text,
        });
    }

    fn info(&mut self, text: String) {
        self.banner = Some(Banner {
            kind: BannerKind::Info,
            text,
        });
    }

    fn pump_worker(&mut self) {
        let Some(w) = &mut self.worker else { return };
        for m in w.drain() {
            match m {
                WorkerMsg::Progress(p) => match p {
                    Progress::Phase(ph) => self.progress.phase = Some(ph),
                    Progress::Load { index, count, .. } => {
                        self.progress.load = Some((index, count))
                    }
                    Progress::Pass { pass, of, verify } => {
                        self.progress.pass = Some((pass, of, verify));
                        self.progress.layer = None;
                    }
                    Progress::Layer { layer, of } => self.progress.layer = Some((layer, of)),
                    Progress::Events(mut batch) => self.live_events.append(&mut batch),
                },
                WorkerMsg::Fits(fits) => self.pending_fits = Some(fits),
                WorkerMsg::Finished(outcome) => {
                    self.worker = None;
                    self.startup_run = false;
                    self.live_events = Vec::new();
                    self.generation += 1;
                    match outcome {
                        Ok(report) => {
                            // A typed or pasted model path that worked goes into the recent list.
                            if let crate::model::ModelSource::Path { path } = &report.settings.model
                            {
                                self.setup.set_model_path(path.clone());
                            }
                            let analysis = Arc::new(Analysis::of(&report));
                            self.set_report(Arc::from(report), analysis);
                            self.banner = self.run_note.take().map(|text| Banner {
                                kind: BannerKind::Info,
                                text,
                            });
                        }
                        Err(RunFailure::Cancelled) => {
                            self.info(RunFailure::Cancelled.message());
                        }
                        Err(f) => {
                            // The profiler's message names the CLI's flags; the window's
                            // fields are what the user can change.
                            let msg = super::in_app_words(&f.message());
                            let req = self.running.take();
                            match req.filter(|r| {
                                r.device.is_sim() && super::fits::is_out_of_memory(&msg)
                            }) {
                                // A simulated device: the fits were tried, so the hint is
                                // what a dry run showed to start, not a guess.
                                Some(r) => {
                                    let head = self.does_not_fit_headline(&r);
                                    self.fits = std::mem::take(&mut self.pending_fits);
                                    self.unfit = Some(head.clone());
                                    self.error(format!(
                                        "{head}: {}. {}",
                                        with_bytes(&msg),
                                        fits_sentence(self.fits.as_deref().unwrap_or_default())
                                    ));
                                }
                                None => self.error(with_oom_hint(
                                    &msg,
                                    self.progress.quant.unwrap_or(self.setup.quant),
                                )),
                            }
                        }
                    }
                    self.running = None;
                    break;
                }
            }
        }
    }

    /// Ctrl+S: the same headless report the CLI's `--png` writes (export::png), never a
    /// capture of the window; written off the UI thread.
    pub fn save_png(&mut self) {
        let Some(r) = self.export_report() else {
            self.error("Nothing to save yet: run a profile or open a session first.".into());
            return;
        };
        let path = self.export_file("png");
        if let Err(e) = export::check_writable(&path) {
            self.error(e.to_string());
            return;
        }
        self.spawn_file_job(move || match export::png::write(&r, &path) {
            Ok(()) => FileDone::Saved(format!("Saved the report {}", path.display())),
            Err(e) => FileDone::Failed(e.to_string()),
        });
    }

    pub fn save_csv(&mut self) {
        let Some(r) = self.export_report() else {
            self.error("Nothing to save yet: run a profile or open a session first.".into());
            return;
        };
        let path = self.export_file("csv");
        self.spawn_file_job(move || match export::csv::write(&r, &path) {
            Ok((timeline, summary)) => FileDone::Saved(format!(
                "Saved {} (timeline) and {} (summary)",
                timeline.display(),
                summary.display()
            )),
            Err(e) => FileDone::Failed(e.to_string()),
        });
    }

    pub fn save_session(&mut self) {
        let Some(r) = self.export_report() else {
            self.error("Nothing to save yet: run a profile or open a session first.".into());
            return;
        };
        let path = self.export_file("json");
        self.spawn_file_job(move || match export::json::write(&r, &path) {
            Ok(()) => FileDone::Saved(format!("Saved session {}", path.display())),
            Err(e) => FileDone::Failed(e.to_string()),
        });
    }

    /// Writes the report's trace as a PyTorch memory snapshot (`torch.cuda._memory_viz`).
    pub fn save_torch_snapshot(&mut self) {
        let Some(r) = self.report.clone() else {
            self.error("Nothing to save yet: run a profile or open a session first.".into());
            return;
        };
        let path = self.export_file("pickle");
        self.spawn_file_job(move || match crate::report::snapshot::write(&r, &path) {
            Ok(()) => FileDone::Saved(format!("Saved PyTorch snapshot {}", path.display())),
            Err(e) => FileDone::Failed(e.to_string()),
        });
    }

    /// Reopens a saved session, or opens a PyTorch memory snapshot (`.pickle`), without
    /// running anything.
    pub fn open_session(&mut self, path: &Path) {
        self.drop_startup_run();
        if self.worker.is_some() {
            self.error("A run is in progress: cancel it before opening a session.".into());
            return;
        }
        let path = path.to_path_buf();
        self.spawn_file_job(move || {
            // The analysis of a million events takes a moment: made here, not on the UI thread.
            let read = if crate::report::snapshot::is_snapshot_path(&path) {
                crate::report::snapshot::read(&path, None).and_then(|mut imported| {
                    let d = imported
                        .take_device(None)
                        .ok_or_else(|| crate::Error::Snapshot {
                            path: path.clone(),
                            problem: "the snapshot holds no segments and no trace entries".into(),
                        })?;
                    Ok(d.into_report(&path, None))
                })
            } else {
                export::json::read(&path)
            }
            .map(|r| {
                let a = Analysis::of(&r);
                Box::new((r, a))
            });
            FileDone::Opened(path, read)
        });
    }

    fn export_file(&self, ext: &str) -> PathBuf {
        let stem = self.export_path.trim();
        let stem = if stem.is_empty() {
            "vramscope-report"
        } else {
            stem
        };
        let p = PathBuf::from(stem);
        if p.extension().is_some_and(|e| e.eq_ignore_ascii_case(ext)) {
            p
        } else {
            let mut s = p.into_os_string();
            s.push(format!(".{ext}"));
            PathBuf::from(s)
        }
    }

    /// A dropped or picked file: a session (.json) opens; anything else becomes the model.
    pub fn use_file(&mut self, path: PathBuf) {
        let session = path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("json"))
            && path.file_name().is_some_and(|n| n != "config.json");
        if session || crate::report::snapshot::is_snapshot_path(&path) {
            self.open_session(&path);
        } else {
            self.setup.set_model_path(path);
        }
    }

    /// Reads a vLLM startup log off the UI thread, then takes its settings and runs them; the
    /// "vLLM log" tab shows vLLM's numbers beside the run's. A log that cannot be read says
    /// why in the banner, and the settings stay as they were.
    pub fn open_vllm_log(&mut self, path: &std::path::Path) {
        let path = path.to_path_buf();
        self.spawn_file_job(move || FileDone::VllmLog(super::vllm_log::load(&path).map(Box::new)));
    }

    fn pick_model_file(&mut self) {
        let t = Instant::now();
        let picked = rfd::FileDialog::new()
            .set_title("Open a model")
            .add_filter(
                "Model (safetensors, config.json, GGUF)",
                &["safetensors", "json", "gguf"],
            )
            .add_filter("All files", &["*"])
            .pick_file();
        match picked {
            Some(p) => {
                self.setup.dialog_note = None;
                self.setup.set_model_path(p);
            }
            None if t.elapsed() < NO_DIALOG_WITHIN => {
                self.setup.dialog_note = Some(
                    "No file dialog is available here (no desktop portal or zenity): type or paste the path above, or drop the file on the window."
                        .into(),
                );
            }
            None => {}
        }
    }

    fn pick_log_file(&mut self) {
        let t = Instant::now();
        let picked = rfd::FileDialog::new()
            .set_title("Open a vLLM startup log")
            .add_filter("vLLM log", &["log", "txt", "out", "err"])
            .add_filter("All files", &["*"])
            .pick_file();
        match picked {
            Some(p) => self.open_vllm_log(&p),
            None if t.elapsed() < NO_DIALOG_WITHIN => {
                self.error(
                    "No file dialog is available here (no desktop portal or zenity): type the log's path into Model file (File) and click Profile, or drop the log on the window."
                        .into(),
                );
            }
            None => {}
        }
    }

    /// "Use line": the pasted `vllm serve …` line read as `vramscope plan` reads it (the
    /// device and release from the form), taken into the setup and profiled; what the line
    /// sets that vramscope does not model is said in the banner.
    pub fn use_serve_line(&mut self, ctx: &egui::Context) {
        let read =
            crate::profile::vllm_args::split_words(&self.setup.serve_line).and_then(|line| {
                let mut words = self.setup.plan_options();
                words.push("--".into());
                words.extend(line);
                crate::app::cli::plan_profile_args(&crate::app::cli::PlanArgs { words })
                    .and_then(|(args, notes)| Ok((args.request()?, notes)))
            });
        match read {
            Ok((req, notes)) => {
                self.setup.apply(&req);
                self.start_profile(ctx);
                // The notes of what the line set that is not modelled (plan's own words, not
                // the release note: the release is the form's).
                let notes: Vec<String> = notes
                    .into_iter()
                    .filter(|n| !n.contains("vramscope's default release"))
                    .collect();
                if !notes.is_empty() && self.worker.is_some() {
                    self.run_note = Some(format!("From the vllm serve line: {}", notes.join("; ")));
                }
            }
            Err(e) => self.error(e.to_string()),
        }
    }

    fn pick_session_file(&mut self) {
        let t = Instant::now();
        let picked = rfd::FileDialog::new()
            .set_title("Open a session or a PyTorch memory snapshot")
            .add_filter("vramscope session", &["json"])
            .add_filter("PyTorch memory snapshot", &["pickle", "pkl"])
            .pick_file();
        match picked {
            Some(p) => self.open_session(&p),
            None if t.elapsed() < NO_DIALOG_WITHIN => {
                // No dialog backend: fall back to the export path field (a snapshot's path
                // as typed, or the session beside the export stem).
                let typed = PathBuf::from(self.export_path.trim());
                let p = if crate::report::snapshot::is_snapshot_path(&typed) {
                    typed
                } else {
                    self.export_file("json")
                };
                if p.is_file() {
                    self.open_session(&p);
                } else {
                    self.error(format!(
                        "No file dialog is available here; type the session's (or the .pickle snapshot's) path into \"Export to\" (tried {}).",
                        p.display()
                    ));
                }
            }
            None => {}
        }
    }

    fn handle_input(&mut self, ctx: &egui::Context) {
        let (profile, save, esc, dropped) = ctx.input_mut(|i| {
            (
                i.consume_shortcut(&PROFILE_KEY),
                i.consume_shortcut(&SAVE_PNG_KEY),
                i.consume_key(Modifiers::NONE, Key::Escape),
                std::mem::take(&mut i.raw.dropped_files),
            )
        });
        if profile {
            self.start_profile(ctx);
        }
        if esc {
            self.cancel();
        }
        if save {
            self.save_png();
        }
        if let Some(p) = dropped.first().map(|f| f.path().to_path_buf()) {
            if super::vllm_log::is_log_path(&p) {
                self.open_vllm_log(&p);
            } else {
                self.use_file(p);
            }
        }
    }

    fn pump_screenshots(&mut self, ctx: &egui::Context) {
        while let Ok((path, img)) = self.shot_rx.try_recv() {
            let done = write_png(&path, &img);
            let closing = self
                .screenshot
                .as_ref()
                .is_some_and(|s| s.requested && s.path == path);
            match done {
                Ok(()) => self.info(format!("Saved the window as {}", path.display())),
                Err(e) => {
                    if closing {
                        *self.exit_error.lock().expect("exit error lock") = Some(e.clone());
                    }
                    self.error(e);
                }
            }
            if closing {
                ctx.send_viewport_cmd(egui::ViewportCommand::Close);
            }
        }
    }

    fn drive_screenshot_job(&mut self, ctx: &egui::Context) {
        let Some(job) = &mut self.screenshot else {
            return;
        };
        if !job.started {
            job.started = true;
            self.start_profile(ctx);
            return;
        }
        if self.worker.is_some() || job.requested {
            return;
        }
        if self.report.is_none() {
            let why = self
                .banner
                .as_ref()
                .map_or("the run produced no report".to_string(), |b| b.text.clone());
            *self.exit_error.lock().expect("exit error lock") = Some(why);
            ctx.send_viewport_cmd(egui::ViewportCommand::Close);
            return;
        }
        // Let the plots lay out with the report for a few frames before capturing.
        job.frames_after_report += 1;
        if job.frames_after_report >= 4 {
            job.requested = true;
            request_window_png(ctx, job.path.clone(), self.shot_tx.clone());
        }
        ctx.request_repaint();
    }

    fn toolbar(&mut self, ui: &mut egui::Ui) {
        let ctx = ui.ctx().clone();
        ui.horizontal(|ui| {
            ui.label(RichText::new("vramscope").heading().strong());
            ui.separator();
            let running = self.worker.is_some();
            let profile = ui
                .add_enabled(
                    !running || self.startup_run,
                    egui::Button::new(RichText::new("Profile").strong())
                        .min_size(egui::vec2(110.0, 30.0)),
                )
                .on_hover_text("Ctrl+R");
            if profile.clicked() {
                self.start_profile(&ctx);
            }
            if ui
                .add_enabled(
                    running,
                    egui::Button::new("Cancel").min_size(egui::vec2(80.0, 30.0)),
                )
                .on_hover_text("Esc")
                .clicked()
            {
                self.cancel();
            }
            if running {
                let secs = self
                    .progress
                    .started
                    .map_or(0.0, |s| s.elapsed().as_secs_f32());
                let eta = self
                    .progress
                    .eta_s()
                    .map_or(String::new(), |s| format!(" · ~{s:.0} s left"));
                ui.add(
                    egui::ProgressBar::new(self.progress.fraction())
                        .text(format!("{} · {:.1} s{eta}", self.progress.text(), secs))
                        .desired_width(460.0)
                        .animate(true),
                );
            } else if let Some(r) = &self.report {
                ui.label(format!(
                    "{} events · {:.2} s{}",
                    r.event_count,
                    r.wall_time_s,
                    if r.device.simulated {
                        " · simulated device"
                    } else {
                        ""
                    }
                ));
            }
            ui.with_layout(egui::Layout::right_to_left(egui::Align::Center), |ui| {
                theme_buttons(ui);
                ui.separator();
                if ui
                    .toggle_value(&mut self.presentation, "Present")
                    .on_hover_text("Presentation mode: larger text, setup hidden")
                    .changed()
                {
                    super::style::set_presentation(ui.ctx(), self.presentation);
                    self.show_setup = !self.presentation;
                }
                ui.toggle_value(&mut self.show_setup, "Setup")
                    .on_hover_text("Show or hide the setup panel");
            });
        });
    }

    /// The banner's strip: an opaque fill, Dismiss at the right, the text wrapping in the
    /// room left of it (so Dismiss never covers a word).
    fn banner_ui(&mut self, ui: &mut egui::Ui) {
        let Some(b) = &self.banner else { return };
        let (fill, text_colour) = match b.kind {
            BannerKind::Error => (Color32::from_rgb(160, 30, 30), Color32::WHITE),
            BannerKind::Info => (
                ui.visuals().extreme_bg_color,
                ui.visuals().strong_text_color(),
            ),
        };
        let prefix = if b.kind == BannerKind::Error {
            "Error: "
        } else {
            ""
        };
        let text = RichText::new(format!("{prefix}{}", b.text))
            .color(text_colour)
            .strong();
        let mut close = false;
        egui::Frame::new()
            .fill(fill)
            .stroke(ui.visuals().widgets.noninteractive.bg_stroke)
            .inner_margin(egui::Margin::symmetric(10, 6))
            .show(ui, |ui| {
                ui.set_width(ui.available_width());
                ui.horizontal_top(|ui| {
                    let dismiss = egui::Button::new("Dismiss");
                    let dismiss_w = ui.fonts_mut(|f| {
                        f.layout_no_wrap(
                            "Dismiss".into(),
                            egui::TextStyle::Button.resolve(ui.style()),
                            Color32::WHITE,
                        )
                        .size()
                        .x
                    }) + 2.0 * ui.spacing().button_padding.x;
                    let text_w =
                        (ui.available_width() - dismiss_w - 2.0 * ui.spacing().item_spacing.x)
                            .max(100.0);
                    ui.allocate_ui_with_layout(
                        egui::vec2(text_w, 0.0),
                        egui::Layout::top_down(egui::Align::Min),
                        |ui| {
                            ui.set_width(text_w);
                            ui.add(egui::Label::new(text).wrap());
                        },
                    );
                    if ui.add(dismiss).clicked() {
                        close = true;
                    }
                });
            });
        if close {
            self.banner = None;
        }
    }

    fn export_ui(&mut self, ui: &mut egui::Ui) {
        ui.heading("Export");
        let label = ui.label("Export to (path; extension added)");
        ui.add(egui::TextEdit::singleline(&mut self.export_path).desired_width(f32::INFINITY))
            .labelled_by(label.id);
        let has = self.report.is_some();
        ui.horizontal_wrapped(|ui| {
            if ui
                .add_enabled(has, egui::Button::new("Save PNG report"))
                .on_hover_text("The CLI's report image (Ctrl+S)")
                .clicked()
            {
                self.save_png();
            }
            if ui.add_enabled(has, egui::Button::new("Save CSV")).clicked() {
                self.save_csv();
            }
            if ui
                .add_enabled(has, egui::Button::new("Save session"))
                .clicked()
            {
                self.save_session();
            }
            if ui
                .add_enabled(has, egui::Button::new("Save as PyTorch snapshot"))
                .on_hover_text("A .pickle for torch.cuda._memory_viz and pytorch.org/memory_viz")
                .clicked()
            {
                self.save_torch_snapshot();
            }
            if ui.button("Open session…").clicked() {
                self.pick_session_file();
            }
        });
    }
}

impl eframe::App for VramscopeApp {
    fn ui(&mut self, ui: &mut egui::Ui, _frame: &mut eframe::Frame) {
        let ctx = ui.ctx().clone();
        self.pump_worker();
        self.pump_file_jobs();
        if std::mem::take(&mut self.run_requested) {
            self.start_profile(&ctx);
        }
        self.pump_screenshots(&ctx);
        self.handle_input(&ctx);
        self.drive_screenshot_job(&ctx);
        if self.worker.is_some() || self.files_pending > 0 {
            // Progress messages wake the UI too; this keeps the elapsed time ticking and
            // picks up finished file jobs.
            ctx.request_repaint_after(Duration::from_millis(100));
        }

        egui::Panel::top("toolbar").show(ui, |ui| {
            ui.add_space(4.0);
            self.toolbar(ui);
            ui.add_space(4.0);
        });
        if self.instance.is_some() {
            egui::Panel::top("ranks").show(ui, |ui| {
                ui.add_space(2.0);
                self.ranks_ui(ui);
                ui.add_space(2.0);
            });
        }
        let window_w = ctx.content_rect().width();
        let mut show_setup = self.show_setup;
        egui::Panel::left("setup")
            .resizable(true)
            // Wide windows have room for the settings grid; narrow ones stack each setting
            // under its name (setup.rs), so at 1280x720 the plot keeps its room.
            .default_size(if window_w < 1500.0 { 250.0 } else { 370.0 })
            .min_size(220.0)
            .max_size(if window_w < 1500.0 { 280.0 } else { 420.0 })
            .show_collapsible(ui, &mut show_setup, |ui| {
                egui::ScrollArea::vertical()
                    .auto_shrink([false, false])
                    .show(ui, |ui| {
                        match self.setup.ui(ui, &self.devices, self.no_gpu.as_deref()) {
                            SetupAction::None => {}
                            SetupAction::OpenModel => self.pick_model_file(),
                            SetupAction::OpenLog => self.pick_log_file(),
                            SetupAction::UseServeLine => self.use_serve_line(&ctx),
                        }
                        ui.add_space(8.0);
                        ui.separator();
                        self.export_ui(ui);
                    });
            });
        self.show_setup = show_setup;
        egui::Panel::right("comparison")
            .resizable(true)
            .default_size(
                (window_w * if window_w < 1500.0 { 0.3 } else { 0.36 }).clamp(340.0, 660.0),
            )
            .min_size(320.0)
            .show(ui, |ui| {
                ui.horizontal_wrapped(|ui| {
                    ui.selectable_value(&mut self.side_tab, SideTab::Budget, "Budget");
                    ui.selectable_value(&mut self.side_tab, SideTab::Waterfall, "Where it goes");
                    ui.selectable_value(&mut self.side_tab, SideTab::Peak, "Peak owners");
                    ui.selectable_value(&mut self.side_tab, SideTab::Compare, "Compare");
                    ui.selectable_value(&mut self.side_tab, SideTab::VllmLog, "vLLM log");
                });
                ui.separator();
                // Both ways: a wide table scrolls inside the panel instead of widening it for
                // good (and taking the room of the band details).
                egui::ScrollArea::both()
                    .auto_shrink([false, false])
                    .show(ui, |ui| {
                        let shown = self.report.as_ref().zip(self.analysis.as_ref());
                        match (self.side_tab, shown) {
                            (SideTab::VllmLog, _) => {
                                super::vllm_log::ui(ui, self.vllm_log.as_ref())
                            }
                            (SideTab::Budget, _) | (_, None)
                                if self.side_tab != SideTab::Compare =>
                            {
                                if let Some(r) = self.comparison.ui(
                                    ui,
                                    self.report.as_deref(),
                                    self.fits.as_deref(),
                                    self.unfit.as_deref(),
                                ) {
                                    self.setup.apply(&r);
                                    self.run_requested = true;
                                }
                            }
                            (SideTab::Waterfall, Some((r, a))) => comparison::waterfall(ui, r, a),
                            (SideTab::Peak, Some((_, a))) => comparison::peak_owners(ui, a),
                            _ => self.compare.ui(ui, shown),
                        }
                    });
            });
        // The banner is a strip of its own at the top of the middle (added after the side
        // panels, it spans the middle only): it covers no control whatever its length, and
        // the setup and the budget never move for it; the plot below gives up the height.
        if self.banner.is_some() {
            egui::Panel::top("banner")
                .frame(egui::Frame::new())
                .show(ui, |ui| self.banner_ui(ui));
        }
        egui::CentralPanel::default_margins().show(ui, |ui| {
            let running = self.worker.is_some();
            let shown = match (&self.report, &self.analysis) {
                (Some(r), Some(a)) if !running => Some((r.clone(), a.clone())),
                _ => None,
            };
            if let Some((r, a)) = &shown {
                ui.horizontal(|ui| {
                    ui.selectable_value(&mut self.tab, CentralTab::Lifetimes, "Lifetimes");
                    ui.selectable_value(&mut self.tab, CentralTab::Lines, "Memory lines");
                    ui.selectable_value(&mut self.tab, CentralTab::Verify, "Verify passes");
                });
                match self.tab {
                    CentralTab::Lifetimes => {
                        self.lifetime.ui(ui, r, a, self.generation);
                        if std::mem::take(&mut self.lifetime.wants_three_passes) {
                            self.setup.passes = 3;
                            self.start_profile(&ctx);
                        }
                    }
                    CentralTab::Verify => self.verify_view.ui(ui, r, a, self.generation),
                    CentralTab::Lines => {
                        let input = TimelineInput {
                            events: &r.events,
                            generation: self.generation,
                            report: Some(r),
                        };
                        self.timeline.ui(ui, &input);
                    }
                }
            } else {
                // While a run is in flight: its live totals (and the GPU's NVML line).
                let input = TimelineInput {
                    events: &self.live_events,
                    generation: self.generation,
                    report: None,
                };
                self.timeline.ui(ui, &input);
            }
        });
    }

    fn save(&mut self, storage: &mut dyn eframe::Storage) {
        if self.screenshot.is_some() {
            return;
        }
        if let Ok(s) = serde_json::to_string(&self.setup) {
            storage.set_string(SETUP_KEY, s);
        }
        storage.set_string(EXPORT_KEY, self.export_path.clone());
    }
}

/// Light / dark / follow-the-system, as words (the icon glyphs are not in every font).
fn theme_buttons(ui: &mut egui::Ui) {
    use egui::ThemePreference as T;
    let mut pref = ui.ctx().options(|o| o.theme_preference);
    let before = pref;
    // Right-to-left layout: added in reverse reading order.
    ui.selectable_value(&mut pref, T::Dark, "Dark");
    ui.selectable_value(&mut pref, T::Light, "Light");
    ui.selectable_value(&mut pref, T::System, "System");
    if pref != before {
        ui.ctx().set_theme(pref);
    }
}

/// Asks the renderer for the window's pixels; they arrive on `tx` after the next paint.
fn request_window_png(ctx: &egui::Context, path: PathBuf, tx: Sender<Shot>) {
    let wake = ctx.clone();
    ctx.request_screenshot(move |img| {
        let _ = tx.send((path, img));
        wake.request_repaint();
    });
    ctx.request_repaint();
}

/// Writes a window screenshot as PNG, atomically.
pub fn write_png(path: &Path, img: &egui::ColorImage) -> Result<(), String> {
    let [w, h] = img.size;
    let rgba: Vec<u8> = img
        .pixels
        .iter()
        .flat_map(|c| c.to_srgba_unmultiplied())
        .collect();
    let mut bytes = Vec::new();
    image::RgbaImage::from_raw(w as u32, h as u32, rgba)
        .ok_or_else(|| format!("{}: screenshot has a bad size {w}x{h}", path.display()))?
        .write_to(
            &mut std::io::Cursor::new(&mut bytes),
            image::ImageFormat::Png,
        )
        .map_err(|e| format!("{}: encoding PNG: {e}", path.display()))?;
    export::atomic_write(path, &bytes).map_err(|e| e.to_string())
}

/// What was tried after a run that did not fit, in one sentence: the fits each dry run
/// showed to start, or that none did.
fn fits_sentence(fits: &[super::fits::Fit]) -> String {
    if fits.is_empty() {
        return "Nothing tried fits (smaller weights, up to 8 GPUs of tensor parallel, each run dry).".into();
    }
    format!(
        "What fits, each checked by a dry run: {}.",
        fits.iter()
            .map(|f| format!("{} ({})", f.change, f.answer))
            .collect::<Vec<_>>()
            .join("; ")
    )
}

impl VramscopeApp {
    /// "Does not fit: llama-3-70b in fp16 on one NVIDIA GeForce RTX 4090 (simulated)".
    fn does_not_fit_headline(&self, r: &crate::profile::ProfileRequest) -> String {
        let model = match &r.model {
            crate::model::ModelSource::Preset { name } => name.clone(),
            crate::model::ModelSource::Path { path } => path
                .file_name()
                .map_or(path.display().to_string(), |n| n.to_string_lossy().into()),
            other => format!("{other:?}"),
        };
        let spec = r.device.to_string();
        let spec = spec.trim_end_matches(":dry").trim_end_matches(":compute");
        let device = self
            .devices
            .iter()
            .find(|d| d.spec == spec)
            .map_or(spec.to_string(), |d| d.name.clone());
        let gpus = match r.tp * r.pp {
            1 => "one".to_string(),
            n => format!("{n} ×"),
        };
        format!(
            "Does not fit: {model} in {} on {gpus} {device}",
            r.quant.label()
        )
    }
}

/// An out-of-memory message in GiB/MiB instead of raw byte counts (any "N bytes" or "N byte"
/// a device or allocator wrote), with what would help this run: a smaller quantization only
/// where there is one (fp16/bf16 → int8 or nf4, int8 → nf4), else fewer tokens or sequences,
/// tensor parallel or a larger device.
pub fn with_oom_hint(msg: &str, quant: crate::quant::Quant) -> String {
    use crate::quant::Quant;
    let s = with_bytes(msg);
    if !msg.contains("out of memory") {
        return s;
    }
    let mut s = s;
    let smaller = match quant {
        Quant::F16 | Quant::BF16 => "int8 or nf4 weights, ",
        Quant::Int8 => "nf4 weights (half of int8's), ",
        _ => "",
    };
    s.push_str(&format!(
        " — try {smaller}fewer tokens or sequences, tensor parallel over more GPUs, or a larger device."
    ));
    s
}

/// A device's or allocator's message in GiB/MiB instead of raw byte counts.
fn with_bytes(msg: &str) -> String {
    let mut out = String::with_capacity(msg.len());
    let mut rest = msg;
    while let Some(p) = rest.find(" byte") {
        let head = &rest[..p];
        let start = head
            .rfind(|c: char| !c.is_ascii_digit())
            .map_or(0, |i| i + 1);
        let after = &rest[p + " byte".len()..];
        let plural = after.starts_with('s');
        let tail = if plural { &after[1..] } else { after };
        match head[start..].parse::<u64>() {
            Ok(n) if start < head.len() => {
                out.push_str(&head[..start]);
                out.push_str(&crate::base::units::fmt_u(n));
            }
            _ => {
                out.push_str(head);
                out.push_str(if plural { " bytes" } else { " byte" });
            }
        }
        rest = tail;
    }
    out.push_str(rest);
    if !msg.contains("out of memory") {
        return out;
    }
    // "of which 81627865088 are allocated": in an out-of-memory message a long bare count
    // is bytes too.
    let mut s = String::with_capacity(out.len());
    for (i, word) in out.split(' ').enumerate() {
        if i > 0 {
            s.push(' ');
        }
        match word.parse::<u64>() {
            Ok(n) if word.len() >= 5 => s.push_str(&crate::base::units::fmt_u(n)),
            _ => s.push_str(word),
        }
    }
    s
}

/// A rank's profile (t0..t3) as two reduced lines, each bucket keeping its highest value:
/// this process's device memory and framework allocated, in GiB over event order.
fn rank_lines(r: &Report) -> [Vec<[f64; 2]>; 2] {
    let events = r.profile_events();
    let step = events.len().div_ceil(400).max(1);
    let gib = |b: u64| b as f64 / crate::base::units::GIB as f64;
    let mut out = [Vec::new(), Vec::new()];
    for (i, chunk) in events.chunks(step).enumerate() {
        let x = (i * step) as f64;
        out[0].push([
            x,
            gib(chunk.iter().map(|e| e.process_used).max().unwrap_or(0)),
        ]);
        out[1].push([x, gib(chunk.iter().map(|e| e.allocated).max().unwrap_or(0))]);
    }
    out
}
