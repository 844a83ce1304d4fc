//! Random JSON shapes through the request parser (chat and completions): it never panics, and
//! every refusal is a 4xx with a message (`memra_server::fuzz::request_json` asserts both).
//! Keys are drawn mostly from the real request fields so the shapes reach deep into validation.

use proptest::prelude::*;
use serde_json::{Map, Number, Value};

use memra_server::fuzz::request_json;

const KEYS: &[&str] = &[
    "model",
    "messages",
    "prompt",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "stream",
    "stream_options",
    "include_usage",
    "logprobs",
    "top_logprobs",
    "n",
    "user",
    "cache_salt",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "speculative",
    "role",
    "content",
    "type",
    "text",
    "x",
];

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|i| Value::Number(i.into())),
        any::<u64>().prop_map(|u| Value::Number(u.into())),
        (-1e40f64..1e40).prop_map(|f| Number::from_f64(f).map_or(Value::Null, Value::Number)),
        (0u8..4).prop_map(|i| Value::Number(i.into())),
        prop_oneof![
            Just("tiny".to_string()),
            Just("user".to_string()),
            Just("system".to_string()),
            Just("assistant".to_string()),
            Just("text".to_string()),
            Just(String::new()),
            ".{0,12}",
        ]
        .prop_map(Value::String),
    ]
}

fn value() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(5, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((prop::sample::select(KEYS), inner), 0..6).prop_map(|kv| {
                Value::Object(
                    kv.into_iter()
                        .map(|(k, v)| (k.to_string(), v))
                        .collect::<Map<_, _>>(),
                )
            }),
        ]
    })
}

/// A valid chat and completions body with up to four fields replaced or added at random.
fn request() -> impl Strategy<Value = Value> {
    prop::collection::vec((prop::sample::select(KEYS), value()), 0..4).prop_map(|kv| {
        let mut o = Map::new();
        o.insert("model".into(), Value::String("tiny".into()));
        o.insert(
            "messages".into(),
            serde_json::json!([{"role": "user", "content": "hi"}]),
        );
        o.insert("prompt".into(), Value::String("hi".into()));
        for (k, v) in kv {
            o.insert(k.to_string(), v);
        }
        Value::Object(o)
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn random_request_shapes_never_panic(v in request()) {
        request_json(v.to_string().as_bytes());
    }

    #[test]
    fn random_json_values_never_panic(v in value()) {
        request_json(v.to_string().as_bytes());
    }

    #[test]
    fn random_bytes_never_panic(b in prop::collection::vec(any::<u8>(), 0..256)) {
        prop_assert!(!request_json(&b));
    }
}

/// The strategy really reaches accepted requests, so the property covers the valid path too.
#[test]
fn some_random_shapes_are_accepted() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let s = request();
    let accepted = (0..3000)
        .filter(|_| {
            let v = s.new_tree(&mut runner).expect("tree").current();
            request_json(v.to_string().as_bytes())
        })
        .count();
    assert!(accepted > 0, "no random shape was accepted");
}
