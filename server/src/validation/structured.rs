//! Structured output and tools at the edge: `response_format`, `tools`, `tool_choice`,
//! `parallel_tool_calls`, and the parameters memra refuses rather than ignore (each a 400
//! naming the parameter).

use memra_engine::grammar::GrammarSpec;
use serde_json::{Map, Value, json};

use crate::errors::ApiError;

use super::{Kind, present};

type Obj = Map<String, Value>;

/// `response_format`.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum ResponseFormat {
    #[default]
    Text,
    JsonObject,
    /// The schema as given (`strict` already applied: objects closed).
    JsonSchema(Value),
}

/// One function a request offers.
#[derive(Clone, Debug, PartialEq)]
pub struct Tool {
    pub name: String,
    /// Its JSON-schema parameters (an object schema; `{}` taken as any object).
    pub parameters: Value,
}

/// `tool_choice`.
#[derive(Clone, Debug, PartialEq)]
pub enum ToolChoice {
    None,
    Auto,
    Required,
    Named(String),
}

/// The request's tools.
#[derive(Clone, Debug, PartialEq)]
pub struct Tools {
    pub tools: Vec<Tool>,
    pub choice: ToolChoice,
    pub parallel: bool,
    /// The `tools` list as sent (for the chat template).
    pub raw: Value,
}

/// Everything that constrains or interprets the output.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Structured {
    pub format: ResponseFormat,
    /// `None` when the request has no tools or `tool_choice` is `none`.
    pub tools: Option<Tools>,
}

/// Parameters that would change the output and that memra does not implement: refused.
fn refuse_unsupported(o: &Obj, kind: Kind) -> Result<(), ApiError> {
    let refuse = |k: &str, why: &str| Err(ApiError::param(k, format!("`{k}` {why}")));
    if let Some(v) = present(o, "logit_bias")
        && v.as_object().is_none_or(|m| !m.is_empty())
    {
        return refuse("logit_bias", "is not supported");
    }
    for k in ["functions", "function_call"] {
        if present(o, k).is_some() {
            return refuse(k, "is not supported; use `tools` and `tool_choice`");
        }
    }
    for k in ["audio", "prediction", "web_search_options"] {
        if present(o, k).is_some() {
            return refuse(k, "is not supported");
        }
    }
    if let Some(m) = present(o, "modalities")
        && *m != json!(["text"])
    {
        return refuse("modalities", "must be [\"text\"]");
    }
    if let Some(b) = present(o, "best_of")
        && b.as_u64() != Some(1)
    {
        return refuse("best_of", "must be 1");
    }
    if present(o, "echo").is_some_and(|e| *e != Value::Bool(false)) {
        return refuse("echo", "is not supported");
    }
    if present(o, "suffix").is_some_and(|s| s.as_str() != Some("")) {
        return refuse("suffix", "is not supported");
    }
    if kind == Kind::Completion {
        for k in ["tools", "tool_choice"] {
            if present(o, k).is_some() {
                return refuse(k, "is only for /v1/chat/completions");
            }
        }
    }
    Ok(())
}

/// Closes every object schema without `additionalProperties` (OpenAI's `strict`).
fn close_objects(v: &mut Value) {
    match v {
        Value::Object(m) => {
            let is_object = m.get("type") == Some(&json!("object")) || m.contains_key("properties");
            if is_object && !m.contains_key("additionalProperties") {
                m.insert("additionalProperties".into(), Value::Bool(false));
            }
            for (k, x) in m.iter_mut() {
                if k != "enum" && k != "const" && k != "default" && k != "examples" {
                    close_objects(x);
                }
            }
        }
        Value::Array(a) => a.iter_mut().for_each(close_objects),
        _ => {}
    }
}

