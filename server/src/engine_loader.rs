//! Starts the engine loop for the configured models.

use std::sync::Arc;

use memra_engine::backend::Device;
use memra_engine::engine::{AdmissionLimits, EngineConfig};
use memra_engine::scheduler::SchedulerConfig;
use memra_server::Generate;
use memra_server::config::{ModelSpec, ServeArgs};
use memra_server::real::{RealEngine, StartConfig, kv_budget};

/// Starts loading; `on_error` gets the message if a model fails to load.
pub fn start(
    specs: &[ModelSpec],
    args: &ServeArgs,
    on_error: Box<dyn FnOnce(String) + Send>,
) -> Result<Arc<dyn Generate>, String> {
    let device: Device = args
        .device
        .parse()
        .map_err(|e| format!("MEMRA_DEVICE `{}`: {e}", args.device))?;
    let engine = EngineConfig {
        device,
        threads: args.threads,
        kv: kv_budget(args.kv_blocks),
        scheduler: SchedulerConfig {
            max_running: args.max_running,
            ..SchedulerConfig::default()
        },
        ..EngineConfig::default()
    };
    let limits = AdmissionLimits {
        max_queued: args.max_queue,
        max_queued_per_tenant: args.tenant_max_in_flight,
        ..AdmissionLimits::default()
    };
    let cfg = StartConfig {
        models: specs
            .iter()
            .map(|s| (s.alias.clone(), s.path.clone()))
            .collect(),
        engine,
        limits,
    };
    Ok(RealEngine::start(cfg, on_error))
}
