//! The snapshot as PyTorch pickles it (`torch.cuda.memory._snapshot()`, 2.1 through 2.11),
//! decoded by serde-pickle into plain structs. Keys PyTorch added or renamed over the versions
//! are optional; keys vramscope does not use are skipped without being kept.

use std::fmt;

use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

/// One stack frame, as `symbolize` writes it. Read leniently: serde-pickle 1.2 loses track
/// of memoized values shared inside shared lists (PyTorch shares frame dicts between stacks,
/// and stacks between an alloc and its free), and gives `None` for the later copies (see
/// `read::options`), so a frame, or a key of one, may come back as `None`: it is left out.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Frame {
    pub filename: String,
    pub line: i64,
    pub name: String,
}

impl<'de> Deserialize<'de> for Frame {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Frame;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a frame dict")
            }
            fn visit_unit<E: de::Error>(self) -> Result<Frame, E> {
                Ok(Frame::default())
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Frame, A::Error> {
                let mut f = Frame::default();
                while let Some(key) = map.next_key::<KeyName>()? {
                    match key.0.as_deref() {
                        Some("filename") => {
                            f.filename = map.next_value::<Option<String>>()?.unwrap_or_default()
                        }
                        Some("name") => {
                            f.name = map.next_value::<Option<String>>()?.unwrap_or_default()
                        }
                        Some("line") => f.line = map.next_value::<Option<i64>>()?.unwrap_or(0),
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(f)
            }
        }
        d.deserialize_any(V)
    }
}

/// Frames PyTorch's own viewer leaves out (`_frame_filter` in torch/cuda/_memory_viz.py):
/// the allocator's and the interpreter's, never the user's.
fn is_shown(f: &Frame) -> bool {
    const OMIT_NAMES: [&str; 8] = [
        "unwind::unwind",
        "CapturedTraceback::gather",
        "gather_with_cpp",
        "_start",
        "__libc_start_main",
        "PyEval_",
        "PyObject_",
        "PyFunction_",
    ];
    const OMIT_FILES: [&str; 10] = [
        "core/boxing",
        "/Register",
        "/Redispatch",
        "pythonrun.c",
        "Modules/main.c",
        "Objects/call.c",
        "Objects/methodobject.c",
        "pycore_ceval.h",
        "ceval.c",
        "cpython/abstract.h",
    ];
    // vramscope's own frames carry the tensor name, which may contain an omitted word by
    // chance (`attn.query_start_loc` holds "_start"): they are always kept.
    f.filename.starts_with(super::VRAMSCOPE_FRAME)
        || (!OMIT_NAMES.iter().any(|o| f.name.contains(o))
            && !OMIT_FILES.iter().any(|o| f.filename.contains(o)))
}

/// The first two shown frames of a stack (innermost first); the rest are read and dropped, so
/// a million entries with deep stacks do not keep their stacks.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct TopFrames(pub Vec<Frame>);

impl<'de> Deserialize<'de> for TopFrames {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = TopFrames;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a list of frames")
            }
            fn visit_unit<E: de::Error>(self) -> Result<TopFrames, E> {
                Ok(TopFrames::default())
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<TopFrames, A::Error> {
                let mut kept = Vec::new();
                while kept.len() < 2 {
                    match seq.next_element::<Frame>()? {
                        Some(f)
                            if is_shown(&f) && !(f.filename.is_empty() && f.name.is_empty()) =>
                        {
                            kept.push(f)
                        }
                        Some(_) => {}
                        None => return Ok(TopFrames(kept)),
                    }
                }
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(TopFrames(kept))
            }
        }
        d.deserialize_any(V)
    }
}

#[derive(Debug, Deserialize)]
pub(crate) struct RawBlock {
    /// Written since PyTorch 2.1; older snapshots leave it to the segment's address plus the
    /// sizes of the blocks before.
    #[serde(default)]
    pub address: Option<u64>,
    pub size: u64,
    pub state: String,
}

#[derive(Debug, Deserialize)]
pub(crate) struct RawSegment {
    #[serde(default)]
    pub device: i64,
    pub address: u64,
    pub total_size: u64,
    #[serde(default)]
    pub allocated_size: Option<u64>,
    #[serde(default)]
    pub blocks: Vec<RawBlock>,
}

