//! Gated DeltaNet on the CPU: the causal convolution and the gated delta rule over each
//! sequence's recurrent state (crate::backend::state has the rule for where a state stands).
//!
//! Every value is computed per token in position order with plain f32 operations (no fused
//! multiply-add), the reductions in ascending index from zero, so a row's bits depend only on
//! its sequence's tokens: never on the step split, the other sequences or the thread count
//! (work is spread over (sequence, value head) pairs only).

use std::collections::HashMap;

use rayon::prelude::*;

use crate::backend::state::{CONV_RING, RING, SeqPlan};
use crate::ops::DeltaParams;

/// One head's run over a step: the state to commit and its output per step row.
type HeadRun = (Vec<f32>, Vec<(usize, Vec<f32>)>);

/// The state of one sequence in one layer.
#[derive(Clone)]
struct Slot {
    /// The delta rule's state at the committed position, `[n_v_heads][head_k][head_v]`.
    s: Vec<f32>,
    /// Convolution inputs by position (`pos % CONV_RING`), `conv_dim` each.
    conv: Vec<f32>,
    /// Delta-rule inputs (the conv output and `[b a]`) by position (`pos % RING`).
    inputs: Vec<f32>,
}

/// A saved state ([`DeltaLayer::save`]): one layer's state of a sequence at a position.
struct Snap {
    /// The position: every position `< pos` is folded into `s`.
    pos: usize,
    /// The delta rule's state at `pos`, as [`Slot::s`].
    s: Vec<f32>,
    /// The convolution inputs of positions `pos - (K - 1) .. pos` in order (zeros before
    /// position 0), `conv_dim` each.
    conv: Vec<f32>,
}

/// One gated DeltaNet layer's states, per slot (grown on first use), and its snapshots by id
/// (grown on demand; the scheduler bounds the ids).
pub struct DeltaLayer {
    p: DeltaParams,
    slots: Vec<Slot>,
    /// The layer's `(a_coef, dt)` as its steps pass them: a snapshot replays the recurrence
    /// with them.
    coefs: Option<(Vec<f32>, Vec<f32>)>,
    snaps: HashMap<u32, Snap>,
}

/// `1 / (1 + exp(-x))`.
fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// `ln(1 + exp(x))`, `x` itself above 20 (as torch's softplus).
fn softplus(x: f32) -> f32 {
    if x > 20.0 { x } else { x.exp().ln_1p() }
}

/// `x * (1 / sqrt(sum x^2 + 1e-6)) * scale`, into `out`.
fn l2_normalise(x: &[f32], scale: f32, out: &mut [f32]) {
    let ss = x.iter().fold(0f32, |a, &v| a + v * v);
    let inv = 1.0 / (ss + 1e-6).sqrt();
    for (o, &v) in out.iter_mut().zip(x) {
        *o = v * inv * scale;
    }
}

/// `x[j] *= sigmoid(g[j / group])` for each value of a row.
pub fn sigmoid_mul(x: &mut [f32], g: &[f32], group: usize) {
    for (j, v) in x.iter_mut().enumerate() {
        *v *= sigmoid(g[j / group]);
    }
}

impl DeltaLayer {
    pub fn new(p: DeltaParams) -> DeltaLayer {
        DeltaLayer {
            p,
            slots: Vec::new(),
            coefs: None,
            snaps: HashMap::new(),
        }
    }

    /// Stores slot `slot`'s state at position `pos` as snapshot `snap`, the slot standing at
    /// `(committed, written)` = `span` with `committed <= pos <= written` (checked by the
    /// caller against the book): positions `committed..pos` are folded from the slot's kept
    /// inputs into its committed state by [`head_steps`], exactly as a step replays them, and
    /// the convolution inputs of the `K - 1` positions before `pos` are copied from its ring.
    pub fn save(
        &mut self,
        pool: &rayon::ThreadPool,
        slot: usize,
        (committed, pos): (usize, usize),
        snap: u32,
    ) -> Result<(), String> {
        let p = self.p;
        let (cd, nv, k) = (p.conv_dim(), p.n_v_heads, p.conv_kernel);
        let iw = self.input_width();
        let head_state = p.head_k * p.head_v;
        let (Some(sl), Some((a_coef, dt))) = (self.slots.get(slot), self.coefs.as_ref()) else {
            return Err(format!(
                "state slot {slot} has not run a step in this layer"
            ));
        };
        if committed > pos || pos - committed >= RING {
            return Err(format!(
                "a snapshot at {pos} cannot be replayed from the state committed at {committed}"
            ));
        }
        let steps: Vec<(Vec<f32>, Option<usize>)> = (committed..pos)
            .map(|q| {
                (
                    sl.inputs[(q % RING) * iw..(q % RING + 1) * iw].to_vec(),
                    None,
                )
            })
            .collect();
        let start = match pos {
            0 => vec![0f32; nv * head_state],
            _ => sl.s.clone(),
        };
        let commit_after = (pos - committed).checked_sub(1);
        let heads: Vec<Vec<f32>> = pool.install(|| {
            (0..nv)
                .into_par_iter()
                .map(|h| {
                    let s0 = &start[h * head_state..(h + 1) * head_state];
                    head_steps(&p, h, s0, &steps, commit_after, (a_coef[h], dt[h])).0
                })
                .collect()
        });
        let mut conv = vec![0f32; (k - 1) * cd];
        for (t, row) in conv.chunks_exact_mut(cd).enumerate() {
            if let Some(q) = (pos + t).checked_sub(k - 1) {
                let at = (q % CONV_RING) * cd;
                row.copy_from_slice(&sl.conv[at..at + cd]);
            }
        }
        self.snaps.insert(
            snap,
            Snap {
                pos,
                s: heads.concat(),
                conv,
            },
        );
        Ok(())
    }

