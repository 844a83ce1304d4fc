//! One CUDA device: context, stream, the NVRTC-built kernel modules, memory helpers and launch
//! wrappers for every kernel (used by the backend and by `memra-verify kernels`). Every launch is
//! checked against the kernel's parameters as read from its source (`memra_kernels::sig`).
//!
//! Kernel arguments are raw device addresses (`u64`): buffers are owned by the caller and used
//! on the one stream, with cudarc's multi-stream event tracking disabled.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DeviceRepr, DriverError,
    ValidAsZeroBits,
};

use memra_kernels::sig::Param;

use crate::error::{Error, Result};
use crate::kv_format::KvDtype;
use crate::quant::DType;

/// A kernel argument.
#[derive(Clone, Copy, Debug)]
pub enum Arg {
    /// A device address.
    Ptr(u64),
    U32(u32),
    U64(u64),
    F32(f32),
}

/// Every kernel's parameter kinds, read once from the sources the modules compile (with
/// `$MEMRA_KERNEL_DIR` applied): the one table launches are checked against.
fn signatures() -> &'static Result<HashMap<String, Vec<Param>>, String> {
    static SIGS: std::sync::OnceLock<Result<HashMap<String, Vec<Param>>, String>> =
        std::sync::OnceLock::new();
    SIGS.get_or_init(|| {
        let build = memra_kernels::Build::with_defines(&[]);
        let mut map = HashMap::new();
        for m in memra_kernels::MODULES {
            let src = memra_kernels::full_source_with(m, &build);
            for s in memra_kernels::sig::signatures(&src).map_err(|e| format!("{}: {e}", m.file))? {
                map.insert(s.name, s.params);
            }
        }
        Ok(map)
    })
}

/// Checks a launch of kernel `name` with `args` against the kernel's parameters.
pub(super) fn check_args(name: &str, args: &[Arg]) -> std::result::Result<(), String> {
    let sigs = signatures().as_ref().map_err(|e| e.clone())?;
    let params = sigs
        .get(name)
        .ok_or_else(|| format!("launch {name}: no such kernel in the sources"))?;
    if params.len() != args.len() {
        return Err(format!(
            "launch {name}: {} arguments for {} parameters",
            args.len(),
            params.len()
        ));
    }
    for (i, (a, p)) in args.iter().zip(params).enumerate() {
        // A device address and a u64 are both 8 bytes passed by value: either may stand for the
        // other; the 4-byte kinds must match exactly.
        let ok = matches!(
            (a, p),
            (Arg::Ptr(_) | Arg::U64(_), Param::Ptr | Param::U64)
                | (Arg::U32(_), Param::U32)
                | (Arg::F32(_), Param::F32)
        );
        if !ok {
            return Err(format!(
                "launch {name}: argument {i} is {a:?}, the kernel takes {p:?}"
            ));
        }
    }
    Ok(())
}

/// Runs `f`, turning a panic (cudarc panics when libcuda/libnvrtc is missing) into `Err` with
/// its message, without printing the panic.
pub fn quiet_catch<T>(f: impl FnOnce() -> T) -> std::result::Result<T, String> {
    let prev = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let r = memra_kernels::catch_panic(f);
    std::panic::set_hook(prev);
    r
}

/// Number of CUDA devices, or why CUDA cannot be used. Never panics.
pub fn device_count() -> std::result::Result<usize, String> {
    match quiet_catch(CudaContext::device_count) {
        Ok(Ok(n)) => Ok(n.max(0) as usize),
        Ok(Err(e)) => Err(format!("CUDA driver: {e:?}")),
        Err(msg) if msg.contains("dynamically load") => {
            Err("the NVIDIA driver library (libcuda.so) was not found".into())
        }
        Err(msg) => Err(msg),
    }
}

/// The weight types the matmul and embedding kernels read.
pub fn kernel_supports(dtype: DType) -> bool {
    memra_kernels::WEIGHT_TYPES.contains(&dtype.name())
}

