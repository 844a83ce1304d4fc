//! Replays the committed seed corpus of the request-JSON fuzz target (fuzz/corpus/request_json)
//! through the entry function the fuzzer calls: `ok-*` bodies are accepted by the chat or the
//! completions parser, `bad-*` refused by both with a 4xx, anything else must not crash.

use memra_server::fuzz::request_json;

#[test]
fn request_json_corpus() {
    let (mut ok, mut bad) = (0, 0);
    for (name, data) in memra_engine::testing::fuzz::corpus("request_json") {
        let accepted = request_json(&data);
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
