//! The snapshot as PyTorch pickles it (`torch.cuda.memory._snapshot()`, 2.1 through 2.11),
//! turned from the pickle machine's values (`unpickle`) into plain structs. Keys PyTorch added
//! or renamed over the versions are optional; keys vramscope does not use are skipped.

use std::rc::Rc;

use super::unpickle::{shape, DecodeError, Dict, Machine, Val};

/// One stack frame, as `symbolize` writes it; missing or `None` keys are empty.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Frame {
    pub filename: Rc<str>,
    pub line: i64,
    pub name: Rc<str>,
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

/// The first two shown frames of a stack (innermost first); the rest are not kept, so a
/// million entries with deep stacks do not keep their stacks.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct TopFrames(pub Vec<Rc<Frame>>);

#[derive(Debug)]
pub(crate) struct RawBlock {
    /// Written since PyTorch 2.1; older snapshots leave it to the segment's address plus the
    /// sizes of the blocks before.
    pub address: Option<u64>,
    pub size: u64,
    pub state: Rc<str>,
}

#[derive(Debug)]
pub(crate) struct RawSegment {
    pub device: i64,
    pub address: u64,
    pub total_size: u64,
    pub allocated_size: Option<u64>,
    pub blocks: Vec<RawBlock>,
}

/// One `device_traces` entry. `oom` entries carry `device_free` instead of `addr`.
#[derive(Debug)]
pub(crate) struct RawEntry {
    pub action: Rc<str>,
    pub addr: Option<u64>,
    pub size: u64,
    pub time_us: Option<i64>,
    pub device_free: Option<u64>,
    pub category: Option<Rc<str>>,
    pub frames: Rc<TopFrames>,
}

/// An `external_annotations` entry (`record_function` annotations, PyTorch 2.6+): a name, a
/// stage (START/END) and a time.
#[derive(Debug, Default)]
pub(crate) struct RawAnnotation {
    pub device: i64,
    pub time_us: Option<i64>,
    pub stage: Option<Rc<str>>,
    pub name: Option<Rc<str>>,
}

/// The whole snapshot: a dict (every version since 2.0) or, in the oldest format, the list
/// of segments alone.
#[derive(Debug, Default)]
pub(crate) struct RawSnapshot {
    pub segments: Vec<RawSegment>,
    pub device_traces: Vec<Vec<Rc<RawEntry>>>,
    pub annotations: Vec<RawAnnotation>,
    pub expandable_segments: bool,
    /// Whether the top-level dict had any key of a memory snapshot.
    pub recognised: bool,
}

type Items = [(Val, Val)];

/// The value of `key` (the last one, as a Python dict keeps the last).
fn get<'a>(items: &'a Items, key: &str) -> Option<&'a Val> {
    items
        .iter()
        .rev()
        .find(|(k, _)| matches!(k, Val::Str(s) if &**s == key))
        .map(|(_, v)| v)
}

fn opt_i64(items: &Items, key: &str) -> Result<Option<i64>, DecodeError> {
    match get(items, key) {
        None | Some(Val::None) => Ok(None),
        Some(Val::Int(i)) => Ok(Some(*i)),
        Some(Val::BigInt) => Err(shape(format!("integer too large in '{key}'"))),
        Some(v) => Err(shape(format!(
            "'{key}' is {}, expected an integer",
            v.kind()
        ))),
    }
}

fn opt_u64(items: &Items, key: &str) -> Result<Option<u64>, DecodeError> {
    match opt_i64(items, key)? {
        Some(i) if i < 0 => Err(shape(format!("'{key}' is negative ({i})"))),
        v => Ok(v.map(|i| i as u64)),
    }
}

fn need_u64(items: &Items, key: &str, what: &str) -> Result<u64, DecodeError> {
    opt_u64(items, key)?.ok_or_else(|| shape(format!("{what} without '{key}'")))
}

fn opt_str(items: &Items, key: &str) -> Result<Option<Rc<str>>, DecodeError> {
    match get(items, key) {
        None | Some(Val::None) => Ok(None),
        Some(Val::Str(s)) => Ok(Some(s.clone())),
        Some(v) => Err(shape(format!("'{key}' is {}, expected a string", v.kind()))),
    }
}