pub struct Gpu {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    /// `cuda:N`.
    pub name: String,
    /// The NVRTC architecture the kernels were built for.
    pub arch: &'static str,
    /// Streaming multiprocessors.
    pub sms: u32,
    /// Most dynamic shared memory one block may opt in to (bytes).
    pub smem_optin: usize,
    /// The attention kernel family: `attn_mma` (tensor cores, where a launch has a kernel:
    /// attention.rs [`super::attn_mma_eligible`]) or `attn_split` for every launch (the
    /// CUDA-core split kernel, which takes the other launches anyway;
    /// [`Gpu::force_attn_split`], `memra-verify kernels --attn-split`).
    pub(super) attn_kernel: &'static str,
    /// Programmatic dependent launch (sm_90 and later): see [`Gpu::launch_ex`].
    pub(super) pdl: bool,
    /// Resident blocks per multiprocessor of an attention kernel with its shared memory.
    occupancy: Mutex<HashMap<(&'static str, usize), usize>>,
    pub(super) funcs: HashMap<&'static str, CudaFunction>,
    /// Modules compiled on first use, per (module, defines): see [`Gpu::variant`].
    variants: Mutex<HashMap<(String, Vec<String>), Funcs>>,
}

/// The kernels of one compiled module variant, by name.
pub type Funcs = Arc<HashMap<String, CudaFunction>>;

/// Modules compiled on first use with their defines (tile parameters), not at open.
pub(super) const LAZY_MODULES: &[&str] = &["products"];

const BLOCK: u32 = 256;
/// Threads of argmax_rows / argmax_at (kernels/cu/sample.cu `ARGMAX_T`).
const ARGMAX_THREADS: u32 = 1024;
/// Grid-stride kernels use at most this many blocks.
const MAX_BLOCKS: u64 = 1 << 16;

/// A driver context on device `device` (checked to exist), with errors naming it.
pub(super) fn open_context(device: usize) -> Result<Arc<CudaContext>> {
    let name = format!("cuda:{device}");
    let fail = |what: String| Error::Backend {
        backend: name.clone(),
        what,
    };
    let n = device_count().map_err(|e| fail(format!("CUDA is not available: {e}")))?;
    if device >= n {
        return Err(fail(format!(
            "no such device: {n} CUDA device(s) present (0..{n})"
        )));
    }
    quiet_catch(|| CudaContext::new(device))
        .map_err(&fail)?
        .map_err(|e| fail(format!("creating the context: {e:?}")))
}

impl Gpu {
    /// Opens device `device`, builds (or loads from the disk cache) every kernel module.
    pub fn open(device: usize) -> Result<Gpu> {
        let name = format!("cuda:{device}");
        let fail = |what: String| Error::Backend {
            backend: name.clone(),
            what,
        };
        let ctx = open_context(device)?;
        // SAFETY: all work goes to the one stream below, in order; buffers outlive their use
        // (the backend synchronizes before freeing or reading back).
        unsafe { ctx.disable_event_tracking() };
        // A created stream, not the legacy default one: CUDA graphs capture only such streams.
        let stream = ctx
            .new_stream()
            .map_err(|e| fail(format!("creating the stream: {e:?}")))?;
        let (major, minor) = ctx
            .compute_capability()
            .map_err(|e| fail(format!("compute capability: {e:?}")))?;
        let arch = memra_kernels::arch_for(major, minor).map_err(|e| fail(e.to_string()))?;
        let sms = ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )
            .map_err(|e| fail(format!("multiprocessor count: {e:?}")))? as u32;
        let smem_optin = ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            )
            .map_err(|e| fail(format!("shared memory per block: {e:?}")))? as usize;
        let dir = memra_kernels::default_cache_dir();
        let mut funcs = HashMap::new();
        for m in memra_kernels::MODULES {
            if LAZY_MODULES.contains(&m.name) {
                continue;
            }
            let image = memra_kernels::load_image_with(m, arch, &dir, &Default::default())
                .map_err(|e| fail(e.to_string()))?;
            let what = image_kind(&image);
            let module = load_image(&ctx, image)
                .map_err(|e| fail(format!("loading {} ({what}) for {arch}: {e:?}", m.file)))?;
            for &k in m.kernels {
                let f = module
                    .load_function(k)
                    .map_err(|e| fail(format!("kernel {k} of {}: {e:?}", m.file)))?;
                funcs.insert(k, f);
            }
        }
        Gpu {
            ctx,
            stream,
            name,
            arch,
            sms,
            smem_optin,
            attn_kernel: "attn_mma",
            pdl: major >= 9,
            occupancy: Mutex::new(HashMap::new()),
            funcs,
            variants: Mutex::new(HashMap::new()),
        }
        .with_attention_smem()
    }

    /// Lets the tensor-core attention kernels take their double-buffered K/V tiles (dynamic
    /// shared memory past the 48 KiB default).
    fn with_attention_smem(self) -> Result<Gpu> {
        for (name, f) in &self.funcs {
            if name.starts_with("attn_mma") {
                self.allow_dynamic_smem(f)
                    .map_err(|e| self.err(format!("kernel {name}: shared memory: {e:?}")))?;
            }
        }
        Ok(self)
    }

    /// Blocks of `name` (128 threads, `smem` bytes of dynamic shared memory) resident on one
    /// multiprocessor (at least 1), asked of the driver once per (kernel, smem).
    pub(super) fn blocks_per_sm(
        &self,
        name: &'static str,
        f: &CudaFunction,
        smem: usize,
    ) -> Result<usize> {
        let mut cache = self
            .occupancy
            .lock()
            .map_err(|_| self.err("occupancy cache poisoned"))?;
        if let Some(&n) = cache.get(&(name, smem)) {
            return Ok(n);
        }
        let n = f
            .occupancy_max_active_blocks_per_multiprocessor(128, smem, None)
            .map_err(|e| self.err(format!("occupancy of {name}: {e:?}")))?
            .max(1) as usize;
        cache.insert((name, smem), n);
        Ok(n)
    }

    /// The attention kernel family in use (`attn_mma`, or `attn_split` after
    /// [`Gpu::force_attn_split`]).
    pub fn attn_kernel(&self) -> &'static str {
        self.attn_kernel
    }

    /// Every attention launch of this device runs the CUDA-core split kernel (`attn_split`),
    /// also where a tensor-core kernel exists: for the kernels gate (`memra-verify kernels
    /// --attn-split`), which checks the split kernel on every shape. Not for serving: the two
    /// families order the arithmetic differently.
    pub fn force_attn_split(&mut self) {
        self.attn_kernel = "attn_split";
    }

    /// The kernels of module `module` built with `defines` (`NAME=VALUE`), compiled (or read
    /// from the disk cache) on first use and kept for the device's lifetime.
    pub fn variant(&self, module: &str, defines: &[String]) -> Result<Funcs> {
        let key = (module.to_string(), defines.to_vec());
        let mut cache = self
            .variants
            .lock()
            .map_err(|_| self.err("kernel variant cache poisoned"))?;
        if let Some(f) = cache.get(&key) {
            return Ok(f.clone());
        }
        let m = memra_kernels::module(module)
            .ok_or_else(|| self.err(format!("no kernel module {module}")))?;
        let build = memra_kernels::Build::with_defines(defines);
        let dir = memra_kernels::default_cache_dir();
        let image = memra_kernels::load_image_with(m, self.arch, &dir, &build)
            .map_err(|e| self.err(e.to_string()))?;
        let what = image_kind(&image);
        let loaded = load_image(&self.ctx, image)
            .map_err(|e| self.err(format!("loading {} {defines:?} ({what}): {e:?}", m.file)))?;
        let mut funcs = HashMap::new();
        for &k in m.kernels {
            let f = loaded
                .load_function(k)
                .map_err(|e| self.err(format!("kernel {k} of {}: {e:?}", m.file)))?;
            if k.starts_with("mms_") || k.starts_with("mwg_") || k.starts_with("mws_") {
                self.allow_dynamic_smem(&f).map_err(|e| {
                    self.err(format!("kernel {k} of {}: shared memory: {e:?}", m.file))
                })?;
            }
            funcs.insert(k.to_string(), f);
        }
        let funcs = Arc::new(funcs);
        cache.insert(key, funcs.clone());
        Ok(funcs)
    }

    /// Lets the shared-memory product `f` take as much dynamic shared memory as the device allows
    /// a block (once, when its module is loaded: a launch asks for what it needs, up to that).
    fn allow_dynamic_smem(&self, f: &CudaFunction) -> std::result::Result<(), DriverError> {
        use cudarc::driver::sys::CUfunction_attribute as A;
        let fixed = f.get_attribute(A::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)?;
        let room = (self.smem_optin as i32 - fixed).max(0);
        f.set_attribute(A::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, room)
    }

    /// Launches `f` with a 3-D-free geometry: `grid` blocks of `block` threads and `smem` bytes
    /// of dynamic shared memory.
    pub fn launch_fn(
        &self,
        f: &CudaFunction,
        what: &str,
        grid: (u32, u32),
        block: u32,
        smem: u32,
        args: &[Arg],
    ) -> Result<()> {
        check_args(what, args).map_err(|e| self.err(e))?;
        self.launch_ex(f, grid, block, smem, args)
            .map_err(|e| self.err(format!("launch {what}: {e:?}")))
    }

    /// The launch itself (`cuLaunchKernelEx`). With `pdl`, programmatic dependent launch is
    /// allowed (the programmatic stream serialization attribute): the kernel may start while the
    /// previous one on the stream finishes; every kernel's first statement (prelude.cuh
    /// `pdl_entry`) waits for that one to complete, so only the launch latency and the blocks'
    /// start overlap it. Without it, a plain launch (no attribute).
    fn launch_ex(
        &self,
        f: &CudaFunction,
        grid: (u32, u32),
        block: u32,
        smem: u32,
        args: &[Arg],
    ) -> std::result::Result<(), DriverError> {
        use cudarc::driver::sys;
        use std::ffi::c_void;
        // Each argument's bytes in an 8-byte cell (a u32 or f32 parameter reads the first 4).
        let mut cells: Vec<[u8; 8]> = args
            .iter()
            .map(|a| match *a {
                Arg::Ptr(v) | Arg::U64(v) => v.to_le_bytes(),
                Arg::U32(v) => u64::from(v).to_le_bytes(),
                Arg::F32(v) => u64::from(v.to_bits()).to_le_bytes(),
            })
            .collect();
        let mut params: Vec<*mut c_void> = cells
            .iter_mut()
            .map(|c| c.as_mut_ptr() as *mut c_void)
            .collect();
        // SAFETY: a plain C struct (an id and a union of integers): all zeros is a valid value.
        let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.programmaticStreamSerializationAllowed = 1;
        let cfg = sys::CUlaunchConfig {
            gridDimX: grid.0.max(1),
            gridDimY: grid.1.max(1),
            gridDimZ: 1,
            blockDimX: block,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: smem,
            hStream: self.stream.cu_stream(),
            attrs: &mut attr,
            numAttrs: u32::from(self.pdl),
        };
        self.ctx.bind_to_thread()?;
        // SAFETY: `params` points at one cell per kernel parameter (checked by `check_args`),
        // alive across the call (the driver copies them); the function and stream belong to this
        // context.
        unsafe {
            sys::cuLaunchKernelEx(
                &cfg,
                f.cu_function(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }
        .result()
    }

    /// Milliseconds of device time taken by the work `f` queues on the stream (events around
    /// it; waits for the end).
    pub fn time_ms(&self, f: impl FnOnce() -> Result<()>) -> Result<f32> {
        let ev = |what: &str| {
            self.ctx
                .new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(|e| self.err(format!("{what} event: {e:?}")))
        };
        let (a, b) = (ev("start")?, ev("end")?);
        a.record(&self.stream)
            .map_err(|e| self.err(format!("record: {e:?}")))?;
        f()?;
        b.record(&self.stream)
            .map_err(|e| self.err(format!("record: {e:?}")))?;
        b.synchronize()
            .map_err(|e| self.err(format!("event sync: {e:?}")))?;
        a.elapsed_ms(&b)
            .map_err(|e| self.err(format!("elapsed: {e:?}")))
    }

    /// An error of this device.
    pub fn err(&self, what: impl Into<String>) -> Error {
        Error::Backend {
            backend: self.name.clone(),
            what: what.into(),
        }
    }

    /// (free, total) device memory in bytes.
    pub fn mem_info(&self) -> Result<(usize, usize)> {
        self.ctx
            .mem_get_info()
            .map_err(|e| self.err(format!("memory info: {e:?}")))
    }

    pub fn upload<T: DeviceRepr>(&self, data: &[T]) -> Result<CudaSlice<T>> {
        let bytes = std::mem::size_of_val(data);
        super::load_stats::uploading(bytes, || self.stream.clone_htod(data))
            .map_err(|e| self.err(format!("upload of {bytes} bytes: {e:?}")))
    }

    /// Uploads `parts` one after the other into one device buffer (an expert stack and a
    /// folded shared expert: no host copy of the whole).
    pub fn upload_parts(&self, parts: &[&[u8]]) -> Result<CudaSlice<u8>> {
        let total: usize = parts.iter().map(|p| p.len()).sum();
        let mut buf = self.zeros::<u8>(total)?;
        let mut at = 0;
        for p in parts {
            let mut dst = buf
                .try_slice_mut(at..at + p.len())
                .ok_or_else(|| self.err(format!("upload of part {at}..+{}", p.len())))?;
            super::load_stats::uploading(p.len(), || self.stream.memcpy_htod(*p, &mut dst))
                .map_err(|e| self.err(format!("upload of {} bytes: {e:?}", p.len())))?;
            at += p.len();
        }
        Ok(buf)
    }

    pub fn zeros<T: DeviceRepr + ValidAsZeroBits>(&self, n: usize) -> Result<CudaSlice<T>> {
        self.stream.alloc_zeros(n.max(1)).map_err(|e| {
            self.err(format!(
                "allocating {} bytes: {e:?}",
                n * std::mem::size_of::<T>()
            ))
        })
    }

    pub fn download<T: DeviceRepr + Default + Clone>(&self, s: &CudaSlice<T>) -> Result<Vec<T>> {
        let v = self
            .stream
            .clone_dtoh(s)
            .map_err(|e| self.err(format!("download: {e:?}")))?;
        self.sync()?;
        Ok(v)
    }

    /// `len` values of `s` from `start`.
    pub fn download_range<T: DeviceRepr + Default + Clone>(
        &self,
        s: &CudaSlice<T>,
        start: usize,
        len: usize,
    ) -> Result<Vec<T>> {
        let view = s
            .try_slice(start..start + len)
            .ok_or_else(|| self.err(format!("download of {start}+{len} beyond {}", s.len())))?;
        let v = self
            .stream
            .clone_dtoh(&view)
            .map_err(|e| self.err(format!("download: {e:?}")))?;
        self.sync()?;
        Ok(v)
    }

    /// Waits for the stream; reports asynchronous kernel faults.
    pub fn sync(&self) -> Result<()> {
        self.stream
            .synchronize()
            .map_err(|e| self.err(format!("kernel execution failed: {e:?}")))
    }

    /// A probe saying whether the work enqueued on the stream so far is still running, without
    /// waiting for it (an event recorded at the call and queried at once). It holds its own
    /// handle on the stream, so it can be asked while the backend is busy in a call: `memra-verify
    /// graph` asks it from a step's mask callback to see the masks overlap the forward.
    pub fn busy_probe(&self) -> impl Fn() -> Result<bool> + use<> {
        let stream = self.stream.clone();
        let name = self.name.clone();
        move || {
            let err = |e| Error::Backend {
                backend: name.clone(),
                what: format!("stream probe: {e:?}"),
            };
            let event = stream.record_event(None).map_err(err)?;
            event.try_is_complete().map(|done| !done).map_err(err)
        }
    }

    /// The device address of `s`.
    pub fn ptr<T>(&self, s: &CudaSlice<T>) -> u64 {
        let (p, _guard) = s.device_ptr(&self.stream);
        p
    }

    /// Launches kernel `name` (of the modules built at open).
    pub fn launch(&self, name: &str, grid: (u32, u32), block: u32, args: &[Arg]) -> Result<()> {
        self.launch_smem(name, grid, block, 0, args)
    }

    /// [`Gpu::launch`] with `smem` bytes of dynamic shared memory.
    pub fn launch_smem(
        &self,
        name: &str,
        grid: (u32, u32),
        block: u32,
        smem: u32,
        args: &[Arg],
    ) -> Result<()> {
        let f = self
            .funcs
            .get(name)
            .ok_or_else(|| self.err(format!("kernel {name} is not built")))?;
        self.launch_fn(f, name, grid, block, smem, args)
    }

    /// Grid for a grid-stride kernel over `n` elements.
    pub(super) fn stride_grid(n: u64) -> (u32, u32) {
        (n.div_ceil(BLOCK as u64).clamp(1, MAX_BLOCKS) as u32, 1)
    }

    pub(super) fn u32_of(&self, v: usize, what: &str) -> Result<u32> {
        u32::try_from(v)
            .map_err(|_| self.err(format!("{what} = {v} exceeds the kernel's u32 range")))
    }

    /// `y[m][n] = dot(W[n], x[m])` for `m` rows: W is `n x k` in `dtype`, rows of `row_bytes`.
    #[allow(clippy::too_many_arguments)]
    pub fn matmul(
        &self,
        dtype: DType,
        w: u64,
        row_bytes: usize,
        x: u64,
        y: u64,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<()> {
        if !kernel_supports(dtype) {
            return Err(self.err(format!("no matmul kernel for {dtype}")));
        }
        if m == 0 || n == 0 {
            return Ok(());
        }
        // F32 (mixture-of-experts routers) by matmul_f32_rows, one block of 8 warps per output
        // feature in fixed K chunks (H200 session 13: qwen3-30b-a3b decode 133 -> 190 tok/s
        // against the per-type kernel's half-warp).
        // Where the 8 x 8 tiles of matmul_f32_tiles fill the device twice over (prefill-sized
        // steps), it reads each row and feature once a tile instead of each row once a feature
        // (kernels/cu/f32rows.cuh: the same bits).
        let (name, features) = match dtype {
            DType::F32 if f32_tiles_fill(m, n, self.sms) => ("matmul_f32_tiles".to_string(), 8),
            DType::F32 => ("matmul_f32_rows".to_string(), 1),
            _ => (format!("matmul_{}", dtype.name()), 16),
        };
        let grid = (
            self.u32_of(n.div_ceil(features), "matmul blocks")?,
            m.div_ceil(8).min(65535) as u32,
        );
        let args = [
            Arg::Ptr(w),
            Arg::Ptr(x),
            Arg::Ptr(y),
            Arg::U32(self.u32_of(m, "M")?),
            Arg::U32(self.u32_of(n, "N")?),
            Arg::U32(self.u32_of(k, "K")?),
            Arg::U64(row_bytes as u64),
        ];
        self.launch(&name, grid, BLOCK, &args)
    }

    /// `y[r] = dequantize(W[tokens[r]])` for `rows` rows of `k` values.
    #[allow(clippy::too_many_arguments)]
    pub fn embed(
        &self,
        dtype: DType,
        w: u64,
        row_bytes: usize,
        tokens: u64,
        y: u64,
        rows: usize,
        k: usize,
    ) -> Result<()> {
        if !kernel_supports(dtype) {
            return Err(self.err(format!("no embedding kernel for {dtype}")));
        }
        let name = format!("embed_{}", dtype.name());
        let args = [
            Arg::Ptr(w),
            Arg::Ptr(tokens),
            Arg::Ptr(y),
            Arg::U32(self.u32_of(k, "K")?),
            Arg::U64(row_bytes as u64),
        ];
        self.launch(&name, (self.u32_of(rows, "rows")?, 1), BLOCK, &args)
    }

    /// RMSNorm of `rows` rows of `width` (`y` may equal `x`).
    pub fn rms_norm(
        &self,
        x: u64,
        w: u64,
        y: u64,
        rows: usize,
        width: usize,
        eps: f32,
    ) -> Result<()> {
        let blocks = self.u32_of(rows.div_ceil((BLOCK / 32) as usize), "norm blocks")?;
        let args = [
            Arg::Ptr(x),
            Arg::Ptr(w),
            Arg::Ptr(y),
            Arg::U32(self.u32_of(rows, "rows")?),
            Arg::U32(self.u32_of(width, "width")?),
            Arg::F32(eps),
        ];
        self.launch("rms_norm", (blocks, 1), BLOCK, &args)
    }

    /// `x[i] += y[i]` for `n` values.
    pub fn add_in_place(&self, x: u64, y: u64, n: usize) -> Result<()> {
        let args = [Arg::Ptr(x), Arg::Ptr(y), Arg::U64(n as u64)];
        self.launch("add_in_place", Self::stride_grid(n as u64), BLOCK, &args)
    }

    /// `x[r][j] += b[j]` over `rows` rows of `width`.
    pub fn add_bias(&self, x: u64, b: u64, rows: usize, width: usize) -> Result<()> {
        let n = (rows * width) as u64;
        let args = [
            Arg::Ptr(x),
            Arg::Ptr(b),
            Arg::U64(n),
            Arg::U32(self.u32_of(width, "width")?),
        ];
        self.launch("add_bias", Self::stride_grid(n), BLOCK, &args)
    }

    /// `g = silu(g) * u` for `n` values.
    pub fn swiglu(&self, g: u64, u: u64, n: usize) -> Result<()> {
        let args = [Arg::Ptr(g), Arg::Ptr(u), Arg::U64(n as u64)];
        self.launch("swiglu", Self::stride_grid(n as u64), BLOCK, &args)
    }

    /// `g = gelu_tanh(g) * u` for `n` values (GeGLU; the CPU's `ops::geglu_tanh` formula).
    pub fn geglu_tanh(&self, g: u64, u: u64, n: usize) -> Result<()> {
        let args = [Arg::Ptr(g), Arg::Ptr(u), Arg::U64(n as u64)];
        self.launch("geglu_tanh", Self::stride_grid(n as u64), BLOCK, &args)
    }

    /// `x *= s` for `n` values.
    pub fn scale(&self, x: u64, s: f32, n: usize) -> Result<()> {
        let args = [Arg::Ptr(x), Arg::F32(s), Arg::U64(n as u64)];
        self.launch("scale_in_place", Self::stride_grid(n as u64), BLOCK, &args)
    }

    /// `x = cap * tanh(x / cap)` for `n` values (logit softcapping).
    pub fn softcap(&self, x: u64, cap: f32, n: usize) -> Result<()> {
        let args = [Arg::Ptr(x), Arg::F32(cap), Arg::U64(n as u64)];
        self.launch("softcap", Self::stride_grid(n as u64), BLOCK, &args)
    }

    /// `dst[r] = src[idx[r]]` for `rows` rows of `width`.
    pub fn gather_rows(
        &self,
        dst: u64,
        src: u64,
        idx: u64,
        rows: usize,
        width: usize,
    ) -> Result<()> {
        let args = [
            Arg::Ptr(dst),
            Arg::Ptr(src),
            Arg::Ptr(idx),
            Arg::U32(self.u32_of(rows, "rows")?),
            Arg::U32(self.u32_of(width, "width")?),
        ];
        self.launch(
            "gather_rows",
            Self::stride_grid((rows * width) as u64),
            BLOCK,
            &args,
        )
    }

    /// Copies `n` values within one buffer from element `src` to element `dst`.
    pub fn copy_range(&self, buf: u64, src: usize, dst: usize, n: usize) -> Result<()> {
        let args = [
            Arg::Ptr(buf),
            Arg::U64(src as u64),
            Arg::U64(dst as u64),
            Arg::U64(n as u64),
        ];
        self.launch("copy_range", Self::stride_grid(n as u64), BLOCK, &args)
    }

    /// Sets `n` values to `v`.
    pub fn fill(&self, x: u64, v: f32, n: usize) -> Result<()> {
        let args = [Arg::Ptr(x), Arg::F32(v), Arg::U64(n as u64)];
        self.launch("fill_f32", Self::stride_grid(n as u64), BLOCK, &args)
    }

    /// Half-rotation RoPE of `rows` rows of `heads` heads, angles from the `cos`/`sin` tables
    /// (`[position][head_dim / 2]`) at the rows' positions (`pos`: one a row, or M-RoPE's
    /// three: `rope_mrope`).
    #[allow(clippy::too_many_arguments)]
    pub fn rope(
        &self,
        x: u64,
        pos: impl Into<RopePos>,
        (cos, sin, half): (u64, u64, usize),
        rows: usize,
        heads: usize,
        head_dim: usize,
    ) -> Result<()> {
        if half == 0 || 2 * half > head_dim {
            return Err(self.err(format!("rope: {half} pairs in heads of {head_dim}")));
        }
        let n = (rows * heads * half) as u64;
        let (kernel, args) = rope_launch(x, pos.into(), (cos, sin, half), rows, heads, head_dim)
            .map_err(|e| self.err(e))?;
        self.launch(&kernel, Self::stride_grid(n), BLOCK, &args)
    }

    /// RoPE of `rows` rows of Q (`n_heads`) and K (`n_kv_heads`) in place and the K/V cache
    /// write at `slot[r]`, in one launch (the arithmetic of [`Gpu::rope`] and [`Gpu::kv_write`]);
    /// a Q8_0 cache is written by a second launch (whole 32-value blocks).
    pub fn rope_kv(&self, a: &RopeKvArgs) -> Result<()> {
        if a.rot == 0 || 2 * a.rot > a.head_dim {
            return Err(self.err(format!(
                "rope_kv: {} pairs in heads of {}",
                a.rot, a.head_dim
            )));
        }
        let (kernel, args, threads) = rope_kv_launch(a).map_err(|e| self.err(e))?;
        self.launch(&kernel, Self::stride_grid(threads as u64), BLOCK, &args)?;
        if a.kv == KvDtype::Q8_0 {
            let width = a.n_kv_heads * a.head_dim;
            self.kv_write(
                a.kv,
                (a.k_cache, a.v_cache),
                (a.k, a.v),
                a.slot,
                a.rows,
                width,
            )?;
        }
        Ok(())
    }

    /// Writes rows of K and V (`width` values) into the caches of format `kv` at position
    /// indices `slot[r]`.
    pub fn kv_write(
        &self,
        kv: KvDtype,
        (kc, vc): (u64, u64),
        (k, v): (u64, u64),
        slot: u64,
        rows: usize,
        width: usize,
    ) -> Result<()> {
        let args = [
            Arg::Ptr(kc),
            Arg::Ptr(vc),
            Arg::Ptr(k),
            Arg::Ptr(v),
            Arg::Ptr(slot),
            Arg::U32(self.u32_of(rows, "rows")?),
            Arg::U32(self.u32_of(width, "width")?),
        ];
        // Q8_0: one warp per (row, 32-value block) of K and of V.
        let threads = match kv {
            KvDtype::Q8_0 => rows * width / 32 * 2 * 32,
            _ => rows * width,
        };
        let kernel = format!("kv_write_{kv}");
        self.launch(&kernel, Self::stride_grid(threads as u64), BLOCK, &args)
    }

    /// Greedy argmax of `rows` rows of `width` logits into `out` (u32 per row).
    pub fn argmax_rows(&self, logits: u64, out: u64, rows: usize, width: usize) -> Result<()> {
        let args = [
            Arg::Ptr(logits),
            Arg::Ptr(out),
            Arg::U32(self.u32_of(width, "width")?),
        ];
        self.launch(
            "argmax_rows",
            (self.u32_of(rows, "rows")?, 1),
            ARGMAX_THREADS,
            &args,
        )
    }

    /// [`Gpu::argmax_rows`] for `n` chosen rows in one launch: entry `j` takes row `rows[j]`
    /// (a device array of `n` u32) of the `width`-float rows at `logits` and writes its token to
    /// `out[j * stride]` (u32 slots).
    pub fn argmax_at(
        &self,
        logits: u64,
        rows: u64,
        n: usize,
        width: usize,
        stride: usize,
        out: u64,
    ) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        let args = [
            Arg::Ptr(logits),
            Arg::Ptr(rows),
            Arg::U32(self.u32_of(width, "width")?),
            Arg::U32(self.u32_of(stride, "stride")?),
            Arg::Ptr(out),
        ];
        self.launch(
            "argmax_at",
            (self.u32_of(n, "rows")?, 1),
            ARGMAX_THREADS,
            &args,
        )
    }

    /// The host's `apply_penalties` on one row of `width` logits: `n` distinct history tokens
    /// `tok` with their counts `cnt`.
    #[allow(clippy::too_many_arguments)]
    pub fn penalize_row(
        &self,
        logits: u64,
        tok: u64,
        cnt: u64,
        n: usize,
        width: usize,
        p: &crate::sampling::SamplingParams,
    ) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        let args = [
            Arg::Ptr(logits),
            Arg::Ptr(tok),
            Arg::Ptr(cnt),
            Arg::U32(self.u32_of(n, "history tokens")?),
            Arg::U32(self.u32_of(width, "width")?),
            Arg::F32(p.repetition_penalty),
            Arg::F32(p.presence_penalty),
            Arg::F32(p.frequency_penalty),
        ];
        self.launch("penalize_row", Self::stride_grid(n as u64), BLOCK, &args)
    }

    /// The first `k` (at most [`TOPK_MAX`]) candidates of the host sampler's order for one row
    /// of `width` logits into `out`: `[count, ids (kmax slots), logit bits (kmax slots)]`.
    pub fn topk_row(
        &self,
        logits: u64,
        width: usize,
        temperature: f32,
        k: usize,
        kmax: usize,
        out: u64,
    ) -> Result<()> {
        if k > TOPK_MAX || kmax > TOPK_MAX || k > kmax {
            return Err(self.err(format!(
                "topk_row: k = {k}, kmax = {kmax} (at most {TOPK_MAX})"
            )));
        }
        let args = [
            Arg::Ptr(logits),
            Arg::U32(self.u32_of(width, "width")?),
            Arg::F32(temperature),
            Arg::U32(self.u32_of(k, "k")?),
            Arg::U32(self.u32_of(kmax, "kmax")?),
            Arg::Ptr(out),
        ];
        self.launch("topk_row", (1, 1), 1024, &args)
    }

    /// [`Gpu::topk_row`] for `n` rows in one launch, one block each: `desc` (a device array of
    /// `3 * n` u32, [`topk_desc`]'s layout) gives entry `j`'s (row of the `width`-float rows at
    /// `logits`, k, temperature bits); entry `j` writes `topk_row`'s layout at
    /// `out + j * (1 + 2 * kmax)` u32 slots.
    pub fn topk_rows(
        &self,
        logits: u64,
        desc: u64,
        n: usize,
        width: usize,
        kmax: usize,
        out: u64,
    ) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        if kmax > TOPK_MAX {
            return Err(self.err(format!("topk_rows: kmax = {kmax} (at most {TOPK_MAX})")));
        }
        let args = [
            Arg::Ptr(logits),
            Arg::Ptr(desc),
            Arg::U32(self.u32_of(width, "width")?),
            Arg::U32(self.u32_of(kmax, "kmax")?),
            Arg::Ptr(out),
        ];
        self.launch("topk_rows", (self.u32_of(n, "rows")?, 1), 1024, &args)
    }
}

