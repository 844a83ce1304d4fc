//! memra-kernels: the CUDA kernel sources (one `.cu` file per op family under `kernels/cu/`),
//! their module table, and their NVRTC build with an on-disk PTX cache.
//!
//! Sources include no CUDA toolkit header: [`PRELUDE`] (our own `prelude.cuh`) is prepended to
//! each, providing f16/bf16 conversions and the fixed reduction tree. Every module is compiled
//! with `--fmad=false` so products are rounded before they are added, as on the CPU reference.
//!
//! cudarc loads `libnvrtc` dynamically and panics when it is missing; every entry point here
//! catches that and returns [`KernelError::NvrtcMissing`] instead.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

pub mod cubin;
pub mod sig;

pub use cubin::{Image, load_image_with};

/// The prelude prepended to every module source.
pub const PRELUDE: &str = include_str!("../cu/prelude.cuh");

/// Block-format dequantization shared by the matmul and embedding modules.
pub const DEQUANT: &str = include_str!("../cu/dequant.cuh");

/// A shared header: its file (for overrides from a directory) and its text.
#[derive(Clone, Copy, Debug)]
pub struct Header {
    pub file: &'static str,
    pub text: &'static str,
}

const H_DEQUANT: Header = Header {
    file: "kernels/cu/dequant.cuh",
    text: DEQUANT,
};
const H_MMA: Header = Header {
    file: "kernels/cu/mma.cuh",
    text: include_str!("../cu/mma.cuh"),
};
const H_PREP: Header = Header {
    file: "kernels/cu/prep.cuh",
    text: include_str!("../cu/prep.cuh"),
};
const H_KVFMT: Header = Header {
    file: "kernels/cu/kvfmt.cuh",
    text: include_str!("../cu/kvfmt.cuh"),
};
const H_F32ROWS: Header = Header {
    file: "kernels/cu/f32rows.cuh",
    text: include_str!("../cu/f32rows.cuh"),
};
const H_WFMT: Header = Header {
    file: "kernels/cu/wfmt.cuh",
    text: include_str!("../cu/wfmt.cuh"),
};

/// Weight types of the v2 tensor-core products (`mmq_<type>` in kernels/cu/products.cu), which
/// read weights repacked by `memra_engine::quant::repack`.
pub const PRODUCT_TYPES: &[&str] = &[
    "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k", "f16", "bf16",
];

/// Weight types the matmul and embedding kernels read, as kernel-name suffixes
/// (`matmul_q4_k`, `embed_q8_0`): the ggml names of `memra_engine::quant::DType`.
pub const WEIGHT_TYPES: &[&str] = &[
    "f32", "f16", "bf16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q4_k", "q5_k", "q6_k",
];

macro_rules! per_type {
    ($($prefix:literal),+ $(; $($extra:literal),+)?) => {
        &[$(
            concat!($prefix, "f32"),
            concat!($prefix, "f16"),
            concat!($prefix, "bf16"),
            concat!($prefix, "q4_0"),
            concat!($prefix, "q4_1"),
            concat!($prefix, "q5_0"),
            concat!($prefix, "q5_1"),
            concat!($prefix, "q8_0"),
            concat!($prefix, "q4_k"),
            concat!($prefix, "q5_k"),
            concat!($prefix, "q6_k"),
        )+ $($($extra,)+)?]
    };
}

/// One compilation unit: a `.cu` file and the `extern "C"` kernels it defines.
#[derive(Clone, Copy, Debug)]
pub struct Module {
    /// Short name (`matmul`), also the cache file prefix.
    pub name: &'static str,
    /// The file under `kernels/cu/`, named in compile errors.
    pub file: &'static str,
    pub source: &'static str,
    /// Shared headers prepended after the prelude (e.g. dequant.cuh).
    pub headers: &'static [Header],
    pub kernels: &'static [&'static str],
}

