//! RoPE frequencies and angles, shared by every backend: the angle of frequency i at position p
//! is `p * inv_freq[i]` in f64, rounded to f32 once for cos and sin. A model may declare several
//! tables (e.g. local and global bases).
//!
//! M-RoPE (Qwen2-VL, Qwen2.5-VL, Qwen3-VL text models): a row has three positions (temporal,
//! height, width; [`crate::vision::mrope`] says which) and each frequency takes one of them,
//! by [`Sections`]: frequency i's angle is `pos[axis(i)] * inv_freq[i]`. A text row's three
//! positions are equal, so its angles are the plain table's.

use crate::config::Llama3RopeScaling;

/// The frequencies of one RoPE table: `inv_freq[i]` for `i in 0..head_dim / 2`, and for M-RoPE
/// which position axis each frequency takes.
#[derive(Clone, Debug, PartialEq)]
pub struct Rope {
    pub inv_freq: Vec<f64>,
    /// M-RoPE sections; `None`: every frequency takes the row's one position.
    pub sections: Option<Sections>,
}

/// How M-RoPE assigns the frequencies of a head to the position axes (0 temporal, 1 height,
/// 2 width): GGUF `{arch}.rope.dimension_sections` (its first three; the fourth must be 0), HF
/// `rope_scaling.mrope_section`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Sections {
    /// Frequencies per axis (temporal, height, width); they add up to the rotated pairs.
    pub sizes: [usize; 3],
    /// Qwen3-VL's interleaved layout (HF `apply_interleaved_mrope`): frequency i takes height
    /// when `i % 3 == 1 && i < 3 * sizes[1]`, width when `i % 3 == 2 && i < 3 * sizes[2]`,
    /// else temporal. Otherwise (Qwen2-VL / Qwen2.5-VL, HF
    /// `apply_multimodal_rotary_pos_emb`) contiguous: the first `sizes[0]` frequencies take
    /// temporal, the next `sizes[1]` height, the rest width.
    pub interleaved: bool,
}

impl Sections {
    /// The position axis frequency `i` takes.
    pub fn axis(&self, i: usize) -> usize {
        let [t, h, w] = self.sizes;
        if self.interleaved {
            match i % 3 {
                1 if i < 3 * h => 1,
                2 if i < 3 * w => 2,
                _ => 0,
            }
        } else if i < t {
            0
        } else if i < t + h {
            1
        } else {
            2
        }
    }

    /// The sizes as `u32` kernel arguments with the layout flag: `[t, h, w, interleaved]`.
    pub fn words(&self) -> [u32; 4] {
        let [t, h, w] = self.sizes.map(|v| v as u32);
        [t, h, w, u32::from(self.interleaved)]
    }
}

impl Rope {
    /// `inv_freq[i] = theta^(-2i/d)`, divided by `factors` (GGUF `rope_freqs.weight`) when
    /// given, else by the llama3 scaling when given.
    pub fn new(
        head_dim: usize,
        theta: f32,
        scaling: Option<Llama3RopeScaling>,
        factors: Option<&[f32]>,
    ) -> Rope {
        let d = head_dim;
        let theta = theta as f64;
        let mut inv_freq: Vec<f64> = (0..d / 2)
            .map(|i| 1.0 / theta.powf((2 * i) as f64 / d as f64))
            .collect();
        if let Some(f) = factors {
            for (v, &fac) in inv_freq.iter_mut().zip(f) {
                *v /= fac as f64;
            }
        } else if let Some(rs) = scaling {
            let old = rs.original_max_position_embeddings as f64;
            let (lo, hi, factor) = (
                rs.low_freq_factor as f64,
                rs.high_freq_factor as f64,
                rs.factor as f64,
            );
            let low_wavelen = old / lo;
            let high_wavelen = old / hi;
            for v in inv_freq.iter_mut() {
                let wavelen = 2.0 * std::f64::consts::PI / *v;
                if wavelen > low_wavelen {
                    *v /= factor;
                } else if wavelen >= high_wavelen {
                    let smooth = (old / wavelen - lo) / (hi - lo);
                    *v = (1.0 - smooth) * *v / factor + smooth * *v;
                }
            }
        }
        Rope {
            inv_freq,
            sections: None,
        }
    }

    /// This table with M-RoPE sections.
    pub fn with_sections(self, sections: Option<Sections>) -> Rope {
        Rope { sections, ..self }
    }

    /// Frequencies per head (`head_dim / 2`).
    pub fn half(&self) -> usize {
        self.inv_freq.len()
    }

    /// cos and sin of every frequency at position `pos`.
    pub fn cos_sin(&self, pos: u32) -> (Vec<f32>, Vec<f32>) {
        self.cos_sin_at([pos; 3])
    }

    /// cos and sin of every frequency at the M-RoPE positions `pos` (temporal, height, width):
    /// frequency i at `pos[axis(i)]`; a table without sections takes `pos[0]`. Each value is
    /// the plain table's at that position (so a device may look it up in a `[position][half]`
    /// table).
    pub fn cos_sin_at(&self, pos: [u32; 3]) -> (Vec<f32>, Vec<f32>) {
        self.inv_freq
            .iter()
            .enumerate()
            .map(|(i, &f)| {
                let p = match &self.sections {
                    Some(s) => pos[s.axis(i)],
                    None => pos[0],
                };
                let a = p as f64 * f;
                (a.cos() as f32, a.sin() as f32)
            })
            .unzip()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections_assign_axes_as_hf_does() {
        // Qwen2-VL / Qwen2.5-VL: [16, 24, 24] over 64 frequencies, contiguous.
        let c = Sections {
            sizes: [16, 24, 24],
            interleaved: false,
        };
        let axes: Vec<usize> = (0..64).map(|i| c.axis(i)).collect();
        assert_eq!(axes[..16], [0; 16]);
        assert_eq!(axes[16..40], [1; 24]);
        assert_eq!(axes[40..], [2; 24]);
        // Qwen3-VL: [24, 20, 20] interleaved: height at 1, 4, .., 58, width at 2, 5, .., 59,
        // temporal elsewhere (61 and 62 included), 24 of them.
        let q = Sections {
            sizes: [24, 20, 20],
            interleaved: true,
        };
        let axes: Vec<usize> = (0..64).map(|i| q.axis(i)).collect();
        for (i, &a) in axes.iter().enumerate() {
            let want = match i % 3 {
                1 if i <= 58 => 1,
                2 if i <= 59 => 2,
                _ => 0,
            };
            assert_eq!(a, want, "frequency {i}");
        }
        assert_eq!(axes.iter().filter(|&&a| a == 0).count(), 24);
        assert_eq!(axes.iter().filter(|&&a| a == 1).count(), 20);
    }

    #[test]
    fn equal_positions_give_the_plain_table() {
        let plain = Rope::new(128, 1e6, None, None);
        let m = plain.clone().with_sections(Some(Sections {
            sizes: [24, 20, 20],
            interleaved: true,
        }));
        for p in [0u32, 1, 17, 4095] {
            assert_eq!(plain.cos_sin(p), m.cos_sin_at([p; 3]));
        }
        // Other axes: each frequency is the plain table's at its axis' position.
        let (c, s) = m.cos_sin_at([3, 10, 20]);
        for i in 0..64 {
            let p = [3, 10, 20][m.sections.unwrap().axis(i)];
            let (pc, ps) = plain.cos_sin(p);
            assert_eq!(
                (c[i].to_bits(), s[i].to_bits()),
                (pc[i].to_bits(), ps[i].to_bits())
            );
        }
    }
}
