//! Replays the committed seed corpus of the request-JSON fuzz target (fuzz/corpus/request_json)
//! through the entry function the fuzzer calls: `ok-*` bodies are accepted by the chat or the
//! completions parser, `bad-*` refused by both with a 4xx, anything else must not crash.

use std::path::PathBuf;

use memra_server::fuzz::request_json;

#[test]
fn request_json_corpus() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/request_json");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .flatten()
        .map(|e| e.path())
        .collect();
    files.sort();
    let (mut ok, mut bad) = (0, 0);
    for f in &files {
        let name = f
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("")
            .to_string();
        let accepted = request_json(&std::fs::read(f).expect("read"));
        if name.starts_with("ok-") {
            assert!(accepted, "{name} was refused");
            ok += 1;
        } else if name.starts_with("bad-") {
            assert!(!accepted, "{name} was accepted");
            bad += 1;
        }
    }
    assert!(ok >= 3 && bad >= 8, "{ok} ok, {bad} bad seeds");
}
