//! A walk over a pickle's opcodes, before anything is decoded: it refuses every opcode that
//! names or calls Python code (globals, reduce, object construction, persistent ids,
//! extension codes). A decoder might turn some of them into plain dicts silently; a memory
//! snapshot is dicts, lists, strings and numbers only, so anything else is refused here.
//! Values are not built; only opcode argument lengths are read to find the next opcode.

use std::io::Read;

use super::input::{Input, InputError};

/// Why the walk refused the stream.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum GuardError {
    Io(String),
    NotPickle,
    Truncated(u64),
    UnknownOpcode(u8, u64),
    Global(&'static str, u64),
    Malformed(&'static str, u64),
    TooDeep(u64),
    /// A string or bytes object longer than `MAX_ATOM_BYTES`: (its length, where).
    TooLong(u64, u64),
}

impl std::fmt::Display for GuardError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GuardError::Io(e) => write!(f, "{e}"),
            GuardError::NotPickle => write!(
                f,
                "not a pickle (a PyTorch memory snapshot starts with the pickle protocol marker 0x80)"
            ),
            GuardError::Truncated(at) => {
                write!(f, "truncated pickle: the file ends at byte {at} before the pickle's STOP")
            }
            GuardError::UnknownOpcode(op, at) => {
                write!(f, "not a pickle: unknown opcode 0x{op:02x} at byte {at}")
            }
            GuardError::Malformed(what, at) => {
                write!(f, "not a valid pickle: {what} at byte {at}")
            }
            GuardError::TooDeep(at) => write!(
                f,
                "refused: values nested more than {MAX_DEPTH} levels deep at byte {at} (a memory snapshot nests about 6)"
            ),
            GuardError::TooLong(n, at) => write!(
                f,
                "refused: a string or bytes object of {n} bytes at byte {at}, more than the {} MiB a memory snapshot's names and paths ever take",
                MAX_ATOM_BYTES >> 20
            ),
            GuardError::Global(what, at) => write!(
                f,
                "refused: the pickle {what} at byte {at}; a memory snapshot holds plain data only, so nothing in it is loaded"
            ),
        }
    }
}

impl From<InputError> for GuardError {
    fn from(e: InputError) -> Self {
        match e {
            InputError::Truncated(at) => GuardError::Truncated(at),
            InputError::Io(e) => GuardError::Io(e),
        }
    }
}

/// Deepest nesting of containers accepted: decoding (and dropping) nested values recurses, so
/// a file of a million nested lists would overflow the stack.
pub(crate) const MAX_DEPTH: u8 = 64;

/// Longest string or bytes object accepted. A snapshot's strings are op names, file paths and
/// actions (C++ symbols reach a few KiB); a longer one is refused before it is read, so a file
/// that is one huge `BINBYTES8` is not read twice to the end.
pub(crate) const MAX_ATOM_BYTES: u64 = 16 << 20;

/// `skip` of an argument of `n` bytes, refused above `MAX_ATOM_BYTES`.
fn skip_atom(r: &mut Input<impl Read>, n: u64, at: u64) -> Result<(), GuardError> {
    if n > MAX_ATOM_BYTES {
        return Err(GuardError::TooLong(n, at));
    }
    Ok(r.skip(n)?)
}

/// The nesting depth of each value on the pickle machine's stack (a shadow of the stack, no
/// values), the MARK positions, and the depth of each memoized value.
#[derive(Default)]
struct Shadow {
    stack: Vec<u8>,
    marks: Vec<usize>,
    memo: Vec<u8>,
    memo_sparse: std::collections::HashMap<u32, u8>,
}

impl Shadow {
    #[inline]
    fn pop(&mut self, at: u64) -> Result<u8, GuardError> {
        if self.marks.last().is_some_and(|&m| m >= self.stack.len()) {
            return Err(GuardError::Malformed("stack underflow", at));
        }
        self.stack
            .pop()
            .ok_or(GuardError::Malformed("stack underflow", at))
    }

    #[inline]
    fn push(&mut self, depth: u8, at: u64) -> Result<(), GuardError> {
        if depth > MAX_DEPTH {
            return Err(GuardError::TooDeep(at));
        }
        self.stack.push(depth);
        Ok(())
    }

