//! Gemma 3's vision tower on a CUDA device (kernels/cu/vision.cu): the function of the CPU
//! reference (vision/siglip.rs) on the GPU, one image at a time, its products and attention on
//! tensor cores (f16 inputs, f32 accumulation; the residual stream, norms and epilogues f32).
//!
//! [`CudaTower::new`] uploads the weights once: Q, K and V of a block as one `[3 hidden][hidden]`
//! matrix (one product, one bias), the projection transposed to `[text_hidden][hidden]` (the
//! products read `W[n][k]`), each matrix as f16 rows zero-padded to the products' K tile (an F16
//! mmproj: its own values; an F32 one rounded to the nearest f16); and it allocates the
//! activations of one image, so the memory is taken before a backend on the same device sizes its
//! KV cache. [`CudaTower::forward`] runs: patch rows, the patch product (+ bias) and the
//! positions; per block LayerNorm, the Q/K/V product, Q/K/V as f16 per head, attention, the
//! output product added into the residual, LayerNorm, the up product with tanh-GELU, the down
//! product added into the residual; the final LayerNorm, the average pool, RMSNorm times the
//! soft-embedding norm (norm.cu `rms_norm`), the projection. Every kernel computes each value in
//! one fixed order (no atomics): the rows of an image are the same bits run after run on a
//! device class; they differ from the CPU tower's by the f16 rounding of the products' inputs
//! (docs/VERIFY.md "The CUDA tower").
//!
//! The forward is written over [`TowerDevice`] (buffers, copies, launches by kernel name) so
//! that another executor can run the same launches; [`Gpu`] is the device.

use std::sync::Mutex;

use super::device::{Arg, Gpu};
use super::vision_kernels::{Epilogue, HEAD_DIMS, Product, TowerKernels, half_qkv_len, padded_k};
use crate::error::{Error, Result};
use crate::vision::{TowerParams, TowerWeights};

/// What the tower needs of a device: f32 and f16-bit buffers, their addresses, copies and
/// kernel launches (every launch is checked against the kernel's source parameters on [`Gpu`]).
pub trait TowerDevice {
    type F32;
    type U16;
    fn upload_f32(&self, v: &[f32]) -> Result<Self::F32>;
    fn upload_u16(&self, v: &[u16]) -> Result<Self::U16>;
    fn alloc_f32(&self, n: usize) -> Result<Self::F32>;
    fn addr_f32(&self, b: &Self::F32) -> u64;
    fn addr_u16(&self, b: &Self::U16) -> u64;
    /// Copies `v` into the start of `b` (an error when `b` is shorter).
    fn write_f32(&self, b: &mut Self::F32, v: &[f32]) -> Result<()>;
    /// The values of `b` (waits for the queued work).
    fn read_f32(&self, b: &Self::F32) -> Result<Vec<f32>>;
    fn launch(&self, name: &str, grid: (u32, u32), block: u32, args: &[Arg]) -> Result<()>;
    /// The device's name in errors and logs (`cuda:0`).
    fn label(&self) -> String;
}

impl TowerDevice for Gpu {
    type F32 = cudarc::driver::CudaSlice<f32>;
    type U16 = cudarc::driver::CudaSlice<u16>;

    fn upload_f32(&self, v: &[f32]) -> Result<Self::F32> {
        self.upload(v)
    }

    fn upload_u16(&self, v: &[u16]) -> Result<Self::U16> {
        self.upload(v)
    }

    fn alloc_f32(&self, n: usize) -> Result<Self::F32> {
        self.zeros(n)
    }

    fn addr_f32(&self, b: &Self::F32) -> u64 {
        self.ptr(b)
    }

    fn addr_u16(&self, b: &Self::U16) -> u64 {
        self.ptr(b)
    }

    fn write_f32(&self, b: &mut Self::F32, v: &[f32]) -> Result<()> {
        if v.len() > b.len() {
            return Err(self.err(format!(
                "tower upload of {} values into {}",
                v.len(),
                b.len()
            )));
        }
        self.stream
            .memcpy_htod(v, b)
            .map_err(|e| self.err(format!("tower upload: {e:?}")))
    }

