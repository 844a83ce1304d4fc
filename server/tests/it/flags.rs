//! docs/FLAGS.md's memra-server section lists every flag and environment variable that
//! config.rs declares, and nothing that it does not.

use clap::CommandFactory;
use memra_server::config::Cli;

fn section() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/FLAGS.md");
    let text = std::fs::read_to_string(path).expect("docs/FLAGS.md");
    let start = text
        .find("## memra-server")
        .expect("a `## memra-server` section");
    let rest = &text[start + 3..];
    let end = rest.find("\n## ").map(|e| e + 1).unwrap_or(rest.len());
    rest[..end].to_string()
}

fn walk(cmd: &clap::Command, envs: &mut Vec<String>, flags: &mut Vec<String>) {
    for a in cmd.get_arguments() {
        if a.is_hide_set() {
            continue;
        }
        if let Some(e) = a.get_env() {
            envs.push(e.to_string_lossy().into_owned());
        }
        if let Some(l) = a.get_long()
            && l != "help"
            && l != "version"
        {
            flags.push(format!("--{l}"));
        }
    }
    for s in cmd.get_subcommands() {
        walk(s, envs, flags);
    }
}

#[test]
fn every_flag_and_env_var_is_documented() {
    let doc = section();
    let (mut envs, mut flags) = (Vec::new(), Vec::new());
    walk(&Cli::command(), &mut envs, &mut flags);
    assert!(envs.len() >= 10, "{envs:?}");
    for e in &envs {
        assert!(
            doc.contains(&format!("`{e}`")),
            "docs/FLAGS.md (memra-server) lacks `{e}`"
        );
    }
    for f in &flags {
        assert!(
            doc.contains(f.as_str()),
            "docs/FLAGS.md (memra-server) lacks {f}"
        );
    }
    // And the doc names no variable the server does not read (tools/install.sh's aside).
    let tools_vars = ["MEMRA_INSTALL_DIR"];
    for word in doc.split('`').filter(|w| w.starts_with("MEMRA_")) {
        if tools_vars.contains(&word) {
            continue;
        }
        let name = word.split(['=', ' ']).next().unwrap_or(word);
        assert!(
            envs.iter().any(|e| e == name),
            "docs/FLAGS.md names {name}, which config.rs lacks"
        );
    }
}
