//! The byte stream the opcode guard and the pickle machine read: a buffer of their own in front
//! of the file, so the one-byte opcodes and short arguments a pickle is made of are read from
//! memory (a call into `Read` per byte was a fifth of the reading time), and short strings are
//! borrowed from the buffer rather than copied into a new allocation.

use std::io::Read;

/// Bytes read from the file at a time.
const BUFFER_BYTES: usize = 1 << 20;

/// Why the stream stopped.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum InputError {
    /// The stream ended at this byte before the argument it was reading.
    Truncated(u64),
    Io(String),
}

pub(crate) struct Input<R> {
    inner: R,
    buf: Box<[u8]>,
    /// The unread bytes are `buf[start..end]`.
    start: usize,
    end: usize,
    /// The stream's byte at `buf[0]`.
    base: u64,
    /// An argument longer than the buffer, read here.
    long: Vec<u8>,
}

impl<R: Read> Input<R> {
    pub(crate) fn new(inner: R) -> Self {
        Input {
            inner,
            buf: vec![0u8; BUFFER_BYTES].into_boxed_slice(),
            start: 0,
            end: 0,
            base: 0,
            long: Vec::new(),
        }
    }

    /// The byte of the stream reached.
    #[inline]
    pub(crate) fn pos(&self) -> u64 {
        self.base + self.start as u64
    }

    /// Reads more of the stream behind the unread bytes (moved to the front first); false at
    /// its end.
    #[cold]
    fn refill(&mut self) -> Result<bool, InputError> {
        if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.base += self.start as u64;
            self.end -= self.start;
            self.start = 0;
        }
        loop {
            match self.inner.read(&mut self.buf[self.end..]) {
                Ok(0) => return Ok(false),
                Ok(n) => {
                    self.end += n;
                    return Ok(true);
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(InputError::Io(e.to_string())),
            }
        }
    }

    /// Makes `n` (at most the buffer's size) bytes unread in the buffer.
    #[inline]
    fn ensure(&mut self, n: usize) -> Result<(), InputError> {
        while self.end - self.start < n {
            if !self.refill()? {
                return Err(InputError::Truncated(self.base + self.end as u64));
            }
        }
        Ok(())
    }

    #[inline]
    pub(crate) fn byte(&mut self) -> Result<u8, InputError> {
        if self.start == self.end {
            self.ensure(1)?;
        }
        let b = self.buf[self.start];
        self.start += 1;
        Ok(b)
    }

    /// The next `N` bytes, as an array (an opcode's fixed-size argument).
    #[inline]
    pub(crate) fn array<const N: usize>(&mut self) -> Result<[u8; N], InputError> {
        if self.end - self.start < N {
            self.ensure(N)?;
        }
        let mut a = [0u8; N];
        a.copy_from_slice(&self.buf[self.start..self.start + N]);
        self.start += N;
        Ok(a)
    }

    #[inline]
    pub(crate) fn u16_le(&mut self) -> Result<u16, InputError> {
        Ok(u16::from_le_bytes(self.array()?))
    }

    #[inline]
    pub(crate) fn u32_le(&mut self) -> Result<u32, InputError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    #[inline]
    pub(crate) fn u64_le(&mut self) -> Result<u64, InputError> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    /// The next `n` bytes. Longer than the buffer, they are read in pieces, so a length field
    /// larger than the file allocates no more than the file holds.
    #[inline]
    pub(crate) fn slice(&mut self, n: usize) -> Result<&[u8], InputError> {
        if n > self.buf.len() {
            return self.read_long(n as u64);
        }
        self.ensure(n)?;
        let s = self.start;
        self.start += n;
        Ok(&self.buf[s..s + n])
    }

    /// `slice` of a length that may not fit a `usize`.
    pub(crate) fn bytes(&mut self, n: u64) -> Result<&[u8], InputError> {
        match usize::try_from(n) {
            Ok(n) if n <= self.buf.len() => self.slice(n),
            _ => self.read_long(n),
        }
    }

