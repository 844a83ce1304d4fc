//! Starts the engine for the configured models. Until the engine loop (`EngineHandle`) lands
//! this is the stopgap serial engine in `memra_server::local`.

use std::sync::Arc;

use memra_engine::backend::Device;
use memra_server::Generate;
use memra_server::config::{ModelSpec, ServeArgs};
use memra_server::local::{LocalConfig, LocalEngine};

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
    let cfg = LocalConfig {
        models: specs
            .iter()
            .map(|s| (s.alias.clone(), s.path.clone()))
            .collect(),
        device,
        threads: args.threads,
        max_queue: args.max_queue,
    };
    Ok(LocalEngine::start(cfg, on_error))
}