    /// Items since the last MARK, removed; their deepest depth.
    fn pop_mark(&mut self, at: u64) -> Result<u8, GuardError> {
        let m = self
            .marks
            .pop()
            .ok_or(GuardError::Malformed("no MARK", at))?;
        let deepest = self.stack[m..].iter().copied().max().unwrap_or(0);
        self.stack.truncate(m);
        Ok(deepest)
    }

    /// Adds a child of `depth` to the container on top.
    #[inline]
    fn add_to_top(&mut self, depth: u8, at: u64) -> Result<(), GuardError> {
        let top = self.pop(at)?;
        self.push(top.max(depth.saturating_add(1)), at)
    }

    #[inline]
    fn memoize(&mut self, id: u32, at: u64) -> Result<(), GuardError> {
        let top = *self
            .stack
            .last()
            .ok_or(GuardError::Malformed("memo of an empty stack", at))?;
        if id as usize == self.memo.len() {
            self.memo.push(top);
        } else if (id as usize) < self.memo.len() {
            self.memo[id as usize] = top;
        } else {
            self.memo_sparse.insert(id, top);
        }
        Ok(())
    }

    #[inline]
    fn get(&mut self, id: u32, at: u64) -> Result<(), GuardError> {
        let d = match self.memo.get(id as usize) {
            Some(&d) => d,
            None => *self
                .memo_sparse
                .get(&id)
                .ok_or(GuardError::Malformed("memo key never stored", at))?,
        };
        self.push(d, at)
    }
}

