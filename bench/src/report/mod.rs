//! `memra-bench report`: the recorded rows (reports/data/*.jsonl) into reports/README.md, SVG
//! figures and the README's performance table. Every cell comes from a recorded row; a ratio to
//! the peer only ever joins rows of the SAME run. Deterministic: the same rows give byte-identical
//! files (no clock, no hash-map order).

mod plot;
mod roof;
mod table;

use std::path::{Path, PathBuf};

use memra_engine::error::{Error, Result};

use crate::record::{self, Row};

pub use table::{fmt_value, side_by_side_runs};

/// Where the README's generated table goes.
pub const BEGIN: &str =
    "<!-- memra-bench report: begin (generated from reports/data; do not edit) -->";
pub const END: &str = "<!-- memra-bench report: end -->";

/// Where to read and write.
#[derive(Clone, Debug)]
pub struct ReportArgs {
    /// The folder of *.jsonl rows.
    pub data: PathBuf,
    /// The folder for README.md and figures/.
    pub out: PathBuf,
    /// The README whose marked section is rewritten (none: leave it).
    pub readme: Option<PathBuf>,
}

/// The generated files: (path, contents), in a fixed order.
pub fn render(rows: &[Row], readme: Option<&str>) -> Result<Vec<(PathBuf, String)>> {
    let valid: Vec<&Row> = rows
        .iter()
        .filter(|r| r.valid && r.value.is_some())
        .collect();
    let mut files = Vec::new();
    let mut figures = Vec::new();
    for (name, svg) in plot::figures(&valid)? {
        figures.push(name.clone());
        files.push((PathBuf::from("figures").join(name), svg));
    }
    files.push((
        PathBuf::from("README.md"),
        table::reports_readme(rows, &valid, &figures),
    ));
    if let Some(text) = readme {
        files.push((
            PathBuf::from("../README.md"),
            splice(text, &table::readme_section(&valid))?,
        ));
    }
    Ok(files)
}

/// Replaces the text between the markers (which must both be present, in order).
pub fn splice(text: &str, section: &str) -> Result<String> {
    let b = text.find(BEGIN);
    let e = text.find(END);
    match (b, e) {
        (Some(b), Some(e)) if b < e => {
            Ok(format!("{}{BEGIN}\n{section}{}", &text[..b], &text[e..]))
        }
        _ => Err(Error::Input(format!(
            "the README has no `{BEGIN}` ... `{END}` section"
        ))),
    }
}

/// Reads the rows, writes every file. Returns the paths written.
pub fn run(a: &ReportArgs) -> Result<Vec<PathBuf>> {
    let rows = record::read_dir(&a.data)?;
    let readme = match &a.readme {
        Some(p) => Some(
            std::fs::read_to_string(p)
                .map_err(|e| Error::Input(format!("{}: {e}", p.display())))?,
        ),
        None => None,
    };
    let files = render(&rows, readme.as_deref())?;
    let mut written = Vec::new();
    for (rel, text) in files {
        let path = match (&a.readme, rel == Path::new("../README.md")) {
            (Some(r), true) => r.clone(),
            _ => a.out.join(&rel),
        };
        write_atomic(&path, &text)?;
        written.push(path);
    }
    Ok(written)
}

/// Writes through a temporary file and a rename, so a failure leaves the old file whole.
fn write_atomic(path: &Path, text: &str) -> Result<()> {
    let err = |e: std::io::Error| Error::Input(format!("{}: {e}", path.display()));
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(err)?;
    }
    let tmp = path.with_extension("tmp-report");
    std::fs::write(&tmp, text).map_err(err)?;
    std::fs::rename(&tmp, path).map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splice_replaces_only_the_marked_section() {
        let t = format!("a\n{BEGIN}\nold\n{END}\nb\n");
        assert_eq!(
            splice(&t, "new\n").unwrap(),
            format!("a\n{BEGIN}\nnew\n{END}\nb\n")
        );
        assert!(splice("no markers", "x").is_err());
        assert!(splice(&format!("{END}{BEGIN}"), "x").is_err());
    }
}
