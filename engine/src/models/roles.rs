//! Tensor roles: the shared vocabulary of what a tensor is in a decoder-only transformer, with
//! its GGUF name (llama.cpp's names are the same for every architecture). Hugging Face names
//! differ between architectures, so each architecture lists its own (`ArchDef::layer_names`).

use super::{Arch, def};

/// The role of a tensor, by layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Role {
    TokenEmbd,
    OutputNorm,
    Output,
    AttnNorm(usize),
    Q(usize),
    K(usize),
    V(usize),
    QBias(usize),
    KBias(usize),
    VBias(usize),
    QNorm(usize),
    KNorm(usize),
    AttnOut(usize),
    FfnNorm(usize),
    Gate(usize),
    Up(usize),
    Down(usize),
    /// RMSNorm of the attention output before the residual add.
    AttnPostNorm(usize),
    /// RMSNorm of the FFN output before the residual add.
    FfnPostNorm(usize),
    /// The MoE router `[n_experts, hidden]`.
    FfnGateInp(usize),
    /// The experts' gate, up and down projections, stacked: `[n_experts, out, in]`. HF
    /// checkpoints hold one 2-D tensor per expert ([`Role::is_experts`], [`expert_name`]).
    GateExps(usize),
    UpExps(usize),
    DownExps(usize),
    /// Multi-token prediction (models/mtp.rs), on layers `n_layers..`: the projection of
    /// `[enorm(embed(t)), hnorm(h)]` `[hidden, 2 * hidden]`.
    MtpEhProj(usize),
    /// RMSNorm of the embedded next token.
    MtpEnorm(usize),
    /// RMSNorm of the previous hidden state.
    MtpHnorm(usize),
    /// The final norm before the (shared) output head.
    MtpSharedNorm(usize),
    /// The MTP layer's own output head (optional: the model's when absent).
    MtpHead(usize),
    /// The MTP layer's own embedding (optional: the model's when absent).
    MtpEmbed(usize),
    /// Gated DeltaNet (qwen3next linear attention): the q/k/v projection in the convolution's
    /// channel order `[q (all key heads), k (same), v (all value heads)]`.
    LinQkv(usize),
    /// The output gate `z` projection `[n_v_heads x head_v, hidden]`.
    LinGate(usize),
    /// The beta/alpha projection `[2 n_v_heads, hidden]`, grouped per key head: for key head
    /// g, the betas of its value heads, then their alphas (llama.cpp's `ssm_ba`, HF
    /// `in_proj_ba`).
    SsmBa(usize),
    /// The causal depthwise convolution `[conv_dim, kernel]`.
    SsmConv(usize),
    /// The per-value-head bias added to alpha before the softplus (HF `dt_bias`).
    SsmDt(usize),
    /// The per-value-head decay coefficient `-exp(A_log)` (HF stores `A_log`).
    SsmA(usize),
    /// The gated RMSNorm of each value head's output `[head_v]` (no `1 + w` offset).
    SsmNorm(usize),
    /// The output projection `[hidden, n_v_heads x head_v]`.
    SsmOut(usize),
    /// The shared expert's sigmoid gate `[hidden]` (one value per row).
    ShexpGateInp(usize),
    /// The shared expert's gate, up and down projections.
    ShexpGate(usize),
    ShexpUp(usize),
    ShexpDown(usize),
}

/// The placeholder for the expert index in the HF name of a stacked-experts role
/// (`model.layers.0.mlp.experts.*.gate_proj.weight`).
pub const EXPERT_WILDCARD: &str = "*";

/// The HF name of expert `e`'s tensor of a stacked-experts role's HF name.
pub fn expert_name(stack_hf_name: &str, e: usize) -> String {
    stack_hf_name.replacen(EXPERT_WILDCARD, &e.to_string(), 1)
}

/// GGUF suffixes of the per-layer roles, in [`Role`] order from `AttnNorm`.
const GGUF_LAYER: [&str; 38] = [
    "attn_norm.weight",
    "attn_q.weight",
    "attn_k.weight",
    "attn_v.weight",
    "attn_q.bias",
    "attn_k.bias",
    "attn_v.bias",
    "attn_q_norm.weight",
    "attn_k_norm.weight",
    "attn_output.weight",
    "ffn_norm.weight",
    "ffn_gate.weight",
    "ffn_up.weight",
    "ffn_down.weight",
    "post_attention_norm.weight",
    "post_ffw_norm.weight",
    "ffn_gate_inp.weight",
    "ffn_gate_exps.weight",
    "ffn_up_exps.weight",
    "ffn_down_exps.weight",
    "nextn.eh_proj.weight",
    "nextn.enorm.weight",
    "nextn.hnorm.weight",
    "nextn.shared_head_norm.weight",
    "nextn.shared_head_head.weight",
    "nextn.embed_tokens.weight",
    "attn_qkv.weight",
    "attn_gate.weight",
    "ssm_ba.weight",
    "ssm_conv1d.weight",
    "ssm_dt.bias",
    "ssm_a",
    "ssm_norm.weight",
    "ssm_out.weight",
    "ffn_gate_inp_shexp.weight",
    "ffn_gate_shexp.weight",
    "ffn_up_shexp.weight",
    "ffn_down_shexp.weight",
];

