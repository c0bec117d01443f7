//! The snapshot as PyTorch pickles it (`torch.cuda.memory._snapshot()`, 2.1 through 2.11),
//! turned from the pickle machine's values (`unpickle`) into plain structs. Keys PyTorch added
//! or renamed over the versions are optional; keys vramscope does not use are skipped.

use std::rc::Rc;

use super::unpickle::{shape, Container, DecodeError, Machine, StrId, Strings, Val};

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
    /// Every trace entry, once (an entry repeated through the memo is one).
    pub entries: Vec<RawEntry>,
    /// Each device's trace: indices in `entries`.
    pub device_traces: Vec<Vec<u32>>,
    pub annotations: Vec<RawAnnotation>,
    pub expandable_segments: bool,
    /// Whether the top-level dict had any key of a memory snapshot.
    pub recognised: bool,
}

type Items = [(Val, Val)];

/// A key of a snapshot's dicts: its interned id and its name (for messages).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Key {
    pub id: StrId,
    pub name: &'static str,
}

/// Every key vramscope reads, interned before the pickle is read, so finding a key in a
/// dict compares ids rather than strings. A trace entry's seven keys come first: their ids
/// are 0..7, so an entry's item finds its slot by its key's id (`entry`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Keys {
    pub action: Key,
    pub addr: Key,
    pub size: Key,
    pub time_us: Key,
    pub device_free: Key,
    pub category: Key,
    pub frames: Key,
    pub filename: Key,
    pub line: Key,
    pub name: Key,
    pub blocks: Key,
    pub address: Key,
    pub state: Key,
    pub device: Key,
    pub total_size: Key,
    pub allocated_size: Key,
    pub segments: Key,
    pub device_traces: Key,
    pub external_annotations: Key,
    pub allocator_settings: Key,
    pub expandable_segments: Key,
    pub stage: Key,
}

impl Keys {
    /// The keys, interned into a table that holds nothing yet.
    pub(crate) fn intern(strings: &mut Strings) -> Keys {
        let mut key = |name: &'static str| Key {
            id: strings.intern(name).0,
            name,
        };
        // In `entry`'s order, ids 0..ENTRY_KEYS.
        Keys {
            action: key("action"),
            addr: key("addr"),
            size: key("size"),
            time_us: key("time_us"),
            device_free: key("device_free"),
            category: key("category"),
            frames: key("frames"),
            filename: key("filename"),
            line: key("line"),
            name: key("name"),
            blocks: key("blocks"),
            address: key("address"),
            state: key("state"),
            device: key("device"),
            total_size: key("total_size"),
            allocated_size: key("allocated_size"),
            segments: key("segments"),
            device_traces: key("device_traces"),
            external_annotations: key("external_annotations"),
            allocator_settings: key("allocator_settings"),
            expandable_segments: key("expandable_segments"),
            stage: key("stage"),
        }
    }
}

/// The value of `key` (the last one, as a Python dict keeps the last).
fn get(items: &Items, key: Key) -> Option<Val> {
    items
        .iter()
        .rev()
        .find(|(k, _)| matches!(k, Val::Str(s) if *s == key.id))
        .map(|(_, v)| *v)
}

fn int(v: Option<Val>, key: Key) -> Result<Option<i64>, DecodeError> {
    match v {
        None | Some(Val::None) => Ok(None),
        Some(Val::Int(i)) => Ok(Some(i)),
        Some(Val::BigInt) => Err(shape(format!("integer too large in '{}'", key.name))),
        Some(v) => Err(shape(format!(
            "'{}' is {}, expected an integer",
            key.name,
            v.kind()
        ))),
    }
}

fn unsigned(v: Option<Val>, key: Key) -> Result<Option<u64>, DecodeError> {
    match int(v, key)? {
        Some(i) if i < 0 => Err(shape(format!("'{}' is negative ({i})", key.name))),
        v => Ok(v.map(|i| i as u64)),
    }
}

fn text(v: Option<Val>, key: Key, s: &Strings) -> Result<Option<Rc<str>>, DecodeError> {
    match v {
        None | Some(Val::None) => Ok(None),
        Some(Val::Str(id)) => Ok(Some(s.get(id).clone())),
        Some(v) => Err(shape(format!(
            "'{}' is {}, expected a string",
            key.name,
            v.kind()
        ))),
    }
}

fn opt_i64(items: &Items, key: Key) -> Result<Option<i64>, DecodeError> {
    int(get(items, key), key)
}

fn opt_u64(items: &Items, key: Key) -> Result<Option<u64>, DecodeError> {
    unsigned(get(items, key), key)
}

fn need_u64(items: &Items, key: Key, what: &str) -> Result<u64, DecodeError> {
    opt_u64(items, key)?.ok_or_else(|| shape(format!("{what} without '{}'", key.name)))
}

