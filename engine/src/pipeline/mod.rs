//! Pipeline parallelism: one model split over stages by layers (`--pp N`, PP-2 for a model
//! too large for one card). Stage 0 embeds the step's tokens and runs its layers; each later
//! stage reads the previous one's residual rows (the hand-over, link.rs) and runs its
//! layers; the last one adds the final norm and the head and picks the tokens. Each stage
//! holds its layers' weights, its layers' part of every KV block and its layers' recurrent
//! state, on its own device (`--devices cuda:0,cuda:1`) or beside the others on one.
//!
//! Exactness: every op is row-wise and the hand-over copies f32 rows exactly, so a row's bits
//! do not depend on the split (`memra-verify pp` checks it against the unsplit model).
//!
//! - plan.rs: the memory plan (per-layer costs, the balanced split, the fit check);
//! - link.rs: [`StageLink`], the hand-over (host copy; on CUDA backend/cuda/link.rs: a device
//!   copy, a peer copy, or NCCL send/recv between two GPUs);
//! - micro.rs: a step's rows cut into micro-batches of whole sequences (`--pp-micro`);
//! - backend.rs: [`Pipeline`], the stages as one [`crate::backend::Backend`], the
//!   micro-batches' work ordered so that two devices work at once.

pub mod backend;
pub mod link;
pub mod micro;
pub mod plan;

pub use backend::Pipeline;
pub use link::{HostLink, StageLink};
pub use plan::{Costs, Split, StageDevice};

use crate::backend::cpu::{CpuBackend, CpuOps, CpuOptions};
use crate::backend::cuda::{self, CudaBackend, CudaOptions};
use crate::backend::{Backend, Device, OpenOptions};
use crate::error::{Error, Result};
use crate::models::{ModelWeights, Stage};

/// How a model is split (`--pp`, `--devices`, `--pp-split`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PpConfig {
    /// Pipeline stages (0 or 1: unsplit).
    pub stages: usize,
    /// One device per stage; empty: every stage on the `--device` device.
    pub devices: Vec<Device>,
    /// The first layer of stages `1..stages`; `None`: balanced by the memory plan.
    pub split: Option<Vec<usize>>,
    /// Micro-batches a step of several sequences is cut into at most (`--pp-micro`; 1: none;
    /// 0: [`DEFAULT_MICRO`]).
    pub micro: usize,
    /// The hand-over between stages on two GPUs (`--pp-link`).
    pub link: LinkChoice,
}

/// Micro-batches per step when `--pp-micro` is not given: two, so that two stages on two
/// devices overlap (micro.rs).
pub const DEFAULT_MICRO: usize = 2;

/// How stages on two different GPUs hand rows over (`--pp-link`). Stages on one device always
/// use a device copy, on the CPU a host copy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LinkChoice {
    /// NCCL send/recv when libnccl loads, else the peer copy.
    #[default]
    Auto,
    /// NCCL send/recv; an error at start when NCCL is absent.
    Nccl,
    /// `cuMemcpyPeerAsync`.
    Peer,
}

impl std::str::FromStr for LinkChoice {
    type Err = Error;

    fn from_str(s: &str) -> Result<LinkChoice> {
        match s.trim() {
            "auto" => Ok(LinkChoice::Auto),
            "nccl" => Ok(LinkChoice::Nccl),
            "peer" => Ok(LinkChoice::Peer),
            other => Err(Error::Input(format!(
                "--pp-link `{other}`: expected auto, nccl or peer"
            ))),
        }
    }
}

impl PpConfig {
    /// The split the flags ask for: `--pp N`, `--devices D0,D1,...` (one per stage; given
    /// alone, with more than one device, it sets the stage count), `--pp-split L1,...`.
    pub fn from_flags(pp: usize, devices: Option<&str>, split: Option<&str>) -> Result<PpConfig> {
        let devices = devices.map(parse_devices).transpose()?.unwrap_or_default();
        let stages = match (pp, devices.len()) {
            (0 | 1, n) if n > 1 => n,
            (p, _) => p,
        };
        if !devices.is_empty() && devices.len() != stages.max(1) {
            return Err(Error::Input(format!(
                "--devices names {} device(s) for --pp {pp}: give one per stage",
                devices.len()
            )));
        }
        let split = split.map(parse_split).transpose()?;
        if split.is_some() && stages < 2 {
            return Err(Error::Input(
                "--pp-split needs --pp 2 or more (or --devices with a device per stage)".into(),
            ));
        }
        Ok(PpConfig {
            stages,
            devices,
            split,
            ..Default::default()
        })
    }

