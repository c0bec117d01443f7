//! The pickle machine for the plain data a memory snapshot is made of: the opcodes
//! `guard::check` lets through (dicts, lists, tuples, strings, numbers, the memo), nothing that
//! names or runs Python code. It runs after the guard, on a stream the guard accepted.
//!
//! Why not serde-pickle's decoder (its encoder still writes the exports): it decodes the whole
//! pickle into its own value tree before any `Deserialize` code runs (7.8× the file for a
//! 10⁶-entry trace), and it counts references to memoized values by their occurrences in the
//! stream rather than by how often a shared container is visited, so the frame dicts PyTorch
//! shares between stacks came back as `None` after their first uses (most op and tensor names
//! of a real snapshot were lost). Here containers live in one arena and values name them by
//! index, so the memo shares them (and a container that contains itself is no leak), strings
//! are interned, and each trace entry and stack frame becomes a compact struct the moment it
//! is appended to its list, so the decoded snapshot takes a fraction of the file's size.

use std::collections::HashMap;
use std::io::Read;
use std::rc::Rc;

use super::input::{Input, InputError};
use super::raw::{self, Frame, Keys, RawEntry, TopFrames};

/// A decoding failure, as the text after "not a PyTorch memory snapshot: " or a whole line.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum DecodeError {
    Truncated,
    Io(String),
    /// The stream is a pickle, but not of a memory snapshot (wrong types, missing keys).
    Shape(String),
    /// A pickle the guard let through but this machine cannot build (bad stack use).
    Malformed(&'static str, u64),
    /// Decoding would take more memory than the reader allows for a file of this size.
    OverBudget(MemoryBudget, u64),
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecodeError::Truncated => write!(f, "truncated pickle: it ends before its STOP"),
            DecodeError::Io(e) => write!(f, "{e}"),
            DecodeError::Shape(what) => write!(f, "not a PyTorch memory snapshot: {what}"),
            DecodeError::Malformed(what, at) => {
                write!(f, "not a valid pickle: {what} at byte {at}")
            }
            DecodeError::OverBudget(b, at) => write!(
                f,
                "refused at byte {at}: decoding it would take more than {} bytes of memory ({READ_MULTIPLE}x the file's {} bytes + {} MiB), the most the reader takes for a file this size; a PyTorch snapshot decodes to a fraction of its size",
                b.limit,
                b.file_bytes,
                READ_BASE_BYTES >> 20
            ),
        }
    }
}

/// The reader's memory bound: the decoded values and the event log built from them take at
/// most `READ_MULTIPLE` × the file's size + `READ_BASE_BYTES` (counted in heap bytes of what
/// is kept; vectors' growth slack comes on top, at most as much again). A real snapshot
/// decodes to a fraction of its size, a hostile one (a file of empty dicts, memo ids far
/// apart, one small entry repeated through the memo) is refused when it reaches the bound.
pub(crate) const READ_MULTIPLE: u64 = 16;
pub(crate) const READ_BASE_BYTES: u64 = 64 << 20;

/// Heap bytes charged against the reader's bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MemoryBudget {
    pub(crate) used: u64,
    pub(crate) limit: u64,
    pub(crate) file_bytes: u64,
}

impl MemoryBudget {
    pub(crate) fn for_file(file_bytes: u64) -> Self {
        MemoryBudget {
            used: 0,
            limit: file_bytes
                .saturating_mul(READ_MULTIPLE)
                .saturating_add(READ_BASE_BYTES),
            file_bytes,
        }
    }

    /// Takes `bytes` more; an error past the bound (`at`: the byte of the file reached).
    pub(crate) fn charge(&mut self, bytes: u64, at: u64) -> Result<(), DecodeError> {
        self.used = self.used.saturating_add(bytes);
        if self.used > self.limit {
            return Err(DecodeError::OverBudget(*self, at));
        }
        Ok(())
    }

    fn credit(&mut self, bytes: u64) {
        self.used = self.used.saturating_sub(bytes);
    }
}