fn parse_response_format(o: &Obj) -> Result<ResponseFormat, ApiError> {
    const P: &str = "response_format";
    let Some(rf) = present(o, P) else {
        return Ok(ResponseFormat::Text);
    };
    let bad = |m: &str| ApiError::param(P, m.to_string());
    let rf = rf
        .as_object()
        .ok_or_else(|| bad("`response_format` must be an object"))?;
    match rf.get("type").and_then(Value::as_str) {
        Some("text") => Ok(ResponseFormat::Text),
        Some("json_object") => Ok(ResponseFormat::JsonObject),
        Some("json_schema") => {
            let js = rf
                .get("json_schema")
                .and_then(Value::as_object)
                .ok_or_else(|| {
                    bad("`response_format.json_schema` must be an object with `name` and `schema`")
                })?;
            let mut schema = match js.get("schema") {
                None | Some(Value::Null) => json!({}),
                Some(s @ Value::Object(_)) => s.clone(),
                Some(_) => {
                    return Err(bad(
                        "`response_format.json_schema.schema` must be an object",
                    ));
                }
            };
            if js.get("strict") == Some(&Value::Bool(true)) {
                close_objects(&mut schema);
            }
            Ok(ResponseFormat::JsonSchema(schema))
        }
        _ => Err(bad(
            "`response_format.type` must be `text`, `json_object` or `json_schema`",
        )),
    }
}

fn valid_name(n: &str) -> bool {
    (1..=64).contains(&n.len())
        && n.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn parse_tool(i: usize, t: &Value) -> Result<Tool, ApiError> {
    let p = format!("tools[{i}]");
    let bad = |m: &str| ApiError::param(&p, format!("`{p}`: {m}"));
    if t.get("type").and_then(Value::as_str) != Some("function") {
        return Err(bad("`type` must be \"function\""));
    }
    let f = t
        .get("function")
        .and_then(Value::as_object)
        .ok_or_else(|| bad("`function` must be an object"))?;
    let name = f.get("name").and_then(Value::as_str).unwrap_or("");
    if !valid_name(name) {
        return Err(bad(
            "`function.name` must be 1-64 letters, digits, `_` or `-`",
        ));
    }
    let mut parameters = match f.get("parameters") {
        None | Some(Value::Null) => json!({"type": "object"}),
        Some(v @ Value::Object(_)) => v.clone(),
        Some(_) => return Err(bad("`function.parameters` must be a JSON schema object")),
    };
    if f.get("strict") == Some(&Value::Bool(true)) {
        close_objects(&mut parameters);
    }
    Ok(Tool {
        name: name.to_string(),
        parameters,
    })
}

fn parse_tool_choice(o: &Obj, tools: &[Tool]) -> Result<ToolChoice, ApiError> {
    const P: &str = "tool_choice";
    let bad = |m: String| ApiError::param(P, m);
    let c = match present(o, P) {
        None if tools.is_empty() => ToolChoice::None,
        None => ToolChoice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "none" => ToolChoice::None,
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            _ => {
                return Err(bad(
                    "`tool_choice` must be none, auto, required or {\"type\":\"function\",\"function\":{\"name\":...}}".into(),
                ));
            }
        },
        Some(v) => {
            let name = v
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .filter(|_| v.get("type").and_then(Value::as_str) == Some("function"))
                .ok_or_else(|| {
                    bad("`tool_choice` must name a function: {\"type\":\"function\",\"function\":{\"name\":...}}".into())
                })?;
            if !tools.iter().any(|t| t.name == name) {
                return Err(bad(format!(
                    "`tool_choice` names `{name}`, which is not in `tools`"
                )));
            }
            ToolChoice::Named(name.to_string())
        }
    };
    if tools.is_empty() && matches!(c, ToolChoice::Required | ToolChoice::Named(_)) {
        return Err(bad("`tool_choice` needs `tools`".into()));
    }
    Ok(c)
}

fn parse_tools(o: &Obj) -> Result<Option<Tools>, ApiError> {
    let list = match present(o, "tools") {
        None => Vec::new(),
        Some(Value::Array(a)) => a.clone(),
        Some(_) => return Err(ApiError::param("tools", "`tools` must be a list")),
    };
    if list.len() > 128 {
        return Err(ApiError::param("tools", "at most 128 tools are allowed"));
    }
    let tools = list
        .iter()
        .enumerate()
        .map(|(i, t)| parse_tool(i, t))
        .collect::<Result<Vec<_>, _>>()?;
    for (i, t) in tools.iter().enumerate() {
        if tools[..i].iter().any(|u| u.name == t.name) {
            return Err(ApiError::param(
                "tools",
                format!("the function name `{}` is given twice", t.name),
            ));
        }
    }
    let choice = parse_tool_choice(o, &tools)?;
    let parallel = match present(o, "parallel_tool_calls") {
        None => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            return Err(ApiError::param(
                "parallel_tool_calls",
                "`parallel_tool_calls` must be true or false",
            ));
        }
    };
    if tools.is_empty() || choice == ToolChoice::None {
        return Ok(None);
    }
    Ok(Some(Tools {
        tools,
        choice,
        parallel,
        raw: Value::Array(list),
    }))
}

