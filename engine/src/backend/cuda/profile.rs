//! The device profile: every tuned parameter of the CUDA backend in one table, chosen at start
//! from the architecture and the multiprocessor count, printed in the startup log.
//!
//! Only [`Profile::nseg`] is part of the arithmetic (the canonical K segmentation of a matrix,
//! from its shape and the profile, never from M). The launch geometry ([`Launch`]) is chosen by
//! M, for speed only: every geometry computes the same bits (kernels/cu/products.cu).

use crate::quant::DType;

/// Launch geometry of one product call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Launch {
    /// Token fragments (8 tokens each) per block.
    pub nt: u32,
    /// 16-row tiles per block.
    pub rpb: u32,
    /// Split K over warps (one segment per warp) instead of one warp walking every segment.
    pub split_k: bool,
    /// The shared-memory product (`mms_<type>`): 8 warps, each `rpb` row tiles x `nt` token
    /// fragments, operands staged by cp.async (large M).
    pub smem: bool,
    /// With `smem`: the warpgroup product (`mwg_<type>`, sm_90a, [`WGMMA_TYPES`]): 2
    /// warpgroups x 64 rows x `8 nt` tokens per block, each k16 step one wgmma (same bits).
    pub wg: bool,
    /// With `wg`: the warp-specialized warpgroup product (`mws_<type>`, F16 / BF16): 3
    /// warpgroups (one copies, two compute 64 rows x `8 nt` tokens each), mbarrier slots,
    /// segment totals in shared memory. Same bits.
    pub ws: bool,
    /// With `ws`: k-tile slots in shared memory (`MWS_STAGES`: [`WS_STAGES`], or
    /// [`WS_STAGES_3WG`] with three computing warpgroups); 0 for every other launch. Speed only.
    pub stages: u32,
    /// With `ws`: computing warpgroups of 64 rows (`MWS_WG`: [`WS_WGS`], or 3 where
    /// [`Profile::launch`] estimates them faster); 0 for every other launch. Speed only.
    pub wgs: u32,
}

/// The launch geometry of the grouped expert products (`mms_grouped_<type>`, issue 16): the
/// shared-memory product at 16 pairs of one expert x 128 rows a block (prefill spreads few pairs
/// over each of many experts: ~10 of 512 at 512 tokens of the 80B hybrid, ~32 of 128 for
/// qwen3-30b-a3b). One of [`Profile::all_launches`], so its variant is compiled at load. Speed
/// only.
pub const MOE_GROUPED_LAUNCH: Launch = smem(1, 2);

/// Most pairs of a mixture-of-experts call that always run one product per pair
/// ([`Profile::moe_grouped`]).
pub const MOE_GROUPED_MIN_PAIRS: usize = 64;

/// Most segments a matrix is cut into (and warps per block of a split-K launch).
pub const MAX_NSEG: u32 = 8;

impl Launch {
    /// The most threads a launch of this geometry uses.
    pub fn max_threads(&self) -> u32 {
        if self.ws {
            return 128 * (self.wgs + 1);
        }
        if self.smem {
            return SMEM_THREADS;
        }
        32 * self.rpb * if self.split_k { MAX_NSEG } else { 1 }
    }

    /// Rows and tokens per block of a shared-memory launch.
    pub const fn smem_block(&self) -> (usize, usize) {
        if self.ws {
            return (64 * self.wgs as usize, 8 * self.nt as usize);
        }
        if self.wg {
            return (WG_ROWS, 8 * self.nt as usize);
        }
        (
            SMEM_WARP_ROWS * 16 * self.rpb as usize,
            SMEM_WARP_TOKS * 8 * self.nt as usize,
        )
    }

    /// Dynamic shared memory of a shared-memory launch for tiles of `tile_bytes` bytes and `kt`
    /// columns (kernels/cu/products.cu, `Mms`).
    pub fn smem_bytes(&self, tile_bytes: usize, kt: usize) -> usize {
        let (rows, toks) = self.smem_block();
        if self.ws {
            // 1024 (alignment), stages of B (the swizzled layout) and tiles, the totals (one f32
            // per computing thread and accumulator), two mbarriers per stage (products.cu, Mws).
            let stages = self.stages as usize;
            return 1024
                + stages * (toks * kt * 2 + (rows / 16) * tile_bytes)
                + 128 * self.wgs as usize * (toks / 2) * 4
                + 16 * stages;
        }
        if self.wg {
            // Stages of tiles and token rows (+16 bytes each), then one k-tile in the B layout.
            return SMEM_STAGES * ((rows / 16) * tile_bytes + toks * (kt * 2 + 16)) + toks * kt * 2;
        }
        let totals = if self.totals_in_smem() {
            SMEM_THREADS as usize * (self.rpb * self.nt) as usize * 4 * 4
        } else {
            0
        };
        SMEM_STAGES * ((rows / 16) * tile_bytes + toks * (kt * 2 + 64)) + totals
    }

