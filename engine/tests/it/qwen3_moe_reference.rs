//! The CPU qwen3moe against an independent naive forward pass written here in f64 (no engine
//! code but the weights' dequantization): whole-sequence causal attention recomputed per
//! position, per-head q/k RMSNorm, NeoX RoPE from theta, and the MoE FFN from its definition
//! (softmax over the experts, top-k, renormalised, weighted SwiGLU experts).
//!
//! Stated tolerance: every logit within 1e-4 of the reference (the tiny model's logits are
//! O(1); f32 vs f64 differ by ~1e-6 here), and each greedy token equal to the reference's argmax
//! unless the reference's top two are within 1e-4 (a near-tie).

use memra_engine::generate::{GenRequest, generate};
use memra_engine::models::{ModelWeights, Role};
use memra_engine::quant::DType;

use crate::qwen3_moe::{VOCAB, cpu, tiny};

const TOL: f64 = 1e-4;

struct Reference<'a> {
    w: &'a ModelWeights,
}

impl Reference<'_> {
    fn t(&self, r: Role) -> Vec<f64> {
        let t = self.w.get(r).expect("tensor");
        t.to_f32()
            .expect("f32")
            .into_iter()
            .map(f64::from)
            .collect()
    }

    /// `W x` for `W` of `rows x x.len()` starting at row `first` of `w`.
    fn matvec(w: &[f64], first: usize, rows: usize, x: &[f64]) -> Vec<f64> {
        let k = x.len();
        (first..first + rows)
            .map(|r| {
                w[r * k..(r + 1) * k]
                    .iter()
                    .zip(x)
                    .map(|(a, b)| a * b)
                    .sum()
            })
            .collect()
    }

    fn rms(x: &[f64], w: &[f64], eps: f64) -> Vec<f64> {
        let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
        let s = 1.0 / (ms + eps).sqrt();
        x.iter().zip(w).map(|(v, g)| v * s * g).collect()
    }

    fn rope(x: &mut [f64], hd: usize, pos: usize, theta: f64) {
        let half = hd / 2;
        for head in x.chunks_exact_mut(hd) {
            for i in 0..half {
                let a = pos as f64 * theta.powf(-2.0 * i as f64 / hd as f64);
                let (c, s) = (a.cos(), a.sin());
                let (x0, x1) = (head[i], head[i + half]);
                head[i] = x0 * c - x1 * s;
                head[i + half] = x1 * c + x0 * s;
            }
        }
    }

    fn softmax(x: &[f64]) -> Vec<f64> {
        let m = x.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = x.iter().map(|v| (v - m).exp()).collect();
        let s: f64 = e.iter().sum();
        e.iter().map(|v| v / s).collect()
    }

    fn moe(&self, l: usize, h: &[f64]) -> Vec<f64> {
        let c = &self.w.config;
        let p = c.moe.expect("moe");
        let (f, d) = (p.expert_ffn, c.hidden);
        let probs = Self::softmax(&Self::matvec(
            &self.t(Role::FfnGateInp(l)),
            0,
            p.n_experts,
            h,
        ));
        let mut order: Vec<usize> = (0..p.n_experts).collect();
        order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]).then(a.cmp(&b)));
        let chosen = &order[..p.n_used];
        let total: f64 = chosen.iter().map(|&e| probs[e]).sum();
        let (gate, up, down) = (
            self.t(Role::GateExps(l)),
            self.t(Role::UpExps(l)),
            self.t(Role::DownExps(l)),
        );
        let mut out = vec![0.0; d];
        for &e in chosen {
            let wt = if p.norm_topk {
                probs[e] / total
            } else {
                probs[e]
            };
            let g = Self::matvec(&gate, e * f, f, h);
            let u = Self::matvec(&up, e * f, f, h);
            let a: Vec<f64> = g
                .iter()
                .zip(&u)
                .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
                .collect();
            for (o, y) in out.iter_mut().zip(Self::matvec(&down, e * d, d, &a)) {
                *o += wt * y;
            }
        }
        out
    }

    /// Logits of every position of `tokens`.
    fn logits(&self, tokens: &[u32]) -> Vec<Vec<f64>> {
        let c = &self.w.config;
        let (d, hd, eps) = (c.hidden, c.head_dim, c.rms_eps as f64);
        let (nh, nkv, theta) = (c.n_heads, c.n_kv_heads, c.rope_theta as f64);
        let emb = self.t(Role::TokenEmbd);
        let mut xs: Vec<Vec<f64>> = tokens
            .iter()
            .map(|&t| emb[t as usize * d..(t as usize + 1) * d].to_vec())
            .collect();
        for l in 0..c.n_layers {
            let (wq, wk, wv, wo) = (
                self.t(Role::Q(l)),
                self.t(Role::K(l)),
                self.t(Role::V(l)),
                self.t(Role::AttnOut(l)),
            );
            let (qn, kn, an) = (
                self.t(Role::QNorm(l)),
                self.t(Role::KNorm(l)),
                self.t(Role::AttnNorm(l)),
            );
            let mut qs = Vec::new();
            let mut ks = Vec::new();
            let mut vs = Vec::new();
            for (pos, x) in xs.iter().enumerate() {
                let h = Self::rms(x, &an, eps);
                let norm_heads = |v: Vec<f64>, w: &[f64]| -> Vec<f64> {
                    v.chunks_exact(hd)
                        .flat_map(|hh| Self::rms(hh, w, eps))
                        .collect()
                };
                let mut q = norm_heads(Self::matvec(&wq, 0, nh * hd, &h), &qn);
                let mut k = norm_heads(Self::matvec(&wk, 0, nkv * hd, &h), &kn);
                Self::rope(&mut q, hd, pos, theta);
                Self::rope(&mut k, hd, pos, theta);
                qs.push(q);
                ks.push(k);
                vs.push(Self::matvec(&wv, 0, nkv * hd, &h));
            }
            for (i, x) in xs.iter_mut().enumerate() {
                let mut att = vec![0.0; nh * hd];
                for head in 0..nh {
                    let kvh = head / (nh / nkv);
                    let q = &qs[i][head * hd..(head + 1) * hd];
                    let scores: Vec<f64> = (0..=i)
                        .map(|j| {
                            let k = &ks[j][kvh * hd..(kvh + 1) * hd];
                            q.iter().zip(k).map(|(a, b)| a * b).sum::<f64>() / (hd as f64).sqrt()
                        })
                        .collect();
                    for (j, p) in Self::softmax(&scores).into_iter().enumerate() {
                        let v = &vs[j][kvh * hd..(kvh + 1) * hd];
                        for (o, vv) in att[head * hd..(head + 1) * hd].iter_mut().zip(v) {
                            *o += p * vv;
                        }
                    }
                }
                for (o, y) in x.iter_mut().zip(Self::matvec(&wo, 0, d, &att)) {
                    *o += y;
                }
                let h = Self::rms(x, &self.t(Role::FfnNorm(l)), eps);
                for (o, y) in x.iter_mut().zip(self.moe(l, &h)) {
                    *o += y;
                }
            }
        }
        let out = match self.w.opt(Role::Output) {
            Some(_) => self.t(Role::Output),
            None => emb,
        };
        let on = self.t(Role::OutputNorm);
        xs.iter()
            .map(|x| Self::matvec(&out, 0, c.vocab, &Self::rms(x, &on, eps)))
            .collect()
    }
}