/// One `device_traces` entry. `oom` entries carry `device_free` instead of `addr`.
#[derive(Debug, Deserialize)]
pub(crate) struct RawEntry {
    pub action: String,
    #[serde(default)]
    pub addr: Option<u64>,
    #[serde(default)]
    pub size: u64,
    #[serde(default)]
    pub time_us: Option<i64>,
    #[serde(default)]
    pub device_free: Option<u64>,
    #[serde(default)]
    pub category: Option<String>,
    #[serde(default)]
    pub frames: TopFrames,
}

/// An `external_annotations` entry (`record_function` annotations, PyTorch 2.6+): a name, a
/// stage (START/END) and a time. Read leniently like `Frame`: its `name` key is the same
/// memoized string as the frames' and can come back as `None`.
#[derive(Debug, Default)]
pub(crate) struct RawAnnotation {
    pub device: i64,
    pub time_us: Option<i64>,
    pub stage: Option<String>,
    pub name: Option<String>,
}

impl<'de> Deserialize<'de> for RawAnnotation {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawAnnotation;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an annotation dict")
            }
            fn visit_unit<E: de::Error>(self) -> Result<RawAnnotation, E> {
                Ok(RawAnnotation::default())
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawAnnotation, A::Error> {
                let mut a = RawAnnotation::default();
                while let Some(key) = map.next_key::<KeyName>()? {
                    match key.0.as_deref() {
                        Some("device") => a.device = map.next_value::<Option<i64>>()?.unwrap_or(0),
                        Some("time_us") => a.time_us = map.next_value()?,
                        Some("stage") => a.stage = map.next_value()?,
                        Some("name") => a.name = map.next_value()?,
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(a)
            }
        }
        d.deserialize_any(V)
    }
}

/// The whole snapshot: a dict (every version since 2.0) or, in the oldest format, the list
/// of segments alone.
#[derive(Debug, Default)]
pub(crate) struct RawSnapshot {
    pub segments: Vec<RawSegment>,
    pub device_traces: Vec<Vec<RawEntry>>,
    pub annotations: Vec<RawAnnotation>,
    pub expandable_segments: bool,
    /// Whether the top-level dict had any key of a memory snapshot.
    pub recognised: bool,
}

#[derive(Debug, Default, Deserialize)]
struct RawSettings {
    #[serde(default)]
    expandable_segments: bool,
}

impl<'de> Deserialize<'de> for RawSnapshot {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawSnapshot;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a dict with 'segments' and 'device_traces'")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<RawSnapshot, A::Error> {
                let mut s = RawSnapshot {
                    recognised: true,
                    ..RawSnapshot::default()
                };
                while let Some(seg) = seq.next_element::<RawSegment>()? {
                    s.segments.push(seg);
                }
                Ok(s)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawSnapshot, A::Error> {
                let mut s = RawSnapshot::default();
                while let Some(key) = map.next_key::<KeyName>()? {
                    match key.0.as_deref() {
                        Some("segments") => {
                            s.segments = map.next_value()?;
                            s.recognised = true;
                        }
                        Some("device_traces") => {
                            s.device_traces = map.next_value()?;
                            s.recognised = true;
                        }
                        Some("external_annotations") => {
                            s.annotations = map.next_value()?;
                        }
                        Some("allocator_settings") => {
                            let settings: RawSettings = map.next_value()?;
                            s.expandable_segments = settings.expandable_segments;
                        }
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(s)
            }
        }
        d.deserialize_any(V)
    }
}

/// A dict key: a string, or anything else (ignored, as a snapshot never has such keys).
struct KeyName(Option<String>);

impl<'de> Deserialize<'de> for KeyName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = KeyName;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a dict key")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<KeyName, E> {
                Ok(KeyName(Some(v.to_string())))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<KeyName, E> {
                Ok(KeyName(Some(v)))
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<KeyName, E> {
                Ok(KeyName(None))
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<KeyName, E> {
                Ok(KeyName(None))
            }
            fn visit_bytes<E: de::Error>(self, _: &[u8]) -> Result<KeyName, E> {
                Ok(KeyName(None))
            }
            fn visit_byte_buf<E: de::Error>(self, _: Vec<u8>) -> Result<KeyName, E> {
                Ok(KeyName(None))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<KeyName, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(KeyName(None))
            }
            fn visit_unit<E: de::Error>(self) -> Result<KeyName, E> {
                Ok(KeyName(None))
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<KeyName, E> {
                Ok(KeyName(None))
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<KeyName, E> {
                Ok(KeyName(None))
            }
        }
        d.deserialize_any(V)
    }
}
