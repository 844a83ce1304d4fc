use super::*;

fn chat(body: &str) -> Result<Parsed, ApiError> {
    parse(Kind::Chat, body.as_bytes(), 1000)
}

fn cmpl(body: &str) -> Result<Parsed, ApiError> {
    parse(Kind::Completion, body.as_bytes(), 1000)
}

fn param_of(r: Result<Parsed, ApiError>) -> String {
    let e = r.expect_err("expected an error");
    assert_eq!(e.status.as_u16(), 400, "{e:?}");
    e.param.unwrap_or_default()
}

#[test]
fn full_chat_request_parses() {
    let p = chat(
        r#"{"model":"m","messages":[{"role":"system","content":"s"},
        {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}],
        "max_completion_tokens":5,"temperature":0.5,"top_p":0.9,"top_k":40,"min_p":0.1,"seed":-1,
        "stop":"x","stream":true,"stream_options":{"include_usage":true},"presence_penalty":0.1,
        "frequency_penalty":-0.1,"repetition_penalty":1.1,"logprobs":true,"top_logprobs":3,
        "user":"u","cache_salt":"salt","n":3,"unknown_field":{"x":1}}"#,
    )
    .unwrap();
    assert_eq!(
        p.prompt,
        PromptInput::Chat(vec![
            ChatMessage::new("system", "s"),
            ChatMessage::new("user", "ab")
        ])
    );
    assert_eq!(p.max_tokens, Some(5));
    assert_eq!(p.params.top_k, 40);
    assert_eq!(p.params.seed, u64::MAX);
    assert_eq!(p.params.temperature, 0.5);
    assert_eq!(p.stop, vec!["x".to_string()]);
    assert!(p.stream && p.include_usage);
    assert_eq!(p.logprobs, Some(3));
    assert_eq!(p.cache_salt.as_deref(), Some("salt"));
    assert_eq!(p.n, 3);
}