    /// With `--pp-micro` (`None`: the default) and `--pp-link` (`None`: auto).
    pub fn with_micro_link(mut self, micro: Option<usize>, link: Option<&str>) -> Result<PpConfig> {
        if micro == Some(0) {
            return Err(Error::Input(
                "--pp-micro 0: give 1 (no micro-batches) or more".into(),
            ));
        }
        self.micro = micro.unwrap_or(0);
        self.link = link.map(str::parse).transpose()?.unwrap_or_default();
        Ok(self)
    }

    /// The most micro-batches a step is cut into.
    pub fn micro_batches(&self) -> usize {
        match self.micro {
            0 => DEFAULT_MICRO,
            n => n,
        }
    }

    /// Whether the model is split at all.
    pub fn is_split(&self) -> bool {
        self.stages > 1
    }

    /// The device of each stage: `devices` when given (one per stage), else `device` for
    /// every stage; `auto` resolved as `--device auto` is. Every stage must be of one kind.
    pub fn stage_devices(&self, device: Device) -> Result<Vec<Device>> {
        let resolve = |d: Device| match d {
            Device::Auto if cuda::cuda_available() => Device::Cuda(0),
            Device::Auto => Device::Cpu,
            d => d,
        };
        let devs: Vec<Device> = match self.devices.len() {
            0 => vec![resolve(device); self.stages.max(1)],
            n if n == self.stages.max(1) => self.devices.iter().map(|&d| resolve(d)).collect(),
            n => {
                return Err(Error::Input(format!(
                    "--devices names {n} device(s) for --pp {}: give one per stage",
                    self.stages
                )));
            }
        };
        let cpu = devs.iter().filter(|&&d| d == Device::Cpu).count();
        if cpu != 0 && cpu != devs.len() {
            return Err(Error::Input(
                "--devices: the stages of one model must all be on the CPU or all on CUDA \
                 devices"
                    .into(),
            ));
        }
        Ok(devs)
    }
}

/// Opens `weights` unsplit ([`crate::backend::open_backend_opts`]) or split as `pp` says
/// ([`open`]).
pub fn open_any(
    device: Device,
    weights: ModelWeights,
    o: &OpenOptions,
    pp: &PpConfig,
) -> Result<Box<dyn Backend>> {
    if pp.is_split() {
        open(device, weights, o, pp)
    } else {
        crate::backend::open_backend_opts(device, weights, o)
    }
}

/// Parses `--devices`: comma-separated devices, e.g. `cuda:0,cuda:1` or `cpu,cpu`.
pub fn parse_devices(s: &str) -> Result<Vec<Device>> {
    s.split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|p| p.trim().parse())
        .collect()
}

/// Parses `--pp-split`: the first layer of each stage after the first, e.g. `12` or `8,16`.
pub fn parse_split(s: &str) -> Result<Vec<usize>> {
    s.split(',')
        .map(|p| {
            p.trim().parse::<usize>().map_err(|_| {
                Error::Input(format!(
                    "--pp-split `{s}`: expected layer numbers separated by commas"
                ))
            })
        })
        .collect()
}

fn device_name(d: Device) -> String {
    match d {
        Device::Cuda(n) => format!("cuda:{n}"),
        _ => "cpu".into(),
    }
}

/// Where the stages run, with the free memory of their devices, and how they store weights.
fn stage_devices(devs: &[Device]) -> Result<Vec<StageDevice>> {
    devs.iter()
        .map(|&d| {
            let free = match d {
                Device::Cuda(n) => Some(cuda::device_memory(n)?.0),
                _ => Some(crate::engine::host_available_bytes()?),
            };
            Ok(StageDevice {
                name: device_name(d),
                free,
            })
        })
        .collect()
}

/// The per-layer costs of `w` on the backend of `devs` (all CPU or all CUDA).
pub fn costs(w: &ModelWeights, devs: &[Device], o: &OpenOptions) -> Result<Costs> {
    let c = &w.config;
    let cuda_stages = devs.iter().any(|d| matches!(d, Device::Cuda(_)));
    let state = c
        .hybrid
        .map_or(0, |p| cuda::delta::layer_bytes(&p.delta(), o.state_slots));
    let (packs, workspace): (&dyn Fn(crate::quant::DType) -> bool, usize) = if cuda_stages {
        let ctx = o
            .kv_blocks
            .saturating_mul(o.block_size)
            .min(c.max_ctx.max(1));
        let v2 = w
            .iter()
            .any(|(_, t)| t.shape.len() >= 2 && cuda::products::product_supports(t.dtype));
        (
            &cuda::products::product_supports,
            cuda::plan::workspace_bytes(c, ctx, v2),
        )
    } else {
        (&|_| false, 0)
    };
    Costs::of(
        w,
        &plan::Storage {
            packs,
            block_size: o.block_size,
            kv_dtype: o.kv_dtype,
            state_per_layer: state,
            workspace,
        },
    )
}

