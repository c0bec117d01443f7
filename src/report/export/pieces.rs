//! A write buffer for the exports' many small writes.

use std::io::Write;

/// Bytes of a `Pieces` buffer: as large as the file's own buffer, which then passes a full
/// one on without copying it.
const PIECES_BYTES: usize = 1 << 20;

/// A write buffer for exports written a few bytes at a time (a JSON key, a CSV field, a
/// number): up to 32 bytes are copied as two fixed-size moves, which compile to loads and
/// stores, where a slice copy of a computed length calls `memcpy` (a fifth of the JSON's
/// time went there).
pub(crate) struct Pieces<W: Write> {
    buf: Box<[u8]>,
    len: usize,
    out: W,
}

impl<W: Write> Pieces<W> {
    pub(crate) fn new(out: W) -> Self {
        Pieces {
            buf: vec![0u8; PIECES_BYTES].into_boxed_slice(),
            len: 0,
            out,
        }
    }

    #[cold]
    fn write_large(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        if self.len + bytes.len() > self.buf.len() {
            self.out.write_all(&self.buf[..self.len])?;
            self.len = 0;
        }
        if bytes.len() >= self.buf.len() {
            return self.out.write_all(bytes);
        }
        self.buf[self.len..self.len + bytes.len()].copy_from_slice(bytes);
        self.len += bytes.len();
        Ok(())
    }
}

/// Writes up to `SHORT` bytes go through `copy_short`.
const SHORT: usize = 32;

/// Copies `src` (at most `SHORT` bytes) to the start of `dst` (`SHORT` bytes) as two
/// overlapping fixed-size moves.
#[inline(always)]
fn copy_short(dst: &mut [u8], src: &[u8]) {
    let n = src.len();
    match n {
        0 => {}
        1 => dst[0] = src[0],
        2..=3 => {
            dst[..2].copy_from_slice(&src[..2]);
            dst[n - 2..n].copy_from_slice(&src[n - 2..]);
        }
        4..=7 => {
            dst[..4].copy_from_slice(&src[..4]);
            dst[n - 4..n].copy_from_slice(&src[n - 4..]);
        }
        8..=15 => {
            dst[..8].copy_from_slice(&src[..8]);
            dst[n - 8..n].copy_from_slice(&src[n - 8..]);
        }
        _ => {
            dst[..16].copy_from_slice(&src[..16]);
            dst[n - 16..n].copy_from_slice(&src[n - 16..]);
        }
    }
}

impl<W: Write> Write for Pieces<W> {
    #[inline]
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.write_all(bytes)?;
        Ok(bytes.len())
    }

    #[inline(always)]
    fn write_all(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        if bytes.len() <= SHORT && self.len + SHORT <= self.buf.len() {
            copy_short(&mut self.buf[self.len..self.len + SHORT], bytes);
            self.len += bytes.len();
            return Ok(());
        }
        self.write_large(bytes)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.write_all(&self.buf[..self.len])?;
        self.len = 0;
        self.out.flush()
    }
}
