//! Chat template tests: real SmolLM2, Llama 3 and Qwen-style ChatML templates (insta snapshots),
//! and the sandbox: raise_exception, fuel/output/replace/recursion limits, includes.

use std::path::PathBuf;

use memra_engine::chat::{ChatMessage, ChatTemplate, format_unix_time};
use memra_engine::error::Error;
use memra_engine::formats::gguf::Gguf;
use memra_engine::tokenizer::Tokenizer;

/// SmolLM2-135M-Instruct's template, as stored in its GGUF `tokenizer.chat_template`.
const SMOLLM2: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// Llama 3 Instruct style.
const LLAMA3: &str = "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";

/// Qwen2.5/Qwen3 style ChatML: default system prompt, whitespace control, Python string methods
/// (split/lstrip/rstrip/startswith), namespace and reverse iteration, tools branch (undefined).
const QWEN: &str = r#"{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {{- tools | tojson }}
    {{- '<|im_end|>\n' }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'].strip() + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if message.role == "user" and not message.content.startswith('<tool_response>') %}
        {%- set ns.last_query_index = index %}
        {%- break %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.role == "system" and loop.first %}
    {%- elif message.role == "assistant" %}
        {%- set content = message.content %}
        {%- if '</think>' in content %}
            {%- set content = content.split('</think>')[-1].lstrip('\n') %}
        {%- endif %}
        {{- '<|im_start|>assistant\n' + content.rstrip() + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
    {%- endif %}
    {%- if message.tool_calls %}{{ raise_exception('no tool calls here') }}{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}"#;

fn msgs(pairs: &[(&str, &str)]) -> Vec<ChatMessage> {
    pairs
        .iter()
        .map(|(r, c)| ChatMessage::new(*r, *c))
        .collect()
}

fn conversation() -> Vec<ChatMessage> {
    msgs(&[
        ("system", "  You are terse.  "),
        ("user", "What is 2+2?"),
        ("assistant", "<think>\nadd them\n</think>\n\n4  "),
        ("user", "And 3+3?"),
    ])
}

#[test]
fn smollm2_template() {
    let t = ChatTemplate::new(SMOLLM2, "<|im_start|>", "<|im_end|>").unwrap();
    assert_eq!(t.source(), SMOLLM2);
    let with_system = t.render(&conversation(), true).unwrap();
    insta::assert_snapshot!("smollm2_system_generation_prompt", with_system);
    let no_prompt = t.render(&conversation(), false).unwrap();
    assert_eq!(format!("{no_prompt}<|im_start|>assistant\n"), with_system);
    // Without a system message the template inserts its default system prompt.
    let default_system = t.render(&msgs(&[("user", "Hi!")]), true).unwrap();
    insta::assert_snapshot!("smollm2_default_system", default_system);
}

#[test]
fn llama3_template() {
    let t = ChatTemplate::new(LLAMA3, "<|begin_of_text|>", "<|eot_id|>").unwrap();
    let out = t.render(&conversation(), true).unwrap();
    // insta trims trailing newlines; the generation prompt ends with two.
    assert!(out.ends_with("<|start_header_id|>assistant<|end_header_id|>\n\n"));
    insta::assert_snapshot!("llama3", out);
}

#[test]
fn qwen_chatml_template() {
    let t = ChatTemplate::new(QWEN, "", "<|im_end|>").unwrap();
    insta::assert_snapshot!("qwen_system", t.render(&conversation(), true).unwrap());
    insta::assert_snapshot!(
        "qwen_default_system",
        t.render(&msgs(&[("user", "Hi"), ("assistant", "Hello!")]), false)
            .unwrap()
    );
}

fn template_err(r: memra_engine::Result<impl std::fmt::Debug>) -> String {
    match r {
        Err(Error::Template(msg)) => msg,
        other => panic!("expected Error::Template, got {other:?}"),
    }
}

#[test]
fn raise_exception_is_a_template_error() {
    let src = "{% if messages[0].role != 'user' %}{{ raise_exception('Conversation roles must alternate user/assistant') }}{% endif %}ok";
    let t = ChatTemplate::new(src, "", "").unwrap();
    assert_eq!(t.render(&msgs(&[("user", "x")]), false).unwrap(), "ok");
    let msg = template_err(t.render(&msgs(&[("assistant", "x")]), false));
    assert!(
        msg.contains("Conversation roles must alternate user/assistant"),
        "{msg}"
    );
}

#[test]
fn compile_errors_are_template_errors() {
    let msg = template_err(ChatTemplate::new("{% for %}", "", ""));
    assert!(msg.contains("syntax error"), "{msg}");
    template_err(ChatTemplate::new("{{ unclosed", "", ""));
}

#[test]
fn endless_loop_runs_out_of_fuel() {
    let src = "{% for i in range(100000) %}{% for j in range(100000) %}{% set x = i * j %}{% endfor %}{% endfor %}";
    // A time limit far past the fuel's reach: fuel must stop it, however loaded the machine.
    let t = ChatTemplate::new(src, "", "")
        .unwrap()
        .with_time_limit(std::time::Duration::from_secs(3600));
    let msg = template_err(t.render(&[], false));
    assert!(msg.contains("fuel"), "{msg}");
}

#[test]
fn huge_output_hits_the_limit() {
    let src = "{% for i in range(100000) %}{{ 'x' * 100000 }}{% endfor %}";
    let t = ChatTemplate::new(src, "", "").unwrap();
    let msg = template_err(t.render(&[], false));
    assert!(msg.contains("output limit"), "{msg}");
    // The limit grows with the input: a long message renders.
    let long = "y".repeat(3 << 20);
    let t = ChatTemplate::new(SMOLLM2, "", "").unwrap();
    let out = t.render(&msgs(&[("user", &long)]), true).unwrap();
    assert!(out.contains(&long));
    // A lower explicit limit applies.
    let mut t = ChatTemplate::new("{{ 'z' * 2000 }}", "", "").unwrap();
    assert_eq!(t.render(&[], false).unwrap().len(), 2000);
    t.set_limits(1_000_000, 1000);
    assert!(template_err(t.render(&[], false)).contains("output limit"));
}

#[test]
fn replace_amplification_is_refused() {
    for src in [
        "{% set s = 'x' * 5000 %}{% set s = s|replace('x', s) %}{% set s = s|replace('x', s) %}{{ s|length }}",
        "{% set s = 'x' * 5000 %}{% set s = s.replace('x', s) %}{% set s = s.replace('x', s) %}{{ s|length }}",
    ] {
        let t = ChatTemplate::new(src, "", "").unwrap();
        let msg = template_err(t.render(&[], false));
        assert!(msg.contains("replace would build"), "{msg}");
    }
    let t = ChatTemplate::new(
        "{{ 'a-b-c'|replace('-', '+') }} {{ 'a-b-c'.replace('-', '', 1) }}",
        "",
        "",
    )
    .unwrap();
    assert_eq!(t.render(&[], false).unwrap(), "a+b+c ab-c");
}

#[test]
fn width_filters_are_bounded_before_they_allocate() {
    // Security review finding 3: each of these aborted the process (allocation failure).
    for (src, want) in [
        ("{{ 'x'|indent(1000000000000) }}", "indent would build"),
        (
            "{{ 'a\nb'|indent(width=1000000000000) }}",
            "indent would build",
        ),
        ("{{ '%01000000000000d'|format(1) }}", "format width"),
        ("{{ '%.1000000000000f'|format(1.5) }}", "format width"),
        ("{{ '{:>1000000000000}'.format('x') }}", "format width"),
    ] {
        let t = ChatTemplate::new(src, "", "").unwrap();
        let msg = template_err(t.render(&[], false));
        assert!(msg.contains(want), "{src}: {msg}");
    }
    // Ordinary uses keep Jinja's behaviour.
    let t = ChatTemplate::new(
        "{{ 'a\nb\n\nc\n'|indent(2) }}|{{ 'a\nb'|indent(width=1, first=true) }}|{{ 'a\n\nb'|indent(2, blank=true) }}|{{ '%05d'|format(42) }}|{{ '{}-{}'.format(1, 2) }}",
        "",
        "",
    )
    .unwrap();
    assert_eq!(
        t.render(&[], false).unwrap(),
        "a\n  b\n\n  c| a\n b|a\n  \n  b|00042|1-2"
    );
}

#[test]
fn deep_recursion_is_an_error() {
    let src = "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}";
    let t = ChatTemplate::new(src, "", "").unwrap();
    template_err(t.render(&[], false));
}

#[test]
fn includes_and_imports_find_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("secret.txt");
    std::fs::write(&secret, "TOP SECRET").unwrap();
    let path = secret.display().to_string();
    for src in [
        format!("{{% include '{path}' %}}"),
        "{% include 'secret.txt' %}".to_string(),
        format!("{{% import '{path}' as s %}}"),
        format!("{{% extends '{path}' %}}"),
        format!("{{% from '{path}' import x %}}"),
    ] {
        // Compiles (Jinja allows these statements) but cannot load anything.
        let t = ChatTemplate::new(&src, "", "").unwrap();
        let msg = template_err(t.render(&[], false));
        assert!(!msg.contains("TOP SECRET"), "{msg}");
        assert!(
            msg.contains("not found") || msg.contains("template"),
            "{msg}"
        );
    }
}

#[test]
fn tojson_writes_like_python() {
    let t = ChatTemplate::new(
        "{{ messages|tojson }}|{{ {'a': [1, 2]}|tojson(indent=2) }}",
        "",
        "",
    )
    .unwrap();
    let out = t.render(&msgs(&[("user", "héllo <b>&'")]), false).unwrap();
    assert_eq!(
        out,
        "[{\"role\": \"user\", \"content\": \"héllo <b>&'\"}]|{\n  \"a\": [\n    1,\n    2\n  ]\n}"
    );
}

#[test]
fn generation_markers_render_nothing() {
    let src = "{% for m in messages %}{% if m.role == 'assistant' %}{%- generation -%}[{{ m.content }}]{%- endgeneration %}{% else %}{{ m.content }}{% endif %}{% endfor %}";
    let t = ChatTemplate::new(src, "", "").unwrap();
    assert_eq!(t.source(), src);
    assert_eq!(
        t.render(&msgs(&[("user", "q"), ("assistant", "a")]), false)
            .unwrap(),
        "q[a]"
    );
}

#[test]
fn undefined_is_lenient() {
    let t = ChatTemplate::new(
        "[{{ foo.bar.baz }}]{% if messages[0].tool_calls %}T{% endif %}{{ tools|default('none') }}",
        "",
        "",
    )
    .unwrap();
    assert_eq!(t.render(&msgs(&[("user", "x")]), false).unwrap(), "[]none");
}

#[test]
fn strftime_now_formats_utc() {
    assert_eq!(
        format_unix_time(0, "%Y-%m-%d %H:%M:%S %a %A %b %B %j %y %%"),
        "1970-01-01 00:00:00 Thu Thursday Jan January 001 70 %"
    );
    // 2024-07-26 13:05:09 UTC, a Friday; day 208 of a leap year.
    let t = 1_721_952_000 + 13 * 3600 + 5 * 60 + 9;
    assert_eq!(format_unix_time(t, "%d %b %Y"), "26 Jul 2024");
    assert_eq!(
        format_unix_time(t, "%-d/%-m %I:%M %p %A %j"),
        "26/7 01:05 PM Friday 208"
    );
    assert_eq!(format_unix_time(951_782_400, "%Y-%m-%d"), "2000-02-29");
    let tmpl = ChatTemplate::new("{{ strftime_now('%Y') }}", "", "").unwrap();
    let year: i32 = tmpl.render(&[], false).unwrap().parse().unwrap();
    assert!(year >= 2024, "{year}");
}

#[test]
fn from_hf_dir_sources() {
    let tok = spm_like_tokenizer();
    let dir = tempfile::tempdir().unwrap();
    assert!(
        ChatTemplate::from_hf_dir(dir.path(), &tok)
            .unwrap()
            .is_none()
    );
    let cfg = dir.path().join("tokenizer_config.json");
    std::fs::write(
        &cfg,
        r#"{"chat_template": "A{{ bos_token }}{{ eos_token }}"}"#,
    )
    .unwrap();
    let t = ChatTemplate::from_hf_dir(dir.path(), &tok)
        .unwrap()
        .unwrap();
    assert_eq!(t.render(&[], false).unwrap(), "A<s></s>");
    std::fs::write(
        &cfg,
        r#"{"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]}"#,
    )
    .unwrap();
    let t = ChatTemplate::from_hf_dir(dir.path(), &tok)
        .unwrap()
        .unwrap();
    assert_eq!(t.render(&[], false).unwrap(), "D");
    std::fs::write(
        &cfg,
        r#"{"chat_template": [{"name": "tool_use", "template": "T"}]}"#,
    )
    .unwrap();
    assert!(template_err(ChatTemplate::from_hf_dir(dir.path(), &tok)).contains("tool_use"));
    // chat_template.jinja wins over tokenizer_config.json.
    std::fs::write(
        dir.path().join("chat_template.jinja"),
        "J{{ messages|length }}",
    )
    .unwrap();
    let t = ChatTemplate::from_hf_dir(dir.path(), &tok)
        .unwrap()
        .unwrap();
    assert_eq!(t.render(&msgs(&[("user", "a")]), false).unwrap(), "J1");
}

/// A minimal tokenizer with <s> and </s>, built from GGUF-style metadata.
fn spm_like_tokenizer() -> Tokenizer {
    use memra_engine::formats::gguf::MetaValue;
    let s = |v: &str| MetaValue::Str(v.into());
    let m: Vec<(String, MetaValue)> = vec![
        ("tokenizer.ggml.model".into(), s("llama")),
        (
            "tokenizer.ggml.tokens".into(),
            MetaValue::Array(vec![s("<unk>"), s("<s>"), s("</s>"), s("▁"), s("a")]),
        ),
        (
            "tokenizer.ggml.scores".into(),
            MetaValue::Array(vec![MetaValue::F32(0.0); 5]),
        ),
        (
            "tokenizer.ggml.token_type".into(),
            MetaValue::Array([2, 3, 3, 1, 1].map(MetaValue::I32).to_vec()),
        ),
        ("tokenizer.ggml.bos_token_id".into(), MetaValue::U32(1)),
        ("tokenizer.ggml.eos_token_id".into(), MetaValue::U32(2)),
    ];
    Tokenizer::from_gguf_metadata(|k| m.iter().find(|(key, _)| key == k).map(|(_, v)| v)).unwrap()
}

fn model_path() -> PathBuf {
    memra_engine::testing::real_model()
}

#[test]
fn real_model_template_from_gguf() {
    let g = Gguf::open(&model_path()).expect("open test model");
    let tok = Tokenizer::from_gguf(&g).unwrap();
    let t = ChatTemplate::from_gguf(&g, &tok)
        .unwrap()
        .expect("model has a chat template");
    assert_eq!(t.source(), SMOLLM2);
    let out = t.render(&msgs(&[("user", "Hi!")]), true).unwrap();
    // The rendered prompt tokenizes with the chat special tokens as single ids.
    let ids = tok.encode(&out, false).unwrap();
    assert_eq!(ids[0], 1);
    assert_eq!(ids.iter().filter(|&&id| id == 2).count(), 2);
    assert_eq!(tok.decode(&ids).unwrap(), out);
}

#[test]
fn tools_reach_the_template_only_when_given() {
    let t = ChatTemplate::new(
        "{% if tools is defined %}{% for t in tools %}{{ t.function.name }};{% endfor %}{% else %}-{% endif %}{% for m in messages %}{{ m.role }}:{{ m.content }}{% if m.tool_calls %}{{ m.tool_calls[0].function.arguments.city }}{% endif %}{{ m.tool_call_id }}|{% endfor %}",
        "",
        "",
    )
    .unwrap();
    let mut call = ChatMessage::new("assistant", "");
    call.tool_calls = Some(serde_json::json!([{"id": "c1", "type": "function",
        "function": {"name": "w", "arguments": {"city": "Oslo"}}}]));
    let mut answer = ChatMessage::new("tool", "sunny");
    answer.tool_call_id = Some("c1".into());
    let msgs = vec![ChatMessage::new("user", "q"), call, answer];
    let tools = serde_json::json!([{"type": "function", "function": {"name": "w"}}]);
    assert_eq!(
        t.render_with_tools(&msgs, Some(&tools), false).unwrap(),
        "w;user:q|assistant:Oslo|tool:sunnyc1|"
    );
    assert_eq!(t.render(&msgs[..1], false).unwrap(), "-user:q|");
}
