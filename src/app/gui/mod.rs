//! The desktop app (eframe/egui, glow renderer): setup on the left, the live timeline in the
//! middle, old-vs-new comparison on the right. Profiling runs on a worker thread.

mod app;
pub mod axis;
mod compare;
mod comparison;
mod fit_table;
mod fits;
mod lifetime;
mod plot;
mod setup;
mod style;
mod timeline;
mod vllm_log;
mod words;
mod worker;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

pub use app::{Banner, BannerKind, CentralTab, VramscopeApp};
pub use compare::{delta_rows, DeltaRow};
pub use comparison::verify_cell;
pub use fits::Fit;
pub use lifetime::{LifetimeView, Part};
pub use setup::{device_name, ModelKind, SetupForm};
pub use timeline::{TimelineInput, TimelineView};
pub use words::in_app_words;

use crate::base::error::{Error, Result};

/// Opens the window. With `screenshot`, profiles the default preset, saves the window as that
/// PNG once the run is done, and returns (an error if the run or the save failed).
pub fn run_app(screenshot: Option<PathBuf>) -> Result<()> {
    if let Some(p) = &screenshot {
        crate::report::export::check_writable(p)?;
    }
    let mut viewport = egui::ViewportBuilder::default()
        .with_title("vramscope")
        .with_app_id("vramscope")
        .with_inner_size([1600.0, 1000.0])
        .with_min_inner_size([960.0, 600.0])
        .with_drag_and_drop(true);
    if let Some(icon) = icon() {
        viewport = viewport.with_icon(icon);
    }
    let options = eframe::NativeOptions {
        viewport,
        renderer: eframe::Renderer::Glow,
        ..Default::default()
    };
    let exit_error = Arc::new(Mutex::new(None));
    let app_error = exit_error.clone();
    eframe::run_native(
        "vramscope",
        options,
        Box::new(move |cc| {
            Ok(Box::new(match screenshot {
                None => VramscopeApp::launched(cc),
                Some(_) => VramscopeApp::with_screenshot(cc, screenshot, app_error),
            }))
        }),
    )
    .map_err(|e| Error::Device {
        spec: "window".into(),
        problem: format!(
            "cannot open the app window ({e}); without a display, use a subcommand such as `vramscope profile`"
        ),
    })?;
    let failed = exit_error.lock().map(|g| g.clone()).unwrap_or(None);
    match failed {
        Some(why) => Err(Error::Export {
            path: "--screenshot".into(),
            problem: why,
        }),
        None => Ok(()),
    }
}

fn icon() -> Option<egui::IconData> {
    let img = image::load_from_memory(include_bytes!("../../../assets/icon.png")).ok()?;
    let rgba = img.to_rgba8();
    Some(egui::IconData {
        width: rgba.width(),
        height: rgba.height(),
        rgba: rgba.into_raw(),
    })
}