/// Heap bytes of one value slot (on the stack, in a list, half a dict item).
const VAL_BYTES: u64 = std::mem::size_of::<Val>() as u64;
/// A container's own allocation: its slot in the arena and its Vec's header and slack.
const CONTAINER_BYTES: u64 = 64;
/// A sparse memo entry or an interned string's map slot and header.
const ENTRY_BYTES: u64 = 48;

pub(crate) fn shape(what: impl Into<String>) -> DecodeError {
    DecodeError::Shape(what.into())
}

/// An interned string: its index in `Strings`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct StrId(u32);

impl StrId {
    pub(crate) fn index(self) -> usize {
        self.0 as usize
    }
}

/// A container: its index in the machine's arena.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ContainerId(u32);

/// A decoded value. Containers are named by their index in the arena, so the memo shares
/// them (as the pickle does) and copying a value copies 16 bytes.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Val {
    None,
    Bool(bool),
    Int(i64),
    /// An integer outside the i64 range (no snapshot field holds one).
    BigInt,
    /// Floats are never used by a snapshot's fields read here.
    Float,
    Str(StrId),
    /// Bytes are never used by a snapshot: only their presence is kept.
    Bytes,
    List(ContainerId),
    Tuple(ContainerId),
    Dict(ContainerId),
}

/// A container's contents: a list's or tuple's items, a dict's items while it is built, then,
/// once appended to a list, the compact form of a trace entry or a stack frame when it is one.
#[derive(Debug)]
pub(crate) enum Container {
    /// `stack`: when the list is a stack of frames already read, 1 + the index of its top
    /// frames in `Machine::stacks` (0 before), so the entries sharing it find them at once.
    Items {
        items: Vec<Val>,
        stack: u32,
    },
    Dict(Vec<(Val, Val)>),
    /// Its index in `Machine::entries`.
    Entry(u32),
    Frame(Rc<Frame>),
}

impl Container {
    fn items(items: Vec<Val>) -> Container {
        Container::Items { items, stack: 0 }
    }
}

impl Val {
    /// What the value is, in Python's words, for messages.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Val::None => "None",
            Val::Bool(_) => "a bool",
            Val::Int(_) | Val::BigInt => "an integer",
            Val::Float => "a float",
            Val::Str(_) => "a string",
            Val::Bytes => "bytes",
            Val::List(_) => "a list",
            Val::Tuple(_) => "a tuple",
            Val::Dict(_) => "a dict",
        }
    }
}

/// The strings of the pickle, each kept once.
#[derive(Default)]
pub(crate) struct Strings {
    all: Vec<Rc<str>>,
    ids: HashMap<Rc<str>, StrId>,
}

impl Strings {
    /// The id of `s`, and whether it is new.
    pub(crate) fn intern(&mut self, s: &str) -> (StrId, bool) {
        if let Some(&id) = self.ids.get(s) {
            return (id, false);
        }
        let id = StrId(self.all.len() as u32);
        let rc: Rc<str> = Rc::from(s);
        self.all.push(rc.clone());
        self.ids.insert(rc, id);
        (id, true)
    }

    pub(crate) fn get(&self, id: StrId) -> &Rc<str> {
        &self.all[id.0 as usize]
    }
}

/// A text argument up to its newline (protocol 0 opcodes), at most 4 KiB.
fn text_line(r: &mut Input<impl Read>) -> Result<Vec<u8>, DecodeError> {
    r.line(4096)?
        .ok_or(DecodeError::Malformed("text argument too long", r.pos()))
}

impl From<InputError> for DecodeError {
    fn from(e: InputError) -> Self {
        match e {
            InputError::Truncated(_) => DecodeError::Truncated,
            InputError::Io(e) => DecodeError::Io(e),
        }
    }
}

/// Spare items vectors kept (`Machine::spare_items`), and the most items one may hold: 512
/// KiB at most outside the budget.
const SPARE_VECTORS: usize = 1024;
const SPARE_MAX_ITEMS: usize = 16;

