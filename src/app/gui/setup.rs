//! The setup panel: what to profile (model, quantization, device, batch, vLLM settings) as
//! plain form state, turned into a `ProfileRequest` when the user clicks Profile.

use std::path::PathBuf;

use egui::RichText;
use serde::{Deserialize, Serialize};

use crate::base::error::{Error, Result};
use crate::base::units::{fmt_u, parse_bytes};
use crate::device::nccl_model::Topology;
use crate::device::{DeviceListing, DeviceSpec};
use crate::model::presets::PRESET_NAMES;
use crate::model::ModelSource;
use crate::profile::request::KvCacheDtype;
use crate::profile::ProfileRequest;
use crate::quant::Quant;

/// How many recent model files are remembered.
const RECENT_MAX: usize = 8;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ModelKind {
    Preset,
    File,
}

/// The form, persisted between sessions (eframe storage) except for the device list.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default)]
pub struct SetupForm {
    pub model_kind: ModelKind,
    pub preset: String,
    /// Path to a model folder, config.json or .safetensors (also accepts preset:/synthetic:).
    pub path: String,
    pub recent: Vec<PathBuf>,
    pub quant: Quant,
    pub int8_threshold: f32,
    /// `sim:PRESET` or `cuda:N`.
    pub device: String,
    /// Simulated devices: shapes only (fast, any size) instead of real math on the CPU.
    pub dry: bool,
    /// Simulated devices: the total to report instead of the preset's (what
    /// `torch.cuda.mem_get_info()` says on the user's GPU); empty: the preset's.
    pub custom_total: String,
    /// vLLM's --kv-cache-dtype.
    pub kv_cache_dtype: KvCacheDtype,
    /// Simulated tensor parallel: how the GPUs reach each other (`--topology`); `None`: the
    /// preset's.
    #[serde(default)]
    pub topology: Option<Topology>,
    /// vLLM's max_num_batched_tokens; 0: vLLM's default.
    pub tokens: usize,
    /// vLLM's max_num_seqs; 0: vLLM's default (by release, and under V1 by GPU), resolved
    /// when the run starts as the CLI resolves a flag left out.
    pub seqs: usize,
    pub passes: u32,
    /// Tensor-parallel GPUs (vLLM's --tensor-parallel-size).
    pub tp: u32,
    /// Pipeline stages (vLLM's --pipeline-parallel-size).
    #[serde(default = "one_stage")]
    pub pp: u32,
    /// The vLLM release to reproduce (`--vllm`).
    #[serde(default = "default_vllm")]
    pub vllm: String,
    pub util: f64,
    pub block_size: u64,
    /// vLLM's max_model_len; 0: the model's max_position_embeddings.
    pub max_model_len: u64,
    /// vLLM's sampler step in the profile pass.
    #[serde(default = "yes")]
    pub sampler: bool,
    pub outside_before: String,
    pub outside_during: String,
    pub outside_during_freed: bool,
    pub verify: bool,
    /// Search the largest KV cache that really serves (the CLI's `--true-max`; one GPU).
    #[serde(default)]
    pub true_max: bool,
    /// vLLM's `--enforce-eager`: no CUDA graphs (a V1 release captures them otherwise).
    #[serde(default)]
    pub enforce_eager: bool,
    /// vLLM's `--enable-chunked-prefill`; `None`: the release's rule (V1 chunks unless off).
    #[serde(default)]
    pub chunked_prefill: Option<bool>,
    /// vLLM's `--enable-prefix-caching` / `--no-enable-prefix-caching` from a pasted line;
    /// `None`: the release's default (only a hybrid model's memory follows it).
    #[serde(default)]
    pub prefix_caching: Option<bool>,
    /// vLLM's `--kv-cache-memory` (V1): the KV cache's size per GPU, given; empty: vLLM
    /// profiles it.
    #[serde(default)]
    pub kv_cache_memory: String,
    /// A pasted `vllm serve …` line, read with the CLI's `plan` parser on "Use line".
    #[serde(skip)]
    pub serve_line: String,
    pub seed: u64,
    /// Set when the last "Open…" showed no dialog.
    #[serde(skip)]
    pub dialog_note: Option<String>,
}

fn yes() -> bool {
    true
}

fn one_stage() -> u32 {
    1
}

fn default_vllm() -> String {
    crate::profile::vllm::DEFAULT.into()
}

/// A number with a "vLLM default" box: checked stores 0 (resolved when the run starts).
fn defaulted<T>(ui: &mut egui::Ui, value: &mut T, fallback: T, range: std::ops::RangeInclusive<T>)
where
    T: egui::emath::Numeric + Default + PartialEq,
{
    let mut auto = *value == T::default();
    ui.horizontal(|ui| {
        if ui.checkbox(&mut auto, "vLLM default").changed() {
            *value = if auto { T::default() } else { fallback };
        }
        if !auto {
            ui.add(egui::DragValue::new(value).range(range));
        }
    });
}