/// A frame dict's items.
pub(crate) fn frame(items: &Items) -> Result<Frame, DecodeError> {
    Ok(Frame {
        filename: opt_str(items, "filename")?.unwrap_or_else(|| Rc::from("")),
        line: opt_i64(items, "line")?.unwrap_or(0),
        name: opt_str(items, "name")?.unwrap_or_else(|| Rc::from("")),
    })
}

/// The first two shown, non-empty frames of a stack.
pub(crate) fn top_frames(stack: &[Val]) -> Result<TopFrames, DecodeError> {
    let mut kept = Vec::new();
    for v in stack {
        let f = match v {
            Val::None => continue,
            Val::Dict(d) => match &*d.borrow() {
                Dict::Frame(f) => f.clone(),
                Dict::Items(items) => Rc::new(frame(items)?),
                Dict::Entry(_) => return Err(shape("a stack frame is a trace entry")),
            },
            other => {
                return Err(shape(format!(
                    "a stack frame is {}, expected a dict",
                    other.kind()
                )))
            }
        };
        if is_shown(&f) && !(f.filename.is_empty() && f.name.is_empty()) {
            kept.push(f);
            if kept.len() == 2 {
                break;
            }
        }
    }
    Ok(TopFrames(kept))
}

/// A trace entry dict's items (called when the entry is appended to its trace).
pub(crate) fn entry(items: &Items, m: &mut Machine) -> Result<RawEntry, DecodeError> {
    let action = match get(items, "action") {
        Some(Val::Str(s)) => s.clone(),
        Some(v) => {
            return Err(shape(format!(
                "'action' is {}, expected a string",
                v.kind()
            )))
        }
        None => return Err(shape("a trace entry without 'action'")),
    };
    let frames = match get(items, "frames") {
        None | Some(Val::None) => Rc::new(TopFrames::default()),
        Some(Val::List(l)) => m.top_frames_of(l)?,
        Some(Val::Tuple(t)) => Rc::new(top_frames(t)?),
        Some(v) => return Err(shape(format!("'frames' is {}, expected a list", v.kind()))),
    };
    Ok(RawEntry {
        action,
        addr: opt_u64(items, "addr")?,
        size: opt_u64(items, "size")?.unwrap_or(0),
        time_us: opt_i64(items, "time_us")?,
        device_free: opt_u64(items, "device_free")?,
        category: opt_str(items, "category")?,
        frames,
    })
}

/// Counts the records taken out of the decoded values: lists shared through the memo could
/// otherwise make a small file stand for billions of them.
struct Budget(u64);

impl Budget {
    fn take(&mut self, n: usize) -> Result<(), DecodeError> {
        self.0 = self.0.checked_sub(n as u64).ok_or_else(|| {
            shape("more records than the file could hold (one list shared many times through the pickle memo)")
        })?;
        Ok(())
    }
}

/// A list's (or tuple's) items.
fn list_items(v: &Val, what: &str) -> Result<Vec<Val>, DecodeError> {
    match v {
        Val::List(l) => Ok(l.borrow().clone()),
        Val::Tuple(t) => Ok(t.to_vec()),
        other => Err(shape(format!(
            "{what} is {}, expected a list",
            other.kind()
        ))),
    }
}

/// Runs `f` on a dict's items.
fn with_items<T>(
    v: &Val,
    what: &str,
    f: impl FnOnce(&Items) -> Result<T, DecodeError>,
) -> Result<T, DecodeError> {
    match v {
        Val::Dict(d) => match &*d.borrow() {
            Dict::Items(items) => f(items),
            Dict::Entry(_) => Err(shape(format!("{what} is a trace entry"))),
            Dict::Frame(_) => Err(shape(format!("{what} is a stack frame"))),
        },
        other => Err(shape(format!(
            "{what} is {}, expected a dict",
            other.kind()
        ))),
    }
}