    /// Whether a shared-memory launch keeps its segment totals in shared memory (`MMS_TOTS`):
    /// the large warp tiles, whose accumulators need the registers.
    pub fn totals_in_smem(&self) -> bool {
        self.smem && self.rpb * self.nt >= 16
    }

    /// `nt<nt>r<rpb>` and the kind (the startup log, `memra-bench kernels`): `s` split K, `m`
    /// the shared-memory product, `w` the warpgroup product, none the register-tiled one.
    pub fn name(&self) -> String {
        let kind = match (self.split_k, self.smem, self.wg) {
            (true, _, _) => "s",
            _ if self.ws => "x",
            (_, true, true) => "w",
            (_, true, _) => "m",
            _ => "",
        };
        let slots = if self.ws && self.stages != WS_STAGES {
            self.stages.to_string()
        } else {
            String::new()
        };
        let wgs = if self.ws && self.wgs != WS_WGS {
            format!("g{}", self.wgs)
        } else {
            String::new()
        };
        format!("nt{}r{}{kind}{wgs}{slots}", self.nt, self.rpb)
    }

    /// The NVRTC defines of the kernel variant.
    pub fn defines(&self) -> Vec<String> {
        if self.wg {
            let mut d = vec![format!("MWG_N={}", 8 * self.nt)];
            // Only a slot count other than the default changes the module (the default build
            // stays the one the gates ran).
            if self.ws && self.stages != WS_STAGES {
                d.push(format!("MWS_STAGES={}", self.stages));
            }
            if self.ws && self.wgs != WS_WGS {
                d.push(format!("MWS_WG={}", self.wgs));
            }
            return d;
        }
        if self.smem {
            return vec![
                format!("MMS_NT={}", self.nt),
                format!("MMS_RT={}", self.rpb),
                format!("MMS_STAGES={SMEM_STAGES}"),
                format!("MMS_TOTS={}", u32::from(self.totals_in_smem())),
            ];
        }
        vec![
            format!("MMQ_NT={}", self.nt),
            format!("MMQ_RPB={}", self.rpb),
            format!("MMQ_MAXT={}", self.max_threads()),
        ]
    }
}

/// Rows per block of the warpgroup product (kernels/cu/products.cu, `Mwg`: 8 row tiles).
const WG_ROWS: usize = 128;

/// Threads of a default warp-specialized launch (kernels/cu/products.cu, `product_ws`: a copier
/// warpgroup and [`WS_WGS`] computing ones).
pub const WS_THREADS: u32 = 128 * (WS_WGS + 1);
/// k-tile slots of the warp-specialized product (MWS_STAGES's default in products.cu).
pub const WS_STAGES: u32 = 4;
/// Computing warpgroups of the warp-specialized product (MWS_WG's default in products.cu).
pub const WS_WGS: u32 = 2;
/// k-tile slots with three computing warpgroups (four of 40 KiB do not fit beside their 96 KiB
/// of totals).
pub const WS_STAGES_3WG: u32 = 3;
/// How much faster per row three computing warpgroups are than two ([`Profile::ws_wide_pays`]):
/// H200 session 17, 28672 x 4096 at M = 4096 (37 waves of 192-row blocks against 55 of 128):
/// 1,897.6 against 1,947.4 µs.
const WS_WIDE_GAIN: f64 = 1.03;

/// Threads of a shared-memory launch (kernels/cu/products.cu: MMS_WR x MMS_WT warps).
pub const SMEM_THREADS: u32 = 256;
const SMEM_WARP_ROWS: usize = 4;
const SMEM_WARP_TOKS: usize = 2;
/// k-tile stages in flight (MMS_STAGES).
pub const SMEM_STAGES: usize = 3;
/// Most dynamic shared memory one block may take on sm_90 (227 KiB opt-in); a device reports
/// its own (`CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN`, [`Profile::smem_max`]).
pub const SMEM_MAX_SM90: usize = 227 * 1024;

impl Launch {
    /// Whether this launch can run a `dtype` product on a device that lets one block take
    /// `smem_max` bytes of shared memory: always, except a shared-memory launch whose stages
    /// exceed it.
    pub fn fits(&self, dtype: DType, smem_max: usize) -> bool {
        if self.ws && warp_specialized(dtype).is_none() {
            return false;
        }
        if self.wg && warpgroup(dtype).is_none() {
            return false;
        }
        !self.smem
            || crate::quant::repack::tile_format(dtype)
                .is_some_and(|f| self.smem_bytes(f.tile_bytes, f.kt) <= smem_max)
    }
}

