//! The op interface below [`Backend`](crate::backend::Backend): what an architecture's forward pass
//! (models/<arch>.rs) is written against, implemented once per backend (cpu/, cuda/).
//!
//! - **Parameters** are uploaded once at load: weight matrices ([`Ops::Mat`], in their stored
//!   block format or any layout the backend likes) and small f32 vectors ([`Ops::Vector`]: norm
//!   weights, biases). RoPE tables and KV layers are declared at load too.
//! - **Activations** are [`Act`] handles: `rows x width` f32 buffers owned by the backend and
//!   declared at load, so their addresses are fixed (CUDA graphs). A step's ops run over the
//!   step's rows ([`Rows::Step`]) or the output head's rows ([`Rows::Head`]), as the output
//!   activation's class says.
//! - **Every op is row-wise by contract** (EXACTNESS.md): a row's result depends on that row's
//!   data, position and own sequence's KV alone, never on the other rows or on how many there are.
//!
//! Fusions are backend-private: the composite ops ([`Ops::norm_matmuls`], [`Ops::norm_matmul`],
//! [`Ops::matmul_add`], [`Ops::rope_kv_write`], [`Ops::attention_matmul_add`],
//! [`Ops::glu_matmul_add`]) have default bodies composing the simple ops; a backend overrides one
//! with fused kernels (RMSNorm + activation preparation, RoPE + KV write, attention + preparation,
//! GLU + preparation, the residual add in the product's epilogue), and [`Ops::mats`] lets it
//! store matrices that read one input as one (Q/K/V, gate/up). A fused op may round differently from the composition (the GPU keeps its own
//! arithmetic, EXACTNESS.md) but must stay row-invariant; on the CPU, the oracle, the
//! composition is the definition.

pub mod rope;

use crate::error::Result;
use crate::weights::Tensor;
use rope::Rope;

/// Which row count an activation has during a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Rows {
    /// One row per step row (the residual stream and every layer intermediate).
    Step,
    /// One row per row the output head runs on (those that want logits, or every step row
    /// when the backend runs the head over the whole step).
    Head,
}

/// An activation handle: a `rows x width` f32 buffer owned by the backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Act {
    pub id: usize,
    pub width: usize,
    pub rows: Rows,
}

/// A RoPE table declared with [`Ops::rope_table`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RopeId(pub usize);

/// A KV cache layer declared with [`Ops::kv_layer`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvId(pub usize);

/// A recurrent-state layer (gated DeltaNet) declared with [`Ops::state_layer`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateId(pub usize);

/// Shapes of one gated DeltaNet layer ([`Ops::state_layer`], [`Ops::conv1d_silu`],
/// [`Ops::gated_delta`]): the conv input is `[q (n_k_heads x head_k), k (same), v (n_v_heads x
/// head_v)]`, `conv_dim` values per row; v-head `h` reads k-head `h / (n_v_heads / n_k_heads)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeltaParams {
    pub n_k_heads: usize,
    pub n_v_heads: usize,
    pub head_k: usize,
    pub head_v: usize,
    /// Taps of the causal depthwise convolution.
    pub conv_kernel: usize,
}

impl DeltaParams {
    /// Values per row of the convolution's input and output.
    pub fn conv_dim(&self) -> usize {
        2 * self.n_k_heads * self.head_k + self.n_v_heads * self.head_v
    }

    /// Values per row of the recurrence's output (`n_v_heads x head_v`).
    pub fn value_dim(&self) -> usize {
        self.n_v_heads * self.head_v
    }
}

/// The gate activation of a gated linear unit: `gate = act(gate) * up`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Glu {
    /// SwiGLU: `silu(g) = g / (1 + exp(-g))`.
    Silu,
    /// GeGLU with the tanh approximation of GELU.
    GeluTanh,
}