/// The pickle machine's state.
pub(crate) struct Machine {
    stack: Vec<Val>,
    marks: Vec<usize>,
    memo: Vec<Option<Val>>,
    memo_sparse: HashMap<u32, Val>,
    memo_count: usize,
    /// Every container made, by `ContainerId`. Nothing is freed before the machine is: the
    /// budget charges a container when it is made, whether or not it is kept.
    containers: Vec<Container>,
    pub(crate) strings: Strings,
    /// The ids of the keys a snapshot's dicts have.
    pub(crate) keys: Keys,
    /// The trace entries, by their index in `Container::Entry`.
    pub(crate) entries: Vec<RawEntry>,
    /// Top frames of the stacks (frame lists) read so far, each once.
    stacks: Vec<Rc<TopFrames>>,
    /// Items vectors of sealed dicts, emptied, for the next dicts to fill: a trace is a
    /// million dicts of the same few keys, each read once and then sealed (a list's worth at
    /// a time, as pickle appends in batches of 1000).
    spare_items: Vec<Vec<(Val, Val)>>,
    pub(crate) budget: MemoryBudget,
    /// The byte of the file the machine is at when it seals dicts (for the budget's message).
    at: u64,
}

impl Machine {
    fn new(budget: MemoryBudget) -> Self {
        let mut strings = Strings::default();
        let keys = Keys::intern(&mut strings);
        Machine {
            budget,
            at: 0,
            stack: Vec::with_capacity(64),
            marks: Vec::new(),
            memo: Vec::new(),
            memo_sparse: HashMap::new(),
            memo_count: 0,
            containers: Vec::new(),
            strings,
            keys,
            entries: Vec::new(),
            stacks: Vec::new(),
            spare_items: Vec::new(),
        }
    }

    /// A container's contents.
    pub(crate) fn container(&self, id: ContainerId) -> &Container {
        &self.containers[id.0 as usize]
    }

    /// A new container, charged for its own allocation (besides its slot on the stack).
    fn make(&mut self, c: Container, at: u64) -> Result<ContainerId, DecodeError> {
        self.budget.charge(CONTAINER_BYTES, at)?;
        let id = u32::try_from(self.containers.len())
            .map_err(|_| DecodeError::Malformed("more than 2^32 containers", at))?;
        self.containers.push(c);
        Ok(ContainerId(id))
    }

    fn pop(&mut self, at: u64) -> Result<Val, DecodeError> {
        if self.marks.last().is_some_and(|&m| m >= self.stack.len()) {
            return Err(DecodeError::Malformed("stack underflow", at));
        }
        self.stack
            .pop()
            .ok_or(DecodeError::Malformed("stack underflow", at))
    }

    fn pop_mark(&mut self, at: u64) -> Result<Vec<Val>, DecodeError> {
        let m = self.take_mark(at)?;
        Ok(self.stack.split_off(m))
    }

    fn take_mark(&mut self, at: u64) -> Result<usize, DecodeError> {
        self.marks
            .pop()
            .ok_or(DecodeError::Malformed("no MARK", at))
    }

    /// The value under the items from stack index `m` on (what APPENDS and SETITEMS add to).
    fn below(&self, m: usize, at: u64) -> Result<Val, DecodeError> {
        if m == 0 || self.marks.last().is_some_and(|&k| k >= m) {
            return Err(DecodeError::Malformed("stack underflow", at));
        }
        Ok(self.stack[m - 1])
    }

    fn top(&self, at: u64) -> Result<Val, DecodeError> {
        self.below(self.stack.len(), at)
    }

    fn string(&mut self, bytes: &[u8], at: u64) -> Result<Val, DecodeError> {
        let s = std::str::from_utf8(bytes)
            .map_err(|_| DecodeError::Malformed("a string that is not UTF-8", at))?;
        let (id, new) = self.strings.intern(s);
        if new {
            self.budget.charge(s.len() as u64 + ENTRY_BYTES, at)?;
        }
        Ok(Val::Str(id))
    }