/// Tuned parameters for one device. Nothing here is read from the environment: the profile is
/// a function of the device (its architecture, multiprocessors and shared memory); the
/// alternatives a gate or a microbenchmark compares are launches they build themselves
/// (`memra-verify kernels`, `memra-bench kernels --launches`).
#[derive(Clone, Debug, PartialEq)]
pub struct Profile {
    /// NVRTC architecture (`compute_90a`, `compute_120a`, ...).
    pub arch: &'static str,
    pub sms: u32,
    /// Warps a small-M product should keep busy per multiprocessor (sets `nseg`, which is part
    /// of the arithmetic: every M of one device uses the same count). 16; 32 and 64 measured no
    /// faster on the H200 (`nseg` is at its cap [`MAX_NSEG`] for the 8B shapes already).
    pub warps_per_sm: u32,
    /// Most dynamic shared memory one block may opt in to (bytes).
    pub smem_max: usize,
    /// Whether this device has the warpgroup (wgmma) products: sm_90a (`compute_90a`).
    pub wgmma: bool,
    /// The types whose large-M products take the warpgroup kernel (with `wgmma`):
    /// [`WGMMA_DEFAULT`]. (`kernel_builds` and the tests enable every [`WGMMA_TYPES`].)
    pub wgmma_types: Vec<DType>,
    /// The mixture-of-experts products' path for every call instead of the choice by size
    /// (set by `memra-verify kernels`, which compares both): `Some(true)` grouped by expert,
    /// `Some(false)` one M = 1 product per (row, slot) pair. Speed only: both give the same bits.
    pub moe_grouped: Option<bool>,
    /// F16 / BF16 large-M products take the warp-specialized launch ([`warp_specialized`])
    /// where its 128-token grid fills the device, else [`warpgroup`]'s (sm_90a; H200 session
    /// 14: F16 420-520 TFLOP/s at 4,096 tokens against the plain warpgroup kernel's 208-223).
    /// Where it runs, an FFN's gate/up product computes SwiGLU in its epilogue (mat.rs
    /// `upload_glu`). Speed only.
    pub ws: bool,
}

const fn split(nt: u32) -> Launch {
    Launch {
        nt,
        rpb: 1,
        split_k: true,
        smem: false,
        wg: false,
        ws: false,
        stages: 0,
        wgs: 0,
    }
}

const fn tiled(nt: u32, rpb: u32) -> Launch {
    Launch {
        nt,
        rpb,
        split_k: false,
        smem: false,
        wg: false,
        ws: false,
        stages: 0,
        wgs: 0,
    }
}

/// A shared-memory launch: warps of `rpb` row tiles x `nt` token fragments.
pub const fn smem(nt: u32, rpb: u32) -> Launch {
    Launch {
        nt,
        rpb,
        split_k: false,
        smem: true,
        wg: false,
        ws: false,
        stages: 0,
        wgs: 0,
    }
}

/// The types with a warpgroup kernel (`mwg_<type>`, kernels/cu/products.cu). Q4_1 and Q5_K
/// have none: their minimum term needs the activations' block sums per token.
pub const WGMMA_TYPES: [DType; 6] = [
    DType::Q4_K,
    DType::Q8_0,
    DType::Q4_0,
    DType::Q6_K,
    DType::F16,
    DType::BF16,
];

/// The types that take the warpgroup kernel by default: Q4_K (measured +5.7% Q4_K_M pp512 on the
/// H200) and F16 (at 64 tokens per block, two blocks per SM: pp512 12,462 vs 12,147, pp4096
/// 11,041 vs 10,732 for the shared-memory mma.sync product, H200 session 11; its bits equal the
/// other geometries', `memra-bench kernels` ALL EQUAL there). The scaled quantized types Q8_0,
/// Q4_0, Q6_K have warpgroup kernels too, not taken (Q8_0 was 20% slower end to end, Q6_K no
/// faster: session 11); BF16 (the F16 kernel over bf16) is not timed. The kernels gate checks
/// all of them against the other geometries bit for bit, and `memra-bench kernels --launches
/// 8,1,w` times them.
pub const WGMMA_DEFAULT: [DType; 2] = [DType::Q4_K, DType::F16];

