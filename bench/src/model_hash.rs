//! The sha256 prefix of a model file, remembered per (path, size, modification time) for
//! files of 256 MiB and more in
//! `~/.cache/memra/model-sha256.tsv` (the home folder of memra_engine::settings): hashing a 48 GB
//! file takes tens of seconds, and every `memra-bench` run of a lease hashed it again. A file
//! that changed (its size or mtime) is hashed anew; a cache that cannot be read or written
//! only costs the hash.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use sha2::{Digest, Sha256};

use memra_engine::error::{Error, Result};

/// Hex digits of the sha256 a row records.
const HEX: usize = 12;

/// Files smaller than this are hashed every time (a fraction of a second; and a small file
/// rewritten with the same size within the file system's mtime resolution keeps its key).
const CACHE_MIN_BYTES: u64 = 256 << 20;

/// The cache file.
fn cache_file() -> Option<PathBuf> {
    Some(memra_engine::settings::home()?.join(".cache/memra/model-sha256.tsv"))
}

/// The cache key of `path`: its canonical path, size and mtime (ns), tab-separated.
fn key(path: &Path, meta: &std::fs::Metadata) -> Option<String> {
    let canon = std::fs::canonicalize(path).ok()?;
    let mtime = meta.modified().ok()?.duration_since(UNIX_EPOCH).ok()?;
    let canon = canon.to_str()?;
    (!canon.contains(['\t', '\n']))
        .then(|| format!("{canon}\t{}\t{}", meta.len(), mtime.as_nanos()))
}

/// The hash recorded for `key` in `text` (the last line that has it).
fn lookup(text: &str, key: &str) -> Option<String> {
    text.lines()
        .rev()
        .filter_map(|l| l.rsplit_once('\t'))
        .find(|(k, h)| *k == key && h.len() == HEX && h.bytes().all(|b| b.is_ascii_hexdigit()))
        .map(|(_, h)| h.to_string())
}

/// The first 12 hex digits of the sha256 of the file at `path` and its size in bytes.
pub fn sha256_prefix(path: &Path) -> Result<(String, u64)> {
    sha256_prefix_in(path, cache_file().as_deref(), CACHE_MIN_BYTES)
}

/// [`sha256_prefix`] with the cache at `cache` (none: always hash) for files of at least
/// `min_bytes`.
pub fn sha256_prefix_in(
    path: &Path,
    cache: Option<&Path>,
    min_bytes: u64,
) -> Result<(String, u64)> {
    let err = |e: std::io::Error| Error::Input(format!("{}: {e}", path.display()));
    let meta = std::fs::metadata(path).map_err(err)?;
    let key = key(path, &meta).filter(|_| meta.len() >= min_bytes);
    if let (Some(c), Some(k)) = (cache, &key)
        && let Some(h) = std::fs::read_to_string(c).ok().and_then(|t| lookup(&t, k))
    {
        return Ok((h, meta.len()));
    }
    let mut f = std::fs::File::open(path).map_err(err)?;
    let mut h = Sha256::new();
    let bytes = std::io::copy(&mut f, &mut h).map_err(err)?;
    let hex: String = h.finalize()[..HEX / 2]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    if let (Some(c), Some(k)) = (cache, key) {
        // One line appended in one write: concurrent runs at worst add the same line twice.
        let _ = c
            .parent()
            .map(std::fs::create_dir_all)
            .transpose()
            .and_then(|_| {
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(c)
            })
            .and_then(|mut f| f.write_all(format!("{k}\t{hex}\n").as_bytes()));
    }
    Ok((hex, bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_then_remembers_until_the_file_changes() {
        let dir = std::env::temp_dir().join(format!("memra-hash-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (file, cache) = (dir.join("m.gguf"), dir.join("c/model-sha256.tsv"));
        std::fs::write(&file, b"").unwrap();
        // The empty input's sha256 (FIPS 180-2 test vector).
        let first = sha256_prefix_in(&file, Some(&cache), 0).unwrap();
        assert_eq!(first, ("e3b0c44298fc".to_string(), 0));
        let text = std::fs::read_to_string(&cache).unwrap();
        assert_eq!(text.lines().count(), 1);
        assert!(text.ends_with("\te3b0c44298fc\n"), "{text}");
        // A remembered hash is used as is: plant another one for the same key.
        std::fs::write(&cache, text.replace("e3b0c44298fc", "0123456789ab")).unwrap();
        assert_eq!(
            sha256_prefix_in(&file, Some(&cache), 0).unwrap().0,
            "0123456789ab"
        );
        // Another size is another key: hashed again ("abc", FIPS 180-2) and appended.
        std::fs::write(&file, b"abc").unwrap();
        assert_eq!(
            sha256_prefix_in(&file, Some(&cache), 0).unwrap(),
            ("ba7816bf8f01".to_string(), 3)
        );
        assert_eq!(std::fs::read_to_string(&cache).unwrap().lines().count(), 2);
        // Below the size limit the cache is neither read nor written.
        std::fs::write(&cache, "").unwrap();
        assert_eq!(
            sha256_prefix_in(&file, Some(&cache), 4).unwrap().0,
            "ba7816bf8f01"
        );
        assert_eq!(std::fs::read_to_string(&cache).unwrap(), "");
        // No cache, or one that is a folder: the hash all the same.
        assert_eq!(sha256_prefix_in(&file, None, 0).unwrap().0, "ba7816bf8f01");
        assert_eq!(
            sha256_prefix_in(&file, Some(&dir), 0).unwrap().0,
            "ba7816bf8f01"
        );
        // A missing file names itself.
        let e = sha256_prefix_in(&dir.join("none.gguf"), Some(&cache), 0).unwrap_err();
        assert!(e.to_string().contains("none.gguf"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn lookup_takes_only_well_formed_lines_of_the_key() {
        let t = "/a\t1\t2\tzzzzzzzzzzzz\n/a\t1\t2\t0123456789ab\n/b\t1\t2\tffffffffffff\n/a\t1\t2\tshort\n";
        assert_eq!(lookup(t, "/a\t1\t2").as_deref(), Some("0123456789ab"));
        assert_eq!(lookup(t, "/a\t1\t3"), None);
    }
}