/// Parses the structured-output and tool fields (and refuses the unsupported ones).
pub fn parse_structured(o: &Obj, kind: Kind) -> Result<Structured, ApiError> {
    refuse_unsupported(o, kind)?;
    Ok(Structured {
        format: parse_response_format(o)?,
        tools: match kind {
            Kind::Chat => parse_tools(o)?,
            Kind::Completion => None,
        },
    })
}

/// The grammar of the response format, if any.
pub fn format_grammar(f: &ResponseFormat) -> Option<GrammarSpec> {
    match f {
        ResponseFormat::Text => None,
        ResponseFormat::JsonObject => Some(GrammarSpec::JsonObject),
        ResponseFormat::JsonSchema(s) => Some(GrammarSpec::JsonSchema(s.clone())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(v: Value) -> Obj {
        v.as_object().cloned().unwrap_or_default()
    }

    fn param_of(v: Value, kind: Kind) -> Option<String> {
        parse_structured(&obj(v), kind).err().and_then(|e| e.param)
    }

    #[test]
    fn strict_closes_every_object() {
        let o = obj(
            json!({"response_format": {"type": "json_schema", "json_schema": {
            "name": "x", "strict": true, "schema": {"type": "object", "properties": {
                "a": {"type": "object", "properties": {"b": {"type": "string"}}},
                "c": {"enum": [{"type": "object"}]}}}}}}),
        );
        let s = parse_structured(&o, Kind::Chat).unwrap();
        let ResponseFormat::JsonSchema(schema) = s.format else {
            panic!("a schema");
        };
        assert_eq!(schema["additionalProperties"], false);
        assert_eq!(schema["properties"]["a"]["additionalProperties"], false);
        assert_eq!(
            schema["properties"]["c"]["enum"][0],
            json!({"type": "object"})
        );
    }

    #[test]
    fn unsupported_parameters_are_refused_by_name() {
        for (body, p) in [
            (json!({"logit_bias": {"1": 5}}), "logit_bias"),
            (json!({"functions": []}), "functions"),
            (json!({"best_of": 3}), "best_of"),
            (json!({"echo": true}), "echo"),
            (json!({"suffix": "x"}), "suffix"),
            (json!({"modalities": ["audio"]}), "modalities"),
            (
                json!({"response_format": {"type": "xml"}}),
                "response_format",
            ),
            (
                json!({"tools": [{"type": "function", "function": {"name": "a b"}}]}),
                "tools[0]",
            ),
            (json!({"tool_choice": "required"}), "tool_choice"),
        ] {
            assert_eq!(
                param_of(body.clone(), Kind::Chat).as_deref(),
                Some(p),
                "{body}"
            );
        }
        assert_eq!(
            param_of(json!({"tools": []}), Kind::Completion).as_deref(),
            Some("tools")
        );
        assert!(
            parse_structured(&obj(json!({"logit_bias": {}, "echo": false})), Kind::Chat).is_ok()
        );
    }

    #[test]
    fn tool_choice_forms() {
        let tools = json!([{"type": "function", "function": {"name": "f", "parameters": {}}}]);
        let t = |c: Value| {
            parse_structured(&obj(json!({"tools": tools, "tool_choice": c})), Kind::Chat)
                .unwrap()
                .tools
        };
        assert_eq!(t(json!("none")), None);
        assert_eq!(t(json!("auto")).unwrap().choice, ToolChoice::Auto);
        assert_eq!(t(json!("required")).unwrap().choice, ToolChoice::Required);
        let named = t(json!({"type": "function", "function": {"name": "f"}})).unwrap();
        assert_eq!(named.choice, ToolChoice::Named("f".into()));
        assert!(named.parallel);
    }
}