/// The warpgroup launch of a `dtype` product (sm_90a), when it has one: 64 tokens per block.
/// F16 / BF16 at 64 take ~83 KiB and 116 registers, so two blocks share an SM (faster end to end
/// than one block of 128 tokens: H200 session 11, pp512 12,462 against 11,710 tok/s; `memra-bench
/// kernels --launches 16,1,w` times 128); the
/// K-quants' 256-column stages are larger (3 stages of Q6_K at 128 tokens would not fit 227 KiB);
/// the scaled types Q8_0 / Q4_0 need another accumulator set per part (at 128 tokens ptxas
/// spills 36 bytes at 255 registers, at 64 it takes 159 registers and none; NVRTC 13.0, sm_90a).
pub const fn warpgroup(dtype: DType) -> Option<Launch> {
    let nt = match dtype {
        DType::F16 | DType::BF16 | DType::Q4_K | DType::Q6_K | DType::Q8_0 | DType::Q4_0 => 8,
        _ => return None,
    };
    Some(Launch {
        nt,
        rpb: 1,
        split_k: false,
        smem: true,
        wg: true,
        ws: false,
        stages: 0,
        wgs: 0,
    })
}

/// The warp-specialized launch of a `dtype` product (sm_90a), when it has one: F16 / BF16, two
/// computing warpgroups, 128 rows x 128 tokens per block (~193 KiB: one block per SM).
pub const fn warp_specialized(dtype: DType) -> Option<Launch> {
    match dtype {
        DType::F16 | DType::BF16 => Some(Launch {
            nt: 16,
            rpb: 1,
            split_k: false,
            smem: true,
            wg: true,
            ws: true,
            stages: WS_STAGES,
            wgs: WS_WGS,
        }),
        _ => None,
    }
}

/// The weight types whose products prefer wider token tiles (cheap dequantization).
fn wide(dtype: DType) -> bool {
    matches!(
        dtype,
        DType::F16 | DType::BF16 | DType::Q8_0 | DType::Q6_K | DType::Q4_K
    )
}

impl Profile {
    /// The profile for a device of architecture `arch` with `sms` multiprocessors and
    /// `smem_max` bytes of opt-in shared memory per block.
    pub fn new(arch: &'static str, sms: u32, smem_max: usize) -> Profile {
        Profile {
            arch,
            sms: sms.max(1),
            warps_per_sm: 16,
            smem_max,
            wgmma: arch == "compute_90a",
            wgmma_types: WGMMA_DEFAULT.to_vec(),
            moe_grouped: None,
            ws: arch == "compute_90a",
        }
    }

    /// The profile of device `g`.
    pub fn for_device(g: &super::device::Gpu) -> Profile {
        Profile::new(g.arch, g.sms, g.smem_optin)
    }

    /// The warpgroup launch of `dtype` on this device for a grid that fills it: [`warp_specialized`]
    /// where the device takes it, else [`warpgroup`].
    pub fn warpgroup(&self, dtype: DType) -> Option<Launch> {
        self.warp_specialized(dtype).or_else(|| warpgroup(dtype))
    }

    /// [`warp_specialized`] on this device (two computing warpgroups).
    pub fn warp_specialized(&self, dtype: DType) -> Option<Launch> {
        warp_specialized(dtype).filter(|_| self.ws)
    }

    /// The three-computing-warpgroup launch of `dtype` on this device (192 rows x 128 tokens,
    /// [`WS_STAGES_3WG`] slots), when it exists; [`Profile::launch`] takes it per product where
    /// [`Profile::ws_wide_pays`] estimates it faster (H200 session 18: F16 pp512 23,753 against
    /// 23,104 tok/s with two everywhere).
    pub fn warp_specialized_wide(&self, dtype: DType) -> Option<Launch> {
        self.warp_specialized(dtype).map(|w| Launch {
            stages: WS_STAGES_3WG,
            wgs: 3,
            ..w
        })
    }

    /// Whether the three-warpgroup launch `wide` of a product of `rows` rows and `m` tokens is
    /// estimated faster than the two-warpgroup one `two`: one block per SM, so a launch takes
    /// its waves times its block's rows over the block's throughput, three computing
    /// warpgroups [`WS_WIDE_GAIN`] times faster per row (measured). Speed only.
    fn ws_wide_pays(&self, wide: &Launch, two: &Launch, rows: usize, m: usize) -> bool {
        let cost = |l: &Launch, gain: f64| {
            let (br, bt) = l.smem_block();
            let waves = (rows.div_ceil(br) * m.div_ceil(bt)).div_ceil(self.sms as usize);
            waves as f64 * br as f64 / gain
        };
        cost(wide, WS_WIDE_GAIN) < cost(two, 1.0)
    }

