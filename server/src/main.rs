//! memra-server: serves models over the OpenAI API, or manages the keyring (`keys add|revoke|list`).

use std::process::ExitCode;

use clap::Parser;
use memra_server::config::{Cli, Command};

mod engine_loader;
mod run;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Some(Command::Keys { action, api_keys }) => run::keys(action, &api_keys),
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
