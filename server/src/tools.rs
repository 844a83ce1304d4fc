//! Tool calls: how the model is told about the functions, the grammar that makes a required
//! or named call well-formed, and reading the calls back out of the generated text.
//!
//! Two formats. A chat template with Hermes/Qwen tool markup (`<tool_call>` in its source)
//! gets `tools` itself and its calls are `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`.
//! Any other model gets the functions in a system message and answers with one JSON object
//! `{"name": ..., "arguments": {...}}` (the generic format).

use memra_engine::chat::ChatMessage;
use memra_engine::grammar::{GrammarSpec, with_layout};
use serde_json::{Value, json};

use crate::validation::{ToolChoice, Tools};

/// How a model's template handles tools.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ToolStyle {
    /// The template writes calls as `<tool_call>` JSON blocks.
    pub hermes: bool,
    /// The template renders `tools` itself.
    pub takes_tools: bool,
}

/// A call read from the output.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCall {
    pub name: String,
    /// The arguments object as JSON text.
    pub arguments: String,
}

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

/// The schema of one call to any of `names`' functions.
fn call_schema(t: &Tools) -> Value {
    let one = |name: &str, params: &Value| {
        json!({"type": "object", "properties": {
            "name": {"const": name}, "arguments": params},
            "required": ["name", "arguments"], "additionalProperties": false})
    };
    let calls: Vec<Value> = t
        .tools
        .iter()
        .filter(|f| match &t.choice {
            ToolChoice::Named(n) => *n == f.name,
            _ => true,
        })
        .map(|f| one(&f.name, &f.parameters))
        .collect();
    if calls.len() == 1 {
        calls.into_iter().next().unwrap_or_default()
    } else {
        json!({"anyOf": calls})
    }
}

/// The grammar that forces a call (`required` or a named function); `None` for `auto`.
pub fn grammar(t: &Tools, style: ToolStyle) -> Option<GrammarSpec> {
    if !matches!(t.choice, ToolChoice::Required | ToolChoice::Named(_)) {
        return None;
    }
    let schema = with_layout(call_schema(t));
    if !style.hermes {
        return Some(GrammarSpec::JsonSchema(schema));
    }
    let many = t.parallel && !matches!(t.choice, ToolChoice::Named(_));
    let start = if many {
        "start: tc (\"\\n\" tc)*"
    } else {
        "start: tc"
    };
    Some(GrammarSpec::Lark(format!(
        "{start}\ntc: \"{OPEN}\\n\" call \"\\n{CLOSE}\"\ncall: %json {schema}\n"
    )))
}

/// The messages the template renders: with the generic format (or a template that does not
/// render `tools`), a system message describing the functions and the answer format comes
/// first (merged into the request's own system message when it has one).
pub fn messages_for(msgs: &[ChatMessage], t: &Tools, style: ToolStyle) -> Vec<ChatMessage> {
    if style.takes_tools {
        return msgs.to_vec();
    }
    let mut text = String::from("You can call these functions:\n");
    for f in t.raw.as_array().into_iter().flatten() {
        text.push_str(&f.get("function").unwrap_or(f).to_string());
        text.push('\n');
    }
    if style.hermes {
        text.push_str(&format!(
            "To call a function, reply with {OPEN}\n{{\"name\": <function name>, \"arguments\": <arguments object>}}\n{CLOSE}"
        ));
    } else {
        text.push_str(
            "To call a function, reply with only a JSON object: {\"name\": <function name>, \"arguments\": <arguments object>}",
        );
    }
    let mut out = msgs.to_vec();
    match out.first_mut() {
        Some(m) if m.role == "system" => {
            m.content = format!("{}\n\n{text}", m.content);
        }
        _ => out.insert(0, ChatMessage::new("system", text)),
    }
    out
}

