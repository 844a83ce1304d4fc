//! The device profile: every tuned parameter of the CUDA backend in one table, chosen at start
//! from the architecture and the multiprocessor count, printed in the startup log.
//!
//! Only [`Profile::nseg`] is part of the arithmetic (the canonical K segmentation of a matrix,
//! from its shape and the profile, never from M). The launch geometry ([`Launch`]) is chosen by
//! M, for speed only: every geometry computes the same bits (kernels/cu/products.cu).

/// Launch geometry of one product call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Launch {
    /// Token fragments (8 tokens each) per block.
    pub nt: u32,
    /// 16-row tiles per block.
    pub rpb: u32,
    /// Split K over warps (one segment per warp) instead of one warp walking every segment.
    pub split_k: bool,
}

/// Most segments a matrix is cut into (and warps per block of a split-K launch).
pub const MAX_NSEG: u32 = 8;

impl Launch {
    /// The most threads a launch of this geometry uses.
    pub fn max_threads(&self) -> u32 {
        32 * self.rpb * if self.split_k { MAX_NSEG } else { 1 }
    }

    /// The NVRTC defines of the kernel variant.
    pub fn defines(&self) -> Vec<String> {
        vec![
            format!("MMQ_NT={}", self.nt),
            format!("MMQ_RPB={}", self.rpb),
            format!("MMQ_MAXT={}", self.max_threads()),
        ]
    }
}

/// Tuned parameters for one device.
#[derive(Clone, Debug, PartialEq)]
pub struct Profile {
    /// NVRTC architecture (`compute_90a`, `compute_120a`, ...).
    pub arch: &'static str,
    pub sms: u32,
    /// Warps a small-M product should keep busy per multiprocessor (sets `nseg`).
    pub warps_per_sm: u32,
    /// Geometry for M <= 8, <= 16, <= 32 and above (prefill).
    pub launches: [Launch; 4],
}

impl Profile {
    /// The profile for a device of architecture `arch` with `sms` multiprocessors.
    pub fn new(arch: &'static str, sms: u32) -> Profile {
        let split = |nt| Launch {
            nt,
            rpb: 1,
            split_k: true,
        };
        Profile {
            arch,
            sms: sms.max(1),
            warps_per_sm: 16,
            launches: [
                split(1),
                split(2),
                split(4),
                Launch {
                    nt: 4,
                    rpb: 4,
                    split_k: false,
                },
            ],
        }
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

    /// The launch geometry for `m` rows.
    pub fn launch(&self, m: usize) -> Launch {
        match m {
            0..=8 => self.launches[0],
            9..=16 => self.launches[1],
            17..=32 => self.launches[2],
            _ => self.launches[3],
        }
    }

    /// One line for the startup log.
    pub fn describe(&self) -> String {
        let l = |x: &Launch| {
            format!(
                "nt{} rpb{}{}",
                x.nt,
                x.rpb,
                if x.split_k { " splitk" } else { "" }
            )
        };
        format!(
            "profile {} sms={} warps/sm={} launches: m<=8 {}, m<=16 {}, m<=32 {}, larger {}",
            self.arch,
            self.sms,
            self.warps_per_sm,
            l(&self.launches[0]),
            l(&self.launches[1]),
            l(&self.launches[2]),
            l(&self.launches[3])
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nseg_depends_on_the_shape_only_and_stays_in_range() {
        let p = Profile::new("compute_90a", 132);
        assert_eq!(p.nseg(4096, 16), 8);
        assert_eq!(p.nseg(28672, 16), 2);
        assert_eq!(p.nseg(49152, 16), 1);
        assert_eq!(p.nseg(576, 9), 8);
        assert_eq!(p.nseg(576, 3), 3);
        assert!(p.nseg(1, 1) == 1);
        for m in [1, 8, 9, 33, 512] {
            assert!(p.launch(m).max_threads() <= 1024);
        }
    }
}