#[test]
fn completion_prompts() {
    let p = cmpl(r#"{"model":"m","prompt":"hi","logprobs":2}"#).unwrap();
    assert_eq!(p.prompt, PromptInput::Text("hi".into()));
    assert_eq!(p.logprobs, Some(2));
    let p = cmpl(r#"{"model":"m","prompt":[1,2,3]}"#).unwrap();
    assert_eq!(p.prompt, PromptInput::Ids(vec![1, 2, 3]));
    let p = cmpl(r#"{"model":"m","prompt":[[4,5]]}"#).unwrap();
    assert_eq!(p.prompt, PromptInput::Ids(vec![4, 5]));
    let p = cmpl(r#"{"model":"m","prompt":["one"]}"#).unwrap();
    assert_eq!(p.prompt, PromptInput::Text("one".into()));
    assert_eq!(
        param_of(cmpl(r#"{"model":"m","prompt":["a","b"]}"#)),
        "prompt"
    );
    assert_eq!(param_of(cmpl(r#"{"model":"m","prompt":[1,-2]}"#)), "prompt");
    assert_eq!(param_of(cmpl(r#"{"model":"m","prompt":""}"#)), "prompt");
    assert_eq!(param_of(cmpl(r#"{"model":"m","prompt":[]}"#)), "prompt");
    assert_eq!(param_of(cmpl(r#"{"model":"m"}"#)), "prompt");
}

#[test]
fn bad_requests_name_their_parameter() {
    let m = r#""model":"m","messages":[{"role":"user","content":"x"}]"#;
    let cases = [
        (format!("{{{m},\"n\":0}}"), "n"),
        (format!("{{{m},\"n\":17}}"), "n"),
        (format!("{{{m},\"n\":1.5}}"), "n"),
        (format!("{{{m},\"temperature\":3}}"), "temperature"),
        (format!("{{{m},\"temperature\":\"hot\"}}"), "temperature"),
        (format!("{{{m},\"top_p\":0}}"), "top_p"),
        (format!("{{{m},\"min_p\":2}}"), "min_p"),
        (format!("{{{m},\"top_k\":-5}}"), "top_k"),
        (format!("{{{m},\"max_tokens\":-1}}"), "max_tokens"),
        (format!("{{{m},\"max_tokens\":0}}"), "max_tokens"),
        (format!("{{{m},\"max_tokens\":1000000}}"), "max_tokens"),
        (
            format!("{{{m},\"max_completion_tokens\":1.5}}"),
            "max_completion_tokens",
        ),
        (
            format!("{{{m},\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\",\"f\",\"g\",\"h\",\"i\"]}}"),
            "stop",
        ),
        (format!("{{{m},\"stop\":[1]}}"), "stop"),
        (format!("{{{m},\"stop\":\"\"}}"), "stop"),
        (
            format!("{{{m},\"presence_penalty\":5}}"),
            "presence_penalty",
        ),
        (
            format!("{{{m},\"repetition_penalty\":0}}"),
            "repetition_penalty",
        ),
        (format!("{{{m},\"top_logprobs\":2}}"), "top_logprobs"),
        (
            format!("{{{m},\"logprobs\":true,\"top_logprobs\":21}}"),
            "top_logprobs",
        ),
        (format!("{{{m},\"stream\":\"yes\"}}"), "stream"),
        (format!("{{{m},\"seed\":\"x\"}}"), "seed"),
        (format!("{{{m},\"user\":\"{}\"}}", "u".repeat(300)), "user"),
        (
            r#"{"messages":[{"role":"user","content":"x"}]}"#.to_string(),
            "model",
        ),
        (r#"{"model":"m","messages":[]}"#.to_string(), "messages"),
        (r#"{"model":"m"}"#.to_string(), "messages"),
        (
            r#"{"model":"m","messages":[{"role":"function","content":"x"}]}"#.to_string(),
            "messages[0].role",
        ),
        (
            r#"{"model":"m","messages":[{"role":"tool","content":"x"}]}"#.to_string(),
            "messages[0].tool_call_id",
        ),
        (
            r#"{"model":"m","messages":[{"role":"user"}]}"#.to_string(),
            "messages[0].content",
        ),
        (
            r#"{"model":"m","messages":[{"role":"user","content":[{"type":"image_url"}]}]}"#
                .to_string(),
            "messages[0].content[0]",
        ),
    ];
    for (body, param) in cases {
        assert_eq!(param_of(chat(&body)), param, "{body}");
    }
}

#[test]
fn malformed_bodies_are_400_without_echo() {
    for body in [&b"not json"[..], b"[1,2]", b"{\"model\":", b"\xff\xfe"] {
        let e = parse(Kind::Chat, body, 10).unwrap_err();
        assert_eq!(e.status.as_u16(), 400);
        assert!(e.param.is_none());
    }
    let secret = "SECRET".repeat(1000);
    let e = chat(&format!("{{\"model\":\"m\",\"messages\":{secret}}}")).unwrap_err();
    assert!(!e.message.contains("SECRET"), "{}", e.message);
}

fn to(ctx: usize, cap: usize) -> Target<'static> {
    Target {
        tenant: "t",
        tenant_max_in_flight: 7,
        vocab: 100,
        ctx,
        max_tokens_cap: cap,
    }
}

#[test]
fn finish_checks_context_and_vocab() {
    let p = cmpl(r#"{"model":"m","prompt":"x","max_tokens":10}"#).unwrap();
    let r = finish(p.clone(), vec![1, 2, 3], None, &to(20, 1000)).unwrap();
    assert_eq!(r.max_tokens, 10);
    assert_eq!(r.tenant, "t");
    assert_eq!(r.tenant_max_in_flight, Some(7));
    let e = finish(p.clone(), vec![1; 15], None, &to(20, 1000)).unwrap_err();
    assert_eq!(e.code, Some("context_length_exceeded"));
    assert_eq!(e.param.as_deref(), Some("prompt"));
    let c = chat(r#"{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":10}"#);
    let e = finish(c.unwrap(), vec![1; 15], None, &to(20, 1000)).unwrap_err();
    assert_eq!(e.code, Some("context_length_exceeded"));
    assert_eq!(e.param.as_deref(), Some("messages"));
    let e = finish(p.clone(), vec![1, 200], None, &to(20, 1000)).unwrap_err();
    assert_eq!(e.param.as_deref(), Some("prompt"));
    let mut q = p;
    q.max_tokens = None;
    assert_eq!(
        finish(q.clone(), vec![1; 5], None, &to(20, 1000))
            .unwrap()
            .max_tokens,
        15
    );
    assert_eq!(
        finish(q.clone(), vec![1; 5], None, &to(20, 4))
            .unwrap()
            .max_tokens,
        4
    );
    let e = finish(q, vec![1; 20], None, &to(20, 1000)).unwrap_err();
    assert_eq!(e.code, Some("context_length_exceeded"));
}

#[test]
fn image_and_video_parts_leave_markers_in_order() {
    let p = chat(
        r#"{"model":"m","messages":[{"role":"user","content":[
        {"type":"text","text":"a "},
        {"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA","detail":"low"}},
        {"type":"text","text":" b"},
        {"type":"video","video":["data:image/jpeg;base64,BB","data:image/jpeg;base64,CC"],"fps":2}]},
        {"role":"user","content":[{"type":"image_url","image_url":"data:image/webp;base64,DD"}]}]}"#,
    )
    .unwrap();
    let PromptInput::Chat(m) = &p.prompt else {
        panic!("not a chat prompt")
    };
    assert_eq!(m[0].content, format!("a {MARKER} b{MARKER}"));
    assert_eq!(m[1].content, MARKER);
    assert_eq!(p.media.len(), 3);
    assert_eq!(
        p.media[0],
        MediaRef::Image {
            url: "data:image/png;base64,AAAA".into(),
            param: "messages[0].content[1].image_url.url".into()
        }
    );
    assert!(
        matches!(&p.media[1], MediaRef::Video { frames, fps: Some(f), .. } if frames.len() == 2 && *f == 2.0)
    );
    assert!(matches!(&p.media[2], MediaRef::Image { url, .. } if url.ends_with("DD")));
}

#[test]
fn bad_media_parts_name_the_part() {
    let one = |part: &str| {
        param_of(chat(&format!(
            r#"{{"model":"m","messages":[{{"role":"user","content":[{{"type":"text","text":"x"}},{part}]}}]}}"#
        )))
    };
    assert_eq!(one(r#"{"type":"image_url"}"#), "messages[0].content[1]");
    assert_eq!(
        one(r#"{"type":"image_url","image_url":{"url":7}}"#),
        "messages[0].content[1]"
    );
    assert_eq!(
        one(r#"{"type":"video","video":[]}"#),
        "messages[0].content[1]"
    );
    assert_eq!(
        one(r#"{"type":"video","video":"x"}"#),
        "messages[0].content[1]"
    );
    assert_eq!(
        one(r#"{"type":"video","video":["a"],"fps":-1}"#),
        "messages[0].content[1]"
    );
    assert_eq!(
        one(r#"{"type":"video_url","video_url":{"url":"x"}}"#),
        "messages[0].content[1]"
    );
    assert_eq!(one(r#"{"type":"input_audio"}"#), "messages[0].content[1]");
    assert_eq!(one(r#"{"type":"text"}"#), "messages[0].content[1]");
    // U+FFFC stands for media: refused in the text of a request that has media, kept otherwise.
    let with = "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"\u{FFFC}\"},{\"type\":\"image_url\",\"image_url\":{\"url\":\"data:image/png;base64,AA\"}}]}]}";
    assert_eq!(param_of(chat(with)), "messages");
    let without = "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"\u{FFFC}\"}]}";
    assert!(chat(without).unwrap().media.is_empty());
}