impl Gpu {
    /// The host's `apply_mask` on `n` rows of `width` logits at `logits`, in place: `packed` is
    /// [`super::select::pack_masks`]'s layout (`n` row indices, then `n` masks of `words` u32).
    /// `live[j]` (zeroed by the caller) becomes 1 when entry `j` allows a token whose logit is
    /// neither NaN nor -inf.
    pub fn mask_rows(
        &self,
        logits: u64,
        packed: u64,
        n: usize,
        width: usize,
        words: usize,
        live: u64,
    ) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        if words < width.div_ceil(32) {
            return Err(self.err(format!("mask_rows: {words} mask words for {width} logits")));
        }
        let args = [
            Arg::Ptr(logits),
            Arg::Ptr(packed),
            Arg::U32(self.u32_of(n, "masked rows")?),
            Arg::U32(self.u32_of(width, "width")?),
            Arg::U32(self.u32_of(words, "mask words")?),
            Arg::Ptr(live),
        ];
        // At most 16 blocks of 256 per row: 151,936 logits are 37 strides of 4,096.
        let x = width.div_ceil(BLOCK as usize).clamp(1, 16) as u32;
        self.launch(
            "mask_rows",
            (x, self.u32_of(n, "masked rows")?),
            BLOCK,
            &args,
        )
    }
}