    /// Loads snapshot `snap` into slot `slot` (grown when needed): its state and the
    /// convolution inputs before its position; returns the position.
    pub fn restore(&mut self, slot: usize, snap: u32) -> Result<usize, String> {
        let (cd, k) = (self.p.conv_dim(), self.p.conv_kernel);
        if !self.snaps.contains_key(&snap) {
            return Err(format!("state snapshot {snap} does not exist"));
        }
        self.slot(slot);
        let (Some(sn), Some(sl)) = (self.snaps.get(&snap), self.slots.get_mut(slot)) else {
            return Err(format!("state snapshot {snap} does not exist"));
        };
        sl.s.copy_from_slice(&sn.s);
        for (t, row) in sn.conv.chunks_exact(cd).enumerate().take(k - 1) {
            if let Some(q) = (sn.pos + t).checked_sub(k - 1) {
                let at = (q % CONV_RING) * cd;
                sl.conv[at..at + cd].copy_from_slice(row);
            }
        }
        Ok(sn.pos)
    }

    /// Forgets snapshot `snap` (a save that failed in another layer).
    pub fn drop_snapshot(&mut self, snap: u32) {
        self.snaps.remove(&snap);
    }

    fn input_width(&self) -> usize {
        self.p.conv_dim() + 2 * self.p.n_v_heads
    }

    fn slot(&mut self, i: usize) -> &mut Slot {
        let p = self.p;
        let input = self.input_width();
        while self.slots.len() <= i {
            self.slots.push(Slot {
                s: vec![0.0; p.n_v_heads * p.head_k * p.head_v],
                conv: vec![0.0; CONV_RING * p.conv_dim()],
                inputs: vec![0.0; RING * input],
            });
        }
        &mut self.slots[i]
    }

    /// The causal convolution + SiLU of every row of `x` (`rows x conv_dim`) into `out`:
    /// `out[c] = silu(sum_t w[c][t] * x[pos - (K - 1) + t][c])`, earlier steps' inputs from
    /// the slot, zero before position 0. Then the step's inputs are kept.
    pub fn conv1d_silu(&mut self, plans: &[SeqPlan], w: &[f32], x: &[f32], out: &mut [f32]) {
        let (cd, k) = (self.p.conv_dim(), self.p.conv_kernel);
        for plan in plans {
            let slot = self.slot(plan.slot);
            for (i, &r) in plan.rows.iter().enumerate() {
                let pos = plan.first + i;
                let o = &mut out[r * cd..(r + 1) * cd];
                for (c, oc) in o.iter_mut().enumerate() {
                    let mut acc = 0f32;
                    for t in 0..k {
                        let Some(q) = (pos + t).checked_sub(k - 1) else {
                            continue;
                        };
                        let v = match q.checked_sub(plan.first) {
                            Some(j) => x[plan.rows[j] * cd + c],
                            None => slot.conv[(q % CONV_RING) * cd + c],
                        };
                        acc += w[c * k + t] * v;
                    }
                    *oc = acc / (1.0 + (-acc).exp());
                }
            }
            for (i, &r) in plan.rows.iter().enumerate() {
                let at = ((plan.first + i) % CONV_RING) * cd;
                slot.conv[at..at + cd].copy_from_slice(&x[r * cd..(r + 1) * cd]);
            }
        }
    }