    /// Whether a mixture-of-experts call of `pairs` (row, slot) pairs over `n_experts` experts
    /// takes the grouped expert products (the pairs sorted by expert, each expert's pairs one
    /// block of rows: its weights read once per [`MOE_GROUPED_LAUNCH`] token tile) instead of an
    /// M = 1 product per pair (its weights read once per pair). Grouping pays when experts get
    /// several pairs each: more than [`MOE_GROUPED_MIN_PAIRS`] pairs and at least two per expert
    /// on average (a guess, not yet measured: issue 16). [`Profile::moe_grouped`]'s field
    /// overrides it.
    pub fn moe_grouped(&self, pairs: usize, n_experts: usize) -> bool {
        self.moe_grouped
            .unwrap_or(pairs > MOE_GROUPED_MIN_PAIRS && pairs >= 2 * n_experts)
    }

    /// Whether large-M `dtype` products take the warpgroup kernel on this device (when its grid
    /// fills the device and its stages fit).
    pub fn wgmma_for(&self, dtype: DType) -> bool {
        self.wgmma && self.wgmma_types.contains(&dtype)
    }

    /// The canonical segment count of a matrix of `rows` rows and `col_tiles` column tiles: the
    /// power of two that gives about `warps_per_sm` warps per multiprocessor at M = 1, at most
    /// [`MAX_NSEG`] and at most one segment per tile.
    pub fn nseg(&self, rows: usize, col_tiles: usize) -> u32 {
        let tiles = rows.div_ceil(16).max(1) as u64;
        let target = (self.sms * self.warps_per_sm) as u64;
        let want = target.div_ceil(tiles).next_power_of_two();
        want.min(MAX_NSEG as u64)
            .min(col_tiles.max(1) as u64)
            .max(1) as u32
    }

    /// The launch geometry for `m` rows of a `dtype` product of `rows` output rows (measured on
    /// the H200 with `memra-bench kernels`, reports/kernel-notes.md). Large M takes the
    /// shared-memory product when its grid fills the device and its stages fit the device's
    /// shared memory, else the register-tiled one.
    pub fn launch(&self, m: usize, dtype: DType, rows: usize) -> Launch {
        match m {
            0..=8 => split(1),
            9..=16 => split(2),
            17..=64 if wide(dtype) => split(4),
            17..=64 => split(2),
            _ => {
                let wanted = self.wgmma_for(dtype);
                // The warp-specialized launch (128 tokens per block) where its grid covers at
                // least half the SMs, else the plain warpgroup one (64 tokens for F16 / BF16).
                let ws = self.warp_specialized(dtype);
                let wide = self
                    .warp_specialized_wide(dtype)
                    .zip(ws)
                    .filter(|(w3, w2)| self.ws_wide_pays(w3, w2, rows, m))
                    .map(|(w3, _)| w3);
                for w in [wide, ws, warpgroup(dtype)].into_iter().flatten() {
                    let (br, bt) = w.smem_block();
                    let blocks = rows.div_ceil(br) * m.div_ceil(bt);
                    if wanted && 2 * blocks >= self.sms as usize && w.fits(dtype, self.smem_max) {
                        return w;
                    }
                }
                let s = match dtype {
                    DType::Q5_K => smem(4, 1),
                    _ => smem(4, 2),
                };
                let (br, bt) = s.smem_block();
                let blocks = rows.div_ceil(br) * m.div_ceil(bt);
                if blocks >= self.sms as usize && s.fits(dtype, self.smem_max) {
                    return s;
                }
                match dtype {
                    DType::F16 | DType::BF16 => tiled(4, 4),
                    DType::Q6_K | DType::Q4_K => tiled(8, 2),
                    _ => tiled(2, 4),
                }
            }
        }
    }

    /// Every geometry [`Profile::launch`] can return (compiled at load).
    pub fn all_launches(&self) -> Vec<Launch> {
        let mut v = vec![
            split(1),
            split(2),
            split(4),
            tiled(4, 4),
            tiled(8, 2),
            tiled(2, 4),
            smem(4, 2),
            smem(4, 1),
            smem(2, 2),
            smem(8, 1),
            MOE_GROUPED_LAUNCH,
        ];
        if self.wgmma {
            for &d in &self.wgmma_types {
                let ws = self.warp_specialized(d);
                let wide = self.warp_specialized_wide(d);
                for w in [warpgroup(d), ws, wide].into_iter().flatten() {
                    if !v.contains(&w) {
                        v.push(w);
                    }
                }
            }
        }
        v
    }

