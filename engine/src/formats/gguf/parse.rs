//! Parsing of one GGUF file's header: metadata and tensor index, with every size checked
//! against the bytes of the file before anything is allocated.

use std::collections::HashSet;
use std::path::Path;

use super::cursor::Cursor;
use super::{GgufTensorInfo, MetaValue, value_type};
use crate::error::Result;
use crate::quant::DType;

/// "GGUF" as stored in the first four bytes.
pub const MAGIC: [u8; 4] = *b"GGUF";
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Deepest nesting of arrays inside arrays accepted (1 = arrays of scalars only).
pub const MAX_ARRAY_DEPTH: usize = 4;
/// Most dimensions of a tensor.
pub const MAX_DIMS: u32 = 4;

/// One parsed file.
pub(crate) struct Parsed {
    pub version: u32,
    pub metadata: Vec<(String, MetaValue)>,
    pub tensors: Vec<GgufTensorInfo>,
    pub alignment: u64,
    pub data_offset: u64,
}

/// Smallest encoding of a metadata entry: key length (8), a 1-byte key, value type (4), 1 byte.
const MIN_KV_BYTES: usize = 8 + 1 + 4 + 1;
/// Smallest encoding of a tensor info: name length (8), 1-byte name, n_dims (4), one dim (8),
/// type (4), offset (8).
const MIN_TENSOR_INFO_BYTES: usize = 8 + 1 + 4 + 8 + 4 + 8;

/// Smallest encoding of one value of type `ty` (for checking array lengths), if `ty` is known.
fn min_value_bytes(ty: u32) -> Option<usize> {
    Some(match ty {
        value_type::U8 | value_type::I8 | value_type::BOOL => 1,
        value_type::U16 | value_type::I16 => 2,
        value_type::U32 | value_type::I32 | value_type::F32 => 4,
        value_type::U64 | value_type::I64 | value_type::F64 => 8,
        value_type::STRING => 8,
        value_type::ARRAY => 4 + 8,
        _ => return None,
    })
}

/// Reads one metadata value of type `ty`; `depth` counts the arrays around it.
fn read_value(
    cur: &mut Cursor<'_>,
    ty: u32,
    depth: usize,
    what: &dyn Fn() -> String,
) -> Result<MetaValue> {
    let at = cur.pos();
    let v = match ty {
        value_type::U8 => MetaValue::U8(cur.u8(what)?),
        value_type::I8 => MetaValue::I8(cur.u8(what)? as i8),
        value_type::U16 => MetaValue::U16(cur.u16(what)?),
        value_type::I16 => MetaValue::I16(cur.u16(what)? as i16),
        value_type::U32 => MetaValue::U32(cur.u32(what)?),
        value_type::I32 => MetaValue::I32(cur.u32(what)? as i32),
        value_type::F32 => MetaValue::F32(f32::from_bits(cur.u32(what)?)),
        value_type::U64 => MetaValue::U64(cur.u64(what)?),
        value_type::I64 => MetaValue::I64(cur.u64(what)? as i64),
        value_type::F64 => MetaValue::F64(f64::from_bits(cur.u64(what)?)),
        value_type::BOOL => match cur.u8(what)? {
            0 => MetaValue::Bool(false),
            1 => MetaValue::Bool(true),
            b => return Err(cur.err_at(at, format!("{}: invalid bool byte {b}", what()))),
        },
        value_type::STRING => MetaValue::Str(cur.string(what)?),
        value_type::ARRAY => {
            if depth >= MAX_ARRAY_DEPTH {
                return Err(cur.err_at(
                    at,
                    format!(
                        "{}: arrays nested deeper than {MAX_ARRAY_DEPTH} levels",
                        what()
                    ),
                ));
            }
            let ety = cur.u32(&|| format!("{} array element type", what()))?;
            let min = min_value_bytes(ety).ok_or_else(|| {
                cur.err_at(at, format!("{}: unknown array element type {ety}", what()))
            })?;
            let n = cur.count(min, &|| format!("{} array length", what()))?;
            let mut items = Vec::with_capacity(n);
            for i in 0..n {
                let item_what = || format!("{} element {i}", what());
                items.push(read_value(cur, ety, depth + 1, &item_what)?);
            }
            MetaValue::Array(items)
        }
        _ => return Err(cur.err_at(at, format!("{}: unknown value type {ty}", what()))),
    };
    Ok(v)
}

