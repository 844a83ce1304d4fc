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

/// `memra-server ARGS config` with `env` (and no other product variable) and its output.
fn effective(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_memra-server"));
    for v in memra_engine::settings::product_vars() {
        cmd.env_remove(v);
    }
    let out = cmd.envs(env.iter().copied()).args(args).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn line<'a>(out: &'a str, key: &str) -> &'a str {
    out.lines()
        .find(|l| l.starts_with(&format!("{key} = ")))
        .unwrap_or_else(|| panic!("no `{key} = ` in\n{out}"))
}

#[test]
fn command_line_over_environment_over_config_file_over_default() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("memra.toml");
    std::fs::write(
        &file,
        "max-running = 5\naddr = \"0.0.0.0:9000\"\nkv-blocks = 77\nmax-queue = 9\n",
    )
    .unwrap();
    let f = file.to_str().unwrap();
    let env = [("MEMRA_MAX_RUNNING", "6"), ("MEMRA_ADDR", "127.0.0.1:9001")];
    let (rc, out, err) = effective(&["--config", f, "--max-running", "7", "config"], &env);
    assert_eq!(rc, 0, "{err}");
    // The command line over the environment over the file.
    assert_eq!(line(&out, "max-running"), "max-running = 7  # command line");
    // The environment over the file.
    assert_eq!(
        line(&out, "addr"),
        "addr = \"127.0.0.1:9001\"  # environment (MEMRA_ADDR)"
    );
    // The file over the default, for a flag with a variable and one without.
    assert_eq!(line(&out, "kv-blocks"), "kv-blocks = 77  # config file");
    assert_eq!(line(&out, "max-queue"), "max-queue = 9  # config file");
    // Nothing sets it: the default.
    assert_eq!(
        line(&out, "max-in-flight"),
        "max-in-flight = 256  # default"
    );
    // MEMRA_CONFIG names the file too.
    let (rc, out, err) = effective(&["config"], &[("MEMRA_CONFIG", f)]);
    assert_eq!(rc, 0, "{err}");
    assert_eq!(line(&out, "max-running"), "max-running = 5  # config file");
    // The printed settings are a config file that gives the same settings.
    let again = dir.path().join("again.toml");
    let body: String = out
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| format!("{}\n", l.split("  #").next().unwrap()))
        .collect();
    std::fs::write(&again, body).unwrap();
    let (rc, out2, err) = effective(&["--config", again.to_str().unwrap(), "config"], &[]);
    assert_eq!(rc, 0, "{err}");
    let values = |o: &str| -> Vec<String> {
        o.lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| l.split("  #").next().unwrap().to_string())
            .collect()
    };
    assert_eq!(values(&out), values(&out2));
}

#[test]
fn a_bad_config_file_stops_the_server_before_it_starts() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("memra.toml");
    std::fs::write(&file, "max-in-flight = \"lots\"\n").unwrap();
    let f = file.to_str().unwrap();
    // No model, no listening: the file is refused first, exit status 2.
    let (rc, _, err) = effective(&["--config", f, "--addr", "127.0.0.1:0"], &[]);
    assert_eq!(rc, 2, "{err}");
    assert!(err.contains(f) && err.contains("`max-in-flight`"), "{err}");
    let (rc, _, err) = effective(&[], &[("MEMRA_CONFIG", "/nonexistent/memra.toml")]);
    assert_eq!(rc, 2, "{err}");
    assert!(err.contains("/nonexistent/memra.toml"), "{err}");
}