    fn memoize(&mut self, id: u32, at: u64) -> Result<(), DecodeError> {
        let v = self.top(at)?;
        let i = id as usize;
        // Dense only while ids come in order (as pickle writes them): ids far apart go to
        // the sparse map, so memory follows the entries stored, never the largest id.
        let replaced = if i < self.memo.len() {
            self.memo[i].replace(v)
        } else if i <= self.memo.len() + 16 {
            self.budget
                .charge((i + 1 - self.memo.len()) as u64 * VAL_BYTES, at)?;
            self.memo.resize(i, None);
            self.memo.push(Some(v));
            None
        } else {
            let old = self.memo_sparse.insert(id, v);
            if old.is_none() {
                self.budget.charge(ENTRY_BYTES + VAL_BYTES, at)?;
            }
            old
        };
        if replaced.is_none() {
            self.memo_count += 1;
        }
        Ok(())
    }

    #[inline]
    fn get(&mut self, id: u32, at: u64) -> Result<(), DecodeError> {
        let v = match self.memo.get(id as usize) {
            Some(Some(v)) => *v,
            _ => *self
                .memo_sparse
                .get(&id)
                .ok_or(DecodeError::Malformed("memo key never stored", at))?,
        };
        self.stack.push(v);
        Ok(())
    }

    /// The value a list receives: a dict that is a trace entry or a stack frame becomes its
    /// compact form (in place, so the memo's reference sees it too).
    fn seal(&mut self, v: Val) -> Result<(), DecodeError> {
        let Val::Dict(d) = v else {
            return Ok(());
        };
        let Container::Dict(items) = &self.containers[d.0 as usize] else {
            return Ok(());
        };
        let k = &self.keys;
        let is = |key: &Val, want: raw::Key| matches!(key, Val::Str(s) if *s == want.id);
        let entry = items.iter().any(|(key, _)| is(key, k.action));
        let frame = !entry
            && !items.is_empty()
            && items
                .iter()
                .all(|(key, _)| is(key, k.filename) || is(key, k.name) || is(key, k.line));
        if !entry && !frame {
            return Ok(());
        }
        let items_bytes = items.len() as u64 * 2 * VAL_BYTES;
        // Taken out while it is read: a frame list that holds the entry itself finds a
        // trace entry, not a dict being read.
        let placeholder = Container::Entry(u32::MAX);
        let Container::Dict(mut items) =
            std::mem::replace(&mut self.containers[d.0 as usize], placeholder)
        else {
            unreachable!("matched above");
        };
        self.budget.credit(items_bytes);
        if entry {
            self.budget
                .charge(std::mem::size_of::<RawEntry>() as u64 + 16, self.at)?;
            let e = raw::entry(&items, self)?;
            let index = self.entries.len() as u32;
            self.entries.push(e);
            self.containers[d.0 as usize] = Container::Entry(index);
        } else {
            self.budget
                .charge(std::mem::size_of::<Frame>() as u64 + 16, self.at)?;
            let f = raw::frame(&items, self)?;
            self.containers[d.0 as usize] = Container::Frame(Rc::new(f));
        }
        // Kept when small, and only so many: the budget no longer counts them.
        if items.capacity() <= SPARE_MAX_ITEMS && self.spare_items.len() < SPARE_VECTORS {
            items.clear();
            self.spare_items.push(items);
        }
        Ok(())
    }

    /// The top frames of a stack (a frame list or tuple), shared by every entry with the
    /// same one.
    pub(crate) fn top_frames_of(&mut self, id: ContainerId) -> Result<Rc<TopFrames>, DecodeError> {
        let Container::Items { items, stack } = self.container(id) else {
            unreachable!("lists and tuples hold items");
        };
        if *stack > 0 {
            return Ok(self.stacks[*stack as usize - 1].clone());
        }
        let t = Rc::new(raw::top_frames(items, self)?);
        self.budget.charge(CONTAINER_BYTES + ENTRY_BYTES, self.at)?;
        self.stacks.push(t.clone());
        let index = self.stacks.len() as u32;
        if let Container::Items { stack, .. } = &mut self.containers[id.0 as usize] {
            *stack = index;
        }
        Ok(t)
    }

