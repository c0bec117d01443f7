//! NVML: device listing, and a sampler thread recording the device's used memory and this
//! process's used memory (ground truth, as `nvidia-smi` shows it) during the passes.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::Nvml;

/// One sample of the sampler thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct NvmlSample {
    pub time_us: u64,
    pub device_used: u64,
    pub process_used: u64,
}

/// Most samples kept (about a minute at the rate NVML allows); older ones are thinned out.
const MAX_SAMPLES: usize = 200_000;

pub(crate) fn init(path: &std::path::Path) -> Result<Arc<Nvml>, String> {
    Nvml::builder()
        .lib_path(path.as_os_str())
        .init()
        .map(Arc::new)
        .map_err(|e| format!("NVML could not start ({}): {e}", path.display()))
}

/// The NVML index of the GPU with this CUDA UUID.
pub(crate) fn index_of(nvml: &Nvml, uuid: &[u8; 16]) -> Result<u32, String> {
    let h: String = uuid.iter().map(|b| format!("{b:02x}")).collect();
    let text = format!(
        "GPU-{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    );
    let dev = nvml
        .device_by_uuid(text.as_str())
        .map_err(|e| format!("NVML does not know the GPU {text}: {e}"))?;
    dev.index()
        .map_err(|e| format!("NVML index of {text}: {e}"))
}

/// What one read of NVML gives.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Reading {
    pub device_used: u64,
    /// This process's used memory; `None` when NVML does not list it (another PID namespace).
    pub process_used: Option<u64>,
}

pub(crate) fn read(nvml: &Nvml, index: u32, pid: u32) -> Option<Reading> {
    let dev = nvml.device_by_index(index).ok()?;
    let mem = dev.memory_info().ok()?;
    let process_used = dev.running_compute_processes().ok().and_then(|ps| {
        ps.iter()
            .find(|p| p.pid == pid)
            .and_then(|p| match p.used_gpu_memory {
                UsedGpuMemory::Used(b) => Some(b),
                UsedGpuMemory::Unavailable => None,
            })
    });
    Some(Reading {
        device_used: mem.used,
        process_used,
    })
}

/// Ground truth: NVML's per-process figure when it lists us, else the device's used memory
/// minus what was used before this process made its context.
pub(crate) fn process_bytes(r: &Reading, device_used_before: u64) -> u64 {
    r.process_used
        .unwrap_or_else(|| r.device_used.saturating_sub(device_used_before))
}

struct Shared {
    stop: AtomicBool,
    peak: AtomicU64,
    samples: Mutex<Vec<NvmlSample>>,
    count: AtomicU64,
}

/// A thread reading NVML as fast as it answers, keeping the peak of this process's memory.
pub(crate) struct Sampler {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    started: Instant,
}

impl Sampler {
    pub fn start(nvml: Arc<Nvml>, index: u32, device_used_before: u64, epoch: Instant) -> Self {
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            peak: AtomicU64::new(0),
            samples: Mutex::new(Vec::new()),
            count: AtomicU64::new(0),
        });
        let s = shared.clone();
        let pid = std::process::id();
        // `VRAMSCOPE_NVML_INTERVAL_US` spaces the reads out (default: as fast as NVML answers,
        // with a 200 µs pause).
        let interval = Duration::from_micros(
            std::env::var("VRAMSCOPE_NVML_INTERVAL_US")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(200),
        );
        let thread = std::thread::Builder::new()
            .name("nvml-sampler".into())
            .spawn(move || {
                while !s.stop.load(Ordering::Relaxed) {
                    if let Some(r) = read(&nvml, index, pid) {
                        let p = process_bytes(&r, device_used_before);
                        s.peak.fetch_max(p, Ordering::Relaxed);
                        s.count.fetch_add(1, Ordering::Relaxed);
                        let mut v = s.samples.lock().expect("sampler lock");
                        if v.len() >= MAX_SAMPLES {
                            // keep every other old sample: the series stays whole, coarser
                            let kept: Vec<NvmlSample> = v.iter().step_by(2).copied().collect();
                            *v = kept;
                        }
                        v.push(NvmlSample {
                            time_us: epoch.elapsed().as_micros() as u64,
                            device_used: r.device_used,
                            process_used: p,
                        });
                    }
                    std::thread::sleep(interval);
                }
            })
            .ok();
        Sampler {
            shared,
            thread,
            started: Instant::now(),
        }
    }

    /// Restarts the peak from `now_bytes`.
    pub fn reset_peak(&self, now_bytes: u64) {
        self.shared.peak.store(now_bytes, Ordering::Relaxed);
    }

    /// Folds in a reading taken outside the thread (right after an allocation).
    pub fn observe(&self, bytes: u64) {
        self.shared.peak.fetch_max(bytes, Ordering::Relaxed);
    }

    pub fn peak(&self) -> u64 {
        self.shared.peak.load(Ordering::Relaxed)
    }

    /// Samples per second since the thread started.
    pub fn rate_hz(&self) -> f64 {
        let n = self.shared.count.load(Ordering::Relaxed) as f64;
        n / self.started.elapsed().as_secs_f64().max(1e-9)
    }

    pub fn samples(&self) -> Vec<NvmlSample> {
        self.shared.samples.lock().expect("sampler lock").clone()
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
