//! The pickle machine for the plain data a memory snapshot is made of: the opcodes
//! `guard::check` lets through (dicts, lists, tuples, strings, numbers, the memo), nothing that
//! names or runs Python code. It runs after the guard, on a stream the guard accepted.
//!
//! Why not serde-pickle's decoder (its encoder still writes the exports): it decodes the whole
//! pickle into its own value tree before any `Deserialize` code runs (7.8× the file for a
//! 10⁶-entry trace), and it counts references to memoized values by their occurrences in the
//! stream rather than by how often a shared container is visited, so the frame dicts PyTorch
//! shares between stacks came back as `None` after their first uses (most op and tensor names
//! of a real snapshot were lost). Here memoized values are shared (`Rc`), strings are
//! interned, and each trace entry and stack frame becomes a compact struct the moment it is
//! appended to its list, so the decoded snapshot takes a fraction of the file's size.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::io::Read;
use std::rc::Rc;

use super::raw::{self, Frame, RawEntry};

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
/// A container's own allocation: reference counts, the RefCell and the Vec header.
const CONTAINER_BYTES: u64 = 64;
/// A sparse memo entry or an interned string's set slot and header.
const ENTRY_BYTES: u64 = 48;

pub(crate) fn shape(what: impl Into<String>) -> DecodeError {
    DecodeError::Shape(what.into())
}

/// A decoded value. Containers are shared, as the pickle's memo shares them.
#[derive(Clone, Debug)]
pub(crate) enum Val {
    None,
    Bool(bool),
    Int(i64),
    /// An integer outside the i64 range (no snapshot field holds one).
    BigInt,
    /// Floats are never used by a snapshot's fields read here.
    Float,
    Str(Rc<str>),
    /// Bytes are never used by a snapshot: only their presence is kept.
    Bytes,
    List(Rc<RefCell<Vec<Val>>>),
    Tuple(Rc<[Val]>),
    Dict(Rc<RefCell<Dict>>),
}

/// A dict's contents: its items while it is built, then, once appended to a list, the
/// compact form of a trace entry or a stack frame when it is one.
#[derive(Debug)]
pub(crate) enum Dict {
    Items(Vec<(Val, Val)>),
    Entry(Rc<RawEntry>),
    Frame(Rc<Frame>),
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

    fn is_container(&self) -> bool {
        matches!(self, Val::List(_) | Val::Dict(_))
    }
}

struct Input<R> {
    inner: R,
    pos: u64,
}

impl<R: Read> Input<R> {
    fn fill(&mut self, buf: &mut [u8]) -> Result<(), DecodeError> {
        self.inner.read_exact(buf).map_err(|e| match e.kind() {
            std::io::ErrorKind::UnexpectedEof => DecodeError::Truncated,
            _ => DecodeError::Io(e.to_string()),
        })?;
        self.pos += buf.len() as u64;
        Ok(())
    }

    fn byte(&mut self) -> Result<u8, DecodeError> {
        let mut b = [0u8; 1];
        self.fill(&mut b)?;
        Ok(b[0])
    }

    fn le(&mut self, n: usize) -> Result<u64, DecodeError> {
        let mut b = [0u8; 8];
        self.fill(&mut b[..n])?;
        Ok(u64::from_le_bytes(b))
    }

    /// `n` bytes, read in pieces so a length field larger than the file allocates nothing.
    fn bytes(&mut self, n: u64) -> Result<Vec<u8>, DecodeError> {
        let mut v = Vec::new();
        let got = (&mut self.inner)
            .take(n)
            .read_to_end(&mut v)
            .map_err(|e| DecodeError::Io(e.to_string()))?;
        self.pos += got as u64;
        if (got as u64) < n {
            return Err(DecodeError::Truncated);
        }
        Ok(v)
    }

    fn skip(&mut self, n: u64) -> Result<(), DecodeError> {
        let got = std::io::copy(&mut (&mut self.inner).take(n), &mut std::io::sink())
            .map_err(|e| DecodeError::Io(e.to_string()))?;
        self.pos += got;
        if got < n {
            return Err(DecodeError::Truncated);
        }
        Ok(())
    }

    /// A text argument up to its newline (protocol 0 opcodes), at most 4 KiB.
    fn line(&mut self) -> Result<Vec<u8>, DecodeError> {
        let mut v = Vec::new();
        loop {
            let b = self.byte()?;
            if b == b'\n' {
                return Ok(v);
            }
            if v.len() >= 4096 {
                return Err(DecodeError::Malformed("text argument too long", self.pos));
            }
            v.push(b);
        }
    }
}

