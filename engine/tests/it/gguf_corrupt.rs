//! A corpus of corrupt GGUF files built by hand from bytes (modelled on llama.cpp
//! tests/test-gguf.cpp). Each must give `Error::Gguf` naming the problem: never a panic, and
//! never an allocation sized from a bogus count (a counting allocator checks the largest one).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::path::Path;

use memra_engine::Error;
use memra_engine::formats::gguf::Gguf;

/// Records the largest single allocation of the current thread.
struct Counting;

thread_local! {
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

fn note(size: usize) {
    let _ = LARGEST.try_with(|m| {
        if size > m.get() {
            m.set(size);
        }
    });
}

// SAFETY: forwards to the system allocator; only records sizes in a const thread-local.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Runs `f`, returning its result and the largest allocation it made on this thread.
pub(crate) fn largest_alloc<T>(f: impl FnOnce() -> T) -> (T, usize) {
    LARGEST.with(|m| m.set(0));
    let r = f();
    (r, LARGEST.with(|m| m.get()))
}

/// Parses `bytes`, returning the result and the largest allocation made while parsing.
fn parse(bytes: &[u8]) -> (Result<Gguf, Error>, usize) {
    largest_alloc(|| Gguf::from_bytes(bytes, Path::new("corrupt.gguf")))
}

// ---- byte builders ------------------------------------------------------------------------

const U8: u32 = 0;
const U32: u32 = 4;
const BOOL: u32 = 7;
const STR: u32 = 8;
const ARR: u32 = 9;
const U64: u32 = 10;
const T_F32: u32 = 0;
const T_Q4_0: u32 = 2;
const T_Q8_0: u32 = 8;

fn s(x: &str) -> Vec<u8> {
    let mut v = (x.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(x.as_bytes());
    v
}

fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

/// A key/value pair with a raw value payload.
fn kv(key: &[u8], ty: u32, payload: &[u8]) -> Vec<u8> {
    let mut v = (key.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(key);
    v.extend_from_slice(&ty.to_le_bytes());
    v.extend_from_slice(payload);
    v
}

fn kv_u32(key: &str, x: u32) -> Vec<u8> {
    kv(key.as_bytes(), U32, &x.to_le_bytes())
}

fn kv_str(key: &str, x: &str) -> Vec<u8> {
    kv(key.as_bytes(), STR, &s(x))
}

/// An array payload: element type, count, raw elements.
fn arr(ety: u32, n: u64, elems: &[u8]) -> Vec<u8> {
    cat(&[&ety.to_le_bytes(), &n.to_le_bytes(), elems])
}

/// A tensor info.
fn ti(name: &[u8], dims: &[u64], ty: u32, offset: u64) -> Vec<u8> {
    let mut v = (name.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(name);
    v.extend_from_slice(&(dims.len() as u32).to_le_bytes());
    for d in dims {
        v.extend_from_slice(&d.to_le_bytes());
    }
    v.extend_from_slice(&ty.to_le_bytes());
    v.extend_from_slice(&offset.to_le_bytes());
    v
}

/// A file with explicit header counts, the given kvs and tensor infos, padding to `align`, and
/// `data_len` bytes of data.
fn file_raw(
    version: u32,
    nt: u64,
    nkv: u64,
    kvs: &[Vec<u8>],
    tis: &[Vec<u8>],
    align: usize,
    data_len: usize,
) -> Vec<u8> {
    let mut v = b"GGUF".to_vec();
    v.extend_from_slice(&version.to_le_bytes());
    v.extend_from_slice(&nt.to_le_bytes());
    v.extend_from_slice(&nkv.to_le_bytes());
    for k in kvs {
        v.extend_from_slice(k);
    }
    for t in tis {
        v.extend_from_slice(t);
    }
    v.resize(v.len().div_ceil(align) * align, 0);
    v.extend(std::iter::repeat_n(0xA5u8, data_len));
    v
}

/// A version-3 file whose counts match its contents.
fn file(kvs: &[Vec<u8>], tis: &[Vec<u8>], data_len: usize) -> Vec<u8> {
    file_raw(
        3,
        tis.len() as u64,
        kvs.len() as u64,
        kvs,
        tis,
        32,
        data_len,
    )
}

/// A small valid file: several metadata types (a nested array too) and two tensors whose data
/// ends exactly at the end of the file, so every strict prefix of it is truncated.
fn valid() -> Vec<u8> {
    let nested = arr(
        ARR,
        2,
        &cat(&[&arr(U32, 1, &7u32.to_le_bytes()), &arr(STR, 1, &s("x"))]),
    );
    file(
        &[
            kv_str("general.architecture", "llama"),
            kv_u32("llama.block_count", 2),
            kv(b"flag", BOOL, &[1]),
            kv(b"toks", ARR, &arr(STR, 2, &cat(&[&s("a"), &s("bc")]))),
            kv(b"nested", ARR, &nested),
        ],
        &[
            ti(b"a.weight", &[32, 2], T_Q8_0, 0),
            ti(b"b.weight", &[8], T_F32, 96),
        ],
        96 + 32,
    )
}

// ---- the corpus ---------------------------------------------------------------------------

fn nested_arrays(depth: usize) -> Vec<u8> {
    let mut v = arr(U8, 0, &[]);
    for _ in 0..depth {
        v = arr(ARR, 1, &v);
    }
    v
}

fn corpus() -> Vec<(&'static str, Vec<u8>, &'static [&'static str])> {
    let t32 = |off| ti(b"t", &[8], T_F32, off);
    let mut bad_utf8_key = kv_u32("k", 1);
    bad_utf8_key[8] = 0xff;
    vec![
        ("empty file", vec![], &["magic", "truncated"]),
        ("short magic", b"GG".to_vec(), &["magic", "truncated"]),
        ("bad magic", cat(&[b"GGML", &valid()[4..]]), &["bad magic"]),
        (
            "version 1",
            file_raw(1, 0, 0, &[], &[], 32, 0),
            &["version 1 is not supported"],
        ),
        (
            "version 0",
            file_raw(0, 0, 0, &[], &[], 32, 0),
            &["version 0 is not supported"],
        ),
        (
            "big-endian version 3",
            file_raw(3u32.swap_bytes(), 0, 0, &[], &[], 32, 0),
            &["big-endian GGUF files are not supported"],
        ),
        (
            "version 4",
            file_raw(4, 0, 0, &[], &[], 32, 0),
            &["version 4 is not supported"],
        ),
        (
            "missing counts",
            cat(&[b"GGUF", &3u32.to_le_bytes(), &[1, 2]]),
            &["tensor count", "truncated"],
        ),
        (
            "huge tensor count",
            file_raw(3, u64::MAX, 0, &[], &[], 32, 0),
            &["tensor count", "too large"],
        ),
        (
            "huge kv count",
            file_raw(3, 0, u64::MAX, &[], &[], 32, 0),
            &["metadata kv count", "too large"],
        ),
        (
            "kv count past the end",
            file_raw(3, 0, 3, &[kv_u32("a", 1)], &[], 1, 0),
            &["metadata kv count 3 is too large"],
        ),
        (
            "tensor count too large after the metadata",
            file_raw(3, 3, 1, &[kv_str("k", &"x".repeat(90))], &[], 1, 0),
            &["tensor count 3 is too large", "after the metadata"],
        ),
        (
            "huge key length",
            file(&[kv(&[], U8, &[0])], &[], 0)
                .iter()
                .enumerate()
                .map(|(i, &b)| if (24..32).contains(&i) { 0xff } else { b })
                .collect(),
            &["metadata key #0 length", "larger than"],
        ),
        (
            "empty key",
            file(&[kv(b"", U8, &[1])], &[], 0),
            &["metadata key #0 is empty"],
        ),
        (
            "key not UTF-8",
            file(&[bad_utf8_key], &[], 0),
            &["metadata key #0", "invalid UTF-8"],
        ),
        (
            "unknown value type",
            file(&[kv(b"k", 13, &[0; 8])], &[], 0),
            &["metadata key `k` value type 13 is unknown"],
        ),
        (
            "value type u32::MAX",
            file(&[kv(b"k", u32::MAX, &[0; 8])], &[], 0),
            &["value type 4294967295 is unknown"],
        ),
        (
            "duplicate key",
            file(&[kv_u32("dup", 1), kv_u32("dup", 2)], &[], 0),
            &["metadata key #1 `dup` is a duplicate"],
        ),
        (
            "alignment 0",
            file(&[kv_u32("general.alignment", 0)], &[], 0),
            &[
                "general.alignment",
                "value 0 is not a non-zero power of two",
            ],
        ),
        (
            "alignment 3",
            file(&[kv_u32("general.alignment", 3)], &[], 0),
            &[
                "general.alignment",
                "value 3 is not a non-zero power of two",
            ],
        ),
        (
            "alignment as u64",
            file(
                &[kv(b"general.alignment", U64, &32u64.to_le_bytes())],
                &[],
                0,
            ),
            &["general.alignment", "must be a u32, found a u64"],
        ),
        (
            "alignment as string",
            file(&[kv_str("general.alignment", "32")], &[], 0),
            &["general.alignment", "must be a u32, found a string"],
        ),
        (
            "huge string length",
            file(&[kv(b"k", STR, &u64::MAX.to_le_bytes())], &[], 0),
            &["metadata key `k` value length", "larger than"],
        ),
        (
            "string past the end",
            file(
                &[kv(b"k", STR, &cat(&[&100u64.to_le_bytes(), b"abc"]))],
                &[],
                0,
            ),
            &["metadata key `k` value length 100"],
        ),
        (
            "string not UTF-8",
            file(
                &[kv(b"k", STR, &cat(&[&2u64.to_le_bytes(), &[0xc3, 0x28]]))],
                &[],
                0,
            ),
            &["metadata key `k` value", "invalid UTF-8"],
        ),
        (
            "bool byte 2",
            file(&[kv(b"k", BOOL, &[2])], &[], 0),
            &["metadata key `k` value", "invalid bool byte 2"],
        ),
        (
            "huge array length",
            file(&[kv(b"k", ARR, &arr(U32, u64::MAX, &[]))], &[], 0),
            &["metadata key `k` value array length", "too large"],
        ),
        (
            "array of strings too long",
            file(&[kv(b"k", ARR, &arr(STR, 1 << 40, &s("a")))], &[], 0),
            &["array length 1099511627776 is too large"],
        ),
        (
            "unknown array element type",
            file(&[kv(b"k", ARR, &arr(77, 1, &[0]))], &[], 0),
            &["unknown array element type 77"],
        ),
        (
            "nested array bomb (deep)",
            file(&[kv(b"k", ARR, &nested_arrays(1000))], &[], 0),
            &["arrays nested deeper than 4"],
        ),
        (
            "nested array bomb (wide)",
            file(
                &[kv(b"k", ARR, &arr(ARR, 1 << 50, &arr(U8, 0, &[])))],
                &[],
                0,
            ),
            &["array length", "too large"],
        ),
        (
            "array element not UTF-8",
            file(
                &[kv(
                    b"k",
                    ARR,
                    &arr(STR, 2, &cat(&[&s("ok"), &1u64.to_le_bytes(), &[0xff]])),
                )],
                &[],
                0,
            ),
            &["metadata key `k` value element 1", "invalid UTF-8"],
        ),
        (
            "huge tensor name length",
            file(&[], &[ti(&[], &[8], T_F32, 0)], 64)
                .iter()
                .enumerate()
                .map(|(i, &b)| if (24..32).contains(&i) { 0xee } else { b })
                .collect(),
            &["tensor #0 name length", "larger than"],
        ),
        (
            "empty tensor name",
            file(&[], &[ti(b"", &[8], T_F32, 0)], 32),
            &["tensor #0 name is empty"],
        ),
        (
            "tensor name not UTF-8",
            file(&[], &[ti(b"\xfe\xff", &[8], T_F32, 0)], 32),
            &["tensor #0 name", "invalid UTF-8"],
        ),
        (
            "n_dims 0",
            file(&[], &[ti(b"t", &[], T_F32, 0)], 32),
            &["tensor `t` n_dims 0 is not in 1..=4"],
        ),
        (
            "n_dims 5",
            file(&[], &[ti(b"t", &[1, 1, 1, 1, 1], T_F32, 0)], 32),
            &["tensor `t` n_dims 5 is not in 1..=4"],
        ),
        (
            "n_dims huge",
            file(
                &[],
                &[cat(&[&s("t"), &u32::MAX.to_le_bytes(), &[0; 20]])],
                32,
            ),
            &["n_dims 4294967295"],
        ),
        (
            "dim 0",
            file(&[], &[ti(b"blk.0.attn_q.weight", &[8, 0], T_F32, 0)], 32),
            &["tensor `blk.0.attn_q.weight` dim 1 is 0"],
        ),
        (
            "dim over i64::MAX",
            file(&[], &[ti(b"t", &[1 << 63], T_F32, 0)], 32),
            &["tensor `t` dim 0 is 9223372036854775808"],
        ),
        (
            "ne overflow",
            file(&[], &[ti(b"t", &[1 << 32, 1 << 32, 1 << 32], T_F32, 0)], 32),
            &["tensor `t` dim 1", "element count overflows"],
        ),
        (
            "nbytes overflow (f32)",
            file(&[], &[ti(b"t", &[1 << 62], T_F32, 0)], 32),
            &["tensor `t` byte size overflows"],
        ),
        (
            "nbytes too big (quantized)",
            file(&[], &[ti(b"t", &[1 << 40, 1 << 20], T_Q8_0, 0)], 64),
            &["tensor `t` data", "outside the file"],
        ),
        (
            "unknown ggml type",
            file(&[], &[ti(b"t", &[8], 99, 0)], 32),
            &["tensor `t` type 99 is an unknown or unsupported ggml type"],
        ),
        (
            "unsupported ggml type q8_1",
            file(&[], &[ti(b"t", &[32], 9, 0)], 64),
            &["tensor `t` type 9"],
        ),
        (
            "row not a multiple of the block",
            file(&[], &[ti(b"t", &[33, 2], T_Q4_0, 0)], 64),
            &["row length 33 is not a multiple of the q4_0 block size 32"],
        ),
        (
            "offset past the end",
            file(&[], &[t32(1 << 20)], 32),
            &["tensor `t` data", "outside the file"],
        ),
        (
            "offset + nbytes overflows",
            file(&[], &[t32(u64::MAX - 31)], 32),
            &["tensor `t` data", "outside the file"],
        ),
        (
            "unaligned offset",
            file(&[], &[t32(8)], 64),
            &["tensor `t` offset 8 is not a multiple of the alignment 32"],
        ),
        (
            "offset unaligned for a custom alignment",
            file(&[kv_u32("general.alignment", 64)], &[t32(32)], 128),
            &["tensor `t` offset 32 is not a multiple of the alignment 64"],
        ),
        (
            "overlapping tensors",
            file(
                &[],
                &[ti(b"a", &[16], T_F32, 0), ti(b"b", &[8], T_F32, 32)],
                96,
            ),
            &["tensor `b` data overlaps tensor `a`"],
        ),
        (
            "duplicate tensor name",
            file(&[], &[t32(0), t32(32)], 64),
            &["tensor #1 name `t` is a duplicate"],
        ),
        (
            "truncated data",
            {
                let mut v = valid();
                v.truncate(v.len() - 1);
                v
            },
            &["tensor `b.weight` data", "outside the file"],
        ),
        (
            "truncated tensor info",
            file_raw(
                3,
                1,
                0,
                &[],
                &[ti(b"t", &[8], T_F32, 0)[..20].to_vec()],
                1,
                20,
            ),
            &["tensor `t`"],
        ),
    ]
}

fn check_error(name: &str, bytes: &[u8], r: Result<Gguf, Error>, words: &[&str]) {
    match r {
        Err(Error::Gguf { path, offset, what }) => {
            assert_eq!(path, Path::new("corrupt.gguf"), "{name}");
            assert!(
                offset <= bytes.len() as u64,
                "{name}: offset {offset} past the file"
            );
            for w in words {
                assert!(what.contains(w), "{name}: `{what}` lacks `{w}`");
            }
        }
        Err(e) => panic!("{name}: expected Error::Gguf, got {e}"),
        Ok(_) => panic!("{name}: corrupt file was accepted"),
    }
}

/// Largest allocation accepted while parsing a corrupt file of `len` bytes.
fn alloc_bound(len: usize) -> usize {
    64 * len + 64 * 1024
}

#[test]
fn valid_base_file_parses() {
    let bytes = valid();
    let (r, _) = parse(&bytes);
    let g = r.expect("the base file is valid");
    assert_eq!(g.tensors().len(), 2);
    assert_eq!(g.get_str_array("toks"), Some(vec!["a", "bc"]));
    assert_eq!(g.tensor_bytes("b.weight").map(|b| b.len()), Some(32));
}

#[test]
fn corrupt_corpus_gives_clean_errors() {
    let cases = corpus();
    assert!(cases.len() >= 30, "corpus has {} cases", cases.len());
    let mut names = std::collections::HashSet::new();
    for (name, bytes, words) in cases {
        assert!(names.insert(name), "case name `{name}` repeated");
        let (r, largest) = parse(&bytes);
        check_error(name, &bytes, r, words);
        assert!(
            largest <= alloc_bound(bytes.len()),
            "{name}: allocated {largest} bytes for a {}-byte file",
            bytes.len()
        );
    }
}

#[test]
fn every_truncation_is_an_error() {
    let bytes = valid();
    for n in 0..bytes.len() {
        let prefix = bytes.get(..n).unwrap_or(&[]);
        let (r, largest) = parse(prefix);
        match r {
            Err(Error::Gguf { offset, what, .. }) => {
                assert!(offset <= n as u64, "prefix {n}: offset {offset}");
                assert!(
                    ["truncated", "too large", "larger than", "outside the file"]
                        .iter()
                        .any(|w| what.contains(w)),
                    "prefix {n}: `{what}` does not say truncated"
                );
            }
            Err(e) => panic!("prefix {n}: expected Error::Gguf, got {e}"),
            Ok(_) => panic!("prefix {n} of {} bytes was accepted", bytes.len()),
        }
        assert!(
            largest <= alloc_bound(bytes.len()),
            "prefix {n}: allocated {largest}"
        );
    }
}

/// Random byte mutations of the valid file: each parses or gives `Error::Gguf`; never a panic.
#[test]
fn mutations_never_panic() {
    let base = valid();
    let mut state: u64 = 0x1234_5678_9abc_def1;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut errors = 0;
    for _ in 0..20_000 {
        let mut bytes = base.clone();
        for _ in 0..(next() % 4 + 1) {
            let i = (next() % bytes.len() as u64) as usize;
            let v = match next() % 4 {
                0 => 0xff,
                1 => 0,
                _ => next() as u8,
            };
            if let Some(b) = bytes.get_mut(i) {
                *b = v;
            }
        }
        let (r, largest) = parse(&bytes);
        match r {
            Ok(_) => {}
            Err(Error::Gguf { .. }) => errors += 1,
            Err(e) => panic!("expected Error::Gguf, got {e}"),
        }
        assert!(largest <= alloc_bound(bytes.len()), "allocated {largest}");
    }
    assert!(errors > 1000, "only {errors} mutations were rejected");
}

/// A file not named as a split part that claims to be one of several parts.
#[test]
fn split_count_without_split_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("model.gguf");
    let bytes = file(&[kv(b"split.count", 2, &2u16.to_le_bytes())], &[], 0);
    std::fs::write(&path, &bytes).expect("write");
    match Gguf::open(&path) {
        Err(Error::Gguf { path: p, what, .. }) => {
            assert_eq!(p, path);
            assert!(
                what.contains("`split.count` is 2 but the file is not named"),
                "{what}"
            );
        }
        other => panic!("expected a split error, got {:?}", other.err()),
    }
}

/// A split part whose `split.no` disagrees with its file name.
#[test]
fn split_part_number_mismatch() {
    let dir = tempfile::tempdir().expect("tempdir");
    let part = |no: u16| {
        file(
            &[
                kv(b"split.no", 2, &no.to_le_bytes()),
                kv(b"split.count", 2, &2u16.to_le_bytes()),
            ],
            &[],
            0,
        )
    };
    let p1 = dir.path().join("m-00001-of-00002.gguf");
    let p2 = dir.path().join("m-00002-of-00002.gguf");
    std::fs::write(&p1, part(0)).expect("write");
    std::fs::write(&p2, part(0)).expect("write");
    match Gguf::open(&p1) {
        Err(Error::Gguf { path, what, .. }) => {
            assert_eq!(path, p2);
            assert!(what.contains("`split.no` is 0, expected 1"), "{what}");
        }
        other => panic!("expected a split error, got {:?}", other.err()),
    }
    std::fs::write(&p2, part(1)).expect("write");
    assert!(Gguf::open(&p1).is_ok(), "a consistent pair opens");
}

/// Opening files from disk: an empty file, a truncated copy and a missing file.
#[test]
fn open_from_disk_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let empty = dir.path().join("empty.gguf");
    std::fs::write(&empty, b"").expect("write");
    match Gguf::open(&empty) {
        Err(Error::Gguf { path, what, .. }) => {
            assert_eq!(path, empty);
            assert!(what.contains("magic"), "{what}");
        }
        other => panic!("expected Error::Gguf, got {:?}", other.err()),
    }
    let short = dir.path().join("short.gguf");
    let v = valid();
    std::fs::write(&short, &v[..v.len() - 7]).expect("write");
    match Gguf::open(&short) {
        Err(Error::Gguf { what, .. }) => assert!(what.contains("outside the file"), "{what}"),
        other => panic!("expected Error::Gguf, got {:?}", other.err()),
    }
    let missing = dir.path().join("missing.gguf");
    match Gguf::open(&missing) {
        Err(Error::Io { path, .. }) => assert_eq!(path, missing),
        other => panic!("expected Error::Io, got {:?}", other.err()),
    }
}