/// The most candidates `topk_row` returns (`TOPK_MAX` in kernels/cu/sample.cu).
pub const TOPK_MAX: usize = 1024;

/// The descriptor of a [`Gpu::topk_rows`] launch: per entry `(row, k, temperature)`, each k at
/// most `kmax` (at most [`TOPK_MAX`]) and each row below 2^32.
pub fn topk_desc(entries: &[(usize, usize, f32)], kmax: usize) -> Result<Vec<u32>> {
    let mut d = Vec::with_capacity(3 * entries.len());
    for &(row, k, t) in entries {
        if k > kmax || kmax > TOPK_MAX {
            return Err(Error::Input(format!(
                "topk_rows: k = {k}, kmax = {kmax} (at most {TOPK_MAX})"
            )));
        }
        let row = u32::try_from(row)
            .map_err(|_| Error::Input(format!("topk_rows: row {row} beyond u32")))?;
        d.extend([row, k as u32, t.to_bits()]);
    }
    Ok(d)
}

/// Where a RoPE launch reads its rows' positions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopePos {
    /// `pos[r]`, one position a row (u32).
    Plain(u64),
    /// M-RoPE (`*_mrope` kernels): `pos3[3 r + axis]` (u32; temporal, height, width), each
    /// frequency's axis by the sections' words (`Sections::words`: t, h, w, interleaved).
    M { pos3: u64, sections: [u32; 4] },
}