/// An op (or op option) that not every backend has: an architecture that uses one asks
/// [`Ops::require`] at load, so a backend without it refuses the model instead of computing
/// something wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Feature {
    /// [`Glu::GeluTanh`].
    GeluTanh,
    /// [`AttnParams::window`].
    SlidingWindow,
    /// [`Ops::scale`].
    Scale,
    /// [`Ops::softcap`].
    Softcap,
    /// [`Ops::experts`] and [`Ops::moe`].
    Moe,
    /// [`Ops::hidden_in`] (multi-token prediction, models/mtp.rs).
    Mtp,
    /// Gated DeltaNet layers: [`Ops::state_layer`], [`Ops::conv1d_silu`],
    /// [`Ops::gated_delta`], [`Ops::sigmoid_mul`] and partial RoPE.
    Recurrent,
}

impl std::fmt::Display for Feature {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Feature::GeluTanh => "tanh-GELU (GeGLU)",
            Feature::SlidingWindow => "sliding-window attention",
            Feature::Scale => "scale",
            Feature::Softcap => "logit softcapping",
            Feature::Moe => "mixture-of-experts FFN (the moe op)",
            Feature::Mtp => "multi-token prediction (mtp speculation; the hidden_in op)",
            Feature::Recurrent => "gated DeltaNet layers (recurrent state; the gated_delta op)",
        })
    }
}

/// Shapes and options of one attention call.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttnParams {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Multiplies q.k (usually `1 / sqrt(head_dim)`).
    pub scale: f32,
    /// Sliding window: a row at position p attends to positions `p + 1 - window ..= p` only.
    pub window: Option<usize>,
    /// Rows of an image attend to the whole image, bidirectionally (Gemma 3): a row with a
    /// given embedding sees its [`crate::backend::RowEmbed::span`] besides its causal (and
    /// windowed) positions ([`crate::backend::spans::attn_range`]). Text rows are unaffected.
    pub spans: bool,
}

impl AttnParams {
    /// Causal attention with the usual `1 / sqrt(head_dim)` scale and no window.
    pub fn causal(n_heads: usize, n_kv_heads: usize, head_dim: usize) -> AttnParams {
        AttnParams {
            n_heads,
            n_kv_heads,
            head_dim,
            scale: 1.0 / (head_dim as f32).sqrt(),
            window: None,
            spans: false,
        }
    }
}

/// Shapes and options of one mixture-of-experts FFN call ([`Ops::moe`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeParams {
    pub n_experts: usize,
    /// Experts per row (top-k).
    pub n_used: usize,
    /// Divide the chosen experts' probabilities by their sum.
    pub norm_topk: bool,
    /// Each expert's gated linear unit.
    pub glu: Glu,
}

/// Where a product's result goes when it is added into a residual stream: `res += W x`.
/// `tmp` (the product's width) is scratch for backends that cannot add in the product itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Residual {
    pub res: Act,
    pub tmp: Act,
}