    fn read_f32(&self, b: &Self::F32) -> Result<Vec<f32>> {
        self.download(b)
    }

    fn launch(&self, name: &str, grid: (u32, u32), block: u32, args: &[Arg]) -> Result<()> {
        Gpu::launch(self, name, grid, block, args)
    }

    fn label(&self) -> String {
        format!("{} ({})", self.name, self.arch)
    }
}

/// A weight matrix `[n][k]` on the device as f16 bits, each row zero-padded to `kp` columns
/// ([`padded_k`]: the products' layout).
pub(super) struct DevMat<D: TowerDevice> {
    w: D::U16,
    pub(super) n: usize,
    pub(super) k: usize,
    pub(super) kp: usize,
}

/// Uploads `m` (`[n][k]` row-major) to `dev` as f16 ([`f16_rows`]).
pub(super) fn upload_mat<D: TowerDevice>(
    dev: &D,
    m: &[f32],
    n: usize,
    k: usize,
) -> Result<DevMat<D>> {
    let kp = padded_k(k);
    let bits = f16_rows(m, n, k, kp)?;
    Ok(DevMat {
        w: dev.upload_u16(&bits)?,
        n,
        k,
        kp,
    })
}

/// The product of `x` (`m` rows) and `w` on `dev` into `y`.
pub(super) fn product_of<D: TowerDevice>(
    dev: &D,
    x: u64,
    w: &DevMat<D>,
    bias: Option<u64>,
    y: u64,
    m: usize,
    epilogue: Epilogue,
) -> Product {
    Product {
        x,
        w: dev.addr_u16(&w.w),
        bias,
        y,
        m,
        n: w.n,
        k: w.k,
        kp: w.kp,
        epilogue,
    }
}

struct DevLayer<D: TowerDevice> {
    ln1: (D::F32, D::F32),
    qkv: DevMat<D>,
    qkv_b: D::F32,
    o: DevMat<D>,
    o_b: D::F32,
    ln2: (D::F32, D::F32),
    up: DevMat<D>,
    up_b: D::F32,
    down: DevMat<D>,
    down_b: D::F32,
}

/// One image's activations (`n` patches, `t` tokens).
struct Scratch<D: TowerDevice> {
    /// `[3][size][size]` input values.
    px: D::F32,
    /// `[n][3 patch^2]` patch rows.
    cols: D::F32,
    /// `[n][hidden]`: the residual stream, and the normalized rows.
    x: D::F32,
    a: D::F32,
    /// `[n][3 hidden]`: Q | K | V.
    qkv: D::F32,
    /// Q, K and V as f16 for the attention (`vit_qkv_half`'s layout, two values a word).
    half: D::F32,
    /// `[n][hidden]`: the attention output.
    att: D::F32,
    /// `[n][ffn]`.
    up: D::F32,
    /// `[t][hidden]`: pooled, then normalized.
    pooled: D::F32,
    normed: D::F32,
    /// `[t][text_hidden]`.
    out: D::F32,
}

/// The tower's weights and one image's activations on a device.
pub struct CudaTower<D: TowerDevice = Gpu> {
    p: TowerParams,
    dev: D,
    patch: DevMat<D>,
    patch_b: D::F32,
    pos: D::F32,
    layers: Vec<DevLayer<D>>,
    post: (D::F32, D::F32),
    soft_norm: D::F32,
    /// `[text_hidden][hidden]`.
    proj: DevMat<D>,
    scratch: Mutex<Scratch<D>>,
}