/// A popup list's rows packed close (the app's roomy button padding would push the last
/// presets below the popup's reach at 1280x720).
fn compact_list(ui: &mut egui::Ui) {
    ui.spacing_mut().item_spacing.y = 0.0;
    ui.spacing_mut().button_padding.y = 2.0;
}

/// A popup's height: the window's, so every entry shows without a scroll where it fits.
fn popup_height(ui: &egui::Ui) -> f32 {
    ui.ctx().content_rect().height()
}

impl Default for SetupForm {
    fn default() -> Self {
        let r = ProfileRequest::default();
        SetupForm {
            model_kind: ModelKind::Preset,
            preset: "llama-3-8b".into(),
            path: String::new(),
            recent: Vec::new(),
            // First launch shows the int8 story: CxB state kept across passes, counted twice
            // by #9352.
            quant: Quant::Int8,
            int8_threshold: r.int8_threshold,
            // The H100 as vLLM sees it: cudaMemGetInfo's total (79.22 GiB in vLLM's own log),
            // not nvidia-smi's 79.65 GiB, which `sim:h100-80gb` keeps simulating.
            device: "sim:h100-sxm".into(),
            dry: true,
            custom_total: String::new(),
            kv_cache_dtype: r.kv_cache_dtype,
            topology: None,
            tokens: r.tokens,
            // vLLM's default, as the CLI leaves it when --max-num-seqs is not given.
            seqs: 0,
            passes: r.passes,
            tp: r.tp,
            pp: r.pp,
            vllm: r.vllm.clone(),
            util: r.util,
            block_size: r.block_size,
            max_model_len: r.max_model_len,
            sampler: r.sampler,
            outside_before: "0".into(),
            outside_during: "0".into(),
            outside_during_freed: r.outside_during_freed,
            verify: r.verify,
            true_max: false,
            enforce_eager: r.enforce_eager,
            chunked_prefill: r.chunked_prefill,
            prefix_caching: r.prefix_caching,
            kv_cache_memory: String::new(),
            serve_line: String::new(),
            seed: r.seed,
            dialog_note: None,
        }
    }
}

impl SetupForm {
    /// The request these settings describe, or the first setting that cannot work.
    pub fn request(&self) -> Result<ProfileRequest> {
        let model = match self.model_kind {
            ModelKind::Preset => ModelSource::parse(&format!("preset:{}", self.preset))?,
            ModelKind::File => {
                let p = self.path.trim();
                if p.is_empty() {
                    return Err(Error::Request(
                        "no model file: type a path, use Open…, or drop a file on the window"
                            .into(),
                    ));
                }
                ModelSource::parse(p)?
            }
        };
        let mut device = DeviceSpec::parse(&self.device)?;
        if let DeviceSpec::Sim { dry, .. } = &mut device {
            *dry = self.dry;
        }
        let size = |what: &str, s: &str| {
            parse_bytes(s).map_err(|e| Error::Request(format!("{what}: {e}")))
        };
        let custom_total = self.custom_total.trim();
        if device.is_sim() && !custom_total.is_empty() {
            device = device.with_total(Some(size("total", custom_total)?))?;
        }
        if device.is_sim() {
            device = device.with_topology(self.topology)?;
        }
        let r = ProfileRequest {
            model,
            quant: self.quant,
            device,
            tokens: self.tokens,
            seqs: self.seqs,
            passes: self.passes,
            tp: self.tp,
            pp: self.pp,
            // Expert and data parallel, hosts: the command line's (`--ep`, `--dp`, `--nodes`).
            enable_expert_parallel: false,
            dp: 1,
            nodes: 1,
            network: Default::default(),
            pp_layer_partition: None,
            vllm: self.vllm.clone(),
            chunked_prefill: self.chunked_prefill,
            // One GPU's search: greyed out (and off) with more.
            true_max: self.true_max && self.tp * self.pp == 1,
            enforce_eager: self.enforce_eager,
            prefix_caching: self.prefix_caching,
            util: self.util,
            block_size: self.block_size,
            max_model_len: self.max_model_len,
            sampler: self.sampler,
            int8_threshold: self.int8_threshold,
            outside_before: size("outside before", &self.outside_before)?,
            outside_during: size("outside during", &self.outside_during)?,
            outside_during_freed: self.outside_during_freed,
            verify: self.verify,
            seed: self.seed,
            kv_cache_dtype: self.kv_cache_dtype,
            kv_cache_memory: match self.kv_cache_memory.trim() {
                "" => None,
                given => Some(size("kv_cache_memory", given)?),
            },
            llm_class: false,
            limit_mm_images: None,
            limit_mm_videos: None,
            mm_processor_kwargs: None,
        };
        r.validate()?;
        Ok(r)
    }