impl From<u64> for RopePos {
    fn from(pos: u64) -> RopePos {
        RopePos::Plain(pos)
    }
}

impl RopePos {
    /// The kernel arguments that stand for the positions.
    fn args(&self) -> Vec<Arg> {
        match *self {
            RopePos::Plain(p) => vec![Arg::Ptr(p)],
            RopePos::M { pos3, sections } => {
                let mut a = vec![Arg::Ptr(pos3)];
                a.extend(sections.map(Arg::U32));
                a
            }
        }
    }

    /// The kernel name's infix: `_mrope` for M-RoPE.
    fn suffix(&self) -> &'static str {
        match self {
            RopePos::Plain(_) => "",
            RopePos::M { .. } => "_mrope",
        }
    }
}

fn u32_arg(v: usize, what: &str) -> std::result::Result<Arg, String> {
    u32::try_from(v)
        .map(Arg::U32)
        .map_err(|_| format!("{what} = {v} exceeds the kernel's u32 range"))
}

/// The kernel and arguments of a [`Gpu::rope`] launch (`rope` or `rope_mrope`).
fn rope_launch(
    x: u64,
    pos: RopePos,
    (cos, sin, half): (u64, u64, usize),
    rows: usize,
    heads: usize,
    head_dim: usize,
) -> std::result::Result<(String, Vec<Arg>), String> {
    let mut args = vec![Arg::Ptr(x)];
    args.extend(pos.args());
    args.extend([
        Arg::Ptr(cos),
        Arg::Ptr(sin),
        u32_arg(rows, "rows")?,
        u32_arg(heads, "heads")?,
        u32_arg(head_dim, "head_dim")?,
        u32_arg(half, "rope pairs")?,
    ]);
    Ok((format!("rope{}", pos.suffix()), args))
}