/// `m` (`[n][k]` row-major) as f16 bits in rows of `kp` (zeros past `k`): each value rounded
/// to the nearest f16 (an F16 mmproj's values are exactly f16: its own bits). A value that is
/// not finite or past the f16 range (65504) is refused: the tensor-core products take f16.
pub(super) fn f16_rows(m: &[f32], n: usize, k: usize, kp: usize) -> Result<Vec<u16>> {
    if m.len() != n * k || kp < k {
        return Err(Error::Weights(format!(
            "tower matrix of {} values, expected {n} x {k}",
            m.len()
        )));
    }
    let mut out = vec![0u16; n * kp];
    for (o, r) in out.chunks_exact_mut(kp).zip(m.chunks_exact(k.max(1))) {
        for (o, &v) in o.iter_mut().zip(r) {
            let h = half::f16::from_f32(v);
            if !h.is_finite() {
                return Err(Error::Unsupported(format!(
                    "the CUDA tower takes f16 weights: {v} is past the f16 range"
                )));
            }
            *o = h.to_bits();
        }
    }
    Ok(out)
}

/// `[rows][cols]` -> `[cols][rows]`.
fn transpose(m: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut t = vec![0f32; m.len()];
    for r in 0..rows {
        for c in 0..cols {
            t[c * rows + r] = m[r * cols + c];
        }
    }
    t
}

impl<D: TowerDevice> CudaTower<D> {
    /// Uploads `w` (of shape `p`) to `dev` and allocates one image's activations.
    pub fn new(dev: D, p: &TowerParams, w: &TowerWeights) -> Result<CudaTower<D>> {
        p.check()?;
        if !HEAD_DIMS.contains(&p.head_dim()) {
            return Err(Error::Unsupported(format!(
                "the CUDA tower has no attention kernel for heads of {} (kernels for {HEAD_DIMS:?})",
                p.head_dim(),
            )));
        }
        let (h, f, ps) = (p.hidden, p.ffn, p.patch_size);
        let v = |x: &[f32]| dev.upload_f32(x);
        let mat = |m: &[f32], n: usize, k: usize| upload_mat(&dev, m, n, k);
        let mut layers = Vec::with_capacity(w.layers.len());
        for l in &w.layers {
            let qkv_w = [&l.q_w[..], &l.k_w, &l.v_w].concat();
            let qkv_b = [&l.q_b[..], &l.k_b, &l.v_b].concat();
            layers.push(DevLayer {
                ln1: (v(&l.ln1_w)?, v(&l.ln1_b)?),
                qkv: mat(&qkv_w, 3 * h, h)?,
                qkv_b: v(&qkv_b)?,
                o: mat(&l.o_w, h, h)?,
                o_b: v(&l.o_b)?,
                ln2: (v(&l.ln2_w)?, v(&l.ln2_b)?),
                up: mat(&l.up_w, f, h)?,
                up_b: v(&l.up_b)?,
                down: mat(&l.down_w, h, f)?,
                down_b: v(&l.down_b)?,
            });
        }
        let (n, t, k) = (p.patches(), p.tokens_per_image(), 3 * ps * ps);
        let z = |len: usize| dev.alloc_f32(len);
        let scratch = Scratch {
            px: z(3 * p.image_size * p.image_size)?,
            cols: z(n * k)?,
            x: z(n * h)?,
            a: z(n * h)?,
            qkv: z(n * 3 * h)?,
            half: z(half_qkv_len(n, p.heads, p.head_dim()) / 2)?,
            att: z(n * h)?,
            up: z(n * f)?,
            pooled: z(t * h)?,
            normed: z(t * h)?,
            out: z(t * p.text_hidden)?,
        };
        Ok(CudaTower {
            patch: mat(&w.patch_w, h, k)?,
            patch_b: v(&w.patch_b)?,
            pos: v(&w.pos)?,
            layers,
            post: (v(&w.post_w)?, v(&w.post_b)?),
            soft_norm: v(&w.soft_norm)?,
            proj: mat(&transpose(&w.proj, h, p.text_hidden), p.text_hidden, h)?,
            scratch: Mutex::new(scratch),
            p: *p,
            dev,
        })
    }

    /// The product of `x` (`m` rows) and `w` into `y`.
    fn product(
        &self,
        x: u64,
        w: &DevMat<D>,
        bias: Option<u64>,
        y: u64,
        m: usize,
        epilogue: Epilogue,
    ) -> Product {
        product_of(&self.dev, x, w, bias, y, m, epilogue)
    }

