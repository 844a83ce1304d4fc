//! The one table of settings (engine/src/settings.rs) against the code: run-gen's flags and
//! defaults, every `MEMRA_*` name the sources use, and the files that read the environment.
//! (memra-server's flags: server/tests/it/flags.rs; docs/FLAGS.md: bench/tests/it/flags.rs.)

use std::path::{Path, PathBuf};
use std::process::Command;

use memra_engine::settings::{Program, SETTINGS};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace")
        .to_path_buf()
}

/// Every file under `dir` whose name ends with `ext`, `target` and hidden folders left out.
fn files(dir: &Path, ext: &str, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') || name == "target" {
            continue;
        }
        if p.is_dir() {
            files(&p, ext, out);
        } else if name.ends_with(ext) {
            out.push(p);
        }
    }
}

fn rust_sources() -> Vec<PathBuf> {
    let mut v = Vec::new();
    for c in ["engine", "server", "bench", "verify", "kernels"] {
        files(&root().join(c), ".rs", &mut v);
    }
    assert!(v.len() > 100, "{} Rust files", v.len());
    v
}

/// The `MEMRA_*` names in `text`.
fn memra_names(text: &str) -> Vec<String> {
    let prefix = concat!("MEMRA", "_");
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find(prefix) {
        let before = rest[..i].chars().next_back();
        let tail = &rest[i + prefix.len()..];
        let n = tail
            .find(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        if n > 0 && !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            out.push(format!("{prefix}{}", &tail[..n]));
        }
        rest = &tail[n..];
    }
    out
}

#[test]
fn every_memra_name_in_the_sources_is_a_row_and_every_row_is_read() {
    let mut seen = Vec::new();
    for p in rust_sources() {
        let text = std::fs::read_to_string(&p).unwrap_or_default();
        for name in memra_names(&text) {
            assert!(
                SETTINGS.iter().any(|s| s.env == name),
                "{} uses {name}, which engine/src/settings.rs lacks (a new variable is a new row; \
                 then `memra-bench flags --out docs/FLAGS.md`)",
                p.display()
            );
            seen.push(name);
        }
    }
    // A row's variable is read somewhere: by the Rust code or by tools/.
    let mut tools = Vec::new();
    files(&root().join("tools"), ".sh", &mut tools);
    let tools: String = tools
        .iter()
        .map(|p| std::fs::read_to_string(p).unwrap_or_default())
        .collect();
    for s in SETTINGS.iter().filter(|s| !s.env.is_empty()) {
        assert!(
            seen.iter().any(|n| n == s.env) || tools.contains(s.env),
            "{} is in the settings table but nothing reads it",
            s.env
        );
    }
}

#[test]
fn only_the_declared_modules_read_the_environment() {
    // engine/src/settings.rs for everything above the kernels crate; kernels/src/lib.rs for its
    // two cache variables (it sits below the engine). Binaries declare theirs as clap `env`.
    let allowed = ["engine/src/settings.rs", "kernels/src/lib.rs"];
    let needles = ["var(", "var_os(", "vars(", "vars_os("].map(|n| format!("env::{n}"));
    for p in rust_sources() {
        let rel = p
            .strip_prefix(root())
            .unwrap_or(&p)
            .to_string_lossy()
            .replace('\\', "/");
        if allowed.contains(&rel.as_str()) {
            continue;
        }
        let text = std::fs::read_to_string(&p).unwrap_or_default();
        for n in &needles {
            assert!(
                !text.contains(n.as_str()),
                "{rel} reads the environment ({n}...): go through memra_engine::settings \
                 (and add a row to its table)"
            );
        }
    }
}

#[test]
fn run_gen_flags_and_defaults_are_the_table_s() {
    let out = Command::new(env!("CARGO_BIN_EXE_run-gen"))
        .arg("--help")
        .output()
        .expect("run-gen --help");
    let help = String::from_utf8_lossy(&out.stdout).into_owned();
    // (flag, default) per option of the long help: a line starting with `--name` (or `-x,
    // --name`), its default the first `[default: X]` before the next option.
    let mut flags: Vec<(String, Option<String>)> = Vec::new();
    for line in help.lines() {
        let t = line.trim_start();
        let t = t
            .strip_prefix("-h, ")
            .or_else(|| t.strip_prefix("-V, "))
            .unwrap_or(t);
        if let Some(rest) = t.strip_prefix("--") {
            let name = rest.split([' ', '<', '=']).next().unwrap_or(rest);
            flags.push((format!("--{name}"), None));
        }
        if let (Some(i), Some(last)) = (line.find("[default: "), flags.last_mut()) {
            let d = &line[i + "[default: ".len()..];
            last.1 = Some(d[..d.find(']').unwrap_or(d.len())].to_string());
        }
    }
    flags.retain(|(f, _)| f != "--help" && f != "--version");
    assert!(flags.len() >= 20, "{help}");
    let rows: Vec<_> = SETTINGS
        .iter()
        .filter(|s| s.program == Program::RunGen)
        .collect();
    for (flag, def) in &flags {
        let row = rows
            .iter()
            .find(|r| r.flag == flag)
            .unwrap_or_else(|| panic!("run-gen {flag} is not in engine/src/settings.rs"));
        match def {
            Some(d) => assert_eq!(row.default, d, "run-gen {flag}: the table's default"),
            None => assert!(
                matches!(row.default, "off" | "—"),
                "run-gen {flag}: clap has no default, the table says {}",
                row.default
            ),
        }
    }
    for r in &rows {
        if r.flag == "MODEL" {
            assert!(help.contains("<MODEL>"), "{help}");
            continue;
        }
        assert!(
            flags.iter().any(|(f, _)| f == r.flag),
            "the settings table lists run-gen {}, which run-gen lacks",
            r.flag
        );
    }
}
