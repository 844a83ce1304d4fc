//! memra-server: serves models over the OpenAI API, manages the keyring (`keys add|revoke|list`),
//! or prints its settings (`config`).

use std::process::ExitCode;

use memra_server::config::{self, Cli, Command, LoadError};

mod engine_loader;
mod run;

fn main() -> ExitCode {
    // Everything is read before anything starts: a bad flag, variable or config file exits here.
    let cli = match Cli::load() {
        Ok(cli) => cli,
        Err(LoadError::Args(e)) => e.exit(),
        Err(e @ LoadError::Config(_)) => {
            eprintln!("memra-server: {e}");
            return ExitCode::from(2);
        }
    };
    let result = match cli.command {
        Some(Command::Keys { action, api_keys }) => match api_keys.or(cli.serve.api_keys) {
            Some(path) => run::keys(action, &path),
            None => Err(
                "keys: no keyring file: give --api-keys PATH (or MEMRA_API_KEYS, or \
                         `api-keys` in the config file)"
                    .into(),
            ),
        },
        Some(Command::Config) => config::effective(std::env::args_os())
            .map(|s| print!("{s}"))
            .map_err(|e| e.to_string()),
        None => run::serve(cli.serve),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("memra-server: {e}");
            ExitCode::FAILURE
        }
    }
}