/// Every kernel module.
pub const MODULES: &[Module] = &[
    Module {
        name: "elementwise",
        file: "kernels/cu/elementwise.cu",
        source: include_str!("../cu/elementwise.cu"),
        headers: &[H_PREP],
        kernels: &[
            "add_in_place",
            "add_bias",
            "swiglu",
            "geglu_tanh",
            "geglu_prep",
            "scale_in_place",
            "softcap",
            "gather_rows",
            "copy_range",
            "fill_f32",
            "sigmoid_mul",
            "gated_add",
        ],
    },
    Module {
        name: "delta",
        file: "kernels/cu/delta.cu",
        source: include_str!("../cu/delta.cu"),
        headers: &[],
        kernels: &[
            "conv1d_silu",
            "gated_delta_k16",
            "gated_delta_k32",
            "gated_delta_k64",
            "gated_delta_k128",
            "gated_delta_conv_k16",
            "gated_delta_conv_k32",
            "gated_delta_conv_k64",
            "gated_delta_conv_k128",
            "keep_inputs",
        ],
    },
    Module {
        name: "matmul",
        file: "kernels/cu/matmul.cu",
        source: include_str!("../cu/matmul.cu"),
        headers: &[H_DEQUANT, H_F32ROWS],
        kernels: per_type!("matmul_", "matmul_id_"; "matmul_f32_rows", "matmul_f32_tiles"),
    },
    Module {
        name: "embed",
        file: "kernels/cu/embed.cu",
        source: include_str!("../cu/embed.cu"),
        headers: &[H_DEQUANT],
        kernels: per_type!("embed_"),
    },
    Module {
        name: "norm",
        file: "kernels/cu/norm.cu",
        source: include_str!("../cu/norm.cu"),
        headers: &[],
        kernels: &["rms_norm"],
    },
    Module {
        name: "rope",
        file: "kernels/cu/rope.cu",
        source: include_str!("../cu/rope.cu"),
        headers: &[H_KVFMT],
        kernels: &[
            "rope",
            "kv_write_f32",
            "kv_write_f16",
            "kv_write_bf16",
            "kv_write_q8_0",
            "rope_kv_f32",
            "rope_kv_f16",
            "rope_kv_bf16",
            "rope_kv_q8_0",
            "rope_kv_norm_f32",
            "rope_kv_norm_f16",
            "rope_kv_norm_bf16",
            "rope_kv_norm_q8_0",
            "rope_mrope",
            "rope_kv_mrope_f32",
            "rope_kv_mrope_f16",
            "rope_kv_mrope_bf16",
            "rope_kv_mrope_q8_0",
            "rope_kv_norm_mrope_f32",
            "rope_kv_norm_mrope_f16",
            "rope_kv_norm_mrope_bf16",
            "rope_kv_norm_mrope_q8_0",
        ],
    },
    Module {
        name: "attention",
        file: "kernels/cu/attention.cu",
        source: include_str!("../cu/attention.cu"),
        headers: &[H_PREP, H_KVFMT],
        kernels: &[
            "attn_split_f32",
            "attn_split_f16",
            "attn_split_bf16",
            "attn_split_q8_0",
        ],
    },
    Module {
        name: "attn_mma",
        file: "kernels/cu/attn_mma.cu",
        source: include_str!("../cu/attn_mma.cu"),
        headers: &[H_MMA, H_PREP, H_KVFMT],
        kernels: &[
            "attn_mma_h64_f32",
            "attn_mma_h64_f16",
            "attn_mma_h64_bf16",
            "attn_mma_h64_q8_0",
            "attn_mma_h128_f32",
            "attn_mma_h128_f16",
            "attn_mma_h128_bf16",
            "attn_mma_h128_q8_0",
            "attn_mmaf_h64_f32",
            "attn_mmaf_h64_f16",
            "attn_mmaf_h64_bf16",
            "attn_mmaf_h64_q8_0",
            "attn_mmaf_h128_f32",
            "attn_mmaf_h128_f16",
            "attn_mmaf_h128_bf16",
            "attn_mmaf_h128_q8_0",
            "attn_mma_h256_f16",
            "attn_mma_h256_bf16",
            "attn_combine",
        ],
    },
    Module {
        name: "sample",
        file: "kernels/cu/sample.cu",
        source: include_str!("../cu/sample.cu"),
        headers: &[],
        kernels: &[
            "argmax_rows",
            "argmax_at",
            "penalize_row",
            "topk_row",
            "topk_rows",
            "mask_rows",
        ],
    },
    Module {
        name: "products",
        file: "kernels/cu/products.cu",
        source: include_str!("../cu/products.cu"),
        headers: &[H_MMA, H_WFMT, H_PREP],
        kernels: &[
            "prepare_h16",
            "norm_prep",
            "add_norm_prep",
            "swiglu_prep",
            "norm_gate_prep",
            "ws_image",
            "mmq_q8_0",
            "mmq_q4_0",
            "mmq_q4_1",
            "mmq_q5_0",
            "mmq_q5_1",
            "mmq_q4_k",
            "mmq_q5_k",
            "mmq_q6_k",
            "mmq_f16",
            "mmq_bf16",
            "mms_q8_0",
            "mms_q4_0",
            "mms_q4_1",
            "mms_q5_0",
            "mms_q5_1",
            "mms_q4_k",
            "mms_q5_k",
            "mms_q6_k",
            "mms_f16",
            "mms_bf16",
            "mwg_q4_k",
            "mwg_f16",
            "mwg_bf16",
            "mwg_q8_0",
            "mwg_q4_0",
            "mwg_q6_k",
            "mws_f16",
            "mws_bf16",
            "mws_glu_f16",
            "mws_glu_bf16",
            "mmq_id_q8_0",
            "mmq_id_q4_0",
            "mmq_id_q4_1",
            "mmq_id_q5_0",
            "mmq_id_q5_1",
            "mmq_id_q4_k",
            "mmq_id_q5_k",
            "mmq_id_q6_k",
            "mmq_id_f16",
            "mmq_id_bf16",
            "mms_grouped_q8_0",
            "mms_grouped_q4_0",
            "mms_grouped_q4_1",
            "mms_grouped_q5_0",
            "mms_grouped_q5_1",
            "mms_grouped_q4_k",
            "mms_grouped_q5_k",
            "mms_grouped_q6_k",
            "mms_grouped_f16",
            "mms_grouped_bf16",
        ],
    },
    Module {
        name: "moe",
        file: "kernels/cu/moe.cu",
        source: include_str!("../cu/moe.cu"),
        headers: &[H_PREP],
        kernels: &["moe_route", "moe_norm_route", "moe_group", "moe_combine"],
    },
    Module {
        name: "vision",
        file: "kernels/cu/vision.cu",
        source: include_str!("../cu/vision.cu"),
        headers: &[H_MMA],
        kernels: &[
            "vit_patches",
            "vit_gemm_mma",
            "vit_qkv_half",
            "vit_layer_norm",
            "vit_attn_mma_d8",
            "vit_attn_mma_d16",
            "vit_attn_mma_d32",
            "vit_attn_mma_d64",
            "vit_attn_mma_d72",
            "vit_attn_mma_d80",
            "vit_attn_mma_d96",
            "vit_attn_mma_d128",
            "vit_pool",
            "qvit_patches",
            "qvit_rope",
            "qvit_attn_win_mma_d8",
            "qvit_attn_win_mma_d16",
            "qvit_attn_win_mma_d32",
            "qvit_attn_win_mma_d64",
            "qvit_attn_win_mma_d72",
            "qvit_attn_win_mma_d80",
            "qvit_attn_win_mma_d96",
            "qvit_attn_win_mma_d128",
        ],
    },
];

