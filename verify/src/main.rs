//! `memra-verify`: run an exactness gate; prints a table and `ALL GREEN`, or exits non-zero.
//!
//! - `memra-verify kernels [--device cuda:N] [--seed S]`
//! - `memra-verify invariance [--device D] (MODEL | --tiny ARCH) [--max-m 64] [--prompt-len 40]`
//! - `memra-verify tokens [--device D] MODEL --fixture verify/fixtures/smollm2-135m-reference.json`
//! - `memra-verify serve-invariance MODEL [--device D] [--requests N] [--max-tokens T]`
//! - `memra-verify graph [--device cuda:N] (MODEL | --tiny ARCH) [--max-m 64] [--gen-tokens 24]`

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use memra_engine::backend::cuda::{CudaBackend, CudaOptions};
use memra_engine::backend::{Backend, Device, open_backend};
use memra_engine::config::Arch;
use memra_engine::models::ModelWeights;
use memra_engine::models::random::{random_weights, tiny_config};
use memra_engine::quant::DType;
use memra_engine::{Error, Result};
use memra_verify::{graph, invariance, kernels, serve_invariance, tokens};

#[derive(Parser)]
#[command(name = "memra-verify", about = "memra exactness gates")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Every CUDA kernel against the CPU reference on random inputs.
    Kernels {
        #[arg(long, default_value = "cuda:0")]
        device: Device,
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// Logits and KV bytes bitwise equal under any batch composition and prefill chunking.
    Invariance {
        /// A GGUF file or HF folder.
        model: Option<PathBuf>,
        /// Use a tiny random model of this architecture instead of MODEL.
        #[arg(long, conflicts_with = "model")]
        tiny: Option<String>,
        #[arg(long, default_value = "auto")]
        device: Device,
        #[arg(long, default_value_t = 64)]
        max_m: usize,
        #[arg(long, default_value_t = 40)]
        prompt_len: usize,
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// CUDA graph steps bitwise equal to plain steps; device token selection equal to the host's.
    Graph {
        /// A GGUF file or HF folder.
        model: Option<PathBuf>,
        /// Use a tiny random model of this architecture instead of MODEL.
        #[arg(long, conflicts_with = "model")]
        tiny: Option<String>,
        #[arg(long, default_value = "cuda:0")]
        device: Device,
        #[arg(long, default_value_t = 64)]
        max_m: usize,
        #[arg(long, default_value_t = 40)]
        prompt_len: usize,
        /// Tokens per whole-generation check.
        #[arg(long, default_value_t = 24)]
        gen_tokens: usize,
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// Greedy tokens of the fixture prompts vs the fixture.
    Tokens {
        model: PathBuf,
        #[arg(long)]
        fixture: PathBuf,
        #[arg(long, default_value = "auto")]
        device: Device,
    },
    /// The same prompts served alone, together (staggered), and with the prefix cache warm.
    ServeInvariance {
        model: PathBuf,
        #[arg(long, default_value = "auto")]
        device: Device,
        #[arg(long, default_value_t = 8)]
        requests: usize,
        #[arg(long, default_value_t = 16)]
        max_tokens: usize,
    },
}

fn tiny(arch: &str) -> Result<ModelWeights> {
    let arch = Arch::from_gguf_name(arch)?;
    random_weights(&tiny_config(arch, 97), 5, DType::Q8_0)
}

fn run(cli: Cli) -> Result<bool> {
    match cli.cmd {
        Cmd::Kernels { device, seed } => {
            let Device::Cuda(n) = device else {
                return Err(Error::Input(
                    "kernels: --device must be cuda or cuda:N".into(),
                ));
            };
            let cases = kernels::run(n, seed)?;
            print!("{}", kernels::report(&cases));
            Ok(cases.iter().all(|c| c.ok()))
        }
        Cmd::Invariance {
            model,
            tiny: t,
            device,
            max_m,
            prompt_len,
            seed,
        } => {
            let weights = match (&model, &t) {
                (_, Some(a)) => tiny(a)?,
                (Some(p), None) => memra_engine::loader::load_weights(p)?,
                (None, None) => {
                    return Err(Error::Input("invariance: give MODEL or --tiny ARCH".into()));
                }
            };
            if prompt_len == 0 || max_m == 0 {
                return Err(Error::Input("--prompt-len and --max-m must be > 0".into()));
            }
            let bs = 16;
            let blocks = invariance::blocks_needed(prompt_len, bs);
            let mut b = open_backend(device, weights, blocks, bs, 0)?;
            let rep = invariance::run(b.as_mut(), seed, prompt_len, max_m)?;
            println!(
                "invariance on {}: {} checks (prefill chunkings 1/7/64/whole, alone and with random rows; M = 1..{max_m}), {} failed",
                b.name(),
                rep.checks,
                rep.failures.len()
            );
            for f in &rep.failures {
                println!("FAIL {f}");
            }
            Ok(rep.failures.is_empty())
        }
        Cmd::Graph {
            model,
            tiny: t,
            device,
            max_m,
            prompt_len,
            gen_tokens,
            seed,
        } => {
            let Device::Cuda(n) = device else {
                return Err(Error::Input(
                    "graph: --device must be cuda or cuda:N".into(),
                ));
            };
            let weights = match (&model, &t) {
                (_, Some(a)) => tiny(a)?,
                (Some(p), None) => memra_engine::loader::load_weights(p)?,
                (None, None) => {
                    return Err(Error::Input("graph: give MODEL or --tiny ARCH".into()));
                }
            };
            if prompt_len == 0 || max_m == 0 || max_m > 64 {
                return Err(Error::Input(
                    "--prompt-len must be > 0 and --max-m 1..64".into(),
                ));
            }
            let bs = 16;
            let opts = CudaOptions {
                device: n,
                kv_blocks: graph::blocks_needed(prompt_len, gen_tokens, bs),
                block_size: bs,
                graphs: true,
            };
            let mut b = CudaBackend::new(weights, &opts)?;
            let rep = graph::run(&mut b, seed, prompt_len, max_m, gen_tokens)?;
            let (captures, replays) = b.graph_counts();
            println!(
                "graph on {}: {} checks (M = 1..{max_m} graph vs plain logits and KV bits; 5 \
                 sampling configs x graphs on/off x device/host selection), {captures} \
                 captures, {replays} replays, {} failed",
                b.name(),
                rep.checks,
                rep.failures.len()
            );
            for f in &rep.failures {
                println!("FAIL {f}");
            }
            Ok(rep.failures.is_empty())
        }
        Cmd::Tokens {
            model,
            fixture,
            device,
        } => {
            let weights = memra_engine::loader::load_weights(&model)?;
            let mut b = open_backend(device, weights, 64, 16, 0)?;
            let res = tokens::run(b.as_mut(), &fixture)?;
            let mut ok = true;
            println!("{:<28} {:>7}  result", "prompt", "tokens");
            for r in &res {
                let verdict = match r.divergence {
                    None => "identical".to_string(),
                    Some((i, want, got, margin)) => {
                        let tie = margin < tokens::NEAR_TIE;
                        ok &= tie;
                        format!(
                            "{} at step {i}: expected {want}, got {got} (fixture margin {margin:.4})",
                            if tie {
                                "near-tie divergence"
                            } else {
                                "DIVERGES"
                            }
                        )
                    }
                };
                println!("{:<28} {:>7}  {verdict}", r.name, r.n_tokens);
            }
            println!("on {}", b.name());
            Ok(ok)
        }
        Cmd::ServeInvariance {
            model,
            device,
            requests,
            max_tokens,
        } => {
            let opts = serve_invariance::Options {
                device,
                requests,
                max_tokens,
            };
            let rep = serve_invariance::run(&model, &opts)?;
            print!("{}", serve_invariance::summary(&rep));
            Ok(rep.failures.is_empty())
        }
    }
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(true) => {
            println!("ALL GREEN");
            ExitCode::SUCCESS
        }
        Ok(false) => {
            println!("FAILED");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("memra-verify: error: {e}");
            ExitCode::FAILURE
        }
    }
}