/// Reads the metadata section (`n` key/value pairs).
fn read_metadata(cur: &mut Cursor<'_>, n: usize) -> Result<Vec<(String, MetaValue)>> {
    let mut out: Vec<(String, MetaValue)> = Vec::with_capacity(n);
    let mut seen: HashSet<String> = HashSet::with_capacity(n);
    for i in 0..n {
        let at = cur.pos();
        let key = cur.string(&|| format!("metadata key #{i}"))?;
        if key.is_empty() {
            return Err(cur.err_at(at, format!("metadata key #{i} is empty")));
        }
        if seen.contains(&key) {
            return Err(cur.err_at(at, format!("metadata key #{i} `{key}` is a duplicate")));
        }
        let ty_at = cur.pos();
        let ty = cur.u32(&|| format!("metadata key `{key}` value type"))?;
        if min_value_bytes(ty).is_none() {
            return Err(cur.err_at(
                ty_at,
                format!("metadata key `{key}` value type {ty} is unknown"),
            ));
        }
        let value = read_value(cur, ty, 0, &|| format!("metadata key `{key}` value"))?;
        if key == KEY_ALIGNMENT {
            check_alignment(cur, ty_at, &value)?;
        }
        seen.insert(key.clone());
        out.push((key, value));
    }
    Ok(out)
}

const KEY_ALIGNMENT: &str = "general.alignment";

/// `general.alignment` must be a u32 power of two (`at`: offset of its value type).
fn check_alignment(cur: &Cursor<'_>, at: usize, value: &MetaValue) -> Result<()> {
    match value {
        MetaValue::U32(a) if a.is_power_of_two() => Ok(()),
        MetaValue::U32(a) => Err(cur.err_at(
            at,
            format!("metadata key `{KEY_ALIGNMENT}` value {a} is not a non-zero power of two"),
        )),
        v => Err(cur.err_at(
            at,
            format!(
                "metadata key `{KEY_ALIGNMENT}` must be a u32, found a {}",
                v.type_name()
            ),
        )),
    }
}

/// The data alignment: `general.alignment` (checked while reading) or the default.
fn alignment(metadata: &[(String, MetaValue)]) -> u64 {
    match metadata.iter().find(|(k, _)| k == KEY_ALIGNMENT) {
        Some((_, MetaValue::U32(a))) => *a as u64,
        _ => DEFAULT_ALIGNMENT,
    }
}

/// Reads one tensor info (without its absolute offset, which needs the data section start).
fn read_tensor_info(
    cur: &mut Cursor<'_>,
    i: usize,
    alignment: u64,
    names: &mut HashSet<String>,
) -> Result<GgufTensorInfo> {
    let at = cur.pos();
    let name = cur.string(&|| format!("tensor #{i} name"))?;
    if name.is_empty() {
        return Err(cur.err_at(at, format!("tensor #{i} name is empty")));
    }
    if names.contains(&name) {
        return Err(cur.err_at(at, format!("tensor #{i} name `{name}` is a duplicate")));
    }
    let nd_at = cur.pos();
    let n_dims = cur.u32(&|| format!("tensor `{name}` n_dims"))?;
    if !(1..=MAX_DIMS).contains(&n_dims) {
        return Err(cur.err_at(
            nd_at,
            format!("tensor `{name}` n_dims {n_dims} is not in 1..={MAX_DIMS}"),
        ));
    }
    let mut dims = Vec::with_capacity(n_dims as usize);
    let mut numel: u64 = 1;
    for d in 0..n_dims {
        let d_at = cur.pos();
        let v = cur.u64(&|| format!("tensor `{name}` dim {d}"))?;
        if v == 0 || v > i64::MAX as u64 {
            return Err(cur.err_at(d_at, format!("tensor `{name}` dim {d} is {v}")));
        }
        numel = numel
            .checked_mul(v)
            .filter(|&n| n <= i64::MAX as u64)
            .ok_or_else(|| {
                cur.err_at(
                    d_at,
                    format!("tensor `{name}` dim {d}: element count overflows"),
                )
            })?;
        dims.push(v);
    }
    let ty_at = cur.pos();
    let ty = cur.u32(&|| format!("tensor `{name}` type"))?;
    let dtype = DType::from_ggml_id(ty).ok_or_else(|| {
        cur.err_at(
            ty_at,
            format!("tensor `{name}` type {ty} is an unknown or unsupported ggml type"),
        )
    })?;
    let row = dims.first().copied().unwrap_or(1);
    if !row.is_multiple_of(dtype.block_size() as u64) {
        return Err(cur.err_at(
            nd_at,
            format!(
                "tensor `{name}` row length {row} is not a multiple of the {dtype} block size {}",
                dtype.block_size()
            ),
        ));
    }
    let row_bytes = dtype
        .bytes_for(row)
        .ok_or_else(|| cur.err_at(nd_at, format!("tensor `{name}` byte size overflows")))?;
    let nbytes = row_bytes
        .checked_mul(numel / row)
        .ok_or_else(|| cur.err_at(nd_at, format!("tensor `{name}` byte size overflows")))?;
    let off_at = cur.pos();
    let offset = cur.u64(&|| format!("tensor `{name}` offset"))?;
    if !offset.is_multiple_of(alignment) {
        return Err(cur.err_at(
            off_at,
            format!(
                "tensor `{name}` offset {offset} is not a multiple of the alignment {alignment}"
            ),
        ));
    }
    names.insert(name.clone());
    Ok(GgufTensorInfo {
        name,
        dtype,
        dims,
        file: 0,
        offset,
        nbytes,
    })
}