/// Walks the opcodes of one pickle up to its STOP; `Ok` when nothing in it names Python code
/// and its values nest at most `MAX_DEPTH` deep.
pub(crate) fn check(reader: impl Read) -> Result<(), GuardError> {
    let mut r = Input::new(reader);
    let mut sh = Shadow::default();
    let first = match r.byte() {
        Ok(b) => b,
        Err(InputError::Truncated(_)) => return Err(GuardError::NotPickle),
        Err(e) => return Err(e.into()),
    };
    // Protocol 2+ (every PyTorch version writes 2 or newer) begins with PROTO.
    if first != 0x80 {
        return Err(GuardError::NotPickle);
    }
    r.byte()?;
    loop {
        let at = r.pos();
        let op = r.byte()?;
        match op {
            b'.' => {
                return match sh.stack.len() {
                    1 => Ok(()),
                    _ => Err(GuardError::Malformed(
                        "STOP with a stack of other than one value",
                        at,
                    )),
                }
            }
            0x95 => r.skip(8)?,
            0x80 => r.skip(1)?,
            b'(' => sh.marks.push(sh.stack.len()),
            b'0' => {
                if sh.marks.last() == Some(&sh.stack.len()) {
                    sh.marks.pop();
                } else {
                    sh.pop(at)?;
                }
            }
            b'1' => {
                sh.pop_mark(at)?;
            }
            b'2' => {
                let top = sh.pop(at)?;
                sh.push(top, at)?;
                sh.push(top, at)?;
            }
            // Atoms.
            b'N' | 0x88 | 0x89 => sh.push(0, at)?,
            b'K' => {
                r.skip(1)?;
                sh.push(0, at)?
            }
            b'M' => {
                r.skip(2)?;
                sh.push(0, at)?
            }
            b'J' => {
                r.skip(4)?;
                sh.push(0, at)?
            }
            b'G' => {
                r.skip(8)?;
                sh.push(0, at)?
            }
            b'U' | 0x8c | b'C' | 0x8a => {
                let n = r.byte()? as u64;
                r.skip(n)?;
                sh.push(0, at)?
            }
            b'T' | b'X' | b'B' => {
                let n = r.u32_le()? as u64;
                skip_atom(&mut r, n, at)?;
                sh.push(0, at)?
            }
            0x8b => {
                let n = r.u32_le()? as i32;
                if n < 0 {
                    return Err(GuardError::Malformed("negative length", at));
                }
                skip_atom(&mut r, n as u64, at)?;
                sh.push(0, at)?
            }
            0x8d | 0x8e | 0x96 => {
                let n = r.u64_le()?;
                skip_atom(&mut r, n, at)?;
                sh.push(0, at)?
            }
            b'I' | b'L' | b'F' | b'S' | b'V' => {
                r.skip_line()?;
                sh.push(0, at)?
            }
            // Empty containers, and containers built from the items since MARK.
            b'}' | b']' | b')' | 0x8f => sh.push(1, at)?,
            b't' | b'l' | b'd' | 0x91 => {
                let d = sh.pop_mark(at)?;
                sh.push(d.saturating_add(1), at)?
            }
            0x85..=0x87 => {
                let mut d = 0;
                for _ in 0..(op - 0x84) {
                    d = d.max(sh.pop(at)?);
                }
                sh.push(d.saturating_add(1), at)?
            }
            b'a' => {
                let v = sh.pop(at)?;
                sh.add_to_top(v, at)?
            }
            b's' => {
                let v = sh.pop(at)?;
                let k = sh.pop(at)?;
                sh.add_to_top(v.max(k), at)?
            }
            b'e' | b'u' | 0x90 => {
                let d = sh.pop_mark(at)?;
                sh.add_to_top(d, at)?
            }
            // Memo.
            // A text memo key: stored, but never readable (text GET is refused below).
            b'p' => r.skip_line()?,
            b'q' => {
                let id = r.byte()? as u32;
                sh.memoize(id, at)?
            }
            b'r' => {
                let id = r.u32_le()?;
                sh.memoize(id, at)?
            }
            0x94 => {
                let id = sh.memo.len() as u32;
                sh.memoize(id, at)?
            }
            b'g' => {
                r.skip_line()?;
                return Err(GuardError::Malformed(
                    "text memo keys are not supported",
                    at,
                ));
            }
            b'h' => {
                let id = r.byte()? as u32;
                sh.get(id, at)?
            }
            b'j' => {
                let id = r.u32_le()?;
                sh.get(id, at)?
            }
            0x97 | 0x98 => return Err(GuardError::Malformed("out-of-band buffers", at)),
            b'c' | 0x93 => return Err(GuardError::Global("names a Python global", at)),
            b'i' | b'o' | 0x81 | 0x92 => {
                return Err(GuardError::Global("constructs a Python object", at))
            }
            b'R' => return Err(GuardError::Global("calls a Python callable (REDUCE)", at)),
            b'b' => {
                return Err(GuardError::Global(
                    "sets a Python object's state (BUILD)",
                    at,
                ))
            }
            b'P' | b'Q' => return Err(GuardError::Global("refers to a persistent object", at)),
            0x82..=0x84 => return Err(GuardError::Global("uses an extension code", at)),
            _ => return Err(GuardError::UnknownOpcode(op, at)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_data_passes_and_globals_are_refused() {
        // {'a': [1, 'x']} in protocol 4, as Python writes it.
        let ok = b"\x80\x04\x95\x12\x00\x00\x00\x00\x00\x00\x00}\x94\x8c\x01a\x94]\x94(K\x01\x8c\x01x\x94es.";
        assert_eq!(check(&ok[..]), Ok(()));
        let global = b"\x80\x02cposix\nsystem\nq\x00.";
        assert!(matches!(check(&global[..]), Err(GuardError::Global(_, 2))));
        assert_eq!(check(&b"PK\x03\x04"[..]), Err(GuardError::NotPickle));
        assert!(matches!(check(&ok[..20]), Err(GuardError::Truncated(_))));
    }

    #[test]
    fn deep_nesting_is_refused_before_decoding() {
        let mut deep = b"\x80\x04".to_vec();
        deep.extend(std::iter::repeat_n(b']', 100));
        deep.extend(std::iter::repeat_n(b'a', 99));
        deep.push(b'.');
        assert!(matches!(check(&deep[..]), Err(GuardError::TooDeep(_))));
        let mut ok = b"\x80\x04".to_vec();
        ok.extend(std::iter::repeat_n(b']', 10));
        ok.extend(std::iter::repeat_n(b'a', 9));
        ok.push(b'.');
        assert_eq!(check(&ok[..]), Ok(()));
    }
}