/// Head dimensions of the vision tower's attention kernels (`vit_attn_mma_d<D>` and the Qwen
/// ViT's window attention `qvit_attn_win_mma_d<D>` in kernels/cu/vision.cu).
pub const VIT_HEAD_DIMS: &[usize] = &[8, 16, 32, 64, 72, 80, 96, 128];

/// Most experts a router may have and most experts per row (kernels/cu/moe.cu, `MOE_MAX_E`,
/// `MOE_MAX_K`).
pub const MOE_MAX_EXPERTS: usize = 1024;
pub const MOE_MAX_USED: usize = 32;

/// The module named `name`.
pub fn module(name: &str) -> Option<&'static Module> {
    MODULES.iter().find(|m| m.name == name)
}

/// Errors of the kernel build.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error(
        "NVRTC (libnvrtc.so) could not be loaded: {0}. Install the CUDA toolkit's NVRTC or the \
         PyPI wheel nvidia-cuda-nvrtc and put its lib folder on LD_LIBRARY_PATH \
         (tools/test.sh does this)"
    )]
    NvrtcMissing(String),
    #[error("NVRTC failed to compile {file} for {arch}: {what}\n--- NVRTC log ---\n{log}")]
    Compile {
        file: String,
        arch: String,
        what: String,
        log: String,
    },
    #[error(
        "compute capability {0}.{1} is not supported (supported: 8.0, 8.6, 8.9, 9.0, 10.0, 12.x)"
    )]
    UnsupportedArch(i32, i32),
    #[error("kernel cache {path}: {what}")]
    Cache { path: PathBuf, what: String },
}

/// The NVRTC virtual architecture for a device's compute capability: 9.0 -> `compute_90a`,
/// 12.0 -> `compute_120a`. PTX for it is JIT-compiled by the driver to that exact chip.
pub fn arch_for(major: i32, minor: i32) -> Result<&'static str, KernelError> {
    Ok(match (major, minor) {
        (8, 0) => "compute_80",
        (8, 6) => "compute_86",
        (8, 9) => "compute_89",
        (9, 0) => "compute_90a",
        (10, 0) => "compute_100a",
        (12, 0) => "compute_120a",
        // Arch-specific ("a") PTX runs only on the exact chip; other 12.x get the portable one.
        (12, _) => "compute_120",
        _ => return Err(KernelError::UnsupportedArch(major, minor)),
    })
}

