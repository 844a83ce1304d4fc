//! Grammar masks over the real SmolLM2 tokenizer: greedy walks that always take the allowed
//! token with the lowest id (or a fixed preference) produce text the grammar describes.

use serde_json::{Value, json};

use super::{Constraint, GrammarSpec, Grammars, allows};
use crate::tokenizer::Tokenizer;

fn tok() -> Tokenizer {
    let g = crate::formats::gguf::Gguf::open(&crate::testing::real_model()).unwrap();
    Tokenizer::from_gguf(&g).unwrap()
}

/// Walks the grammar, at each step taking the first allowed token of `prefer` (token texts),
/// else the allowed token whose text is longest (lowest id on ties); stops at end of sequence.
fn walk(tok: &Tokenizer, c: &mut Constraint, prefer: &[&str], max: usize) -> (String, bool) {
    let mut ids = Vec::new();
    let stops = tok.stop_ids().to_vec();
    for _ in 0..max {
        let mask = c.mask().unwrap();
        let allowed: Vec<u32> = (0..tok.vocab_size() as u32)
            .filter(|&t| allows(&mask, t))
            .collect();
        assert!(!allowed.is_empty(), "an empty mask after {ids:?}");
        if allowed.iter().all(|t| stops.contains(t)) {
            return (tok.decode(&ids).unwrap(), true);
        }
        let pick = prefer
            .iter()
            .filter_map(|p| tok.encode_plain(p).ok())
            .filter(|e| e.len() == 1)
            .map(|e| e[0])
            .find(|t| allowed.contains(t))
            .unwrap_or_else(|| {
                *allowed
                    .iter()
                    .filter(|t| !stops.contains(t))
                    .max_by_key(|&&t| (tok.token_bytes(t).map_or(0, |b| b.len()), u32::MAX - t))
                    .unwrap()
            });
        c.commit(pick).unwrap();
        ids.push(pick);
    }
    (tok.decode(&ids).unwrap(), false)
}

#[test]
fn a_schema_walk_gives_json_of_that_shape() {
    let t = tok();
    let g = Grammars::new(&t);
    let schema = json!({"type": "object", "properties": {
        "color": {"enum": ["red", "green"]},
        "n": {"type": "integer", "minimum": 0, "maximum": 9},
        "ok": {"type": "boolean"}},
        "required": ["color", "n", "ok"], "additionalProperties": false});
    let mut c = g.compile(&GrammarSpec::JsonSchema(schema)).unwrap().start();
    let (text, done) = walk(&t, &mut c, &["\"", "green", "7", "true", "}"], 60);
    assert!(done, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert!(v["color"] == "red" || v["color"] == "green", "{v}");
    assert!(v["n"].as_i64().is_some_and(|n| (0..=9).contains(&n)), "{v}");
    assert!(v["ok"].is_boolean(), "{v}");
    assert!(c.is_done() || done);
}

#[test]
fn json_object_forbids_anything_but_an_object_start() {
    let t = tok();
    let g = Grammars::new(&t);
    let mut c = g.compile(&GrammarSpec::JsonObject).unwrap().start();
    let mask = c.mask().unwrap();
    let brace = t.encode_plain("{").unwrap()[0];
    let word = t.encode_plain("Hello").unwrap()[0];
    assert!(allows(&mask, brace));
    assert!(!allows(&mask, word));
    for &s in t.stop_ids() {
        assert!(!allows(&mask, s), "EOS before the object");
    }
}

#[test]
fn end_of_sequence_only_once_complete() {
    let t = tok();
    let g = Grammars::new(&t);
    let schema = json!({"type": "object", "properties": {"a": {"const": 1}},
        "required": ["a"], "additionalProperties": false});
    let mut c = g.compile(&GrammarSpec::JsonSchema(schema)).unwrap().start();
    let (text, done) = walk(&t, &mut c, &[], 30);
    assert!(done, "{text}");
    assert_eq!(text, "{\"a\": 1}");
    let mask = c.mask().unwrap();
    let eos = t.eos_id().unwrap();
    assert!(allows(&mask, eos));
    assert_eq!(mask.iter().map(|w| w.count_ones()).sum::<u32>() as usize, {
        let s = t.stop_ids();
        s.len()
    });
}

#[test]
fn drafted_masks_match_plain_walks_and_leave_the_state_alone() {
    let t = tok();
    let g = Grammars::new(&t);
    let grammar = g.compile(&GrammarSpec::JsonObject).unwrap();
    let drafts = t.encode_plain("{\"k\": 12, zzz").unwrap();
    let mut c = grammar.start();
    let masks = c.masks_along(&drafts).unwrap();
    assert_eq!(masks.len(), drafts.len() + 1);
    // Plain: commit one draft at a time, the mask before each equals the drafted one.
    let mut plain = grammar.start();
    for (j, &d) in drafts.iter().enumerate() {
        let m = plain.mask().unwrap();
        assert_eq!(m, masks[j], "row {j}");
        if !allows(&m, d) {
            break;
        }
        plain.commit(d).unwrap();
    }
    // The drafted walk rolled back: the first mask is the start's.
    assert_eq!(c.mask().unwrap(), masks[0]);
}

#[test]
fn a_bad_schema_is_an_input_error_naming_the_problem() {
    let t = tok();
    let g = Grammars::new(&t);
    let e = g
        .compile(&GrammarSpec::JsonSchema(json!({"type": "no-such-type"})))
        .unwrap_err();
    let m = e.to_string();
    assert!(m.contains("grammar does not compile"), "{m}");
    let e = g
        .compile(&GrammarSpec::Lark("start: undefined_rule".into()))
        .unwrap_err();
    assert!(e.to_string().contains("undefined_rule"), "{e}");
}

#[test]
fn compiled_grammars_are_cached() {
    let t = tok();
    let g = Grammars::new(&t);
    let s = GrammarSpec::JsonSchema(json!({"type": "string"}));
    let a = g.compile(&s).unwrap();
    let b = g.compile(&s).unwrap();
    assert!(std::sync::Arc::ptr_eq(&a, &b));
    assert_eq!(g.cached(), 1);
}
