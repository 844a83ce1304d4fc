//! Split models: `NAME-00001-of-0000N.gguf` ... `NAME-0000N-of-0000N.gguf`, each part a complete
//! GGUF file with `split.no` (0-based), `split.count` and, in the first, `split.tensors.count`.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::parse::{self, Parsed};
use super::{Gguf, map_file};
use crate::error::{Error, Result};

pub(crate) const KEY_NO: &str = "split.no";
pub(crate) const KEY_COUNT: &str = "split.count";
pub(crate) const KEY_TENSORS_COUNT: &str = "split.tensors.count";

/// The parts of a split name: `prefix` (path without `-NNNNN-of-NNNNN.gguf`) and the part count.
pub(crate) struct SplitName {
    pub prefix: String,
    pub count: u32,
}

/// The file name of part `no` (1-based) of `count`.
pub fn split_path(prefix: &str, no: u32, count: u32) -> PathBuf {
    PathBuf::from(format!("{prefix}-{no:05}-of-{count:05}.gguf"))
}

fn five_digits(s: &str) -> Option<u32> {
    if s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit()) {
        s.parse().ok()
    } else {
        None
    }
}

/// Recognises `PREFIX-NNNNN-of-MMMMM.gguf` with 1 <= NNNNN <= MMMMM.
pub(crate) fn split_name(path: &Path) -> Option<SplitName> {
    let s = path.to_str()?;
    let stem = s.strip_suffix(".gguf")?;
    // "-NNNNN-of-MMMMM" is 15 bytes, all ASCII.
    let cut = stem.len().checked_sub(15)?;
    let (prefix, tail) = (stem.get(..cut)?, stem.get(cut..)?);
    let tail = tail.strip_prefix('-')?;
    let (no, count) = tail.split_once("-of-")?;
    let (no, count) = (five_digits(no)?, five_digits(count)?);
    if prefix.is_empty() || no == 0 || no > count {
        return None;
    }
    Some(SplitName {
        prefix: prefix.to_string(),
        count,
    })
}

fn gguf_err(path: &Path, what: String) -> Error {
    Error::Gguf {
        path: path.to_path_buf(),
        offset: 0,
        what,
    }
}

fn meta_u64(p: &Parsed, key: &str) -> Option<u64> {
    p.metadata
        .iter()
        .find(|(k, _)| k == key)
        .and_then(|(_, v)| v.as_u64())
}

fn has_key(p: &Parsed, key: &str) -> bool {
    p.metadata.iter().any(|(k, _)| k == key)
}

/// A file not named as a split part must not claim to be one of several parts.
pub(crate) fn check_not_split(path: &Path, parsed: &Parsed) -> Result<()> {
    match (has_key(parsed, KEY_COUNT), meta_u64(parsed, KEY_COUNT)) {
        (false, _) | (true, Some(0 | 1)) => Ok(()),
        (true, Some(n)) => Err(gguf_err(
            path,
            format!(
                "metadata `{KEY_COUNT}` is {n} but the file is not named NAME-00001-of-{n:05}.gguf"
            ),
        )),
        (true, None) => Err(gguf_err(
            path,
            format!("metadata `{KEY_COUNT}` is not a non-negative integer"),
        )),
    }
}

/// Checks one part's `split.no` and `split.count` against its file name.
fn check_part(path: &Path, parsed: &Parsed, no: u32, count: u32) -> Result<()> {
    match meta_u64(parsed, KEY_COUNT) {
        Some(c) if c == count as u64 => {}
        Some(c) => {
            return Err(gguf_err(
                path,
                format!("metadata `{KEY_COUNT}` is {c}, the file name says {count}"),
            ));
        }
        None => {
            return Err(gguf_err(
                path,
                format!("split part lacks metadata `{KEY_COUNT}` (or it is not an integer)"),
            ));
        }
    }
    match meta_u64(parsed, KEY_NO) {
        Some(n) if n == (no - 1) as u64 => Ok(()),
        Some(n) => Err(gguf_err(
            path,
            format!(
                "metadata `{KEY_NO}` is {n}, expected {} for part {no} of {count}",
                no - 1
            ),
        )),
        None => Err(gguf_err(
            path,
            format!("split part lacks metadata `{KEY_NO}` (or it is not an integer)"),
        )),
    }
}

/// Opens all parts of a split model; `path` is any one of them.
pub(crate) fn open_split(path: &Path, name: &SplitName) -> Result<Gguf> {
    let mut parts: Vec<(PathBuf, Arc<memmap2::Mmap>, Parsed)> = Vec::new();
    let mut names: HashSet<String> = HashSet::new();
    for no in 1..=name.count {
        let p = split_path(&name.prefix, no, name.count);
        let map = map_file(&p)?;
        let parsed = parse::parse(&map, &p)?;
        check_part(&p, &parsed, no, name.count)?;
        for t in &parsed.tensors {
            if !names.insert(t.name.clone()) {
                return Err(gguf_err(
                    &p,
                    format!("tensor `{}` is also in an earlier split part", t.name),
                ));
            }
        }
        parts.push((p, map, parsed));
    }
    if let Some((first, _, parsed)) = parts.first()
        && has_key(parsed, KEY_TENSORS_COUNT)
    {
        match meta_u64(parsed, KEY_TENSORS_COUNT) {
            Some(n) if n == names.len() as u64 => {}
            other => {
                return Err(gguf_err(
                    first,
                    format!(
                        "metadata `{KEY_TENSORS_COUNT}` is {other:?}, but the parts hold {} tensors",
                        names.len()
                    ),
                ));
            }
        }
    }
    Ok(Gguf::from_parts(path.to_path_buf(), parts))
}