    /// Takes a request's settings (a vLLM log's): model, quantization, device and total,
    /// and vLLM's settings.
    pub fn apply(&mut self, r: &ProfileRequest) {
        match &r.model {
            ModelSource::Preset { name } => {
                self.model_kind = ModelKind::Preset;
                self.preset = name.clone();
            }
            ModelSource::Path { path } => {
                self.model_kind = ModelKind::File;
                self.path = path.display().to_string();
            }
            ModelSource::Synthetic { .. } => {}
        }
        self.quant = r.quant;
        if let DeviceSpec::Sim {
            preset,
            dry,
            total,
            topology,
        } = &r.device
        {
            self.device = format!("sim:{preset}");
            self.dry = *dry;
            self.custom_total = total.map_or(String::new(), |t| t.to_string());
            self.topology = *topology;
        }
        self.kv_cache_dtype = r.kv_cache_dtype;
        self.tokens = r.tokens;
        self.seqs = r.seqs;
        self.tp = r.tp;
        self.pp = r.pp;
        self.vllm = r.vllm.clone();
        self.util = r.util;
        self.block_size = r.block_size;
        self.max_model_len = r.max_model_len;
        self.enforce_eager = r.enforce_eager;
        self.true_max = r.true_max;
        self.chunked_prefill = r.chunked_prefill;
        self.prefix_caching = r.prefix_caching;
        self.kv_cache_memory = r.kv_cache_memory.map_or(String::new(), |b| b.to_string());
    }

    /// The `vramscope plan` options that say what the form says beyond a pasted line: the
    /// device (and its total and links) and the release, which a `vllm serve` line never names.
    pub fn plan_options(&self) -> Vec<String> {
        let mut o = vec!["--device".to_string()];
        if self.device.starts_with("sim:") {
            o.push(format!(
                "{}:{}",
                self.device,
                if self.dry { "dry" } else { "compute" }
            ));
            if !self.custom_total.trim().is_empty() {
                o.extend(["--total".into(), self.custom_total.trim().to_string()]);
            }
            if let Some(t) = self.topology {
                o.extend(["--topology".into(), t.name().to_string()]);
            }
        } else {
            o.push(self.device.clone());
        }
        o.extend(["--vllm".into(), self.vllm.clone()]);
        o
    }

    /// Uses `path` as the model and remembers it.
    /// Quick enough to profile at launch without being asked: a built-in preset on a
    /// simulated device, dry (shapes and allocations only).
    pub fn starts_by_itself(&self) -> bool {
        self.model_kind == ModelKind::Preset && self.device.starts_with("sim:") && self.dry
    }

    pub fn set_model_path(&mut self, path: PathBuf) {
        self.path = path.display().to_string();
        self.model_kind = ModelKind::File;
        self.recent.retain(|p| p != &path);
        self.recent.insert(0, path);
        self.recent.truncate(RECENT_MAX);
    }