/// The ops an architecture's forward pass uses. Each runs over the rows of its output's class.
pub trait Ops: Send + Sized + 'static {
    /// A weight matrix `[out_features, in_features]`.
    type Mat: Send;
    /// Several weight matrices that read the same input (Q/K/V; gate/up); a backend may store
    /// them as one.
    type Mats: Send;
    /// A small f32 vector (norm weight, bias).
    type Vector: Send;

    // ---- load time ----

    /// Uploads a weight matrix (2-D tensor).
    fn mat(&mut self, t: &Tensor) -> Result<Self::Mat>;
    /// Uploads matrices that are always applied to the same input, in this order.
    fn mats(&mut self, ts: &[&Tensor]) -> Result<Self::Mats>;
    /// Uploads a gated FFN's gate and up matrices (for [`Ops::norm_glu_ffn`]); a backend may
    /// lay them out for a fused activation. The default is [`Ops::mats`].
    fn glu_mats(&mut self, gate: &Tensor, up: &Tensor) -> Result<Self::Mats> {
        self.mats(&[gate, up])
    }
    /// Uploads an embedding table (for [`Ops::embed`]); `head`: it is also the output matrix
    /// (tied embeddings). The default is [`Ops::mat`].
    fn table(&mut self, t: &Tensor, _head: bool) -> Result<Self::Mat> {
        self.mat(t)
    }
    /// Uploads a stack of expert matrices `[n_experts, out_features, in_features]` (3-D tensor)
    /// for [`Ops::moe`].
    fn experts(&mut self, t: &Tensor) -> Result<Self::Mat>;
    /// A MoE FFN with a shared expert folded in as one more expert (qwen3next), uploaded for
    /// [`Ops::norm_moe_shared`]: the router `[n_experts, hidden]` with the shared expert's gate
    /// (`hidden` values) as row `n_experts`, then the gate, up and down stacks with the shared
    /// expert's matrices (`shared`: the stacks' per-expert shapes) appended as expert
    /// `n_experts`. `None` where the backend keeps the shared expert apart (the default, and
    /// where the shared matrices' types differ from the stacks'): the model then uploads and
    /// runs it on its own.
    fn fold_shared_expert(
        &mut self,
        _router: &Tensor,
        _stacks: [&Tensor; 3],
        _shared: [&Tensor; 3],
        _gate: &Tensor,
        _p: &MoeParams,
    ) -> Result<Option<[Self::Mat; 4]>> {
        Ok(None)
    }
    /// Uploads a vector (dequantized to f32).
    fn vector(&mut self, t: &Tensor) -> Result<Self::Vector>;
    /// Declares an activation of `width` values per row.
    fn act(&mut self, name: &'static str, width: usize, rows: Rows) -> Act;
    /// Declares a RoPE table (angles `pos * inv_freq[i]`, computed on the host in f64).
    fn rope_table(&mut self, rope: Rope) -> Result<RopeId>;
    /// Declares one layer of paged KV cache, `width` values per position for K and for V.
    fn kv_layer(&mut self, width: usize) -> Result<KvId>;
    /// Declares one gated DeltaNet layer's recurrent state (the convolution's last inputs and
    /// the delta rule's state, per state slot; crate::backend::state). Only backends with
    /// [`Feature::Recurrent`] have it.
    fn state_layer(&mut self, _p: &DeltaParams) -> Result<StateId> {
        Err(crate::error::Error::Unsupported(
            "gated DeltaNet layers are not yet supported on this backend".into(),
        ))
    }
    /// Checks this backend has every op of `needs` (architecture `arch` uses them); a clear
    /// error naming the first missing one otherwise. The default: every op is there.
    fn require(&self, _arch: &str, _needs: &[Feature]) -> Result<()> {
        Ok(())
    }

    // ---- simple ops ----

    /// `out[r] = dequantize(table[token[r]])`.
    fn embed(&mut self, table: &Self::Mat, out: Act) -> Result<()>;
    /// `out[r]` = row `r` of the step's hidden input (an MTP layer's previous hidden state,
    /// set by [`crate::backend::exec::Exec::set_hidden_in`]). Only backends with
    /// [`Feature::Mtp`] have it.
    fn hidden_in(&mut self, _out: Act) -> Result<()> {
        Err(crate::error::Error::Unsupported(
            "mtp speculation is not yet supported on this backend".into(),
        ))
    }
    /// Overwrites the rows of `x` that the step gives an embedding for
    /// ([`crate::backend::StepBatch::embeds`]). Backends that do not read the step's
    /// embeddings (`Exec::injects_rows` false) never see a step with some: the runner refuses
    /// it first.
    fn inject(&mut self, _x: Act) -> Result<()> {
        Ok(())
    }
    /// Adds part `part` of each of the step's given embeddings (the `w = x.width` values from
    /// `part * w` of its row; part 0 is what [`Ops::inject`] writes) into its row of `x`, one
    /// add per value; the other rows are untouched (Qwen3-VL's deepstack rows). `tmp` (x's
    /// width) is scratch for a backend that copies the rows to the device first.
    fn inject_add(&mut self, _x: Act, _part: usize, _tmp: Act) -> Result<()> {
        Err(crate::error::Error::Unsupported(
            "deepstack image rows (Qwen3-VL) are not supported on this backend".into(),
        ))
    }
    /// `y[r][n] = dot(W[n], x[r])`.
    fn matmul(&mut self, w: &Self::Mat, x: Act, y: Act) -> Result<()>;
    /// `ys[i] = W[i] x` for each matrix of `w`.
    fn matmuls(&mut self, w: &Self::Mats, x: Act, ys: &[Act]) -> Result<()>;
    /// RMSNorm of each group of `group` values of each row (`group == x.width` for a whole-row
    /// norm, `head_dim` for per-head norms), scaled by `w` (`group` values). `y` may equal `x`.
    fn rms_norm(&mut self, x: Act, w: &Self::Vector, y: Act, group: usize, eps: f32) -> Result<()>;
    /// `x += y`.
    fn add(&mut self, x: Act, y: Act) -> Result<()>;
    /// `x[r] += b`.
    fn add_bias(&mut self, x: Act, b: &Self::Vector) -> Result<()>;
    /// `x *= s` (e.g. Gemma's embedding scale `sqrt(hidden)`).
    fn scale(&mut self, x: Act, s: f32) -> Result<()>;
    /// `x = cap * tanh(x / cap)` (logit softcapping).
    fn softcap(&mut self, x: Act, cap: f32) -> Result<()>;
    /// `gate = act(gate) * up`.
    fn glu(&mut self, kind: Glu, gate: Act, up: Act) -> Result<()>;
    /// Half-rotation (NeoX) RoPE of each head of `x` at the row's position, from `table`: the
    /// pairs `(i, i + half)` for `i < half`, `half` the table's frequency count. A table of
    /// fewer than `head_dim / 2` frequencies rotates the first `2 * half` values of each head
    /// and leaves the rest (partial RoPE, [`Feature::Recurrent`] backends). A table with
    /// M-RoPE sections takes frequency i at the row's M-RoPE position of its axis
    /// ([`crate::backend::StepBatch::mrope`], `Rope::cos_sin_at`).
    fn rope(&mut self, x: Act, table: RopeId, head_dim: usize) -> Result<()>;
    /// Writes each row's K and V into `kv` at the row's position.
    fn kv_write(&mut self, kv: KvId, k: Act, v: Act) -> Result<()>;
    /// Causal attention of each row's `q` over its own sequence's KV in `kv` into `out`.
    fn attention(&mut self, kv: KvId, q: Act, out: Act, p: &AttnParams) -> Result<()>;
    /// Mixture-of-experts FFN of each row of `x` (its router logits in `router`, one per
    /// expert) into `out`. Routing: softmax over the experts' logits; the `n_used` highest
    /// probabilities (equal ones: the lowest expert index first); divided by their sum when
    /// `p.norm_topk`. Then `out = sum of w_e * down_e(glu(gate_e x, up_e x))` over the chosen
    /// experts, added in ascending expert index onto zero. `experts` are the gate, up and down
    /// stacks ([`Ops::experts`]). A row's bits must not depend on which rows share its experts.
    fn moe(
        &mut self,
        experts: [&Self::Mat; 3],
        x: Act,
        router: Act,
        out: Act,
        p: &MoeParams,
    ) -> Result<()>;

    /// `x[r][j] *= sigmoid(g[r][j / (x.width / g.width)])` (`g.width` divides `x.width`: one
    /// gate per group of values, e.g. one per row).
    fn sigmoid_mul(&mut self, _x: Act, _g: Act) -> Result<()> {
        Err(crate::error::Error::Unsupported(
            "sigmoid gating is not yet supported on this backend".into(),
        ))
    }
    /// Causal depthwise convolution of each row's `x` (`conv_dim` channels) over its own
    /// sequence's previous `conv_kernel - 1` inputs (zero before position 0), then SiLU, into
    /// `out`: `out[c] = silu(sum_t w[c][t] * x[pos - (kernel - 1) + t][c])`, the sum in
    /// ascending `t` from zero. `w` is `[conv_dim, conv_kernel]`. The inputs of earlier steps
    /// come from `st` (crate::backend::state says which).
    fn conv1d_silu(&mut self, _st: StateId, _w: &Self::Vector, _x: Act, _out: Act) -> Result<()> {
        Err(crate::error::Error::Unsupported(
            "gated DeltaNet layers are not yet supported on this backend".into(),
        ))
    }
    /// The gated delta rule of each row, in position order per sequence, from the state `st`
    /// holds for its sequence: `qkv` is the convolution's output (q, k, v), `ba` the
    /// `[beta (n_v_heads), alpha (n_v_heads)]` projections. Per v-head `h`: `q`, `k` are
    /// L2-normalised (`x / sqrt(sum x^2 + 1e-6)`), `q` scaled by `1 / sqrt(head_k)`,
    /// `beta = sigmoid(b)`, `g = a_coef[h] * softplus(a + dt_bias[h])`; then
    /// `S *= exp(g); S += k (beta (v - S^T k))^T; o = S^T q` (`S` is `head_k x head_v`).
    /// `out` is `n_v_heads x head_v`. The recurrence is per token (chunk length 1), so a row's
    /// bits never depend on how its sequence's positions were split into steps.
    fn gated_delta(
        &mut self,
        _st: StateId,
        _qkv: Act,
        _ba: Act,
        _coef: [&Self::Vector; 2],
        _out: Act,
    ) -> Result<()> {
        Err(crate::error::Error::Unsupported(
            "gated DeltaNet layers are not yet supported on this backend".into(),
        ))
    }

    // ---- composite ops: fusion points (defaults compose the simple ops) ----

    /// A gated DeltaNet layer's core: `qkv = conv1d_silu(x)` ([`Ops::conv1d_silu`]), then the
    /// gated delta rule of `qkv` and `ba` into `out` ([`Ops::gated_delta`]). `qkv` holds the
    /// convolution's output after it, as with the two ops.
    fn conv_gated_delta(
        &mut self,
        st: StateId,
        (w, x, qkv): (&Self::Vector, Act, Act),
        ba: Act,
        coef: [&Self::Vector; 2],
        out: Act,
    ) -> Result<()> {
        self.conv1d_silu(st, w, x, qkv)?;
        self.gated_delta(st, qkv, ba, coef, out)
    }

    /// RMSNorm of `x` into `h`, then `ys[i] = W[i] h`.
    fn norm_matmuls(
        &mut self,
        x: Act,
        norm: &Self::Vector,
        eps: f32,
        h: Act,
        w: &Self::Mats,
        ys: &[Act],
    ) -> Result<()> {
        self.rms_norm(x, norm, h, x.width, eps)?;
        self.matmuls(w, h, ys)
    }

    /// RMSNorm of `x` into `h`, then `y = W h` (the output head).
    fn norm_matmul(
        &mut self,
        x: Act,
        norm: &Self::Vector,
        eps: f32,
        h: Act,
        w: &Self::Mat,
        y: Act,
    ) -> Result<()> {
        self.rms_norm(x, norm, h, x.width, eps)?;
        self.matmul(w, h, y)
    }

    /// `r.res += W x`.
    fn matmul_add(&mut self, w: &Self::Mat, x: Act, r: Residual) -> Result<()> {
        self.matmul(w, x, r.tmp)?;
        self.add(r.res, r.tmp)
    }

    /// RoPE of `q` and `k`, then K and V into the cache.
    fn rope_kv_write(
        &mut self,
        q: Act,
        k: Act,
        v: Act,
        table: RopeId,
        head_dim: usize,
        kv: KvId,
    ) -> Result<()> {
        self.rope(q, table, head_dim)?;
        self.rope(k, table, head_dim)?;
        self.kv_write(kv, k, v)
    }

    /// Attention into `att`, then `r.res += W att` (the output projection).
    fn attention_matmul_add(
        &mut self,
        kv: KvId,
        q: Act,
        att: Act,
        p: &AttnParams,
        w: &Self::Mat,
        r: Residual,
    ) -> Result<()> {
        self.attention(kv, q, att, p)?;
        self.matmul_add(w, att, r)
    }

    /// `r.res += down (act(gate) * up)`; `gate` holds `act(gate) * up` afterwards or is scratch
    /// (a backend that prepares the product's input in the same pass need not write it back).
    fn glu_matmul_add(
        &mut self,
        kind: Glu,
        gate: Act,
        up: Act,
        down: &Self::Mat,
        r: Residual,
    ) -> Result<()> {
        self.glu(kind, gate, up)?;
        self.matmul_add(down, gate, r)
    }

    /// `y = down (act(gate) * up)` (a gated FFN's output without a residual add); `gate` is
    /// scratch afterwards.
    fn glu_matmul(
        &mut self,
        kind: Glu,
        gate: Act,
        up: Act,
        down: &Self::Mat,
        y: Act,
    ) -> Result<()> {
        self.glu(kind, gate, up)?;
        self.matmul(down, gate, y)
    }

    /// A gated DeltaNet's output into the residual: `c = RMSNorm(c) * norm` with one norm per
    /// `group` values, `gate = silu(gate) * c`, `r.res += w gate` (`c` and `gate` are scratch
    /// afterwards; one preparation for `w` on a backend that fuses them).
    fn norm_gate_matmul_add(
        &mut self,
        (c, norm, group, eps): (Act, &Self::Vector, usize, f32),
        gate: Act,
        w: &Self::Mat,
        r: Residual,
    ) -> Result<()> {
        self.rms_norm(c, norm, c, group, eps)?;
        self.glu_matmul_add(Glu::Silu, gate, c, w, r)
    }

    /// The MoE FFN with its shared expert folded in, added into the residual: `h = norm *
    /// RMSNorm(x)`, `logits = w[0] h` (`p.n_experts + 1` wide), then `x += out` where `out` is
    /// `moe(h)` plus `sigmoid(logit n_experts) shared(h)`, the shared expert's term added after
    /// the routed experts' (the sum [`Ops::norm_moe`] then [`Ops::gated_add`] compute). `w`: the
    /// weights of [`Ops::fold_shared_expert`], the only way to get them.
    fn norm_moe_shared(
        &mut self,
        _xn: (Act, &Self::Vector, f32, Act),
        _w: &[Self::Mat; 4],
        _logits: Act,
        _out: Act,
        _p: &MoeParams,
    ) -> Result<()> {
        Err(crate::error::Error::Unsupported(
            "a shared expert folded into the MoE is not supported on this backend".into(),
        ))
    }

    /// A gated shared expert's output `s` added to the routed experts' `o` and into the
    /// residual: `s *= sigmoid(g)` ([`Ops::sigmoid_mul`]), `o += s`, `x += o` (`o` keeps the
    /// FFN's output, `s` is scratch afterwards; one pass on a backend that fuses them).
    fn gated_add(&mut self, (s, g): (Act, Act), o: Act, x: Act) -> Result<()> {
        self.sigmoid_mul(s, g)?;
        self.add(o, s)?;
        self.add(x, o)
    }

    /// [`Ops::moe`] into `out`, then `x += out` (the MoE FFN added into the residual stream;
    /// one pass on a backend that fuses them).
    fn moe_add(
        &mut self,
        experts: [&Self::Mat; 3],
        (h, router): (Act, Act),
        out: Act,
        x: Act,
        p: &MoeParams,
    ) -> Result<()> {
        self.moe(experts, h, router, out, p)?;
        self.add(x, out)
    }

    /// `h = RMSNorm(x) * norm`, the router logits `router.1 = router.0 h`, then [`Ops::moe`] of
    /// `h` into `out`, added into `x` when `add` ([`Ops::moe_add`]: a pre-norm MoE FFN; the
    /// norm, router and routing in one pass on a backend that fuses them).
    #[allow(clippy::too_many_arguments)]
    fn norm_moe(
        &mut self,
        (x, norm, eps, h): (Act, &Self::Vector, f32, Act),
        (router, logits): (&Self::Mat, Act),
        experts: [&Self::Mat; 3],
        out: Act,
        add: bool,
        p: &MoeParams,
    ) -> Result<()> {
        self.norm_matmul(x, norm, eps, h, router, logits)?;
        if add {
            self.moe_add(experts, (h, logits), out, x, p)
        } else {
            self.moe(experts, h, logits, out, p)
        }
    }

    /// The per-head RMSNorms of q and k (`norms`: weights of one head, `eps`), then
    /// [`Ops::rope_kv_write`] (one launch on a backend that fuses them).
    #[allow(clippy::too_many_arguments)]
    fn qk_norm_rope_kv_write(
        &mut self,
        (q, k, v): (Act, Act, Act),
        norms: [&Self::Vector; 2],
        eps: f32,
        table: RopeId,
        head_dim: usize,
        kv: KvId,
    ) -> Result<()> {
        self.rms_norm(q, norms[0], q, head_dim, eps)?;
        self.rms_norm(k, norms[1], k, head_dim, eps)?;
        self.rope_kv_write(q, k, v, table, head_dim, kv)
    }

    /// Attention into `att`, then `y = W att` (an output projection without a residual add).
    #[allow(clippy::too_many_arguments)]
    fn attention_matmul(
        &mut self,
        kv: KvId,
        q: Act,
        att: Act,
        p: &AttnParams,
        w: &Self::Mat,
        y: Act,
    ) -> Result<()> {
        self.attention(kv, q, att, p)?;
        self.matmul(w, att, y)
    }

    /// `x += RMSNorm(o) * post` (a post-norm sublayer added into the residual: Gemma 3's
    /// sandwich norms); `o` is scratch afterwards.
    fn post_norm_add(&mut self, o: Act, post: &Self::Vector, eps: f32, x: Act) -> Result<()> {
        self.rms_norm(o, post, o, o.width, eps)?;
        self.add(x, o)
    }

    /// [`Ops::post_norm_add`], then [`Ops::norm_matmuls`] of the new `x` (one pass over the
    /// residual on a backend that fuses them).
    fn post_norm_add_norm_matmuls(
        &mut self,
        (o, post, post_eps): (Act, &Self::Vector, f32),
        x: Act,
        (norm, eps, h): (&Self::Vector, f32, Act),
        w: &Self::Mats,
        ys: &[Act],
    ) -> Result<()> {
        self.post_norm_add(o, post, post_eps, x)?;
        self.norm_matmuls(x, norm, eps, h, w, ys)
    }

    /// A gated FFN added into the residual: RMSNorm of `x` into `h`, `gate`, `up` = the
    /// matrices of `gate_up` ([`Ops::glu_mats`]) times `h`, then [`Ops::glu_matmul_add`] (`gate`
    /// and `up` are scratch afterwards).
    fn norm_glu_ffn(
        &mut self,
        (x, norm, eps, h): (Act, &Self::Vector, f32, Act),
        gate_up: &Self::Mats,
        kind: Glu,
        (gate, up): (Act, Act),
        down: &Self::Mat,
        r: Residual,
    ) -> Result<()> {
        self.norm_matmuls(x, norm, eps, h, gate_up, &[gate, up])?;
        self.glu_matmul_add(kind, gate, up, down, r)
    }

    /// Hands a named intermediate (`attn_norm`, `q`, ..., layer `layer`) to the dump sink, if
    /// one is installed; backends may ignore it.
    fn dump(&mut self, _name: &str, _layer: usize, _x: Act) {}
}