fn layer_role(i: usize, l: usize) -> Option<Role> {
    Some(match i {
        0 => Role::AttnNorm(l),
        1 => Role::Q(l),
        2 => Role::K(l),
        3 => Role::V(l),
        4 => Role::QBias(l),
        5 => Role::KBias(l),
        6 => Role::VBias(l),
        7 => Role::QNorm(l),
        8 => Role::KNorm(l),
        9 => Role::AttnOut(l),
        10 => Role::FfnNorm(l),
        11 => Role::Gate(l),
        12 => Role::Up(l),
        13 => Role::Down(l),
        14 => Role::AttnPostNorm(l),
        15 => Role::FfnPostNorm(l),
        16 => Role::FfnGateInp(l),
        17 => Role::GateExps(l),
        18 => Role::UpExps(l),
        19 => Role::DownExps(l),
        20 => Role::MtpEhProj(l),
        21 => Role::MtpEnorm(l),
        22 => Role::MtpHnorm(l),
        23 => Role::MtpSharedNorm(l),
        24 => Role::MtpHead(l),
        25 => Role::MtpEmbed(l),
        26 => Role::LinQkv(l),
        27 => Role::LinGate(l),
        28 => Role::SsmBa(l),
        29 => Role::SsmConv(l),
        30 => Role::SsmDt(l),
        31 => Role::SsmA(l),
        32 => Role::SsmNorm(l),
        33 => Role::SsmOut(l),
        34 => Role::ShexpGateInp(l),
        35 => Role::ShexpGate(l),
        36 => Role::ShexpUp(l),
        37 => Role::ShexpDown(l),
        _ => return None,
    })
}

/// (index into [`GGUF_LAYER`], layer) of a per-layer role.
fn role_index(r: Role) -> Option<(usize, usize)> {
    Some(match r {
        Role::AttnNorm(l) => (0, l),
        Role::Q(l) => (1, l),
        Role::K(l) => (2, l),
        Role::V(l) => (3, l),
        Role::QBias(l) => (4, l),
        Role::KBias(l) => (5, l),
        Role::VBias(l) => (6, l),
        Role::QNorm(l) => (7, l),
        Role::KNorm(l) => (8, l),
        Role::AttnOut(l) => (9, l),
        Role::FfnNorm(l) => (10, l),
        Role::Gate(l) => (11, l),
        Role::Up(l) => (12, l),
        Role::Down(l) => (13, l),
        Role::AttnPostNorm(l) => (14, l),
        Role::FfnPostNorm(l) => (15, l),
        Role::FfnGateInp(l) => (16, l),
        Role::GateExps(l) => (17, l),
        Role::UpExps(l) => (18, l),
        Role::DownExps(l) => (19, l),
        Role::MtpEhProj(l) => (20, l),
        Role::MtpEnorm(l) => (21, l),
        Role::MtpHnorm(l) => (22, l),
        Role::MtpSharedNorm(l) => (23, l),
        Role::MtpHead(l) => (24, l),
        Role::MtpEmbed(l) => (25, l),
        Role::LinQkv(l) => (26, l),
        Role::LinGate(l) => (27, l),
        Role::SsmBa(l) => (28, l),
        Role::SsmConv(l) => (29, l),
        Role::SsmDt(l) => (30, l),
        Role::SsmA(l) => (31, l),
        Role::SsmNorm(l) => (32, l),
        Role::SsmOut(l) => (33, l),
        Role::ShexpGateInp(l) => (34, l),
        Role::ShexpGate(l) => (35, l),
        Role::ShexpUp(l) => (36, l),
        Role::ShexpDown(l) => (37, l),
        Role::TokenEmbd | Role::OutputNorm | Role::Output => return None,
    })
}

/// (GGUF name, HF name) of the roles outside the layers, the same for every architecture.
fn global_names(r: Role) -> Option<(&'static str, &'static str)> {
    match r {
        Role::TokenEmbd => Some(("token_embd.weight", "model.embed_tokens.weight")),
        Role::OutputNorm => Some(("output_norm.weight", "model.norm.weight")),
        Role::Output => Some(("output.weight", "lm_head.weight")),
        _ => None,
    }
}

const GLOBAL: [Role; 3] = [Role::TokenEmbd, Role::OutputNorm, Role::Output];

impl Role {
    /// The GGUF tensor name of this role.
    pub fn gguf_name(self) -> String {
        if let Some((g, _)) = global_names(self) {
            return g.into();
        }
        let (i, l) = role_index(self).unwrap_or((0, 0));
        format!("blk.{l}.{}", GGUF_LAYER[i])
    }

