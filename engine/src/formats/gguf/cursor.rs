//! A bounds-checked little-endian reader over a byte slice. Every read names the field it reads,
//! so a short or malformed file yields `Error::Gguf` with the field and its byte offset.

use std::path::Path;

use crate::error::{Error, Result};

pub(crate) struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    path: &'a Path,
}

impl<'a> Cursor<'a> {
    pub(crate) fn new(buf: &'a [u8], path: &'a Path) -> Self {
        Cursor { buf, pos: 0, path }
    }

    pub(crate) fn pos(&self) -> usize {
        self.pos
    }

    pub(crate) fn len(&self) -> usize {
        self.buf.len()
    }

    pub(crate) fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }

    /// An error at byte offset `at`.
    pub(crate) fn err_at(&self, at: usize, what: impl Into<String>) -> Error {
        Error::Gguf {
            path: self.path.to_path_buf(),
            offset: at as u64,
            what: what.into(),
        }
    }

    /// Takes `n` bytes, or fails naming `what` as truncated.
    pub(crate) fn take(&mut self, n: usize, what: &dyn Fn() -> String) -> Result<&'a [u8]> {
        let at = self.pos;
        if n > self.remaining() {
            return Err(self.err_at(
                at,
                format!(
                    "{}: truncated (needs {n} bytes, {} left)",
                    what(),
                    self.remaining()
                ),
            ));
        }
        let end = at + n;
        let s = self
            .buf
            .get(at..end)
            .ok_or_else(|| self.err_at(at, what()))?;
        self.pos = end;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N]> {
        let s = self.take(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    pub(crate) fn u8(&mut self, what: &dyn Fn() -> String) -> Result<u8> {
        Ok(self.array::<1>(what)?[0])
    }
    pub(crate) fn u16(&mut self, what: &dyn Fn() -> String) -> Result<u16> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }
    pub(crate) fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }
    pub(crate) fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// Reads a count and checks that `count` elements of at least `min_each` bytes each fit in
    /// the bytes left, so no allocation sized from the file can exceed the file.
    pub(crate) fn count(&mut self, min_each: usize, what: &dyn Fn() -> String) -> Result<usize> {
        let at = self.pos;
        let n = self.u64(what)?;
        let need = n.checked_mul(min_each.max(1) as u64);
        match need {
            Some(need) if need <= self.remaining() as u64 => usize::try_from(n)
                .map_err(|_| self.err_at(at, format!("{} {n} is too large", what()))),
            _ => Err(self.err_at(
                at,
                format!(
                    "{} {n} is too large ({} bytes left, each element needs at least {min_each})",
                    what(),
                    self.remaining()
                ),
            )),
        }
    }

    /// A GGUF string: u64 length, then that many bytes of UTF-8.
    pub(crate) fn string(&mut self, what: &dyn Fn() -> String) -> Result<String> {
        let at = self.pos;
        let n = self.u64(&|| format!("{} length", what()))?;
        if n > self.remaining() as u64 {
            return Err(self.err_at(
                at,
                format!(
                    "{} length {n} is larger than the {} bytes left",
                    what(),
                    self.remaining()
                ),
            ));
        }
        let bytes = self.take(n as usize, what)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_owned()),
            Err(e) => Err(self.err_at(
                at + 8 + e.valid_up_to(),
                format!("{}: invalid UTF-8", what()),
            )),
        }
    }
}