    /// The gated delta rule of every row (see [`crate::ops::Ops::gated_delta`]): per
    /// sequence, the positions between the committed state and the step are replayed from the
    /// slot's kept inputs, then the step's rows run; the state is committed at
    /// `plan.commit_to` and the step's inputs kept.
    pub fn gated_delta(
        &mut self,
        pool: &rayon::ThreadPool,
        plans: &[SeqPlan],
        (qkv, ba): (&[f32], &[f32]),
        (a_coef, dt): (&[f32], &[f32]),
        out: &mut [f32],
    ) {
        let p = self.p;
        let (cd, nv, hv) = (p.conv_dim(), p.n_v_heads, p.head_v);
        let iw = self.input_width();
        let head_state = p.head_k * hv;
        if self
            .coefs
            .as_ref()
            .is_none_or(|(a, d)| a.as_slice() != a_coef || d.as_slice() != dt)
        {
            self.coefs = Some((a_coef.to_vec(), dt.to_vec()));
        }
        for plan in plans {
            self.slot(plan.slot);
        }
        // Per sequence: its rows' inputs (replayed positions first) and whether they output.
        let mut jobs = Vec::new();
        for plan in plans {
            let slot = &self.slots[plan.slot];
            let mut steps: Vec<(Vec<f32>, Option<usize>)> = (plan.replay_from..plan.first)
                .map(|q| {
                    (
                        slot.inputs[(q % RING) * iw..(q % RING + 1) * iw].to_vec(),
                        None,
                    )
                })
                .collect();
            for &r in &plan.rows {
                let mut v = qkv[r * cd..(r + 1) * cd].to_vec();
                v.extend_from_slice(&ba[r * 2 * nv..(r + 1) * 2 * nv]);
                steps.push((v, Some(r)));
            }
            let start = match plan.first {
                0 => vec![0f32; nv * head_state],
                _ => slot.s.clone(),
            };
            // The committed state is the one after position commit_to - 1 (the start state
            // when nothing is committed past it).
            let commit_after = plan.commit_to.checked_sub(plan.replay_from + 1);
            jobs.push((plan, steps, start, commit_after));
        }
        // (sequence, head) -> (the head's committed state, its output per step row).
        let work: Vec<(usize, usize)> = (0..jobs.len())
            .flat_map(|j| (0..nv).map(move |h| (j, h)))
            .collect();
        let results: Vec<HeadRun> = pool.install(|| {
            work.par_iter()
                .map(|&(j, h)| {
                    let (_, steps, start, commit_after) = &jobs[j];
                    let s0 = &start[h * head_state..(h + 1) * head_state];
                    head_steps(&p, h, s0, steps, *commit_after, (a_coef[h], dt[h]))
                })
                .collect()
        });
        for (&(j, h), (committed, outs)) in work.iter().zip(results) {
            let plan = jobs[j].0;
            let slot = &mut self.slots[plan.slot];
            slot.s[h * head_state..(h + 1) * head_state].copy_from_slice(&committed);
            for (r, o) in outs {
                out[r * nv * hv + h * hv..r * nv * hv + (h + 1) * hv].copy_from_slice(&o);
            }
        }
        for (plan, steps, _, _) in &jobs {
            let slot = &mut self.slots[plan.slot];
            let own = steps.len() - plan.rows.len();
            for (i, (v, _)) in steps[own..].iter().enumerate() {
                let at = ((plan.first + i) % RING) * iw;
                slot.inputs[at..at + iw].copy_from_slice(v);
            }
        }
    }
}

/// One value head `h` of one sequence through `steps` (each: the conv output and `[b a]` of a
/// position, and its output row when it has one) from state `s0` (`head_k x head_v`). Returns
/// the state after step `commit_after` (`s0` when `None`) and the outputs.
fn head_steps(
    p: &DeltaParams,
    h: usize,
    s0: &[f32],
    steps: &[(Vec<f32>, Option<usize>)],
    commit_after: Option<usize>,
    (a_coef, dt): (f32, f32),
) -> HeadRun {
    let (hk, hv, nk, nv) = (p.head_k, p.head_v, p.n_k_heads, p.n_v_heads);
    let r = nv / nk;
    let (g, j) = (h / r, h % r);
    let scale = 1.0 / (hk as f32).sqrt();
    let mut s = s0.to_vec();
    let mut committed = s0.to_vec();
    let mut outs = Vec::new();
    let (mut q, mut k) = (vec![0f32; hk], vec![0f32; hk]);
    let (mut kv, mut o) = (vec![0f32; hv], vec![0f32; hv]);
    for (n, (x, row)) in steps.iter().enumerate() {
        l2_normalise(&x[g * hk..(g + 1) * hk], scale, &mut q);
        l2_normalise(&x[(nk + g) * hk..(nk + g + 1) * hk], 1.0, &mut k);
        let v = &x[2 * nk * hk + h * hv..2 * nk * hk + (h + 1) * hv];
        let ba = &x[p.conv_dim()..];
        let beta = sigmoid(ba[g * 2 * r + j]);
        let decay = (a_coef * softplus(ba[g * 2 * r + r + j] + dt)).exp();
        for x in s.iter_mut() {
            *x *= decay;
        }
        kv.fill(0.0);
        for (i, &ki) in k.iter().enumerate() {
            for (m, &sij) in kv.iter_mut().zip(&s[i * hv..(i + 1) * hv]) {
                *m += sij * ki;
            }
        }
        for (m, &vj) in kv.iter_mut().zip(v) {
            *m = (vj - *m) * beta;
        }
        for (i, &ki) in k.iter().enumerate() {
            for (sij, &dj) in s[i * hv..(i + 1) * hv].iter_mut().zip(&kv) {
                *sij += ki * dj;
            }
        }
        if let Some(row) = row {
            o.fill(0.0);
            for (i, &qi) in q.iter().enumerate() {
                for (m, &sij) in o.iter_mut().zip(&s[i * hv..(i + 1) * hv]) {
                    *m += sij * qi;
                }
            }
            outs.push((*row, o.clone()));
        }
        if Some(n) == commit_after {
            committed = s.clone();
        }
    }
    (committed, outs)
}