/// The pickle machine's state.
pub(crate) struct Machine {
    stack: Vec<Val>,
    marks: Vec<usize>,
    memo: Vec<Option<Val>>,
    memo_sparse: HashMap<u32, Val>,
    memo_count: usize,
    /// Containers put on the stack twice by DUP: like memoized ones, they could be made into
    /// a cycle, so they are emptied at the end (see `Drop`).
    duplicated: Vec<Val>,
    strings: HashSet<Rc<str>>,
    /// Top frames of stacks (frame lists) shared between entries, computed once.
    top_frames: HashMap<usize, (Val, Rc<raw::TopFrames>)>,
    pub(crate) budget: MemoryBudget,
    /// The byte of the file the machine is at (for the budget's message).
    at: u64,
}

impl Drop for Machine {
    /// A hostile pickle can make containers that contain themselves (through the memo or
    /// DUP), which reference counting never frees, and chains of them deeper than the guard
    /// sees, which a recursive drop would overflow the stack on. Every such container went
    /// through the memo or DUP, so emptying those one by one, without recursion, breaks every
    /// cycle and every deep chain.
    fn drop(&mut self) {
        let memo = std::mem::take(&mut self.memo).into_iter().flatten();
        let sparse = std::mem::take(&mut self.memo_sparse).into_values();
        let dup = std::mem::take(&mut self.duplicated);
        let cached = std::mem::take(&mut self.top_frames)
            .into_values()
            .map(|v| v.0);
        for v in memo.chain(sparse).chain(dup).chain(cached) {
            empty(&v);
        }
    }
}

fn empty(v: &Val) {
    match v {
        Val::List(l) => {
            // Taken out first, then dropped: the borrow ends before children are dropped.
            let items = std::mem::take(&mut *l.borrow_mut());
            drop(items);
        }
        Val::Dict(d) => {
            let body = std::mem::replace(&mut *d.borrow_mut(), Dict::Items(Vec::new()));
            drop(body);
        }
        _ => {}
    }
}

impl Machine {
    fn new(budget: MemoryBudget) -> Self {
        Machine {
            budget,
            at: 0,
            stack: Vec::with_capacity(64),
            marks: Vec::new(),
            memo: Vec::new(),
            memo_sparse: HashMap::new(),
            memo_count: 0,
            duplicated: Vec::new(),
            strings: HashSet::new(),
            top_frames: HashMap::new(),
        }
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
        let m = self
            .marks
            .pop()
            .ok_or(DecodeError::Malformed("no MARK", at))?;
        Ok(self.stack.split_off(m))
    }

    fn top(&self, at: u64) -> Result<&Val, DecodeError> {
        if self.marks.last().is_some_and(|&m| m >= self.stack.len()) {
            return Err(DecodeError::Malformed("stack underflow", at));
        }
        self.stack
            .last()
            .ok_or(DecodeError::Malformed("stack underflow", at))
    }

    fn string(&mut self, bytes: Vec<u8>, at: u64) -> Result<Val, DecodeError> {
        let s = String::from_utf8(bytes)
            .map_err(|_| DecodeError::Malformed("a string that is not UTF-8", at))?;
        if let Some(rc) = self.strings.get(s.as_str()) {
            return Ok(Val::Str(rc.clone()));
        }
        self.budget.charge(s.len() as u64 + ENTRY_BYTES, at)?;
        let rc: Rc<str> = Rc::from(s);
        self.strings.insert(rc.clone());
        Ok(Val::Str(rc))
    }

    fn memoize(&mut self, id: u32, at: u64) -> Result<(), DecodeError> {
        let v = self.top(at)?.clone();
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
        match replaced {
            None => self.memo_count += 1,
            // A container that leaves the memo may still be part of a cycle: it is emptied
            // at the end like the ones still in it.
            Some(old) if old.is_container() => self.duplicated.push(old),
            Some(_) => {}
        }
        Ok(())
    }

    fn get(&mut self, id: u32, at: u64) -> Result<(), DecodeError> {
        let v = match self.memo.get(id as usize) {
            Some(Some(v)) => v.clone(),
            _ => self
                .memo_sparse
                .get(&id)
                .cloned()
                .ok_or(DecodeError::Malformed("memo key never stored", at))?,
        };
        self.stack.push(v);
        Ok(())
    }

