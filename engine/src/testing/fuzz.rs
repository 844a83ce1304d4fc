//! The entry points of the fuzz targets (fuzz/, cargo-fuzz), shared with the stable test that
//! replays their committed seed corpora (engine/tests/it/fuzz_replay.rs). Each takes untrusted
//! bytes through the code a model file goes through and says whether they were accepted; any
//! panic, abort or hang is a finding.

use std::path::Path;

use crate::chat::{ChatMessage, ChatTemplate};
use crate::formats::gguf::Gguf;
use crate::formats::safetensors::SafetensorsFile;
use crate::loader::gguf_weights;
use crate::tokenizer::Tokenizer;

/// The committed seed corpus of fuzz target `target` (fuzz/corpus/<target>): (file name,
/// bytes), sorted by name. Panics when the folder cannot be read (tests only).
pub fn corpus(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus")
        .join(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .flatten()
        .map(|e| e.path())
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|f| {
            let name = f
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or("")
                .to_string();
            let data = std::fs::read(&f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
            (name, data)
        })
        .collect()
}

/// Fuel and output limit of a fuzzed template render: small, so one input stays fast.
const FUEL: u64 = 200_000;
const MAX_OUTPUT: usize = 1 << 16;

/// What an input came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Accepted through the last stage.
    Accepted,
    /// Refused with this error.
    Rejected(String),
}

fn outcome<T>(r: crate::Result<T>) -> Outcome {
    match r {
        Ok(_) => Outcome::Accepted,
        Err(e) => Outcome::Rejected(e.to_string()),
    }
}

fn sample() -> [ChatMessage; 2] {
    [
        ChatMessage::new("system", "Be brief."),
        ChatMessage::new("user", "Hello <|im_end|> ünï 🦀"),
    ]
}

/// GGUF bytes through the parser, the config and weights, the tokenizer (and one encode) and
/// the chat template (and one render): what `load_model` does with a file.
pub fn gguf(data: &[u8]) -> Outcome {
    let g = match Gguf::from_bytes(data, Path::new("fuzz.gguf")) {
        Ok(g) => g,
        Err(e) => return Outcome::Rejected(e.to_string()),
    };
    for t in g.tensors() {
        if let Some(t) = g.tensor(&t.name)
            && t.numel() <= 1 << 16
        {
            let _ = t.to_f32();
        }
    }
    let weights = gguf_weights(&g);
    let tok = match Tokenizer::from_gguf(&g) {
        Ok(t) => t,
        Err(e) => return Outcome::Rejected(e.to_string()),
    };
    if let Ok(ids) = tok.encode("Hello, world! 123 ünï 🦀 <|im_end|>", false) {
        let _ = tok.decode(&ids);
    }
    match ChatTemplate::from_gguf(&g, &tok) {
        Ok(Some(mut t)) => {
            t.set_limits(FUEL, MAX_OUTPUT);
            if let Err(e) = t.render(&sample(), true) {
                return Outcome::Rejected(e.to_string());
            }
        }
        Ok(None) => {}
        Err(e) => return Outcome::Rejected(e.to_string()),
    }
    outcome(weights)
}

/// A safetensors file's bytes through the header checks.
pub fn safetensors(data: &[u8]) -> Outcome {
    outcome(SafetensorsFile::check_bytes(
        Path::new("fuzz.safetensors"),
        data,
    ))
}

/// A chat template and a message: the bytes up to the first NUL are the template source, the
/// rest the user's message (both lossily UTF-8). Compiled and rendered with small limits.
pub fn chat_template(data: &[u8]) -> Outcome {
    let (src, msg) = match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &b""[..]),
    };
    let src = String::from_utf8_lossy(src);
    let msg = String::from_utf8_lossy(msg);
    let mut t = match ChatTemplate::new(&src, "<s>", "</s>") {
        Ok(t) => t,
        Err(e) => return Outcome::Rejected(e.to_string()),
    };
    t.set_limits(FUEL, MAX_OUTPUT);
    let msgs = [
        ChatMessage::new("system", "Be brief."),
        ChatMessage::new("user", msg.as_ref()),
    ];
    outcome(t.render(&msgs, true))
}