    /// The device's name (`cuda:0 (compute_90a)`).
    pub fn label(&self) -> String {
        self.dev.label()
    }

    /// The embedding rows (`tokens_per_image x text_hidden`) of one image's input values
    /// (`[3][size][size]`, [`crate::vision::VisionTower::pixels`]): siglip::forward's layout.
    /// Calls from several threads take turns (one image's activations).
    pub fn forward(&self, px: &[f32]) -> Result<Vec<f32>> {
        let p = &self.p;
        let s = p.image_size;
        if px.len() != 3 * s * s {
            return Err(Error::Input(format!(
                "the tower takes 3x{s}x{s} values, got {}",
                px.len()
            )));
        }
        let mut sc = self
            .scratch
            .lock()
            .map_err(|_| Error::Input("the CUDA tower's activations are poisoned".into()))?;
        self.dev.write_f32(&mut sc.px, px)?;
        let k = TowerKernels { dev: &self.dev };
        let a = |b: &D::F32| self.dev.addr_f32(b);
        let (n, h, t) = (p.patches(), p.hidden, p.tokens_per_image());
        let prod = |x: &D::F32, w: &DevMat<D>, b: Option<&D::F32>, y: &D::F32, m, e| {
            k.product(&self.product(a(x), w, b.map(a), a(y), m, e))
        };
        let ln = |(w, b): &(D::F32, D::F32)| (a(w), a(b));
        k.patches(a(&sc.px), a(&sc.cols), s, p.patch_size)?;
        prod(
            &sc.cols,
            &self.patch,
            Some(&self.patch_b),
            &sc.x,
            n,
            Epilogue::Plain,
        )?;
        k.add(a(&sc.x), a(&self.pos), n * h)?;
        for l in &self.layers {
            k.layer_norm(a(&sc.x), ln(&l.ln1), a(&sc.a), n, h, p.eps)?;
            prod(&sc.a, &l.qkv, Some(&l.qkv_b), &sc.qkv, n, Epilogue::Plain)?;
            k.half_qkv(a(&sc.qkv), a(&sc.half), n, p.heads, p.head_dim())?;
            k.attention(a(&sc.half), a(&sc.att), n, p.heads, p.head_dim())?;
            prod(&sc.att, &l.o, Some(&l.o_b), &sc.x, n, Epilogue::Add)?;
            k.layer_norm(a(&sc.x), ln(&l.ln2), a(&sc.a), n, h, p.eps)?;
            prod(&sc.a, &l.up, Some(&l.up_b), &sc.up, n, Epilogue::Gelu)?;
            prod(&sc.up, &l.down, Some(&l.down_b), &sc.x, n, Epilogue::Add)?;
        }
        k.layer_norm(a(&sc.x), ln(&self.post), a(&sc.a), n, h, p.eps)?;
        k.pool(a(&sc.a), a(&sc.pooled), p.grid(), p.pool, h)?;
        k.rms_norm(
            a(&sc.pooled),
            a(&self.soft_norm),
            a(&sc.normed),
            t,
            h,
            p.eps,
        )?;
        prod(&sc.normed, &self.proj, None, &sc.out, t, Epilogue::Plain)?;
        self.dev.read_f32(&sc.out)
    }
}

#[cfg(test)]
pub(super) mod tests {
    use std::cell::{Cell, RefCell};

    use super::*;
    use crate::vision::random::random_tower;

    /// A device that computes nothing: buffers are (address, length), and every launch is
    /// checked against its kernel's parameters in the sources and recorded.
    #[derive(Default)]
    pub(in crate::backend::cuda) struct DryRun {
        next: Cell<u64>,
        pub(in crate::backend::cuda) launches: RefCell<Vec<String>>,
    }

    impl DryRun {
        fn buf(&self, n: usize) -> (u64, usize) {
            let a = self.next.get() + 256;
            self.next.set(a + 4 * n as u64);
            (a, n)
        }
    }