    #[cold]
    fn read_long(&mut self, n: u64) -> Result<&[u8], InputError> {
        let mut long = std::mem::take(&mut self.long);
        long.clear();
        let buffered = (self.end - self.start).min(usize::try_from(n).unwrap_or(usize::MAX));
        long.extend_from_slice(&self.buf[self.start..self.start + buffered]);
        // The buffer is used up; the rest is read past it.
        self.base += (self.start + buffered) as u64;
        self.buf.copy_within(self.start + buffered..self.end, 0);
        self.end -= self.start + buffered;
        self.start = 0;
        let rest = n - buffered as u64;
        let got = (&mut self.inner)
            .take(rest)
            .read_to_end(&mut long)
            .map_err(|e| InputError::Io(e.to_string()))?;
        self.base += got as u64;
        self.long = long;
        if (got as u64) < rest {
            return Err(InputError::Truncated(self.pos()));
        }
        Ok(&self.long)
    }

    /// Skips `n` bytes.
    #[inline]
    pub(crate) fn skip(&mut self, n: u64) -> Result<(), InputError> {
        if n <= (self.end - self.start) as u64 {
            self.start += n as usize;
            return Ok(());
        }
        self.skip_long(n)
    }

    #[cold]
    fn skip_long(&mut self, n: u64) -> Result<(), InputError> {
        let mut left = n;
        loop {
            let here = ((self.end - self.start) as u64).min(left);
            self.start += here as usize;
            left -= here;
            if left == 0 {
                return Ok(());
            }
            if !self.refill()? {
                return Err(InputError::Truncated(self.pos()));
            }
        }
    }

    /// The bytes up to the next newline (which is consumed, not returned), at most `max`
    /// bytes; `None` when the line is longer.
    pub(crate) fn line(&mut self, max: usize) -> Result<Option<Vec<u8>>, InputError> {
        let mut v = Vec::new();
        loop {
            let b = self.byte()?;
            if b == b'\n' {
                return Ok(Some(v));
            }
            if v.len() >= max {
                return Ok(None);
            }
            v.push(b);
        }
    }

    /// Skips the bytes up to and including the next newline, however many.
    pub(crate) fn skip_line(&mut self) -> Result<(), InputError> {
        loop {
            let unread = &self.buf[self.start..self.end];
            if let Some(i) = unread.iter().position(|&b| b == b'\n') {
                self.start += i + 1;
                return Ok(());
            }
            self.start = self.end;
            if !self.refill()? {
                return Err(InputError::Truncated(self.pos()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_across_refills_and_longer_than_the_buffer_read_whole() {
        let mut data: Vec<u8> = (0..BUFFER_BYTES as u32 * 3).map(|i| i as u8).collect();
        data.extend(b"text\nend");
        let mut r = Input::new(&data[..]);
        r.skip(BUFFER_BYTES as u64 - 2).unwrap();
        assert_eq!(r.u32_le().unwrap(), u32::from_le_bytes([254, 255, 0, 1]));
        let long = r.bytes(BUFFER_BYTES as u64 + 10).unwrap().to_vec();
        assert_eq!(long.len(), BUFFER_BYTES + 10);
        assert_eq!(long[0], 2);
        r.skip(BUFFER_BYTES as u64 * 3 - r.pos()).unwrap();
        assert_eq!(r.line(16).unwrap().as_deref(), Some(&b"text"[..]));
        assert_eq!(r.pos(), BUFFER_BYTES as u64 * 3 + 5);
        assert_eq!(r.slice(3).unwrap(), b"end");
        assert_eq!(r.byte(), Err(InputError::Truncated(r.pos())));
    }

    #[test]
    fn a_length_past_the_end_is_truncated_where_the_stream_ends() {
        let data = [1u8, 2, 3];
        let mut r = Input::new(&data[..]);
        assert_eq!(r.slice(5), Err(InputError::Truncated(3)));
        let mut r = Input::new(&data[..]);
        assert_eq!(r.bytes(u64::MAX), Err(InputError::Truncated(3)));
        let mut r = Input::new(&data[..]);
        assert_eq!(r.skip(10), Err(InputError::Truncated(3)));
    }
}