/// The kernel, arguments and threads of a [`Gpu::rope_kv`] launch (`rope_kv[_norm][_mrope]_<fmt>`):
/// one thread per rotated pair, or (with the norms) one warp per head.
fn rope_kv_launch(a: &RopeKvArgs) -> std::result::Result<(String, Vec<Arg>, usize), String> {
    let heads = a.rows * (a.n_heads + a.n_kv_heads);
    let mut args = vec![Arg::Ptr(a.q), Arg::Ptr(a.k), Arg::Ptr(a.v)];
    args.extend(a.pos.args());
    args.extend([
        Arg::Ptr(a.cos),
        Arg::Ptr(a.sin),
        Arg::Ptr(a.k_cache),
        Arg::Ptr(a.v_cache),
        Arg::Ptr(a.slot),
    ]);
    let m = a.pos.suffix();
    let (kernel, threads) = match a.norm {
        None => (format!("rope_kv{m}_{}", a.kv), heads * (a.head_dim / 2)),
        Some((qn, kn, eps)) => {
            args.extend([Arg::Ptr(qn), Arg::Ptr(kn), Arg::F32(eps)]);
            (format!("rope_kv_norm{m}_{}", a.kv), heads * 32)
        }
    };
    args.extend([
        u32_arg(a.rows, "rows")?,
        u32_arg(a.n_heads, "heads")?,
        u32_arg(a.n_kv_heads, "kv heads")?,
        u32_arg(a.head_dim, "head_dim")?,
        u32_arg(a.rot, "rope pairs")?,
    ]);
    Ok((kernel, args, threads))
}