fn segment(v: &Val, budget: &mut Budget) -> Result<RawSegment, DecodeError> {
    with_items(v, "a segment", |items| {
        let blocks = match get(items, "blocks") {
            None | Some(Val::None) => Vec::new(),
            Some(b) => {
                let list = list_items(b, "'blocks'")?;
                budget.take(list.len())?;
                list.iter()
                    .map(|b| {
                        with_items(b, "a block", |bi| {
                            Ok(RawBlock {
                                address: opt_u64(bi, "address")?,
                                size: need_u64(bi, "size", "a block")?,
                                state: opt_str(bi, "state")?
                                    .ok_or_else(|| shape("a block without 'state'"))?,
                            })
                        })
                    })
                    .collect::<Result<_, _>>()?
            }
        };
        Ok(RawSegment {
            device: opt_i64(items, "device")?.unwrap_or(0),
            address: need_u64(items, "address", "a segment")?,
            total_size: need_u64(items, "total_size", "a segment")?,
            allocated_size: opt_u64(items, "allocated_size")?,
            blocks,
        })
    })
}

fn segments(v: &Val, budget: &mut Budget) -> Result<Vec<RawSegment>, DecodeError> {
    let list = list_items(v, "'segments'")?;
    budget.take(list.len())?;
    list.iter().map(|s| segment(s, budget)).collect()
}

fn trace(v: &Val, budget: &mut Budget) -> Result<Vec<Rc<RawEntry>>, DecodeError> {
    let list = list_items(v, "a device trace")?;
    budget.take(list.len())?;
    list.iter()
        .map(|e| match e {
            Val::Dict(d) => match &*d.borrow() {
                Dict::Entry(e) => Ok(e.clone()),
                Dict::Items(_) | Dict::Frame(_) => Err(shape("a trace entry without 'action'")),
            },
            other => Err(shape(format!(
                "a trace entry is {}, expected a dict",
                other.kind()
            ))),
        })
        .collect()
}

fn annotation(v: &Val) -> Result<RawAnnotation, DecodeError> {
    if matches!(v, Val::None) {
        return Ok(RawAnnotation::default());
    }
    with_items(v, "an annotation", |items| {
        Ok(RawAnnotation {
            device: opt_i64(items, "device")?.unwrap_or(0),
            time_us: opt_i64(items, "time_us")?,
            stage: opt_str(items, "stage")?,
            name: opt_str(items, "name")?,
        })
    })
}

/// The top-level value, a snapshot dict (or the oldest format's list of segments);
/// `stream_bytes` bounds how many records it may stand for.
pub(crate) fn snapshot(top: &Val, stream_bytes: u64) -> Result<RawSnapshot, DecodeError> {
    let mut budget = Budget(stream_bytes);
    let mut s = RawSnapshot::default();
    match top {
        Val::List(_) | Val::Tuple(_) => {
            s.segments = segments(top, &mut budget)?;
            s.recognised = true;
        }
        Val::Dict(d) => {
            let body = d.borrow();
            let Dict::Items(items) = &*body else {
                return Ok(s);
            };
            if let Some(v) = get(items, "segments") {
                s.segments = segments(v, &mut budget)?;
                s.recognised = true;
            }
            if let Some(v) = get(items, "device_traces") {
                let devices = list_items(v, "'device_traces'")?;
                budget.take(devices.len())?;
                s.device_traces = devices
                    .iter()
                    .map(|t| trace(t, &mut budget))
                    .collect::<Result<_, _>>()?;
                s.recognised = true;
            }
            if let Some(v) = get(items, "external_annotations") {
                let list = list_items(v, "'external_annotations'")?;
                budget.take(list.len())?;
                s.annotations = list.iter().map(annotation).collect::<Result<_, _>>()?;
            }
            if let Some(v) = get(items, "allocator_settings") {
                s.expandable_segments = match v {
                    Val::None => false,
                    v => with_items(v, "'allocator_settings'", |items| {
                        Ok(matches!(
                            get(items, "expandable_segments"),
                            Some(Val::Bool(true))
                        ))
                    })?,
                };
            }
        }
        other => {
            return Err(shape(format!(
                "the pickle holds {}, expected a dict with 'segments' and 'device_traces'",
                other.kind()
            )))
        }
    }
    Ok(s)
}