    /// Draws the form; returns what the user asked of the app (a dialog, a pasted line).
    pub fn ui(
        &mut self,
        ui: &mut egui::Ui,
        devices: &[DeviceListing],
        no_gpu: Option<&str>,
    ) -> SetupAction {
        let mut action = SetupAction::None;
        ui.heading("Model");
        ui.horizontal_wrapped(|ui| {
            ui.radio_value(&mut self.model_kind, ModelKind::Preset, "Preset");
            ui.radio_value(&mut self.model_kind, ModelKind::File, "File");
            if ui
                .button("Open vLLM log…")
                .on_hover_text(
                    "A vLLM startup log (.log, .txt): its release, model and settings are \
                     taken into the setup and run, and the vLLM log tab sets its numbers \
                     beside the run's (vramscope explain)",
                )
                .clicked()
            {
                action = SetupAction::OpenLog;
            }
        });
        match self.model_kind {
            ModelKind::Preset => {
                ui.horizontal(|ui| {
                    let label = ui.label("Preset model");
                    egui::ComboBox::from_id_salt("preset")
                        .selected_text(self.preset.as_str())
                        .width(170.0)
                        // Tall enough for every preset: none hides below a scroll.
                        .height(popup_height(ui))
                        .show_ui(ui, |ui| {
                            compact_list(ui);
                            // Three columns: the 36 presets fit a 720-pixel window.
                            egui::Grid::new("preset_grid")
                                .num_columns(3)
                                .spacing([8.0, 0.0])
                                .show(ui, |ui| {
                                    for (k, n) in PRESET_NAMES.iter().enumerate() {
                                        ui.selectable_value(&mut self.preset, n.to_string(), *n);
                                        if k % 3 == 2 {
                                            ui.end_row();
                                        }
                                    }
                                });
                        })
                        .response
                        .labelled_by(label.id);
                });
                ui.small("Seeded synthetic weights of the real shape.");
            }
            ModelKind::File => {
                let label = ui.label("Model file");
                ui.add(
                    egui::TextEdit::singleline(&mut self.path)
                        .hint_text("folder, config.json or .safetensors")
                        .desired_width(f32::INFINITY),
                )
                .labelled_by(label.id);
                ui.horizontal(|ui| {
                    if ui.button("Open…").clicked() {
                        action = SetupAction::OpenModel;
                    }
                    let mut picked = None;
                    ui.add_enabled_ui(!self.recent.is_empty(), |ui| {
                        ui.menu_button("Recent", |ui| {
                            for p in &self.recent {
                                if ui.button(p.display().to_string()).clicked() {
                                    picked = Some(p.clone());
                                }
                            }
                        });
                    });
                    if let Some(p) = picked {
                        self.set_model_path(p);
                    }
                });
                // The note that no file dialog exists takes the hint's place in a strip of
                // fixed height: the settings below never jump.
                let line = ui.text_style_height(&egui::TextStyle::Body);
                let strip_h = 4.0 * line;
                let (rect, _) = ui.allocate_exact_size(
                    egui::vec2(ui.available_width(), strip_h),
                    egui::Sense::hover(),
                );
                let mut strip = ui.new_child(
                    egui::UiBuilder::new()
                        .max_rect(rect)
                        .layout(egui::Layout::top_down(egui::Align::Min)),
                );
                strip.set_clip_rect(rect.intersect(ui.clip_rect()));
                match &self.dialog_note {
                    Some(note) => {
                        strip.add(
                            egui::Label::new(
                                RichText::new(note)
                                    .small()
                                    .color(strip.visuals().warn_fg_color),
                            )
                            .wrap(),
                        );
                    }
                    None => {
                        strip.small("Or drop a file on the window.");
                    }
                }
            }
        }
        let l = ui.label("or paste a vllm serve line").on_hover_text(
            "The command you run, e.g. vllm serve Qwen/Qwen2.5-32B-Instruct \
             --tensor-parallel-size 2 --max-model-len 8192: read as vramscope plan reads it \
             (the device and the release stay the ones chosen here), then profiled.",
        );
        ui.horizontal(|ui| {
            let use_w = 80.0;
            // Multi-line, so a command pasted from a README keeps its `\` line breaks.
            ui.add(
                egui::TextEdit::multiline(&mut self.serve_line)
                    .hint_text("vllm serve MODEL …")
                    .desired_rows(1)
                    .desired_width((ui.available_width() - use_w).max(80.0)),
            )
            .labelled_by(l.id);
            let has = !self.serve_line.trim().is_empty();
            if ui.add_enabled(has, egui::Button::new("Use line")).clicked() {
                action = SetupAction::UseServeLine;
            }
        });
        ui.add_space(6.0);
        ui.heading("Quantization");
        ui.horizontal_wrapped(|ui| {
            for q in Quant::ALL {
                ui.selectable_value(&mut self.quant, q, q.label());
            }
        });
        // Always there (greyed out unless int8), so choosing a quantization never moves the
        // settings below.
        ui.add_enabled_ui(self.quant == Quant::Int8, |ui| {
            ui.horizontal(|ui| {
                let l = ui.label("int8 threshold");
                ui.add(
                    egui::DragValue::new(&mut self.int8_threshold)
                        .range(0.0..=100.0)
                        .speed(0.1),
                )
                .labelled_by(l.id)
                .on_disabled_hover_text("LLM.int8's outlier threshold (int8 only)");
            });
        });
        ui.add_space(6.0);
        let device_heading = ui.heading("Device");
        let current = devices
            .iter()
            .find(|d| d.spec == self.device)
            .map(device_name)
            .unwrap_or_else(|| self.device.clone());
        egui::ComboBox::from_id_salt("device")
            .selected_text(current)
            // A long device name is cut ("…") rather than widening the panel into the plot.
            .width(ui.available_width().min(330.0))
            .truncate()
            .height(popup_height(ui))
            .show_ui(ui, |ui| {
                compact_list(ui);
                for d in devices {
                    let text = format!("{}  ({})", device_name(d), fmt_u(d.total_bytes));
                    ui.selectable_value(&mut self.device, d.spec.clone(), text)
                        .on_hover_text(which_total(d));
                }
            })
            .response
            .labelled_by(device_heading.id);
        if self.device.starts_with("sim:") {
            ui.horizontal_wrapped(|ui| {
                ui.radio_value(&mut self.dry, true, "dry (shapes only)");
                ui.radio_value(&mut self.dry, false, "compute (CPU math)");
            });
            let preset = devices
                .iter()
                .find(|d| d.spec == self.device)
                .and_then(|d| d.preset);
            ui.horizontal(|ui| {
                let l = ui.label("total");
                let hint = preset
                    .map(|p| fmt_u(p.total_bytes))
                    .unwrap_or_else(|| "the preset's".into());
                ui.add(
                    egui::TextEdit::singleline(&mut self.custom_total)
                        .hint_text(hint)
                        .desired_width(90.0),
                )
                .labelled_by(l.id)
                .on_hover_text(
                    "The total your GPU reports (python -c 'import torch; \
                     print(torch.cuda.mem_get_info()[1])', vLLM's total_gpu_memory), e.g. \
                     79.22GiB or a byte count. Empty: the preset's.",
                );
            });
            if let Some(p) = preset {
                ui.add(
                    egui::Label::new(
                        RichText::new(format!(
                            "{}: {}; nvidia-smi {}",
                            p.simulated_total_label(),
                            fmt_u(p.total_bytes),
                            fmt_u(p.smi_bytes)
                        ))
                        .small(),
                    )
                    .wrap(),
                )
                .on_hover_text(p.total_source);
            }
        }
        if let Some(why) = no_gpu {
            ui.add(
                egui::Label::new(
                    RichText::new(format!("No CUDA GPU: {}", first_line(why))).small(),
                )
                .wrap(),
            )
            .on_hover_text(why);
        }
        ui.add_space(6.0);
        ui.heading("Batch and vLLM settings");
        // A narrow panel (1280x720) puts each control under its name instead of widening the
        // panel into the plot's room.
        let narrow = ui.available_width() < NARROW_PX;
        settings_rows(ui, "settings", narrow, |ui| {
            ui.label("max_num_batched_tokens").on_hover_text(
                "vLLM's --max-num-batched-tokens: the tokens of the profile batch. vLLM's default \
                 in V0 with chunked prefill off is max(max_model_len, 2048) (vllm/config.py, \
                 SchedulerConfig); in V1 `vllm serve` takes 8192 on a GPU of 70 GiB or more that \
                 is not an A100, else 2048 (engine/arg_utils.py).",
            );
            defaulted(ui, &mut self.tokens, 8192, 1..=1_048_576);
            ui.end_row();
            ui.label("max_num_seqs").on_hover_text(
                "vLLM's --max-num-seqs: the profile batch is split into this many dummy \
                 sequences, and the sampler runs on one row of logits per sequence. vLLM's \
                 default: 256 in V0 (up to 0.8); in V1 (0.11 on) `vllm serve` takes 1024 on a \
                 GPU of 70 GiB or more that is not an A100, else 256 (engine/arg_utils.py), as \
                 `vramscope profile` does without the flag.",
            );
            defaulted(ui, &mut self.seqs, 256, 1..=65_536);
            ui.end_row();
            let l = ui.label("sampler").on_hover_text(
                "vLLM's profile run samples with top_p=0.99, top_k=vocab-1 after the forward \
                 (model_runner.py profile_run); for most models the sampler owns the peak. \
                 Off: forward and logits only.",
            );
            ui.checkbox(&mut self.sampler, "vLLM's sampler step")
                .labelled_by(l.id);
            ui.end_row();
            let l = ui.label("passes");
            ui.add(egui::DragValue::new(&mut self.passes).range(1..=1000))
                .labelled_by(l.id);
            ui.end_row();
            let l = ui.label("tensor parallel").on_hover_text(
                "vLLM's --tensor-parallel-size: one worker per GPU (cuda:N and the GPUs after \
                 it, or that many simulated devices), NCCL between them; the engine takes the \
                 fewest KV blocks over the ranks.",
            );
            egui::ComboBox::from_id_salt("tp")
                .selected_text(format!(
                    "{} GPU{}",
                    self.tp,
                    if self.tp == 1 { "" } else { "s" }
                ))
                .show_ui(ui, |ui| {
                    for n in [1u32, 2, 4, 8] {
                        ui.selectable_value(&mut self.tp, n, format!("{n}"));
                    }
                })
                .response
                .labelled_by(l.id);
            ui.end_row();
            let l = ui.label("pipeline stages").on_hover_text(
                "vLLM's --pipeline-parallel-size: the layers cut over stages as vLLM cuts them                  (tensor-parallel GPUs each; simulated devices, V1 releases); the engine takes                  the fewest KV blocks over every rank.",
            );
            egui::ComboBox::from_id_salt("pp")
                .selected_text(format!("{}", self.pp))
                .show_ui(ui, |ui| {
                    for n in [1u32, 2, 4, 8] {
                        ui.selectable_value(&mut self.pp, n, format!("{n}"));
                    }
                })
                .response
                .labelled_by(l.id);
            ui.end_row();
            // Always there for simulated GPUs (greyed out on one), so choosing tensor
            // parallel never moves the settings below.
            if self.device.starts_with("sim:") {
                let l = ui.label("GPU links").on_hover_text(
                    "How the simulated GPUs reach each other (--topology): NCCL's memory and \
                     whether vLLM's custom all-reduce runs follow it. The preset's: NVLink for \
                     SXM boards, PCIe for data-center PCIe cards, PCIe without peer-to-peer for \
                     GeForce cards.",
                );
                let label = |t: Option<Topology>| match t {
                    None => "the preset's".to_string(),
                    Some(t) => t.describe().to_string(),
                };
                let several = self.tp * self.pp > 1;
                let topology = &mut self.topology;
                ui.add_enabled_ui(several, |ui| {
                    egui::ComboBox::from_id_salt("topology")
                        .selected_text(label(*topology))
                        .show_ui(ui, |ui| {
                            ui.selectable_value(topology, None, label(None));
                            for t in Topology::ALL {
                                ui.selectable_value(topology, Some(t), label(Some(t)));
                            }
                        })
                        .response
                        .labelled_by(l.id)
                        .on_disabled_hover_text("one GPU: no links");
                });
                ui.end_row();
            }
            let l = ui.label("vLLM release").on_hover_text(
                "The vLLM release whose profile run, defaults, formula and log lines to \
                 reproduce (vramscope's table of releases, read from each release's source).",
            );
            // Every release in view (the V1 ones hid below the popup's default height), V0
            // and V1 apart, and what the one under the pointer changed in a box below the
            // list rather than a tooltip over its neighbours.
            egui::ComboBox::from_id_salt("vllm")
                .selected_text(self.vllm.as_str())
                .height(popup_height(ui))
                .show_ui(ui, |ui| {
                    compact_list(ui);
                    ui.horizontal_top(|ui| {
                        let mut hovered = None;
                        ui.vertical(|ui| {
                            for (v1, title) in [(false, "V0 engine"), (true, "V1 engine")] {
                                ui.label(RichText::new(title).small().strong());
                                for r in crate::profile::vllm::RELEASES.iter().filter(|r| {
                                    matches!(r.engine, crate::profile::vllm::Engine::V1 { .. })
                                        == v1
                                }) {
                                    let item = ui.selectable_value(
                                        &mut self.vllm,
                                        r.name.to_string(),
                                        r.name,
                                    );
                                    if item.hovered() {
                                        hovered = Some(r);
                                    }
                                }
                            }
                        });
                        let note =
                            hovered.or_else(|| crate::profile::vllm::release(&self.vllm).ok());
                        if let Some(r) = note {
                            ui.separator();
                            ui.allocate_ui_with_layout(
                                egui::vec2(RELEASE_NOTE_PX, 0.0),
                                egui::Layout::top_down(egui::Align::Min),
                                |ui| {
                                    ui.set_width(RELEASE_NOTE_PX);
                                    ui.add(
                                        egui::Label::new(
                                            RichText::new(format!("{}: {}", r.name, r.changes))
                                                .small(),
                                        )
                                        .wrap(),
                                    );
                                },
                            );
                        }
                    });
                })
                .response
                .labelled_by(l.id);
            ui.end_row();
            let l = ui.label("gpu_memory_utilization")
                .on_hover_text("vLLM's --gpu-memory-utilization (default 0.9): the share of the GPU the instance may take, KV cache included.");
            ui.add(egui::Slider::new(&mut self.util, 0.05..=1.0).fixed_decimals(2))
                .labelled_by(l.id);
            ui.end_row();
            let l = ui
                .label("block_size")
                .on_hover_text("vLLM's --block-size (default 16): tokens per KV cache block.");
            ui.add(egui::DragValue::new(&mut self.block_size).range(1..=4096))
                .labelled_by(l.id);
            ui.end_row();
            ui.label("max_model_len").on_hover_text(
                "vLLM's --max-model-len: by default the model's max_position_embeddings \
                 (config.json). It sets the default batch and the max concurrency shown.",
            );
            defaulted(ui, &mut self.max_model_len, 8192, 1..=1_048_576);
            ui.end_row();
            let l = ui.label("kv_cache_dtype").on_hover_text(
                "vLLM's --kv-cache-dtype: auto stores K and V in the model's dtype; every fp8 \
                 name stores one byte per element (vllm/utils.py maps them to torch.uint8), \
                 so a block takes half the bytes of fp16/bf16.",
            );
            egui::ComboBox::from_id_salt("kv_cache_dtype")
                .selected_text(self.kv_cache_dtype.name())
                .show_ui(ui, |ui| {
                    for d in KvCacheDtype::ALL {
                        ui.selectable_value(&mut self.kv_cache_dtype, d, d.name());
                    }
                })
                .response
                .labelled_by(l.id);
            ui.end_row();
        });
        egui::CollapsingHeader::new("Advanced").show(ui, |ui| {
            settings_rows(ui, "advanced", narrow, |ui| {
                let l = ui.label("held by another process");
                ui.add(egui::TextEdit::singleline(&mut self.outside_before).desired_width(90.0))
                    .labelled_by(l.id)
                    .on_hover_text(
                        "memory another process holds before the instance starts, e.g. 512MiB",
                    );
                ui.end_row();
                let l = ui.label("outside framework, 1st pass");
                ui.add(egui::TextEdit::singleline(&mut self.outside_during).desired_width(90.0))
                    .labelled_by(l.id)
                    .on_hover_text(
                        "NCCL-like memory allocated outside the framework during the first pass",
                    );
                ui.end_row();
                ui.label("");
                ui.checkbox(&mut self.outside_during_freed, "freed after the passes");
                ui.end_row();
                ui.label("");
                ui.checkbox(&mut self.verify, "verify each budget");
                ui.end_row();
                ui.label("");
                let one_gpu = self.tp * self.pp == 1;
                ui.add_enabled(
                    one_gpu,
                    egui::Checkbox::new(&mut self.true_max, "find the true maximum"),
                )
                .on_hover_text(
                    "Also search the largest KV cache that really serves: the most blocks with                      which two max-batch passes after the profile stay within floor(T·u)                      without running out of memory (verify runs; one GPU).",
                )
                .on_disabled_hover_text("one GPU's search: with tensor parallel or pipeline stages it does not run");
                ui.end_row();
                ui.label("");
                ui.checkbox(&mut self.enforce_eager, "enforce eager (no CUDA graphs)")
                    .on_hover_text(
                        "vLLM's --enforce-eager. Without it a V1 release (0.15 on) captures its \
                         CUDA graphs after the KV cache; 0.19 estimates their memory, 0.21 \
                         subtracts the estimate from the KV budget.",
                    );
                ui.end_row();
                let l = ui.label("chunked prefill").on_hover_text(
                    "vLLM's --enable-chunked-prefill. The release's rule: V0 chunks above a \
                     32k context (the batch is then the release's chunk), V1 always. Off, a \
                     max_num_batched_tokens below max_model_len is refused, as vLLM refuses \
                     it; V1 off takes the release's own default batch.",
                );
                let label = |c: Option<bool>| match c {
                    None => "the release's rule",
                    Some(true) => "on",
                    Some(false) => "off",
                };
                egui::ComboBox::from_id_salt("chunked_prefill")
                    .selected_text(label(self.chunked_prefill))
                    .show_ui(ui, |ui| {
                        for c in [None, Some(true), Some(false)] {
                            ui.selectable_value(&mut self.chunked_prefill, c, label(c));
                        }
                    })
                    .response
                    .labelled_by(l.id);
                ui.end_row();
                let l = ui.label("kv_cache_memory").on_hover_text(
                    "vLLM's --kv-cache-memory (V1, 0.11 on): the KV cache's size per GPU, \
                     e.g. 40GiB; vLLM then skips its memory profiling. Empty: profiled.",
                );
                ui.add(
                    egui::TextEdit::singleline(&mut self.kv_cache_memory)
                        .hint_text("profiled")
                        .desired_width(90.0),
                )
                .labelled_by(l.id);
                ui.end_row();
                let l = ui.label("seed");
                ui.add(egui::DragValue::new(&mut self.seed))
                    .labelled_by(l.id);
                ui.end_row();
            });
        });
        action
    }
}