    /// APPEND and APPENDS: the stack's values from index `m` on go to the list under them.
    fn append_from(&mut self, m: usize, at: u64) -> Result<(), DecodeError> {
        self.at = at;
        for i in m..self.stack.len() {
            self.seal(self.stack[i])?;
        }
        match self.below(m, at)? {
            Val::List(l) => {
                let Container::Items { items, .. } = &mut self.containers[l.0 as usize] else {
                    unreachable!("lists hold items");
                };
                items.extend_from_slice(&self.stack[m..]);
                self.stack.truncate(m);
                Ok(())
            }
            other => Err(shape(format!(
                "APPEND to {}, which is not a list",
                other.kind()
            ))),
        }
    }

    /// SETITEM and SETITEMS: the stack's keys and values from index `m` on go to the dict
    /// under them.
    fn set_items_from(&mut self, m: usize, at: u64) -> Result<(), DecodeError> {
        if !(self.stack.len() - m).is_multiple_of(2) {
            return Err(DecodeError::Malformed(
                "SETITEMS with an odd number of items",
                at,
            ));
        }
        match self.below(m, at)? {
            Val::Dict(d) => {
                let Container::Dict(pairs) = &mut self.containers[d.0 as usize] else {
                    return Err(shape(
                        "a trace entry or frame dict is changed after it was used",
                    ));
                };
                let items = &self.stack[m..];
                let n = items.len() / 2;
                // The spare vector only where it fits with at most as much again to spare
                // (the slack the budget allows for).
                if pairs.capacity() == 0 {
                    let fits = |v: &Vec<(Val, Val)>| (n..=2 * n).contains(&v.capacity());
                    if self.spare_items.last().is_some_and(fits) {
                        *pairs = self.spare_items.pop().expect("checked");
                    }
                }
                pairs.reserve_exact(n);
                pairs.extend(items.chunks_exact(2).map(|kv| (kv[0], kv[1])));
                self.stack.truncate(m);
                Ok(())
            }
            other => Err(shape(format!(
                "SETITEM on {}, which is not a dict",
                other.kind()
            ))),
        }
    }

    fn int_from_le(bytes: &[u8]) -> Val {
        if bytes.is_empty() {
            return Val::Int(0);
        }
        let negative = bytes[bytes.len() - 1] & 0x80 != 0;
        if bytes.len() > 8 {
            // Fits only if every byte past the 8th is sign extension.
            let ext = if negative { 0xff } else { 0 };
            if bytes[8..].iter().any(|&b| b != ext) || ((bytes[7] & 0x80 != 0) != negative) {
                return Val::BigInt;
            }
        }
        let mut b = [if negative { 0xff } else { 0 }; 8];
        let n = bytes.len().min(8);
        b[..n].copy_from_slice(&bytes[..n]);
        Val::Int(i64::from_le_bytes(b))
    }

    fn text_int(line: &[u8], at: u64) -> Result<Val, DecodeError> {
        let s = std::str::from_utf8(line)
            .ok()
            .map(|s| s.trim_end_matches('L'))
            .ok_or(DecodeError::Malformed(
                "a text integer that is not ASCII",
                at,
            ))?;
        match s {
            "01" => return Ok(Val::Bool(true)),
            "00" => return Ok(Val::Bool(false)),
            _ => {}
        }
        match s.parse::<i64>() {
            Ok(i) => Ok(Val::Int(i)),
            Err(_)
                if !s.is_empty()
                    && s.trim_start_matches('-')
                        .bytes()
                        .all(|b| b.is_ascii_digit()) =>
            {
                Ok(Val::BigInt)
            }
            Err(_) => Err(DecodeError::Malformed(
                "a text integer that is not a number",
                at,
            )),
        }
    }