fn argmax(v: &[f64]) -> (usize, f64) {
    let mut s: Vec<usize> = (0..v.len()).collect();
    s.sort_by(|&a, &b| v[b].total_cmp(&v[a]));
    (s[0], v[s[0]] - v[s[1]])
}

#[test]
fn cpu_matches_the_f64_reference() {
    for (seed, dtype) in [(11, DType::F32), (12, DType::Q8_0)] {
        let w = tiny(seed, dtype);
        let prompt: Vec<u32> = (0..14).map(|i| (i * 41 + 3) % VOCAB as u32).collect();
        let mut req = GenRequest::greedy(prompt.clone(), 8);
        req.keep_logits = true;
        let out = generate(&mut cpu(w.clone()), &req, &mut |_| Ok(())).expect("generate");
        // The reference over the prompt and the engine's tokens (teacher forcing).
        let mut all = prompt.clone();
        all.extend(&out.tokens);
        let reference = Reference { w: &w }.logits(&all);
        let first = reference.len() - out.logits.len() - 1;
        let mut worst = 0f64;
        for (i, got) in out.logits.iter().enumerate() {
            let want = &reference[first + i];
            for (a, b) in got.iter().zip(want) {
                worst = worst.max((*a as f64 - b).abs());
            }
            let (top, gap) = argmax(want);
            assert!(
                out.tokens[i] as usize == top || gap < TOL,
                "{dtype} step {i}: token {} vs reference {top} (gap {gap})",
                out.tokens[i]
            );
        }
        assert!(worst < TOL, "{dtype}: max |logit diff| {worst}");
        eprintln!("qwen3moe {dtype}: max |logit diff| vs the f64 reference {worst:.2e}");
    }
}