/// The KV blocks a split model's stages can hold in their devices' free memory (`reserve`
/// bytes kept back per device, `fraction` of the rest, at most `cap`).
pub fn auto_kv_blocks(
    w: &ModelWeights,
    device: Device,
    pp: &PpConfig,
    o: &OpenOptions,
    budget: (usize, f64, usize),
) -> Result<usize> {
    let devs = pp.stage_devices(device)?;
    let costs = costs(w, &devs, o)?;
    let ranges = plan::ranges(&costs, devs.len(), pp.split.as_deref())?;
    Ok(plan::auto_blocks(
        &costs,
        &ranges,
        &stage_devices(&devs)?,
        budget,
    ))
}

/// Plans the split of `weights` (`pp`; every stage on `device` unless `pp.devices` says
/// otherwise), checks each stage fits its device, and opens the stages as one backend.
pub fn open(
    device: Device,
    weights: ModelWeights,
    o: &OpenOptions,
    pp: &PpConfig,
) -> Result<Box<dyn Backend>> {
    match pp.stage_devices(device)?[0] {
        Device::Cuda(_) => Ok(Box::new(open_cuda(device, &weights, o, pp)?)),
        _ => Ok(Box::new(open_cpu(device, &weights, o, pp)?)),
    }
}

/// The planned stages of `weights`: each stage's device, layers and the checked split.
fn planned(
    device: Device,
    weights: &ModelWeights,
    o: &OpenOptions,
    pp: &PpConfig,
) -> Result<(Vec<Device>, Vec<Stage>, Split)> {
    let devs = pp.stage_devices(device)?;
    let costs = costs(weights, &devs, o)?;
    let ranges = plan::ranges(&costs, devs.len(), pp.split.as_deref())?;
    let split = plan::check(&costs, &ranges, &stage_devices(&devs)?, o.kv_blocks)?;
    let n = weights.config.n_layers;
    let stages = ranges
        .into_iter()
        .map(|layers| Stage {
            layers,
            n_layers: n,
        })
        .collect();
    Ok((devs, stages, split))
}

/// [`open`] on CUDA devices (typed: the graph gate switches each stage's graphs).
pub fn open_cuda(
    device: Device,
    weights: &ModelWeights,
    o: &OpenOptions,
    pp: &PpConfig,
) -> Result<Pipeline<cuda::CudaOps>> {
    let (devs, stages, split) = planned(device, weights, o, pp)?;
    let mut runners: Vec<CudaBackend> = Vec::new();
    let mut links: Vec<Box<dyn StageLink<cuda::CudaOps>>> = Vec::new();
    let mut notes = Vec::new();
    for (i, (s, d)) in stages.iter().zip(&devs).enumerate() {
        let Device::Cuda(ordinal) = *d else {
            return Err(Error::Input(
                "--devices: the stages must all be CUDA devices".into(),
            ));
        };
        check_ordinal(ordinal)?;
        let opts = CudaOptions {
            device: ordinal,
            kv_blocks: o.kv_blocks,
            block_size: o.block_size,
            graphs: o.graphs,
            kv_dtype: o.kv_dtype,
            state_slots: o.state_slots,
        };
        runners.push(CudaBackend::new_stage(weights, &opts, s)?);
        if i > 0 {
            let (from, to) = (runners[i - 1].ops(), runners[i].ops());
            let same = devs[i - 1] == *d;
            links.push(cuda_link(pp.link, same, from, to, &mut notes)?);
        }
    }
    let mut summary = with_links(&split, &links, pp.micro_batches());
    for n in notes {
        summary.push_str(&format!(" ({n})"));
    }
    let mut p = Pipeline::new(runners, links, summary)?;
    p.set_micro(pp.micro_batches());
    Ok(p)
}

/// The hand-over two CUDA stages get.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkKind {
    /// A device-to-device copy (both stages on one GPU).
    Device,
    /// `cuMemcpyPeerAsync` between two GPUs.
    Peer,
    /// NCCL send/recv between two GPUs.
    Nccl,
}