    fn run(&mut self, r: &mut Input<impl Read>) -> Result<Val, DecodeError> {
        loop {
            let at = r.pos();
            let op = r.byte()?;
            let depth = self.stack.len();
            self.step(op, at, r)?;
            if op == b'.' {
                return self
                    .stack
                    .pop()
                    .ok_or(DecodeError::Malformed("stack underflow", at));
            }
            // Every value pushed takes a slot, on the stack and then in its container.
            if self.stack.len() > depth {
                self.budget
                    .charge((self.stack.len() - depth) as u64 * VAL_BYTES, at)?;
            }
        }
    }

    /// One opcode.
    fn step(&mut self, op: u8, at: u64, r: &mut Input<impl Read>) -> Result<(), DecodeError> {
        {
            match op {
                b'.' => {
                    let v = self.pop(at)?;
                    self.stack.push(v);
                }
                0x80 => {
                    r.byte()?;
                }
                0x95 => {
                    r.u64_le()?;
                }
                b'(' => self.marks.push(self.stack.len()),
                b'0' => {
                    if self.marks.last() == Some(&self.stack.len()) {
                        self.marks.pop();
                    } else {
                        self.pop(at)?;
                    }
                }
                b'1' => {
                    self.pop_mark(at)?;
                }
                b'2' => {
                    let v = self.top(at)?;
                    self.stack.push(v);
                }
                b'N' => self.stack.push(Val::None),
                0x88 => self.stack.push(Val::Bool(true)),
                0x89 => self.stack.push(Val::Bool(false)),
                b'K' => {
                    let v = r.byte()? as i64;
                    self.stack.push(Val::Int(v));
                }
                b'M' => {
                    let v = r.u16_le()? as i64;
                    self.stack.push(Val::Int(v));
                }
                b'J' => {
                    let v = r.u32_le()? as i32 as i64;
                    self.stack.push(Val::Int(v));
                }
                b'G' => {
                    r.skip(8)?;
                    self.stack.push(Val::Float);
                }
                0x8a => {
                    let n = r.byte()? as u64;
                    let b = r.bytes(n)?;
                    self.stack.push(Self::int_from_le(b));
                }
                0x8b => {
                    let n = r.u32_le()? as i32;
                    if n < 0 {
                        return Err(DecodeError::Malformed("negative length", at));
                    }
                    let b = r.bytes(n as u64)?;
                    self.stack.push(Self::int_from_le(b));
                }
                b'I' | b'L' => {
                    let line = text_line(r)?;
                    self.stack.push(Self::text_int(&line, at)?);
                }
                b'F' => {
                    let line = text_line(r)?;
                    std::str::from_utf8(&line)
                        .ok()
                        .and_then(|s| s.parse::<f64>().ok())
                        .ok_or(DecodeError::Malformed(
                            "a text float that is not a number",
                            at,
                        ))?;
                    self.stack.push(Val::Float);
                }
                b'S' | b'V' => {
                    return Err(DecodeError::Malformed(
                        "text-encoded strings (pickle protocol 0) are not supported",
                        at,
                    ))
                }
                0x8c => {
                    let n = r.byte()? as u64;
                    let b = r.bytes(n)?;
                    let v = self.string(b, at)?;
                    self.stack.push(v);
                }
                b'X' => {
                    let n = r.u32_le()? as u64;
                    let b = r.bytes(n)?;
                    let v = self.string(b, at)?;
                    self.stack.push(v);
                }
                0x8d => {
                    let n = r.u64_le()?;
                    let b = r.bytes(n)?;
                    let v = self.string(b, at)?;
                    self.stack.push(v);
                }
                b'U' | b'C' => {
                    let n = r.byte()? as u64;
                    r.skip(n)?;
                    self.stack.push(Val::Bytes);
                }
                b'T' | b'B' => {
                    let n = r.u32_le()? as u64;
                    r.skip(n)?;
                    self.stack.push(Val::Bytes);
                }
                0x8e | 0x96 => {
                    let n = r.u64_le()?;
                    r.skip(n)?;
                    self.stack.push(Val::Bytes);
                }
                b'}' => {
                    let d = self.make(Container::Dict(Vec::new()), at)?;
                    self.stack.push(Val::Dict(d));
                }
                // Sets are not part of a snapshot; kept as lists, so a set where a list is
                // expected is read like one and anything else is a type error.
                b']' | 0x8f => {
                    let l = self.make(Container::items(Vec::new()), at)?;
                    self.stack.push(Val::List(l));
                }
                b')' => {
                    let t = self.make(Container::items(Vec::new()), at)?;
                    self.stack.push(Val::Tuple(t));
                }
                b'l' | 0x91 => {
                    self.at = at;
                    let items = self.pop_mark(at)?;
                    for &v in &items {
                        self.seal(v)?;
                    }
                    let l = self.make(Container::items(items), at)?;
                    self.stack.push(Val::List(l));
                }
                b't' => {
                    let items = self.pop_mark(at)?;
                    let t = self.make(Container::items(items), at)?;
                    self.stack.push(Val::Tuple(t));
                }
                b'd' => {
                    let items = self.pop_mark(at)?;
                    if !items.len().is_multiple_of(2) {
                        return Err(DecodeError::Malformed(
                            "DICT with an odd number of items",
                            at,
                        ));
                    }
                    let pairs = items.chunks_exact(2).map(|kv| (kv[0], kv[1])).collect();
                    let d = self.make(Container::Dict(pairs), at)?;
                    self.stack.push(Val::Dict(d));
                }
                0x85..=0x87 => {
                    let n = (op - 0x84) as usize;
                    let mut items = Vec::with_capacity(n);
                    for _ in 0..n {
                        items.push(self.pop(at)?);
                    }
                    items.reverse();
                    let t = self.make(Container::items(items), at)?;
                    self.stack.push(Val::Tuple(t));
                }
                b'a' => {
                    let v = self.pop(at)?;
                    self.stack.push(v);
                    self.append_from(self.stack.len() - 1, at)?;
                }
                b'e' | 0x90 => {
                    let m = self.take_mark(at)?;
                    self.append_from(m, at)?;
                }
                b's' => {
                    let v = self.pop(at)?;
                    let k = self.pop(at)?;
                    self.stack.extend([k, v]);
                    self.set_items_from(self.stack.len() - 2, at)?;
                }
                b'u' => {
                    let m = self.take_mark(at)?;
                    self.set_items_from(m, at)?;
                }
                // A text memo key can never be read back (text GET is refused by the guard).
                b'p' => {
                    text_line(r)?;
                }
                b'q' => {
                    let id = r.byte()? as u32;
                    self.memoize(id, at)?;
                }
                b'r' => {
                    let id = r.u32_le()?;
                    self.memoize(id, at)?;
                }
                0x94 => {
                    let id = u32::try_from(self.memo_count)
                        .map_err(|_| DecodeError::Malformed("memo full", at))?;
                    self.memoize(id, at)?;
                }
                b'h' => {
                    let id = r.byte()? as u32;
                    self.get(id, at)?;
                }
                b'j' => {
                    let id = r.u32_le()?;
                    self.get(id, at)?;
                }
                // Everything else was refused by the guard before this machine ran.
                _ => return Err(DecodeError::Malformed("an opcode the guard refuses", at)),
            }
        }
        Ok(())
    }
}