    /// The value a list receives: a dict that is a trace entry or a stack frame becomes its
    /// compact form (in place, so the memo's reference sees it too).
    fn seal(&mut self, v: &Val) -> Result<(), DecodeError> {
        let Val::Dict(d) = v else {
            return Ok(());
        };
        let compact = {
            let body = d.borrow();
            let Dict::Items(items) = &*body else {
                return Ok(());
            };
            let items_bytes = items.len() as u64 * 2 * VAL_BYTES;
            let has = |k: &str| {
                items
                    .iter()
                    .any(|(key, _)| matches!(key, Val::Str(s) if &**s == k))
            };
            if has("action") {
                self.budget.credit(items_bytes);
                self.budget
                    .charge(std::mem::size_of::<raw::RawEntry>() as u64 + 16, self.at)?;
                Some(Dict::Entry(Rc::new(raw::entry(items, self)?)))
            } else if !items.is_empty()
                && items.iter().all(|(key, _)| {
                    matches!(key, Val::Str(s) if matches!(&**s, "filename" | "name" | "line"))
                })
            {
                self.budget.credit(items_bytes);
                self.budget
                    .charge(std::mem::size_of::<raw::Frame>() as u64 + 16, self.at)?;
                Some(Dict::Frame(Rc::new(raw::frame(items)?)))
            } else {
                None
            }
        };
        if let Some(c) = compact {
            *d.borrow_mut() = c;
        }
        Ok(())
    }

    /// The top frames of a stack (a frame list), shared by every entry with the same list.
    pub(crate) fn top_frames_of(
        &mut self,
        list: &Rc<RefCell<Vec<Val>>>,
    ) -> Result<Rc<raw::TopFrames>, DecodeError> {
        // Only a list something else holds (the memo) can be met again; caching others would
        // let a freed list's address name a later one.
        let shared = Rc::strong_count(list) > 1;
        let key = Rc::as_ptr(list) as usize;
        if shared {
            if let Some((_, t)) = self.top_frames.get(&key) {
                return Ok(t.clone());
            }
        }
        let t = Rc::new(raw::top_frames(&list.borrow())?);
        if shared {
            self.budget.charge(CONTAINER_BYTES + ENTRY_BYTES, self.at)?;
            self.top_frames
                .insert(key, (Val::List(list.clone()), t.clone()));
        }
        Ok(t)
    }

    fn append(&mut self, items: Vec<Val>, at: u64) -> Result<(), DecodeError> {
        for v in &items {
            self.seal(v)?;
        }
        match self.top(at)? {
            Val::List(l) => {
                l.try_borrow_mut()
                    .map_err(|_| DecodeError::Malformed("a list appended to itself", at))?
                    .extend(items);
                Ok(())
            }
            other => Err(shape(format!(
                "APPEND to {}, which is not a list",
                other.kind()
            ))),
        }
    }

