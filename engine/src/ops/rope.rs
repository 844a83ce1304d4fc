//! RoPE frequencies and angles, shared by every backend: the angle of frequency i at position p
//! is `p * inv_freq[i]` in f64, rounded to f32 once for cos and sin. A model may declare several
//! tables (e.g. local and global bases).

use crate::config::Llama3RopeScaling;

/// The frequencies of one RoPE table: `inv_freq[i]` for `i in 0..head_dim / 2`.
#[derive(Clone, Debug, PartialEq)]
pub struct Rope {
    pub inv_freq: Vec<f64>,
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
        Rope { inv_freq }
    }

    /// Frequencies per head (`head_dim / 2`).
    pub fn half(&self) -> usize {
        self.inv_freq.len()
    }

    /// cos and sin of every frequency at position `pos`.
    pub fn cos_sin(&self, pos: u32) -> (Vec<f32>, Vec<f32>) {
        self.inv_freq
            .iter()
            .map(|&f| {
                let a = pos as f64 * f;
                (a.cos() as f32, a.sin() as f32)
            })
            .unzip()
    }
}