/// Pointers and shapes of a [`Gpu::rope_kv`] launch.
#[derive(Clone, Copy, Debug)]
pub struct RopeKvArgs {
    pub q: u64,
    pub k: u64,
    pub v: u64,
    pub pos: RopePos,
    pub cos: u64,
    pub sin: u64,
    pub k_cache: u64,
    pub v_cache: u64,
    pub slot: u64,
    pub rows: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Pairs rotated per head (the RoPE table's frequencies: `head_dim / 2`, fewer for
    /// partial RoPE).
    pub rot: usize,
    /// The caches' format.
    pub kv: KvDtype,
    /// The per-head RMSNorms of Q and K before RoPE (q weights, k weights, eps), in the same
    /// launch (`rope_kv_norm_<fmt>`: the bits of [`Gpu::rms_norm`] on each head first).
    pub norm: Option<(u64, u64, f32)>,
}

/// "cubin" or "PTX": which kind of image a load error is about.
fn image_kind(image: &memra_kernels::Image) -> &'static str {
    match image {
        memra_kernels::Image::Cubin(_) => "precompiled cubin",
        memra_kernels::Image::Ptx(_) => "PTX",
    }
}

/// Loads a module image: a precompiled cubin as it is, PTX through the driver's JIT.
fn load_image(
    ctx: &Arc<CudaContext>,
    image: memra_kernels::Image,
) -> std::result::Result<Arc<cudarc::driver::CudaModule>, cudarc::driver::DriverError> {
    match image {
        memra_kernels::Image::Cubin(bin) => ctx.load_module(cudarc::nvrtc::Ptx::from_binary(bin)),
        memra_kernels::Image::Ptx(ptx) => ctx.load_module(cudarc::nvrtc::Ptx::from_src(ptx)),
    }
}