    /// The GGUF suffix of a per-layer role (`attn_q.weight`).
    pub fn gguf_suffix(self) -> Option<&'static str> {
        role_index(self).map(|(i, _)| GGUF_LAYER[i])
    }

    /// The Hugging Face tensor name of this role in architecture `arch`.
    pub fn hf_name(self, arch: Arch) -> String {
        if let Some((_, h)) = global_names(self) {
            return h.into();
        }
        let (i, l) = role_index(self).unwrap_or((0, 0));
        let suffix = def(arch)
            .layer_names
            .iter()
            .find(|(g, _)| *g == GGUF_LAYER[i])
            .map_or(GGUF_LAYER[i], |(_, h)| h);
        format!("model.layers.{l}.{suffix}")
    }

    /// The role of a GGUF tensor name.
    pub fn from_gguf_name(name: &str) -> Option<Role> {
        if let Some(&r) = GLOBAL.iter().find(|r| global_names(**r).unwrap().0 == name) {
            return Some(r);
        }
        let rest = name.strip_prefix("blk.")?;
        let (l, suffix) = rest.split_once('.')?;
        let l: usize = l.parse().ok()?;
        let i = GGUF_LAYER.iter().position(|g| *g == suffix)?;
        layer_role(i, l)
    }

    /// The role of a Hugging Face tensor name in architecture `arch`.
    pub fn from_hf_name(name: &str, arch: Arch) -> Option<Role> {
        if let Some(&r) = GLOBAL.iter().find(|r| global_names(**r).unwrap().1 == name) {
            return Some(r);
        }
        let rest = name.strip_prefix("model.layers.")?;
        let (l, suffix) = rest.split_once('.')?;
        let l: usize = l.parse().ok()?;
        let (g, _) = def(arch).layer_names.iter().find(|(_, h)| *h == suffix)?;
        let i = GGUF_LAYER.iter().position(|x| x == g)?;
        layer_role(i, l)
    }

    /// The (stacked role, expert index) of the HF name of one expert's tensor
    /// (`model.layers.3.mlp.experts.17.up_proj.weight`) in architecture `arch`.
    pub fn from_hf_expert_name(name: &str, arch: Arch) -> Option<(Role, usize)> {
        let (head, rest) = name.split_once(".experts.")?;
        let (e, tail) = rest.split_once('.')?;
        let e: usize = e.parse().ok()?;
        let stack = format!("{head}.experts.{EXPERT_WILDCARD}.{tail}");
        let role = Role::from_hf_name(&stack, arch)?;
        role.is_experts().then_some((role, e))
    }

    /// Whether this role is a stack of per-expert matrices (one HF tensor per expert).
    pub fn is_experts(self) -> bool {
        matches!(
            self,
            Role::GateExps(_) | Role::UpExps(_) | Role::DownExps(_)
        )
    }

    /// The layer this role belongs to, if any.
    pub fn layer(self) -> Option<usize> {
        role_index(self).map(|(_, l)| l)
    }

    /// Whether GGUF files of a q/k-permuting architecture store this tensor's rows permuted.
    pub fn is_qk(self) -> bool {
        matches!(
            self,
            Role::Q(_) | Role::K(_) | Role::QBias(_) | Role::KBias(_)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for arch in super::super::ARCHS.iter().map(|d| d.arch) {
            let listed = |r: &Role| {
                let g = r.gguf_suffix();
                def(arch).layer_names.iter().any(|(s, _)| Some(*s) == g)
            };
            for l in [0usize, 7, 29] {
                let roles = (0..GGUF_LAYER.len()).filter_map(|i| layer_role(i, l));
                for r in roles.filter(listed) {
                    assert_eq!(Role::from_gguf_name(&r.gguf_name()), Some(r));
                    assert_eq!(Role::from_hf_name(&r.hf_name(arch), arch), Some(r));
                }
            }
            assert_eq!(
                Role::from_hf_name("lm_head.weight", arch),
                Some(Role::Output)
            );
        }
        assert_eq!(Role::from_gguf_name("blk.x.attn_q.weight"), None);
        let up = Role::UpExps(4).hf_name(Arch::Qwen3Moe);
        assert_eq!(up, "model.layers.4.mlp.experts.*.up_proj.weight");
        let one = expert_name(&up, 17);
        assert_eq!(one, "model.layers.4.mlp.experts.17.up_proj.weight");
        assert_eq!(
            Role::from_hf_expert_name(&one, Arch::Qwen3Moe),
            Some((Role::UpExps(4), 17))
        );
        assert_eq!(
            Role::from_hf_expert_name(
                "model.layers.4.mlp.experts.x.up_proj.weight",
                Arch::Qwen3Moe
            ),
            None
        );
        assert_eq!(
            Role::from_gguf_name("blk.2.ffn_down_exps.weight"),
            Some(Role::DownExps(2))
        );
        assert_eq!(
            Role::Q(3).hf_name(Arch::Llama),
            "model.layers.3.self_attn.q_proj.weight"
        );
    }
}