/// A call object `{"name", "arguments"}` naming one of `t`'s functions.
fn call_of(v: &Value, t: &Tools) -> Option<ToolCall> {
    let name = v.get("name")?.as_str()?;
    if !t.tools.iter().any(|f| f.name == name) {
        return None;
    }
    let args = match v.get("arguments").or_else(|| v.get("parameters")) {
        Some(Value::String(s)) => serde_json::from_str::<Value>(s).ok()?,
        Some(a @ Value::Object(_)) => a.clone(),
        None => json!({}),
        Some(_) => return None,
    };
    Some(ToolCall {
        name: name.to_string(),
        arguments: args.to_string(),
    })
}

/// The calls in `text` and the text before them (`None` when empty); `None` when the text
/// holds no well-formed call.
pub fn parse(text: &str, t: &Tools, style: ToolStyle) -> Option<(Option<String>, Vec<ToolCall>)> {
    let mut calls = Vec::new();
    let content;
    if style.hermes {
        let first = text.find(OPEN)?;
        content = text[..first].trim();
        let mut rest = &text[first..];
        while let Some(at) = rest.find(OPEN) {
            let body = &rest[at + OPEN.len()..];
            let end = body.find(CLOSE).unwrap_or(body.len());
            calls.push(call_of(&serde_json::from_str(body[..end].trim()).ok()?, t)?);
            rest = &body[end..];
        }
    } else {
        content = "";
        match serde_json::from_str::<Value>(text.trim()).ok()? {
            Value::Array(a) => {
                for v in &a {
                    calls.push(call_of(v, t)?);
                }
            }
            v => calls.push(call_of(&v, t)?),
        }
    }
    if calls.is_empty() {
        return None;
    }
    if !t.parallel {
        calls.truncate(1);
    }
    Some(((!content.is_empty()).then(|| content.to_string()), calls))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validation::Tool;

    fn tools(choice: ToolChoice) -> Tools {
        let raw = json!([{"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]);
        Tools {
            tools: vec![Tool {
                name: "get_weather".into(),
                parameters: raw[0]["function"]["parameters"].clone(),
            }],
            choice,
            parallel: true,
            raw,
        }
    }

    #[test]
    fn generic_calls_parse_and_unknown_functions_do_not() {
        let t = tools(ToolChoice::Required);
        let s = ToolStyle::default();
        let (content, calls) = parse(
            r#" {"name": "get_weather", "arguments": {"city": "Paris"}}"#,
            &t,
            s,
        )
        .unwrap();
        assert_eq!(content, None);
        assert_eq!(calls[0].name, "get_weather");
        assert_eq!(calls[0].arguments, r#"{"city":"Paris"}"#);
        assert!(parse(r#"{"name": "nope", "arguments": {}}"#, &t, s).is_none());
        assert!(parse("Paris is sunny.", &t, s).is_none());
    }

    #[test]
    fn hermes_calls_parse_with_leading_text() {
        let t = tools(ToolChoice::Auto);
        let s = ToolStyle {
            hermes: true,
            takes_tools: true,
        };
        let text = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n</tool_call>";
        let (content, calls) = parse(text, &t, s).unwrap();
        assert_eq!(content.as_deref(), Some("Let me check."));
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[1].arguments, r#"{"city":"Rome"}"#);
    }

    #[test]
    fn grammars_only_for_required_and_named() {
        let s = ToolStyle::default();
        assert!(grammar(&tools(ToolChoice::Auto), s).is_none());
        assert!(matches!(
            grammar(&tools(ToolChoice::Required), s),
            Some(GrammarSpec::JsonSchema(_))
        ));
        let h = ToolStyle {
            hermes: true,
            takes_tools: true,
        };
        let Some(GrammarSpec::Lark(g)) =
            grammar(&tools(ToolChoice::Named("get_weather".into())), h)
        else {
            panic!("a Lark grammar");
        };
        assert!(g.starts_with("start: tc\n"), "{g}");
    }

    #[test]
    fn the_generic_format_is_described_in_a_system_message() {
        let t = tools(ToolChoice::Auto);
        let m = messages_for(&[ChatMessage::new("user", "hi")], &t, ToolStyle::default());
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].role, "system");
        assert!(m[0].content.contains("get_weather"));
    }
}