/// What the setup panel asks of the app this frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SetupAction {
    None,
    /// The model file dialog.
    OpenModel,
    /// The vLLM log dialog.
    OpenLog,
    /// Read the pasted `vllm serve` line and profile it.
    UseServeLine,
}

/// Width of the release popup's note on what the release changed.
const RELEASE_NOTE_PX: f32 = 320.0;

/// Below this width the settings flow instead of standing in a two-column grid.
const NARROW_PX: f32 = 330.0;

/// Label/control rows (`end_row` after each): a grid, or when `narrow` each control under its
/// label.
fn settings_rows(ui: &mut egui::Ui, id: &str, narrow: bool, rows: impl FnOnce(&mut egui::Ui)) {
    if narrow {
        ui.vertical(rows);
    } else {
        egui::Grid::new(id).num_columns(2).show(ui, rows);
    }
}

/// The first line of a message, cut at a word boundary near 120 characters with "…" (the
/// whole message is on hover).
fn first_line(s: &str) -> String {
    const MAX: usize = 120;
    let l = s.lines().next().unwrap_or(s);
    if l.len() <= MAX {
        return l.to_string();
    }
    let mut end = MAX;
    while !l.is_char_boundary(end) {
        end -= 1;
    }
    let cut = l[..end].rfind(' ').unwrap_or(end);
    format!(
        "{}… (hover for more)",
        l[..cut].trim_end_matches([',', ':', ';'])
    )
}