/// Parses a whole GGUF file held in `buf`.
pub(crate) fn parse(buf: &[u8], path: &Path) -> Result<Parsed> {
    let mut cur = Cursor::new(buf, path);
    let magic = cur.take(4, &|| "magic".to_string())?;
    if magic != MAGIC {
        return Err(cur.err_at(0, format!("bad magic {magic:02x?}, expected \"GGUF\"")));
    }
    let version = cur.u32(&|| "version".to_string())?;
    match version {
        2 | 3 => {}
        1 => return Err(cur.err_at(4, "version 1 is not supported (only 2 and 3)")),
        v if (1..=3).contains(&v.swap_bytes()) => {
            return Err(cur.err_at(4, "big-endian GGUF files are not supported"));
        }
        v => return Err(cur.err_at(4, format!("version {v} is not supported (only 2 and 3)"))),
    }
    let n_tensors = cur.count(MIN_TENSOR_INFO_BYTES, &|| "tensor count".to_string())?;
    let n_kv = cur.count(MIN_KV_BYTES, &|| "metadata kv count".to_string())?;
    let metadata = read_metadata(&mut cur, n_kv)?;
    let alignment = alignment(&metadata);
    // Re-check the tensor count now that the metadata has consumed its bytes.
    if (n_tensors as u64).saturating_mul(MIN_TENSOR_INFO_BYTES as u64) > cur.remaining() as u64 {
        return Err(cur.err_at(
            16,
            format!(
                "tensor count {n_tensors} is too large for the {} bytes left after the metadata",
                cur.remaining()
            ),
        ));
    }
    let mut names = HashSet::with_capacity(n_tensors);
    let mut tensors = Vec::with_capacity(n_tensors);
    let mut info_at = Vec::with_capacity(n_tensors);
    for i in 0..n_tensors {
        info_at.push(cur.pos());
        tensors.push(read_tensor_info(&mut cur, i, alignment, &mut names)?);
    }
    let end = cur.pos() as u64;
    let data_offset = end
        .checked_add(alignment - 1)
        .map(|v| v / alignment * alignment)
        .ok_or_else(|| cur.err_at(cur.pos(), "data section offset overflows"))?;
    let file_len = cur.len() as u64;
    for (t, &at) in tensors.iter_mut().zip(&info_at) {
        let start = data_offset.checked_add(t.offset);
        let stop = start.and_then(|s| s.checked_add(t.nbytes));
        match (start, stop) {
            (Some(s), Some(e)) if e <= file_len => t.offset = s,
            _ => {
                return Err(cur.err_at(
                    at,
                    format!(
                        "tensor `{}` data (offset {} + {} bytes after the data section at {data_offset}) \
                         lies outside the file of {file_len} bytes (truncated data?)",
                        t.name, t.offset, t.nbytes
                    ),
                ));
            }
        }
    }
    check_overlap(&cur, &tensors)?;
    Ok(Parsed {
        version,
        metadata,
        tensors,
        alignment,
        data_offset,
    })
}

/// Tensor data ranges must not overlap.
fn check_overlap(cur: &Cursor<'_>, tensors: &[GgufTensorInfo]) -> Result<()> {
    let mut order: Vec<&GgufTensorInfo> = tensors.iter().filter(|t| t.nbytes > 0).collect();
    order.sort_by_key(|t| t.offset);
    for w in order.windows(2) {
        if let [a, b] = w
            && a.offset + a.nbytes > b.offset
        {
            return Err(cur.err_at(
                b.offset as usize,
                format!(
                    "tensor `{}` data overlaps tensor `{}` (bytes {}..{} and {}..{})",
                    b.name,
                    a.name,
                    b.offset,
                    b.offset + b.nbytes,
                    a.offset,
                    a.offset + a.nbytes
                ),
            ));
        }
    }
    Ok(())
}
