//! memra-server's flags (server/src/config.rs, clap) are exactly the memra-server rows of the one
//! table of settings (engine/src/settings.rs), with the same environment variables and defaults;
//! docs/FLAGS.md is generated from that table (bench/tests/it/flags.rs checks the file).

use clap::CommandFactory;
use memra_engine::settings::{Program, SETTINGS};
use memra_server::config::Cli;

/// (flag, env, clap's default) of every visible argument of `cmd` and its subcommands.
fn walk(cmd: &clap::Command, out: &mut Vec<(String, String, Option<String>)>) {
    for a in cmd.get_arguments() {
        if a.is_hide_set() {
            continue;
        }
        let Some(l) = a.get_long().filter(|l| *l != "help" && *l != "version") else {
            continue;
        };
        let env = a
            .get_env()
            .map(|e| e.to_string_lossy().into_owned())
            .unwrap_or_default();
        let def = a
            .get_default_values()
            .first()
            .map(|d| d.to_string_lossy().into_owned());
        out.push((format!("--{l}"), env, def));
    }
    for s in cmd.get_subcommands() {
        walk(s, out);
    }
}

#[test]
fn every_flag_and_env_var_is_a_row_of_the_settings_table() {
    let mut args = Vec::new();
    walk(&Cli::command(), &mut args);
    assert!(args.len() >= 10, "{args:?}");
    let rows: Vec<_> = SETTINGS
        .iter()
        .filter(|s| s.program == Program::Server)
        .collect();
    for (flag, env, def) in &args {
        // `keys add --max-in-flight` (no variable) shares the serve flag's name.
        let Some(row) = rows
            .iter()
            .find(|r| r.flag == flag && (r.env == env || env.is_empty()))
        else {
            panic!("memra-server {flag} ({env}) is not in engine/src/settings.rs");
        };
        let shown = row.default.trim_matches('`');
        match def.as_deref() {
            Some("false") => assert_eq!(shown, "off", "{flag}"),
            Some(d) => assert_eq!(shown, d, "{flag}: the table's default differs from clap's"),
            None => {}
        }
    }
    for r in &rows {
        assert!(
            args.iter().any(|(f, e, _)| f == r.flag && e == r.env),
            "the settings table lists memra-server {} ({}), which config.rs lacks",
            r.flag,
            r.env
        );
    }
}