    /// One line for the startup log.
    pub fn describe(&self) -> String {
        let l = |m: usize, d: DType| self.launch(m, d, 4096).name();
        format!(
            "profile {} sms={} smem/block={} KiB warps/sm={} wgmma={} launch (4096 rows) q4_k m=1/16/64/512: {} {} {} {}; f16: {} {} {} {}",
            self.arch,
            self.sms,
            self.smem_max / 1024,
            self.warps_per_sm,
            if self.wgmma {
                let names: Vec<&str> = self.wgmma_types.iter().map(|d| d.name()).collect();
                format!("[{}]", names.join(","))
            } else {
                "off".to_string()
            },
            l(1, DType::Q4_K),
            l(16, DType::Q4_K),
            l(64, DType::Q4_K),
            l(512, DType::Q4_K),
            l(1, DType::F16),
            l(16, DType::F16),
            l(64, DType::F16),
            l(512, DType::F16)
        )
    }
}

/// Every (module, build) the engine can load on a device of `arch` (`compute_90a`,
/// `compute_120a`): each module loaded at start with its default build, and the `products`
/// variants of every launch a profile can choose (every warpgroup type enabled) plus the grouped
/// MoE launch. `memra-bench kernel-cache` precompiles exactly these; a CI test compiles them.
/// The products builds read `MEMRA_KERNEL_DIR` as the engine does (kernels/src/lib.rs).
pub fn kernel_builds(
    arch: &'static str,
) -> Vec<(&'static memra_kernels::Module, memra_kernels::Build)> {
    let mut out = Vec::new();
    for m in memra_kernels::MODULES {
        if !super::device::LAZY_MODULES.contains(&m.name) {
            out.push((m, memra_kernels::Build::default()));
        }
    }
    let Some(products) = memra_kernels::module("products") else {
        return out;
    };
    let mut p = Profile::new(arch, 132, SMEM_MAX_SM90);
    p.wgmma_types = WGMMA_TYPES.to_vec();
    p.ws = true;
    let mut sets: Vec<Vec<String>> = vec![Vec::new()];
    for l in p.all_launches() {
        if !sets.contains(&l.defines()) {
            sets.push(l.defines());
        }
    }
    for d in sets {
        out.push((products, memra_kernels::Build::with_defines(&d)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moe_calls_group_by_size_unless_overridden() {
        let mut p = Profile::new("compute_90a", 132, SMEM_MAX_SM90);
        // Decode-sized calls run per pair; a prefill chunk of Qwen3-30B-A3B (128 experts, 8
        // per row) groups from 32 rows.
        assert!(!p.moe_grouped(8, 128));
        assert!(!p.moe_grouped(64, 8));
        assert!(!p.moe_grouped(255, 128));
        assert!(p.moe_grouped(256, 128));
        assert!(p.moe_grouped(65, 8));
        p.moe_grouped = Some(true);
        assert!(p.moe_grouped(1, 128));
        p.moe_grouped = Some(false);
        assert!(!p.moe_grouped(1 << 20, 8));
    }

    #[test]
    fn small_grids_keep_the_register_tiled_product() {
        let p = Profile::new("compute_90a", 132, SMEM_MAX_SM90);
        assert!(p.launch(512, DType::F16, 4096).smem);
        // 576 rows: 5 row blocks x 8 token blocks < 132 SMs.
        assert!(!p.launch(512, DType::Q4_1, 576).smem);
        assert!(p.launch(4096, DType::Q4_1, 576).smem);
        assert!(!p.launch(64, DType::F16, 1 << 16).smem);
    }

    #[test]
    fn large_products_take_the_warpgroup_kernel_on_sm90a_only() {
        let mut p = Profile::new("compute_90a", 132, SMEM_MAX_SM90);
        // By default Q4_K and F16; the other types' warpgroup kernels when listed.
        for d in WGMMA_DEFAULT {
            let l = p.launch(512, d, 4096);
            assert!(l.wg && l.smem && l.fits(d, SMEM_MAX_SM90), "{d}: {l:?}");
            assert!(p.all_launches().contains(&l), "{d}");
        }
        for d in [DType::BF16, DType::Q8_0, DType::Q6_K] {
            assert!(!p.launch(512, d, 4096).wg, "{d}");
        }
        // F16's plain warpgroup launch (a grid too small for the warp-specialized one) at 64
        // tokens per block: two blocks fit one SM (228 KiB).
        assert!(p.launch(512, DType::F16, 4096).ws);
        let l = p.launch(256, DType::F16, 4096);
        let f = crate::quant::repack::tile_format(DType::F16).unwrap();
        assert!(
            l.nt == 8 && 2 * l.smem_bytes(f.tile_bytes, f.kt) <= 228 * 1024,
            "{l:?}"
        );
        p.wgmma_types = WGMMA_TYPES.to_vec();
        for d in WGMMA_TYPES {
            let l = p.launch(512, d, 4096);
            assert!(l.wg && l.smem && l.fits(d, SMEM_MAX_SM90), "{d}: {l:?}");
            assert!(p.all_launches().contains(&l), "{d}");
            // Small M keeps the register-tiled product.
            assert!(!p.launch(64, d, 4096).wg, "{d}");
        }
        for d in [DType::Q4_1, DType::Q5_K] {
            assert!(!p.launch(512, d, 4096).wg, "{d}");
            assert!(warpgroup(d).is_none(), "{d}");
        }
        // F16 blocks of 128 tokens (`memra-bench kernels --launches 16,1,w`) fit; Q6_K's
        // stages would not at 128.
        let w128 = Launch {
            nt: 16,
            ..warpgroup(DType::F16).unwrap()
        };
        assert!(w128.fits(DType::F16, SMEM_MAX_SM90));
        assert!(!w128.fits(DType::Q6_K, SMEM_MAX_SM90));
        p.wgmma = false;
        assert!(!p.launch(512, DType::Q4_K, 4096).wg);
        assert!(p.all_launches().iter().all(|l| !l.wg));
        let b = Profile::new("compute_120a", 170, 99 * 1024);
        assert!(!b.wgmma);
        assert!(!b.launch(512, DType::F16, 4096).wg);
    }

    #[test]
    fn the_warp_specialized_launch_takes_large_f16_and_bf16_products() {
        let mut p = Profile::new("compute_90a", 132, SMEM_MAX_SM90);
        p.ws = false;
        assert!(!p.launch(512, DType::F16, 4096).ws);
        assert!(p.all_launches().iter().all(|l| !l.ws));
        p.ws = true;
        assert_eq!(Profile::new("compute_90a", 132, SMEM_MAX_SM90).ws, p.ws);
        // 4096 rows x 256 tokens: 64 blocks of 128 x 128 leave half the SMs idle; the plain
        // warpgroup launch (64 tokens per block, two per SM) takes it.
        let mid = p.launch(256, DType::F16, 4096);
        assert!(mid.wg && !mid.ws, "{mid:?}");
        let l = p.launch(512, DType::F16, 4096);
        assert!(
            l.ws && l.wg && l.smem && l.max_threads() == WS_THREADS,
            "{l:?}"
        );
        assert_eq!(l.name(), "nt16r1x");
        // One block per SM: 4 slots of 16 KiB tiles + 16 KiB token rows, 64 KiB of totals.
        let f = crate::quant::repack::tile_format(DType::F16).unwrap();
        let bytes = l.smem_bytes(f.tile_bytes, f.kt);
        assert_eq!(bytes, 1024 + 4 * 32768 + 65536 + 64);
        assert!(l.fits(DType::F16, SMEM_MAX_SM90) && l.fits(DType::BF16, SMEM_MAX_SM90));
        assert!(!l.fits(DType::Q4_K, SMEM_MAX_SM90) && !l.fits(DType::F16, 99 * 1024));
        // Both warpgroup launches are compiled at load (and precompiled by kernel-cache); the
        // other types keep theirs.
        let all = p.all_launches();
        assert!(all.contains(&l) && all.contains(&warpgroup(DType::F16).unwrap()));
        assert!(!p.launch(512, DType::Q4_K, 4096).ws);
        assert!(
            kernel_builds("compute_90a")
                .iter()
                .any(|(_, b)| b.defines.contains(&"MWG_N=128".to_string()))
        );
        // Not on a device without wgmma.
        let mut b = Profile::new("compute_120a", 170, 99 * 1024);
        b.ws = true;
        assert!(!b.launch(512, DType::F16, 4096).wg);
    }

    #[test]
    fn only_a_slot_count_other_than_the_default_changes_the_ws_module() {
        let p = Profile::new("compute_90a", 132, SMEM_MAX_SM90);
        let f = crate::quant::repack::tile_format(DType::F16).unwrap();
        let def = p.launch(512, DType::F16, 4096);
        assert_eq!(def.stages, WS_STAGES);
        assert_eq!(def.defines(), vec!["MWG_N=128".to_string()]);
        // Five slots of 32 KiB still fit 227 KiB with the 64 KiB of totals; six do not.
        let five = Launch { stages: 5, ..def };
        assert_eq!(
            five.smem_bytes(f.tile_bytes, f.kt),
            1024 + 5 * 32768 + 65536 + 80
        );
        assert!(five.defines().contains(&"MWS_STAGES=5".to_string()));
        assert_eq!(five.name(), "nt16r1x5");
        assert!(five.fits(DType::F16, SMEM_MAX_SM90));
        assert!(!Launch { stages: 6, ..def }.fits(DType::F16, SMEM_MAX_SM90));
        // Three computing warpgroups: 192-row blocks, 512 threads, 3 slots of 40 KiB beside 96
        // KiB of totals.
        let three = p.warp_specialized_wide(DType::F16).unwrap();
        assert!(three.ws && three.wgs == 3 && three.stages == 3, "{three:?}");
        assert_eq!(three.smem_block(), (192, 128));
        assert_eq!(three.max_threads(), 512);
        let bytes = three.smem_bytes(f.tile_bytes, f.kt);
        assert_eq!(bytes, 1024 + 3 * (16384 + 12 * 2048) + 98304 + 48);
        assert!(bytes <= SMEM_MAX_SM90 && three.fits(DType::F16, SMEM_MAX_SM90));
        let d = three.defines();
        assert!(d.contains(&"MWS_WG=3".to_string()) && d.contains(&"MWS_STAGES=3".to_string()));
        assert_eq!(three.name(), "nt16r1xg33");
        // Per product: three where fewer waves of wider blocks pay (qkv at 512 tokens: one wave
        // against two; gate/up at 4,096), two where both take one wave (4096 rows) or the waves
        // cost the same (gate/up at 512: 5 x 192 against 7 x 128 rows); both compiled.
        let wgs = |rows: usize, m: usize| p.launch(m, DType::F16, rows).wgs;
        assert_eq!(wgs(6144, 512), 3);
        assert_eq!(wgs(28672, 4096), 3);
        assert_eq!(wgs(28672, 512), 2);
        assert_eq!(wgs(4096, 512), 2);
        assert_eq!(wgs(4096, 4096), 2);
        assert!(p.all_launches().contains(&three));
        assert!(
            p.all_launches()
                .contains(&p.warp_specialized(DType::F16).unwrap())
        );
    }

    #[test]
    fn a_device_with_less_shared_memory_keeps_the_register_tiled_product() {
        // sm_120 (RTX 5090 class) lets one block opt in to 99 KiB.
        let p = Profile::new("compute_120a", 170, 99 * 1024);
        for d in [
            DType::F16,
            DType::Q4_K,
            DType::Q8_0,
            DType::Q6_K,
            DType::Q5_K,
        ] {
            let l = p.launch(4096, d, 4096);
            assert!(l.fits(d, p.smem_max), "{l:?} for {d}");
        }
        // A device with too little for any stage set keeps the register-tiled product.
        let small = Profile::new("compute_120a", 170, 16 * 1024);
        for d in [DType::F16, DType::Q4_K, DType::Q8_0] {
            assert!(!small.launch(4096, d, 4096).smem, "{d}");
        }
    }

    #[test]
    fn nseg_depends_on_the_shape_only_and_stays_in_range() {
        let p = Profile::new("compute_90a", 132, SMEM_MAX_SM90);
        assert_eq!(p.nseg(4096, 16), 8);
        assert_eq!(p.nseg(28672, 16), 2);
        assert_eq!(p.nseg(49152, 16), 1);
        assert_eq!(p.nseg(576, 9), 8);
        assert_eq!(p.nseg(576, 3), 3);
        assert!(p.nseg(1, 1) == 1);
        for m in [1, 8, 9, 33, 512] {
            for d in [
                DType::Q4_K,
                DType::F16,
                DType::Q6_K,
                DType::Q5_K,
                DType::Q8_0,
                DType::Q4_1,
                DType::Q5_0,
                DType::Q5_1,
            ] {
                let l = p.launch(m, d, 4096);
                assert!(l.max_threads() <= 1024);
                assert!(p.all_launches().contains(&l));
                assert!(l.fits(d, p.smem_max), "{l:?} for {d}");
            }
        }
    }

    /// Every products variant a profile can launch compiles for its architecture (the engine
    /// compiles them at start; H200 session 9 found MWG_N=64, Q4_K's warpgroup launch, broken
    /// while the default build compiled). Needs NVRTC (tools/test.sh puts it on the path).
    #[test]
    fn every_products_variant_compiles_for_its_architecture() {
        // One thread per architecture (NVRTC takes ~5 s a variant).
        std::thread::scope(|s| {
            for arch in ["compute_90a", "compute_120a"] {
                s.spawn(move || {
                    let builds = kernel_builds(arch);
                    let products: Vec<_> = builds
                        .iter()
                        .filter(|(m, _)| m.name == "products")
                        .collect();
                    // the default, the grouped MoE launch, at least one warpgroup launch on Hopper
                    assert!(products.len() >= if arch == "compute_90a" { 3 } else { 2 });
                    for (m, b) in products {
                        if let Err(e) = memra_kernels::compile_with(m, arch, b) {
                            panic!("{arch} products {:?}: {e}", b.defines);
                        }
                    }
                });
            }
        });
    }
}