/// Runs `f`, turning a panic (cudarc's dynamic loader panics when a library is missing) into
/// an error carrying the panic message.
pub fn catch_panic<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|p| {
        p.downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "panic without a message".into())
    })
}

/// NVRTC's (major, minor) version, or why NVRTC cannot be used.
pub fn nvrtc_version() -> Result<(i32, i32), KernelError> {
    let r = catch_panic(|| {
        let (mut major, mut minor) = (0i32, 0i32);
        // SAFETY: nvrtcVersion writes two ints through valid pointers.
        let res = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
        (res, major, minor)
    })
    .map_err(KernelError::NvrtcMissing)?;
    match r {
        (cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS, major, minor) => Ok((major, minor)),
        (e, _, _) => Err(KernelError::NvrtcMissing(format!("nvrtcVersion: {e:?}"))),
    }
}

/// The NVRTC options every module is compiled with (besides the architecture).
pub const COMPILE_OPTIONS: &[&str] = &["--fmad=false", "--std=c++17", "-default-device"];

/// How a module is built: its NVRTC defines (`NAME=VALUE`, e.g. tile parameters) and an optional
/// directory whose files replace the built-in sources of the same name (`$MEMRA_KERNEL_DIR`:
/// variants are tried on the GPU machine without a Rust rebuild).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Build {
    pub defines: Vec<String>,
    pub source_dir: Option<PathBuf>,
}

impl Build {
    /// The build with `defines` and the source directory from `$MEMRA_KERNEL_DIR`, if set.
    pub fn with_defines(defines: &[String]) -> Build {
        Build {
            defines: defines.to_vec(),
            source_dir: std::env::var_os("MEMRA_KERNEL_DIR").map(PathBuf::from),
        }
    }
}

/// The text of `file` (a path like `kernels/cu/x.cu`): from `dir` when that folder holds a file
/// of the same name, else `builtin`.
fn source_text(dir: Option<&Path>, file: &str, builtin: &'static str) -> String {
    let name = Path::new(file).file_name();
    match (dir, name) {
        (Some(d), Some(n)) => std::fs::read_to_string(d.join(n)).unwrap_or_else(|_| builtin.into()),
        _ => builtin.to_string(),
    }
}

/// The full source NVRTC sees for `m`: the prelude, then the module.
pub fn full_source(m: &Module) -> String {
    full_source_with(m, &Build::default())
}

/// [`full_source`] under `b` (sources from `b.source_dir` where present).
pub fn full_source_with(m: &Module, b: &Build) -> String {
    let dir = b.source_dir.as_deref();
    let mut s = source_text(dir, "kernels/cu/prelude.cuh", PRELUDE);
    for h in m.headers {
        s.push_str(&format!("\n#line 1 \"{}\"\n", h.file));
        s.push_str(&source_text(dir, h.file, h.text));
    }
    let body = source_text(dir, m.file, m.source);
    s.push_str(&format!("\n#line 1 \"{}\"\n{}", m.file, body));
    s
}

/// The NVRTC options of a build: [`COMPILE_OPTIONS`] (less `--fmad=false` for modules that
/// choose their own rounding, see [`fmad_free`]) and `-D` per define.
pub fn options_for(m: &Module, b: &Build) -> Vec<String> {
    let mut o: Vec<String> = COMPILE_OPTIONS
        .iter()
        .filter(|o| !(fmad_free(m) && o.starts_with("--fmad")))
        .map(|s| s.to_string())
        .collect();
    o.extend(b.defines.iter().map(|d| format!("-D{d}")));
    o
}

/// Modules whose float arithmetic is written with explicit `_rn` intrinsics (the v2 products):
/// they compile with FMA contraction allowed, which cannot change those expressions.
pub fn fmad_free(m: &Module) -> bool {
    m.name == "products"
}

/// Compiles `m` for `arch` (e.g. `compute_90a`) and returns the PTX text.
pub fn compile(m: &Module, arch: &'static str) -> Result<String, KernelError> {
    compile_with(m, arch, &Build::default())
}