    fn set_items(&mut self, items: Vec<Val>, at: u64) -> Result<(), DecodeError> {
        if !items.len().is_multiple_of(2) {
            return Err(DecodeError::Malformed(
                "SETITEMS with an odd number of items",
                at,
            ));
        }
        match self.top(at)? {
            Val::Dict(d) => {
                let mut body = d
                    .try_borrow_mut()
                    .map_err(|_| DecodeError::Malformed("a dict set into itself", at))?;
                let Dict::Items(pairs) = &mut *body else {
                    return Err(shape(
                        "a trace entry or frame dict is changed after it was used",
                    ));
                };
                let mut it = items.into_iter();
                while let (Some(k), Some(v)) = (it.next(), it.next()) {
                    pairs.push((k, v));
                }
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
            let at = r.pos;
            self.at = at;
            let op = r.byte()?;
            let depth = self.stack.len();
            // A new container's own allocation, besides its slot on the stack.
            if matches!(
                op,
                b'}' | b']' | 0x8f | b')' | b'l' | 0x91 | b't' | b'd' | 0x85..=0x87
            ) {
                self.budget.charge(CONTAINER_BYTES, at)?;
            }
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
                    r.le(8)?;
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
                    let v = self.top(at)?.clone();
                    if v.is_container() {
                        self.budget.charge(VAL_BYTES, at)?;
                        self.duplicated.push(v.clone());
                    }
                    self.stack.push(v);
                }
                b'N' => self.stack.push(Val::None),
                0x88 => self.stack.push(Val::Bool(true)),
                0x89 => self.stack.push(Val::Bool(false)),
                b'K' => {
                    let v = r.le(1)? as i64;
                    self.stack.push(Val::Int(v));
                }
                b'M' => {
                    let v = r.le(2)? as i64;
                    self.stack.push(Val::Int(v));
                }
                b'J' => {
                    let v = r.le(4)? as u32 as i32 as i64;
                    self.stack.push(Val::Int(v));
                }
                b'G' => {
                    let mut b = [0u8; 8];
                    r.fill(&mut b)?;
                    self.stack.push(Val::Float);
                }
                0x8a => {
                    let n = r.le(1)?;
                    let b = r.bytes(n)?;
                    self.stack.push(Self::int_from_le(&b));
                }
                0x8b => {
                    let n = r.le(4)? as u32 as i32;
                    if n < 0 {
                        return Err(DecodeError::Malformed("negative length", at));
                    }
                    let b = r.bytes(n as u64)?;
                    self.stack.push(Self::int_from_le(&b));
                }
                b'I' | b'L' => {
                    let line = r.line()?;
                    self.stack.push(Self::text_int(&line, at)?);
                }
                b'F' => {
                    let line = r.line()?;
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
                    let n = r.le(1)?;
                    let b = r.bytes(n)?;
                    let v = self.string(b, at)?;
                    self.stack.push(v);
                }
                b'X' => {
                    let n = r.le(4)?;
                    let b = r.bytes(n)?;
                    let v = self.string(b, at)?;
                    self.stack.push(v);
                }
                0x8d => {
                    let n = r.le(8)?;
                    let b = r.bytes(n)?;
                    let v = self.string(b, at)?;
                    self.stack.push(v);
                }
                b'U' | b'C' => {
                    let n = r.le(1)?;
                    r.skip(n)?;
                    self.stack.push(Val::Bytes);
                }
                b'T' | b'B' => {
                    let n = r.le(4)?;
                    r.skip(n)?;
                    self.stack.push(Val::Bytes);
                }
                0x8e | 0x96 => {
                    let n = r.le(8)?;
                    r.skip(n)?;
                    self.stack.push(Val::Bytes);
                }
                b'}' => self
                    .stack
                    .push(Val::Dict(Rc::new(RefCell::new(Dict::Items(Vec::new()))))),
                // Sets are not part of a snapshot; kept as lists, so a set where a list is
                // expected is read like one and anything else is a type error.
                b']' | 0x8f => self
                    .stack
                    .push(Val::List(Rc::new(RefCell::new(Vec::new())))),
                b')' => self.stack.push(Val::Tuple(Rc::from(Vec::new()))),
                b'l' | 0x91 => {
                    let items = self.pop_mark(at)?;
                    for v in &items {
                        self.seal(v)?;
                    }
                    self.stack.push(Val::List(Rc::new(RefCell::new(items))));
                }
                b't' => {
                    let items = self.pop_mark(at)?;
                    self.stack.push(Val::Tuple(Rc::from(items)));
                }
                b'd' => {
                    let items = self.pop_mark(at)?;
                    if !items.len().is_multiple_of(2) {
                        return Err(DecodeError::Malformed(
                            "DICT with an odd number of items",
                            at,
                        ));
                    }
                    let mut pairs = Vec::with_capacity(items.len() / 2);
                    let mut it = items.into_iter();
                    while let (Some(k), Some(v)) = (it.next(), it.next()) {
                        pairs.push((k, v));
                    }
                    self.stack
                        .push(Val::Dict(Rc::new(RefCell::new(Dict::Items(pairs)))));
                }
                0x85..=0x87 => {
                    let n = (op - 0x84) as usize;
                    let mut items = Vec::with_capacity(n);
                    for _ in 0..n {
                        items.push(self.pop(at)?);
                    }
                    items.reverse();
                    self.stack.push(Val::Tuple(Rc::from(items)));
                }
                b'a' => {
                    let v = self.pop(at)?;
                    self.append(vec![v], at)?;
                }
                b'e' | 0x90 => {
                    let items = self.pop_mark(at)?;
                    self.append(items, at)?;
                }
                b's' => {
                    let v = self.pop(at)?;
                    let k = self.pop(at)?;
                    self.set_items(vec![k, v], at)?;
                }
                b'u' => {
                    let items = self.pop_mark(at)?;
                    self.set_items(items, at)?;
                }
                // A text memo key can never be read back (text GET is refused by the guard).
                b'p' => {
                    r.line()?;
                }
                b'q' => {
                    let id = r.le(1)? as u32;
                    self.memoize(id, at)?;
                }
                b'r' => {
                    let id = r.le(4)? as u32;
                    self.memoize(id, at)?;
                }
                0x94 => {
                    let id = u32::try_from(self.memo_count)
                        .map_err(|_| DecodeError::Malformed("memo full", at))?;
                    self.memoize(id, at)?;
                }
                b'h' => {
                    let id = r.le(1)? as u32;
                    self.get(id, at)?;
                }
                b'j' => {
                    let id = r.le(4)? as u32;
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
    let mut input = Input {
        inner: reader,
        pos: 0,
    };
    let mut m = Machine::new(MemoryBudget::for_file(file_bytes));
    let top = m.run(&mut input)?;
    m.stack.clear();
    let snapshot = raw::snapshot(&top, input.pos)?;
    Ok((snapshot, m.budget))
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
        let t = &s.device_traces[0];
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