/// A device's name in the setup, one per entry: a preset kept from before (it simulates the
/// `nvidia-smi` total) carries the card's name as its newer preset does (which simulates the
/// total vLLM divides), so it says which total it is ("NVIDIA L4 (simulated)" twice, 22.49 and
/// 22.06 GiB, was two entries of one name).
pub fn device_name(d: &crate::device::DeviceListing) -> String {
    match d.preset {
        Some(p) if p.superseded_by.is_some() => match d.name.strip_suffix(')') {
            Some(head) => format!("{head}, nvidia-smi total)"),
            None => format!("{} (nvidia-smi total)", d.name),
        },
        _ => d.name.clone(),
    }
}

/// Which total a device entry is, for its tooltip in the device picker: what vLLM divides
/// (`cudaMemGetInfo`'s total, vLLM's `total_gpu_memory`), measured or estimated, or, for a
/// preset kept from before, the `nvidia-smi` framebuffer and the preset that is vLLM's.
pub fn which_total(d: &crate::device::DeviceListing) -> String {
    let Some(p) = d.preset else {
        return format!(
            "{}: the total this GPU's driver reports (cudaMemGetInfo), what vLLM divides",
            fmt_u(d.total_bytes)
        );
    };
    match p.superseded_by {
        Some(new) => format!(
            "{}: nvidia-smi's framebuffer total (a name kept from before); vLLM divides \
             cudaMemGetInfo's total, {} on this card: sim:{new}",
            fmt_u(p.total_bytes),
            fmt_u(
                crate::device::presets::find(new).map_or(p.mem_get_info_bytes, |n| n.total_bytes)
            )
        ),
        None => format!(
            "{}: {}, what vLLM divides (nvidia-smi shows {}). Source: {}",
            fmt_u(p.total_bytes),
            p.simulated_total_label(),
            fmt_u(p.smi_bytes),
            p.total_source
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 51 item 9: the first launch is the H100 as vLLM sees it (cudaMemGetInfo's
    /// 79.22 GiB), not nvidia-smi's 79.65 GiB; the picker says which total each entry is.
    #[test]
    fn the_first_launch_device_is_the_total_vllm_divides_and_the_picker_says_which() {
        let f = SetupForm::default();
        assert_eq!(f.device, "sim:h100-sxm");
        let (devices, _) = crate::device::list_devices();
        let find = |spec: &str| devices.iter().find(|d| d.spec == spec).unwrap();
        let vllms = find("sim:h100-sxm");
        assert_eq!(vllms.total_bytes, 7922 * (1 << 30) / 100);
        let tip = which_total(vllms);
        assert!(
            tip.starts_with("79.22 GiB: cudaMemGetInfo total (measured), what vLLM divides (nvidia-smi shows 79.65 GiB)"),
            "{tip}"
        );
        let smi = which_total(find("sim:h100-80gb"));
        assert_eq!(
            smi,
            "79.65 GiB: nvidia-smi's framebuffer total (a name kept from before); vLLM divides \
             cudaMemGetInfo's total, 79.22 GiB on this card: sim:h100-sxm"
        );
    }

    #[test]
    fn a_long_reason_is_cut_at_a_word_and_says_there_is_more() {
        assert_eq!(first_line("no driver\nsecond line"), "no driver");
        let long = format!(
            "NVML library not found: no libnvidia-ml.so.1 in {}",
            "/usr/lib64, ".repeat(20)
        );
        let short = first_line(&long);
        assert!(short.ends_with("… (hover for more)"), "{short}");
        let kept = short.trim_end_matches("… (hover for more)");
        assert!(kept.len() <= 120 && long.starts_with(kept), "{short}");
        assert!(
            kept.ends_with("/usr/lib64"),
            "cut at a word, no comma: {short}"
        );
    }

    #[test]
    fn default_form_is_the_default_request_in_int8_with_vllms_default_sequences() {
        assert_eq!(
            SetupForm::default().request().unwrap(),
            ProfileRequest {
                quant: Quant::Int8,
                seqs: 0,
                // The H100 as vLLM sees it; the library's default request keeps nvidia-smi's.
                device: crate::device::DeviceSpec::parse("sim:h100-sxm:dry").unwrap(),
                ..ProfileRequest::default()
            }
        );
    }

    #[test]
    fn empty_file_path_is_an_error_naming_what_to_do() {
        let f = SetupForm {
            model_kind: ModelKind::File,
            ..SetupForm::default()
        };
        let e = f.request().unwrap_err().to_string();
        assert!(e.contains("no model file"), "{e}");
    }

    #[test]
    fn recent_files_are_most_recent_first_without_duplicates() {
        let mut f = SetupForm::default();
        f.set_model_path("/a".into());
        f.set_model_path("/b".into());
        f.set_model_path("/a".into());
        assert_eq!(f.recent, vec![PathBuf::from("/a"), PathBuf::from("/b")]);
        assert_eq!(f.model_kind, ModelKind::File);
    }

    #[test]
    fn a_custom_total_goes_to_the_simulated_device() {
        let f = SetupForm {
            custom_total: "22.03GiB".into(),
            kv_cache_dtype: KvCacheDtype::Fp8,
            ..SetupForm::default()
        };
        let r = f.request().unwrap();
        assert_eq!(
            r.device.total_override(),
            Some(crate::base::units::parse_bytes("22.03GiB").unwrap())
        );
        assert_eq!(r.kv_cache_dtype, KvCacheDtype::Fp8);
        let bad = SetupForm {
            custom_total: "1KiB".into(),
            ..SetupForm::default()
        };
        let e = bad.request().unwrap_err().to_string();
        assert!(e.contains("--total"), "{e}");
    }

    #[test]
    fn a_chosen_topology_goes_to_the_simulated_devices() {
        let f = SetupForm {
            tp: 2,
            topology: Some(Topology::PcieNoP2p),
            ..SetupForm::default()
        };
        let r = f.request().unwrap();
        assert!(
            matches!(
                r.device,
                DeviceSpec::Sim {
                    topology: Some(Topology::PcieNoP2p),
                    ..
                }
            ),
            "{:?}",
            r.device
        );
        let preset = SetupForm {
            tp: 2,
            ..SetupForm::default()
        };
        assert!(matches!(
            preset.request().unwrap().device,
            DeviceSpec::Sim { topology: None, .. }
        ));
    }

    #[test]
    fn bad_sizes_name_the_setting() {
        let f = SetupForm {
            outside_before: "lots".into(),
            ..SetupForm::default()
        };
        let e = f.request().unwrap_err().to_string();
        assert!(e.contains("outside before"), "{e}");
    }
}