/// Whether an F32 product of `m` rows and `n` features takes `matmul_f32_tiles` (8 features x 8
/// rows a block) rather than `matmul_f32_rows` (one feature a block): where its tiles number at
/// least two per multiprocessor. Speed only (one order, the same bits).
pub fn f32_tiles_fill(m: usize, n: usize, sms: u32) -> bool {
    m.div_ceil(8) * n.div_ceil(8) >= 2 * sms as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Prefill-sized routers take the tiled F32 kernel, decode steps the row one; the kernels
    /// gate's F32 cases (N = 1000, M = 1 .. 33, row 0 bitwise across M) run both.
    #[test]
    fn f32_products_take_the_tiles_where_they_fill_the_device() {
        assert!(f32_tiles_fill(512, 513, 132));
        assert!(f32_tiles_fill(4096, 128, 132));
        assert!(!f32_tiles_fill(1, 513, 132));
        assert!(!f32_tiles_fill(8, 513, 132));
        assert!(!f32_tiles_fill(16, 128, 132));
        assert!(f32_tiles_fill(33, 1000, 132) && !f32_tiles_fill(1, 1000, 132));
        assert_eq!(
            check_args(
                "matmul_f32_tiles",
                &[
                    Arg::Ptr(1),
                    Arg::Ptr(2),
                    Arg::Ptr(3),
                    Arg::U32(4),
                    Arg::U32(5),
                    Arg::U32(6),
                    Arg::U64(7)
                ]
            ),
            Ok(())
        );
    }

    #[test]
    fn the_gemma_elementwise_kernels_take_the_launch_s_arguments() {
        let glu = [Arg::Ptr(1), Arg::Ptr(2), Arg::U64(3)];
        assert_eq!(check_args("geglu_tanh", &glu), Ok(()));
        let scaled = [Arg::Ptr(1), Arg::F32(0.5), Arg::U64(3)];
        assert_eq!(check_args("scale_in_place", &scaled), Ok(()));
        assert_eq!(check_args("softcap", &scaled), Ok(()));
    }

    /// Every RoPE launch (plain and M-RoPE, with and without the norms, every cache format)
    /// passes what its kernel takes.
    #[test]
    fn rope_launches_take_their_kernels_arguments() {
        let m = RopePos::M {
            pos3: 7,
            sections: [16, 24, 24, 0],
        };
        for pos in [RopePos::Plain(7), m] {
            let (k, args) = rope_launch(1, pos, (2, 3, 64), 5, 4, 128).unwrap();
            assert_eq!(check_args(&k, &args), Ok(()), "{k}");
            for kv in [KvDtype::F32, KvDtype::F16, KvDtype::Bf16, KvDtype::Q8_0] {
                for norm in [None, Some((8, 9, 1e-6))] {
                    let a = RopeKvArgs {
                        q: 1,
                        k: 2,
                        v: 3,
                        pos,
                        cos: 4,
                        sin: 5,
                        k_cache: 6,
                        v_cache: 10,
                        slot: 11,
                        rows: 3,
                        n_heads: 8,
                        n_kv_heads: 2,
                        head_dim: 128,
                        rot: 64,
                        kv,
                        norm,
                    };
                    let (k, args, _) = rope_kv_launch(&a).unwrap();
                    assert_eq!(check_args(&k, &args), Ok(()), "{k}");
                }
            }
        }
        let (k, _) = rope_launch(1, m, (2, 3, 64), 5, 4, 128).unwrap();
        assert_eq!(k, "rope_mrope");
    }

    #[test]
    fn launches_are_checked_against_the_kernel_sources() {
        let ok = [Arg::Ptr(1), Arg::F32(0.5), Arg::U64(3)];
        assert_eq!(check_args("fill_f32", &ok), Ok(()));
        let e = check_args("fill_f32", &ok[..2]).unwrap_err();
        assert!(e.contains("2 arguments for 3 parameters"), "{e}");
        let e = check_args("fill_f32", &[Arg::Ptr(1), Arg::U32(0), Arg::U64(3)]).unwrap_err();
        assert!(e.contains("argument 1") && e.contains("F32"), "{e}");
        let e = check_args("fill_f32", &[Arg::Ptr(1), Arg::F32(0.0), Arg::U32(3)]).unwrap_err();
        assert!(e.contains("argument 2"), "{e}");
        assert!(check_args("no_such_kernel", &[]).is_err());
        // Macro-stamped kernels are in the table too.
        assert!(signatures().as_ref().unwrap().contains_key("mmq_q4_k"));
        assert!(signatures().as_ref().unwrap().contains_key("matmul_q6_k"));
    }
}
