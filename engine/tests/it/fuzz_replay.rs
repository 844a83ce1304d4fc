//! Replays the committed seed corpora of the engine's fuzz targets (fuzz/corpus/...) through the
//! same entry functions the fuzzers call (`memra_engine::testing::fuzz`): `ok-*` inputs must be
//! accepted, `bad-*` refused with an error, and anything else (a fuzzer finding) must not crash.

use std::time::{Duration, Instant};

use memra_engine::testing::fuzz::{self, Outcome};

/// Runs every input of `fuzz/corpus/<target>` through `entry`; returns how many it ran.
fn replay(target: &str, entry: fn(&[u8]) -> Outcome) -> usize {
    let files = fuzz::corpus(target);
    let (mut ok, mut bad) = (0, 0);
    for (name, data) in &files {
        let start = Instant::now();
        let out = entry(data);
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{target}/{name} took {:?}",
            start.elapsed()
        );
        if name.starts_with("ok-") {
            assert_eq!(out, Outcome::Accepted, "{target}/{name}");
            ok += 1;
        } else if name.starts_with("bad-") {
            assert!(
                matches!(out, Outcome::Rejected(_)),
                "{target}/{name}: {out:?}"
            );
            bad += 1;
        }
    }
    assert!(ok >= 1 && bad >= 1, "{target}: {ok} ok and {bad} bad seeds");
    files.len()
}

#[test]
fn gguf_reader_corpus() {
    assert!(replay("gguf_reader", fuzz::gguf) >= 8);
}

#[test]
fn safetensors_header_corpus() {
    assert!(replay("safetensors_header", fuzz::safetensors) >= 8);
}

#[test]
fn chat_template_corpus() {
    assert!(replay("chat_template", fuzz::chat_template) >= 10);
}