/// Decodes one pickle (already checked by `guard::check`) into a snapshot, within the
/// memory bound of a file of `file_bytes`; the budget comes back with what the snapshot
/// holds charged, for the replay to go on charging.
pub(crate) fn decode(
    reader: impl Read,
    file_bytes: u64,
) -> Result<(raw::RawSnapshot, MemoryBudget), DecodeError> {
    let mut input = Input::new(reader);
    let mut m = Machine::new(MemoryBudget::for_file(file_bytes));
    let top = m.run(&mut input)?;
    m.stack.clear();
    let snapshot = raw::snapshot(top, &mut m, input.pos())?;
    let budget = m.budget;
    drop(m);
    Ok((snapshot, budget))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long1_integers_keep_their_sign_and_more_than_64_bits_are_too_large() {
        assert!(matches!(
            Machine::int_from_le(&[0x00, 0x10]),
            Val::Int(4096)
        ));
        assert!(matches!(Machine::int_from_le(&[0xff]), Val::Int(-1)));
        assert!(matches!(
            Machine::int_from_le(&[0, 0, 0, 0, 0, 0, 0, 0x80, 0xff]),
            Val::Int(i64::MIN)
        ));
        assert!(matches!(
            Machine::int_from_le(&[0, 0, 0, 0, 0, 0, 0, 0, 1]),
            Val::BigInt
        ));
        // 2^64 - 1 needs a ninth byte for its sign: larger than any i64.
        assert!(matches!(
            Machine::int_from_le(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0]),
            Val::BigInt
        ));
    }

    /// `pickle.dumps` (protocol 4) of a trace whose frees share their stacks with the allocs,
    /// and whose frame dict `f` is shared between the two stacks, as PyTorch's pickles do.
    const SHARED: &[u8] = b"\x80\x04\x95\xe7\x00\x00\x00\x00\x00\x00\x00}\x94\x8c\rdevice_traces\x94]\x94]\x94(}\x94(\x8c\x06action\x94\x8c\x05alloc\x94\x8c\x04addr\x94K\x00\x8c\x04size\x94M\x00\x02\x8c\x06frames\x94]\x94}\x94(\x8c\x08filename\x94\x8c\x04a.py\x94\x8c\x04line\x94K\x03\x8c\x04name\x94\x8c\x03fwd\x94uau}\x94(h\x05h\x06h\x07M\x00\x02h\x08M\x00\x02h\t]\x94(}\x94(h\x0c\x8c\x04b.py\x94h\x0eK\x07h\x0f\x8c\x02mm\x94uh\x0beu}\x94(h\x05\x8c\x0efree_requested\x94h\x07K\x00h\x08M\x00\x02h\th\nu}\x94(h\x05h\x17h\x07M\x00\x02h\x08M\x00\x02h\th\x12ueas.";

    #[test]
    fn frames_shared_through_the_memo_reach_every_entry() {
        let (s, _) = decode(SHARED, SHARED.len() as u64).unwrap();
        let t: Vec<&RawEntry> = s.device_traces[0]
            .iter()
            .map(|&i| &s.entries[i as usize])
            .collect();
        type Named<'a> = (&'a str, Vec<(&'a str, &'a str, i64)>);
        let top: Vec<Named> = t
            .iter()
            .map(|e| {
                let frames = e
                    .frames
                    .0
                    .iter()
                    .map(|f| (&*f.name, &*f.filename, f.line))
                    .collect();
                (&*e.action, frames)
            })
            .collect();
        let f = ("fwd", "a.py", 3);
        let g = ("mm", "b.py", 7);
        assert_eq!(
            top,
            [
                ("alloc", vec![f]),
                ("alloc", vec![g, f]),
                ("free_requested", vec![f]),
                ("free_requested", vec![g, f]),
            ]
        );
        // The shared stack is one value, not a copy per entry.
        assert!(Rc::ptr_eq(&t[0].frames, &t[2].frames));
        assert_eq!((t[1].addr, t[1].size), (Some(512), 512));
    }

    #[test]
    fn a_list_that_contains_itself_is_a_shape_error() {
        // l = []; l.append(l); {'segments': l}
        let bytes = b"\x80\x04}\x94\x8c\x08segments\x94]\x94h\x02as.";
        let e = decode(&bytes[..], bytes.len() as u64).unwrap_err();
        assert_eq!(
            e.to_string(),
            "not a PyTorch memory snapshot: a segment is a list, expected a dict"
        );
    }

    #[test]
    fn a_stream_that_ends_early_is_truncated() {
        assert_eq!(
            decode(&SHARED[..100], 100).unwrap_err(),
            DecodeError::Truncated
        );
    }
}