/// The hand-over for `choice` between two stages on one device (`same`) or two, where NCCL
/// does or does not load (`nccl`): one device always a device copy (an error when NCCL was
/// asked for: NCCL links two GPUs); `nccl` an error without NCCL; `auto` NCCL when it loads,
/// else the peer copy.
pub fn link_kind(choice: LinkChoice, same: bool, nccl: bool) -> Result<LinkKind> {
    use cuda::link::NcclLink;
    match (choice, same) {
        (LinkChoice::Nccl, true) => Err(Error::Input(
            "--pp-link nccl: two stages share one GPU; NCCL links stages on two different \
             GPUs (one GPU uses a device copy)"
                .into(),
        )),
        (_, true) => Ok(LinkKind::Device),
        (LinkChoice::Peer, false) => Ok(LinkKind::Peer),
        (LinkChoice::Nccl, false) if !nccl => Err(NcclLink::missing()),
        (LinkChoice::Nccl | LinkChoice::Auto, false) if nccl => Ok(LinkKind::Nccl),
        (_, false) => Ok(LinkKind::Peer),
    }
}

/// The hand-over from stage `from` to stage `to` (`same`: on one device), as [`link_kind`]
/// says; with `auto`, a communicator that does not open falls back to the peer copy. Why NCCL
/// is not used (auto between two GPUs) is noted in `notes` (the split summary).
fn cuda_link(
    choice: LinkChoice,
    same: bool,
    from: &cuda::CudaOps,
    to: &cuda::CudaOps,
    notes: &mut Vec<String>,
) -> Result<Box<dyn StageLink<cuda::CudaOps>>> {
    use cuda::link::{DeviceLink, NcclLink, nccl_available};
    let nccl = nccl_available();
    match link_kind(choice, same, nccl)? {
        LinkKind::Device => Ok(Box::new(DeviceLink::new(false))),
        LinkKind::Peer => {
            if choice == LinkChoice::Auto {
                notes.push(format!("nccl not used: {}", NcclLink::missing()));
            }
            Ok(Box::new(DeviceLink::peer(from, to)?))
        }
        LinkKind::Nccl => match NcclLink::open(from, to) {
            Ok(l) => Ok(Box::new(l)),
            Err(e) if choice == LinkChoice::Auto => {
                notes.push(format!("nccl not used: {e}"));
                Ok(Box::new(DeviceLink::peer(from, to)?))
            }
            Err(e) => Err(e),
        },
    }
}

/// [`open`] on the CPU: the stages in this process, handing rows over through host memory.
pub fn open_cpu(
    device: Device,
    weights: &ModelWeights,
    o: &OpenOptions,
    pp: &PpConfig,
) -> Result<Pipeline<CpuOps>> {
    let (devs, stages, split) = planned(device, weights, o, pp)?;
    if devs.iter().any(|d| *d != Device::Cpu) {
        return Err(Error::Input(
            "--devices: the stages must all be `cpu`".into(),
        ));
    }
    let opts = CpuOptions::from(o);
    let runners = stages
        .iter()
        .map(|s| CpuBackend::build_stage(CpuOps::new(&opts)?, weights, s))
        .collect::<Result<Vec<_>>>()?;
    let links: Vec<Box<dyn StageLink<CpuOps>>> = (1..runners.len())
        .map(|_| Box::new(HostLink::default()) as _)
        .collect();
    let summary = with_links(&split, &links, pp.micro_batches());
    let mut p = Pipeline::new(runners, links, summary)?;
    p.set_micro(pp.micro_batches());
    Ok(p)
}

/// The split's summary with the hand-over of each link (one kind when they agree) and the
/// micro-batches.
fn with_links<O: crate::backend::exec::Exec>(
    split: &Split,
    links: &[Box<dyn StageLink<O>>],
    micro: usize,
) -> String {
    let mut kinds: Vec<&str> = links.iter().map(|l| l.kind()).collect();
    kinds.dedup();
    let kind = match kinds.is_empty() {
        true => "none".to_string(),
        false => kinds.join(", "),
    };
    let micro = match micro {
        1 => "off".to_string(),
        n => format!("up to {n} a step"),
    };
    format!(
        "{}; hand-over: {kind}; micro-batches: {micro}",
        split.summary()
    )
}

fn check_ordinal(n: usize) -> Result<()> {
    match cuda::device_count() {
        Ok(c) if n < c => Ok(()),
        Ok(c) => Err(Error::Input(format!(
            "--devices cuda:{n}: {c} CUDA device(s) present"
        ))),
        Err(e) => Err(Error::Input(format!(
            "--devices cuda:{n}: CUDA is not available ({e}); use --devices cpu,cpu"
        ))),
    }
}