    impl TowerDevice for DryRun {
        type F32 = (u64, usize);
        type U16 = (u64, usize);
        fn upload_f32(&self, v: &[f32]) -> Result<Self::F32> {
            Ok(self.buf(v.len()))
        }
        fn upload_u16(&self, v: &[u16]) -> Result<Self::U16> {
            Ok(self.buf(v.len()))
        }
        fn alloc_f32(&self, n: usize) -> Result<Self::F32> {
            Ok(self.buf(n))
        }
        fn addr_f32(&self, b: &Self::F32) -> u64 {
            b.0
        }
        fn addr_u16(&self, b: &Self::U16) -> u64 {
            b.0
        }
        fn write_f32(&self, b: &mut Self::F32, v: &[f32]) -> Result<()> {
            assert!(v.len() <= b.1);
            Ok(())
        }
        fn read_f32(&self, b: &Self::F32) -> Result<Vec<f32>> {
            Ok(vec![0.0; b.1])
        }
        fn launch(&self, name: &str, grid: (u32, u32), block: u32, args: &[Arg]) -> Result<()> {
            super::super::device::check_args(name, args).map_err(Error::Input)?;
            assert!(
                grid.0 >= 1 && grid.1 >= 1 && block.is_multiple_of(32),
                "{name} {grid:?}"
            );
            self.launches.borrow_mut().push(name.to_string());
            Ok(())
        }
        fn label(&self) -> String {
            "dry".into()
        }
    }

    #[test]
    fn every_launch_of_a_forward_takes_its_kernel_s_arguments() {
        let p = TowerParams::tiny(64);
        let t = CudaTower::new(DryRun::default(), &p, &random_tower(&p, 3)).unwrap();
        let px = vec![0f32; 3 * 64 * 64];
        assert_eq!(t.forward(&px).unwrap().len(), 16 * 64);
        let l = t.dev.launches.borrow();
        // patches, product, positions; 8 per block; final norm, pool, RMSNorm, projection.
        assert_eq!(l.len(), 3 + 8 * p.layers + 4);
        assert_eq!(l[0], "vit_patches");
        assert!(l.contains(&"vit_qkv_half".to_string()));
        assert!(l.contains(&"vit_attn_mma_d8".to_string()));
        assert!(
            !l.iter()
                .any(|k| k.starts_with("vit_gemm") && k != "vit_gemm_mma")
        );
        assert_eq!(l[l.len() - 2], "rms_norm");
        assert!(t.forward(&px[1..]).is_err());
    }

    #[test]
    fn head_dims_without_a_kernel_are_refused() {
        let p = TowerParams {
            heads: 32,
            hidden: 160,
            ..TowerParams::tiny(64)
        };
        let e = CudaTower::new(DryRun::default(), &p, &random_tower(&p, 3));
        assert!(matches!(e, Err(Error::Unsupported(_))));
    }

    #[test]
    fn matrices_go_up_as_f16_rows_padded_with_zeros() {
        assert_eq!(padded_k(1), 32);
        assert_eq!(padded_k(588), 608);
        assert_eq!(padded_k(1152), 1152);
        let m = [1.0, -0.5, 0.0, 2f32.powi(-24), 65504.0, 0.1];
        let bits = f16_rows(&m, 2, 3, 4).unwrap();
        // 0.1 rounds to the nearest f16 (0x2e66), exact values keep their bits.
        assert_eq!(bits, [0x3c00, 0xb800, 0, 0, 1, 0x7bff, 0x2e66, 0]);
        assert!(f16_rows(&[1e6], 1, 1, 32).is_err());
        assert!(f16_rows(&[f32::NAN], 1, 1, 32).is_err());
        assert!(f16_rows(&[1.0; 5], 2, 3, 4).is_err());
        assert_eq!(
            transpose(&[1., 2., 3., 4., 5., 6.], 2, 3),
            [1., 4., 2., 5., 3., 6.]
        );
    }
}