fn opt_str(items: &Items, key: Key, s: &Strings) -> Result<Option<Rc<str>>, DecodeError> {
    text(get(items, key), key, s)
}

/// A frame dict's items.
pub(crate) fn frame(items: &Items, m: &Machine) -> Result<Frame, DecodeError> {
    let (k, s) = (&m.keys, &m.strings);
    Ok(Frame {
        filename: opt_str(items, k.filename, s)?.unwrap_or_else(|| Rc::from("")),
        line: opt_i64(items, k.line)?.unwrap_or(0),
        name: opt_str(items, k.name, s)?.unwrap_or_else(|| Rc::from("")),
    })
}

/// The first two shown, non-empty frames of a stack.
pub(crate) fn top_frames(stack: &[Val], m: &Machine) -> Result<TopFrames, DecodeError> {
    let mut kept = Vec::with_capacity(2);
    for v in stack {
        let f = match v {
            Val::None => continue,
            Val::Dict(d) => match m.container(*d) {
                Container::Frame(f) => f.clone(),
                Container::Dict(items) => Rc::new(frame(items, m)?),
                Container::Entry(_) => return Err(shape("a stack frame is a trace entry")),
                Container::Items { .. } => unreachable!("dicts hold items in pairs"),
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

/// How many keys of a trace entry are read; their ids are 0..ENTRY_KEYS (`Keys`).
const ENTRY_KEYS: usize = 7;

/// A trace entry dict's items (called when the entry is appended to its trace): one walk
/// over the items, the last of a repeated key winning as in a Python dict.
pub(crate) fn entry(items: &Items, m: &mut Machine) -> Result<RawEntry, DecodeError> {
    let k = m.keys;
    let mut found: [Option<Val>; ENTRY_KEYS] = [None; ENTRY_KEYS];
    for (key, v) in items {
        if let Val::Str(id) = key {
            if let Some(slot) = found.get_mut(id.index()) {
                *slot = Some(*v);
            }
        }
    }
    let [action, addr, size, time_us, device_free, category, frames] = found;
    let action = match action {
        Some(Val::Str(s)) => m.strings.get(s).clone(),
        Some(v) => {
            return Err(shape(format!(
                "'action' is {}, expected a string",
                v.kind()
            )))
        }
        None => return Err(shape("a trace entry without 'action'")),
    };
    let frames = match frames {
        None | Some(Val::None) => Rc::new(TopFrames::default()),
        Some(Val::List(l) | Val::Tuple(l)) => m.top_frames_of(l)?,
        Some(v) => {
            return Err(shape(format!(
                "'{}' is {}, expected a list",
                k.frames.name,
                v.kind()
            )))
        }
    };
    Ok(RawEntry {
        action,
        addr: unsigned(addr, k.addr)?,
        size: unsigned(size, k.size)?.unwrap_or(0),
        time_us: int(time_us, k.time_us)?,
        device_free: unsigned(device_free, k.device_free)?,
        category: text(category, k.category, &m.strings)?,
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
fn list_items<'a>(v: Val, what: &str, m: &'a Machine) -> Result<&'a [Val], DecodeError> {
    match v {
        Val::List(l) | Val::Tuple(l) => match m.container(l) {
            Container::Items { items, .. } => Ok(items),
            _ => unreachable!("lists and tuples hold items"),
        },
        other => Err(shape(format!(
            "{what} is {}, expected a list",
            other.kind()
        ))),
    }
}

/// Runs `f` on a dict's items.
fn with_items<T>(
    v: Val,
    what: &str,
    m: &Machine,
    f: impl FnOnce(&Items) -> Result<T, DecodeError>,
) -> Result<T, DecodeError> {
    match v {
        Val::Dict(d) => match m.container(d) {
            Container::Dict(items) => f(items),
            Container::Entry(_) => Err(shape(format!("{what} is a trace entry"))),
            Container::Frame(_) => Err(shape(format!("{what} is a stack frame"))),
            Container::Items { .. } => unreachable!("dicts hold items in pairs"),
        },
        other => Err(shape(format!(
            "{what} is {}, expected a dict",
            other.kind()
        ))),
    }
}

fn segment(v: Val, m: &Machine, budget: &mut Budget) -> Result<RawSegment, DecodeError> {
    let (k, s) = (&m.keys, &m.strings);
    with_items(v, "a segment", m, |items| {
        let blocks = match get(items, k.blocks) {
            None | Some(Val::None) => Vec::new(),
            Some(b) => {
                let list = list_items(b, "'blocks'", m)?;
                budget.take(list.len())?;
                list.iter()
                    .map(|&b| {
                        with_items(b, "a block", m, |bi| {
                            Ok(RawBlock {
                                address: opt_u64(bi, k.address)?,
                                size: need_u64(bi, k.size, "a block")?,
                                state: opt_str(bi, k.state, s)?
                                    .ok_or_else(|| shape("a block without 'state'"))?,
                            })
                        })
                    })
                    .collect::<Result<_, _>>()?
            }
        };
        Ok(RawSegment {
            device: opt_i64(items, k.device)?.unwrap_or(0),
            address: need_u64(items, k.address, "a segment")?,
            total_size: need_u64(items, k.total_size, "a segment")?,
            allocated_size: opt_u64(items, k.allocated_size)?,
            blocks,
        })
    })
}

fn segments(v: Val, m: &Machine, budget: &mut Budget) -> Result<Vec<RawSegment>, DecodeError> {
    let list = list_items(v, "'segments'", m)?;
    budget.take(list.len())?;
    list.iter().map(|&s| segment(s, m, budget)).collect()
}

fn trace(v: Val, m: &Machine, budget: &mut Budget) -> Result<Vec<u32>, DecodeError> {
    let list = list_items(v, "a device trace", m)?;
    budget.take(list.len())?;
    list.iter()
        .map(|e| match e {
            Val::Dict(d) => match m.container(*d) {
                Container::Entry(e) => Ok(*e),
                _ => Err(shape("a trace entry without 'action'")),
            },
            other => Err(shape(format!(
                "a trace entry is {}, expected a dict",
                other.kind()
            ))),
        })
        .collect()
}

fn annotation(v: Val, m: &Machine) -> Result<RawAnnotation, DecodeError> {
    if matches!(v, Val::None) {
        return Ok(RawAnnotation::default());
    }
    let (k, s) = (&m.keys, &m.strings);
    with_items(v, "an annotation", m, |items| {
        Ok(RawAnnotation {
            device: opt_i64(items, k.device)?.unwrap_or(0),
            time_us: opt_i64(items, k.time_us)?,
            stage: opt_str(items, k.stage, s)?,
            name: opt_str(items, k.name, s)?,
        })
    })
}

/// The top-level value, a snapshot dict (or the oldest format's list of segments);
/// `stream_bytes` bounds how many records it may stand for. The trace entries move out of
/// the machine into the snapshot.
pub(crate) fn snapshot(
    top: Val,
    m: &mut Machine,
    stream_bytes: u64,
) -> Result<RawSnapshot, DecodeError> {
    let mut s = read_top(top, m, stream_bytes)?;
    s.entries = std::mem::take(&mut m.entries);
    Ok(s)
}

fn read_top(top: Val, m: &Machine, stream_bytes: u64) -> Result<RawSnapshot, DecodeError> {
    let mut budget = Budget(stream_bytes);
    let mut s = RawSnapshot::default();
    let k = &m.keys;
    match top {
        Val::List(_) | Val::Tuple(_) => {
            s.segments = segments(top, m, &mut budget)?;
            s.recognised = true;
        }
        Val::Dict(d) => {
            let Container::Dict(items) = m.container(d) else {
                return Ok(s);
            };
            if let Some(v) = get(items, k.segments) {
                s.segments = segments(v, m, &mut budget)?;
                s.recognised = true;
            }
            if let Some(v) = get(items, k.device_traces) {
                let devices = list_items(v, "'device_traces'", m)?;
                budget.take(devices.len())?;
                s.device_traces = devices
                    .iter()
                    .map(|&t| trace(t, m, &mut budget))
                    .collect::<Result<_, _>>()?;
                s.recognised = true;
            }
            if let Some(v) = get(items, k.external_annotations) {
                let list = list_items(v, "'external_annotations'", m)?;
                budget.take(list.len())?;
                s.annotations = list
                    .iter()
                    .map(|&a| annotation(a, m))
                    .collect::<Result<_, _>>()?;
            }
            if let Some(v) = get(items, k.allocator_settings) {
                s.expandable_segments = match v {
                    Val::None => false,
                    v => with_items(v, "'allocator_settings'", m, |items| {
                        Ok(matches!(
                            get(items, k.expandable_segments),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trace_entrys_keys_are_the_first_interned_in_entrys_order() {
        let mut strings = Strings::default();
        let k = Keys::intern(&mut strings);
        let ids: Vec<usize> = [
            k.action,
            k.addr,
            k.size,
            k.time_us,
            k.device_free,
            k.category,
            k.frames,
        ]
        .iter()
        .map(|key| key.id.index())
        .collect();
        assert_eq!(ids, (0..ENTRY_KEYS).collect::<Vec<_>>());
        assert!(k.filename.id.index() >= ENTRY_KEYS);
    }
}
