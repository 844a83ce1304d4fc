//! Starts the engine loop for the configured models.

use std::sync::Arc;

use memra_server::Generate;
use memra_server::config::{ModelSpec, ServeArgs};
use memra_server::real::{RealEngine, StartConfig, check_draft_paths};

/// Starts loading; `on_error` gets the message if a model fails to load.
pub fn start(
    specs: &[ModelSpec],
    args: &ServeArgs,
    on_error: Box<dyn FnOnce(String) + Send>,
) -> Result<Arc<dyn Generate>, String> {
    let cfg = StartConfig::from_args(specs, args)?;
    // A missing or unreadable draft model is refused before any model loads.
    check_draft_paths(&cfg)?;
    Ok(RealEngine::start(cfg, on_error))
}