/// [`compile`] under build `b`.
pub fn compile_with(m: &Module, arch: &'static str, b: &Build) -> Result<String, KernelError> {
    let src = full_source_with(m, b);
    let opts = cudarc::nvrtc::CompileOptions {
        arch: Some(arch),
        options: options_for(m, b),
        name: Some(m.file.to_string()),
        ..Default::default()
    };
    let res = catch_panic(|| cudarc::nvrtc::compile_ptx_with_opts(src, opts))
        .map_err(KernelError::NvrtcMissing)?;
    let ptx = res.map_err(|e| {
        let (what, log) = match &e {
            cudarc::nvrtc::CompileError::CompileError { nvrtc, log, .. } => {
                (format!("{nvrtc:?}"), log.to_string_lossy().into_owned())
            }
            other => (format!("{other:?}"), String::new()),
        };
        KernelError::Compile {
            file: m.file.to_string(),
            arch: arch.to_string(),
            what,
            log,
        }
    })?;
    let text = catch_panic(|| ptx.to_src()).map_err(|what| KernelError::Compile {
        file: m.file.to_string(),
        arch: arch.to_string(),
        what: format!("PTX is not text: {what}"),
        log: String::new(),
    })?;
    Ok(text.trim_end_matches('\0').to_string())
}

/// The cache folder: `$MEMRA_KERNEL_CACHE`, else `~/.cache/memra/kernels`. (This crate's two
/// environment variables, `MEMRA_KERNEL_CACHE` and `MEMRA_KERNEL_DIR`, are rows of the one table
/// of settings, engine/src/settings.rs; it sits below the engine, so it reads them itself.)
pub fn default_cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("MEMRA_KERNEL_CACHE") {
        return PathBuf::from(d);
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    home.join(".cache/memra/kernels")
}

/// The cache file of `m` for `arch` under NVRTC `version`: keyed by the hash of the full source
/// and options, the architecture and the NVRTC version.
pub fn cache_path(dir: &Path, m: &Module, arch: &str, version: (i32, i32)) -> PathBuf {
    cache_path_with(dir, m, arch, version, &Build::default())
}

/// [`cache_path`] under build `b` (its sources and defines are part of the key).
pub fn cache_path_with(
    dir: &Path,
    m: &Module,
    arch: &str,
    version: (i32, i32),
    b: &Build,
) -> PathBuf {
    dir.join(format!(
        "{}-{arch}-nvrtc{}.{}-{}.ptx",
        m.name,
        version.0,
        version.1,
        cache_hash(m, b)
    ))
}

/// The cache key of `m` under `b`: the first 8 bytes (hex) of the sha256 of its full source and
/// NVRTC options.
pub fn cache_hash(m: &Module, b: &Build) -> String {
    let mut h = Sha256::new();
    h.update(full_source_with(m, b).as_bytes());
    for o in options_for(m, b) {
        h.update(o.as_bytes());
        h.update([0u8]);
    }
    h.finalize()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// PTX of `m` for `arch`, from the disk cache under `dir` or compiled (and then stored). A cache
/// that cannot be written is not an error (the PTX is still returned).
pub fn compile_cached(m: &Module, arch: &'static str, dir: &Path) -> Result<String, KernelError> {
    compile_cached_with(m, arch, dir, &Build::default())
}

/// [`compile_cached`] under build `b`.
pub fn compile_cached_with(
    m: &Module,
    arch: &'static str,
    dir: &Path,
    b: &Build,
) -> Result<String, KernelError> {
    let version = nvrtc_version()?;
    let path = cache_path_with(dir, m, arch, version, b);
    match std::fs::read_to_string(&path) {
        Ok(text) if text.contains(".entry") => return Ok(text),
        _ => {}
    }
    let ptx = compile_with(m, arch, b)?;
    if std::fs::create_dir_all(dir).is_ok() {
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        if std::fs::write(&tmp, &ptx).is_ok() {
            let _ = std::fs::rename(&tmp, &path);
        }
    }
    Ok(ptx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arch_table() {
        assert_eq!(arch_for(9, 0).ok(), Some("compute_90a"));
        assert_eq!(arch_for(12, 0).ok(), Some("compute_120a"));
        assert!(matches!(
            arch_for(7, 5),
            Err(KernelError::UnsupportedArch(7, 5))
        ));
    }

    /// Module names are unique (they name cache files); that each module's kernel list is its
    /// source's is `sig::modules::module_lists_match_their_sources`.
    #[test]
    fn module_names_are_unique() {
        for (i, m) in MODULES.iter().enumerate() {
            assert!(MODULES[..i].iter().all(|o| o.name != m.name), "{}", m.name);
        }
    }

    #[test]
    fn cache_key_depends_on_arch_and_version() {
        let m = &MODULES[0];
        let d = Path::new("/x");
        let a = cache_path(d, m, "compute_90a", (13, 0));
        assert_ne!(a, cache_path(d, m, "compute_120a", (13, 0)));
        assert_ne!(a, cache_path(d, m, "compute_90a", (13, 1)));
    }
}
