//! Chat templates (Jinja, as in HF tokenizer_config.json / GGUF `tokenizer.chat_template`) rendered
//! with minijinja in a sandbox. Templates from model files are untrusted code:
//!
//! - no loader: `include`/`import`/`extends` find nothing; each render compiles the source afresh,
//!   so a template cannot include itself either;
//! - fuel (instructions per render) and a recursion limit stop endless loops and deep recursion;
//! - a time limit per render ([`DEFAULT_TIME_LIMIT`], 2 s; [`ChatTemplate::with_time_limit`]): fuel
//!   counts instructions, but one instruction may take time in proportion to a value of up to the
//!   output limit (`s|upper`, `'x' * n`, `'y' in s`), so a template can stay under its fuel and
//!   still burn CPU for minutes on the request path. The guard checks (below), plus a clock check
//!   before every loop iteration and every comparison, `in`, test, index and slice, fail the
//!   render with `template render exceeded its time limit of N ms` once the deadline has passed
//!   (the server answers 400, like any template error). The clock is read every 16th check; the
//!   checks add about 10% to a real template's render (gemma3's and SmolLM2's, 160 messages:
//!   ~0.43 ms instead of ~0.39 ms, ~0.2 us per message; `chat_guard` test `render_timing`);
//! - size guards (`chat_guard`): the compiled template runs with checks inserted before `+`, `*`,
//!   `~` and namespace assignment and after literals and call/filter results, so no value grows
//!   past the output limit (1 MiB plus 4x the message text), and all emission (captures included)
//!   is counted; the rendered prompt is held to the output limit. A template that would build a
//!   huge value (`(0, 1) * 10**12`, a list or string doubled in a loop) fails with an error
//!   naming the operator instead of exhausting memory (fuzz finding
//!   `chat_template/bad-oom-sequence-repeat-concat`); the string `replace` filter/method refuses
//!   results over 16 MiB;
//! - HF compatibility: trim_blocks + lstrip_blocks, chainable (lenient) undefined values, Python
//!   string/dict methods (`.strip()`, `.startswith()`, `.items()`, ... via minijinja-contrib
//!   pycompat), `raise_exception(msg)` (an `Error::Template` carrying `msg`), `strftime_now(fmt)`
//!   (UTC) and a `tojson` that writes like Python's `json.dumps` (`", "`/`": "`, non-ASCII kept,
//!   optional `indent`);
//! - filters whose output size is set by an argument are checked before they run: `indent`
//!   (width x lines), `format` / `str.format` (any field width or precision over
//!   [`MAX_FORMAT_WIDTH`]) and `batch` / `slice` (count); `string * n` is held to the output limit.

use std::io;
use std::path::Path;
use std::time::{Duration, Instant};

use minijinja::value::{Kwargs, Value};
use minijinja::{Environment, ErrorKind, UndefinedBehavior, context, machinery};
use serde::Serialize;

use crate::chat_const;
use crate::chat_guard::{self, Budget};
use crate::error::{Error, Result};
use crate::formats::gguf::Gguf;
use crate::tokenizer::Tokenizer;

/// Instructions one render may execute.
pub const DEFAULT_FUEL: u64 = 20_000_000;
/// Wall time one render may take (real templates take well under a millisecond).
pub const DEFAULT_TIME_LIMIT: Duration = Duration::from_secs(2);
/// Output bytes always allowed; 4x the message text is allowed on top.
pub const DEFAULT_MAX_OUTPUT: usize = 1 << 20;
/// Largest string the `replace` filter may build.
const MAX_REPLACE_OUTPUT: usize = 16 << 20;
const RECURSION_LIMIT: usize = 100;
/// Bytes a render may emit, captures included, per byte of its output limit: 2 lets a template
/// render everything through macros or `{% set %}` blocks (each byte emitted twice), while the
/// output string never grows past twice the limit (the largest allocation stays small: the
/// load_corrupt_gguf allocation bound).
const EMIT_FACTOR: usize = 2;
/// Largest width or precision a `format` field may ask for.
pub const MAX_FORMAT_WIDTH: usize = 1 << 16;
/// Largest string `indent` may build.
const MAX_INDENT_OUTPUT: usize = 16 << 20;

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
    /// An assistant turn's tool calls, as HF templates read them:
    /// `[{"id", "type": "function", "function": {"name", "arguments": {...}}}]`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<serde_json::Value>,
    /// A `tool` message: the call it answers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.into(),
            content: content.into(),
            tool_calls: None,
            tool_call_id: None,
        }
    }
}

/// A compiled (validated) chat template with its BOS/EOS strings.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    /// `source` without HF's `{% generation %}` markers.
    compiled: String,
    bos_token: String,
    eos_token: String,
    max_output: usize,
    time_limit: Duration,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("source_len", &self.source.len())
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish_non_exhaustive()
    }
}

fn template_error(e: &minijinja::Error) -> Error {
    // Show the whole chain (minijinja puts the location in the top error).
    let mut msg = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(s) = src {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        src = s.source();
    }
    Error::Template(msg)
}

impl ChatTemplate {
    /// Compiles `source`; syntax errors are `Error::Template`.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<ChatTemplate> {
        let env = sandbox_env(DEFAULT_FUEL);
        let compiled = strip_generation_tags(source);
        if compiled.contains(chat_guard::RESERVED) {
            return Err(Error::Template(format!(
                "the template uses a name starting with {}, which is reserved",
                chat_guard::RESERVED
            )));
        }
        // Before compiling: the compiler folds constant expressions (see chat_const).
        chat_const::check(&compiled).map_err(|e| template_error(&e))?;
        env.template_from_str(&compiled)
            .map_err(|e| template_error(&e))?;
        Ok(ChatTemplate {
            env,
            source: source.to_string(),
            compiled,
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
            max_output: DEFAULT_MAX_OUTPUT,
            time_limit: DEFAULT_TIME_LIMIT,
        })
    }

    /// Overrides the wall time a render may take (tests, operators).
    pub fn with_time_limit(mut self, time_limit: Duration) -> ChatTemplate {
        self.time_limit = time_limit;
        self
    }

    /// Overrides the fuel per render and the base output limit (tests, operators).
    pub fn set_limits(&mut self, fuel: u64, max_output: usize) {
        self.env.set_fuel(Some(fuel));
        self.max_output = max_output;
    }

    /// `source` with the BOS/EOS strings of `tok`.
    pub fn with_tokenizer(source: &str, tok: &Tokenizer) -> Result<ChatTemplate> {
        let (bos, eos) = special_strings(tok);
        Self::new(source, &bos, &eos)
    }

    /// The template in `tokenizer.chat_template`, if any.
    pub fn from_gguf(g: &Gguf, tok: &Tokenizer) -> Result<Option<ChatTemplate>> {
        let key = "tokenizer.chat_template";
        let Some(v) = g.get(key) else {
            return Ok(None);
        };
        let source = v
            .as_str()
            .ok_or_else(|| Error::Template(format!("metadata {key} must be a string")))?;
        let (bos, eos) = special_strings(tok);
        Self::new(source, &bos, &eos).map(Some)
    }

    /// `chat_template.jinja` in `dir`, else `chat_template` in tokenizer_config.json (a string,
    /// or a list of `{name, template}` of which "default" is used).
    pub fn from_hf_dir(dir: &Path, tok: &Tokenizer) -> Result<Option<ChatTemplate>> {
        let (bos, eos) = special_strings(tok);
        let jinja = dir.join("chat_template.jinja");
        if jinja.is_file() {
            let source = std::fs::read_to_string(&jinja).map_err(|e| Error::io(&jinja, e))?;
            return Self::new(&source, &bos, &eos).map(Some);
        }
        let cfg_path = dir.join("tokenizer_config.json");
        if !cfg_path.is_file() {
            return Ok(None);
        }
        let text = std::fs::read_to_string(&cfg_path).map_err(|e| Error::io(&cfg_path, e))?;
        let cfg: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| Error::Template(format!("{}: {e}", cfg_path.display())))?;
        let source = match cfg.get("chat_template") {
            None | Some(serde_json::Value::Null) => return Ok(None),
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(serde_json::Value::Array(list)) => named_default(list)?,
            Some(_) => {
                return Err(Error::Template(
                    "tokenizer_config.json chat_template must be a string or a list".into(),
                ));
            }
        };
        Self::new(&source, &bos, &eos).map(Some)
    }

    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders the conversation; `add_generation_prompt` opens the assistant's turn.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        self.render_with_tools(messages, None, add_generation_prompt)
    }

    /// Whether the template reads `tools` (renders function definitions itself).
    pub fn takes_tools(&self) -> bool {
        self.source.contains("tools")
    }

    /// [`ChatTemplate::render`] with the request's function definitions as `tools` (the
    /// OpenAI list, as HF templates expect).
    pub fn render_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
    ) -> Result<String> {
        let start = Instant::now();
        let tmpl = self
            .env
            .template_from_str(&self.compiled)
            .map_err(|e| template_error(&e))?;
        let input: usize = messages
            .iter()
            .map(|m| m.content.len() + m.role.len())
            .sum();
        let limit = self.max_output.saturating_add(input.saturating_mul(4));
        // Captures (`{% set %}` blocks, macro calls) are emitted twice, into the capture and then
        // into the output: the emission budget allows for that; the output itself is held to
        // `limit` below.
        let budget = Value::from_object(Budget::new(
            limit,
            limit.saturating_mul(EMIT_FACTOR),
            start,
            self.time_limit,
        ));
        let ctx = context! {
            messages => messages,
            tools => tools.map_or(Value::UNDEFINED, Value::from_serialize),
            add_generation_prompt => add_generation_prompt,
            bos_token => &self.bos_token,
            eos_token => &self.eos_token,
            __memra_budget => budget.clone(),
        };
        // The compiled template with the size checks of `chat_guard` inserted, run by minijinja's
        // VM exactly as `Template::render` runs it.
        let compiled = machinery::get_compiled_template(&tmpl);
        let code = chat_guard::guard_instructions(&compiled.instructions, &budget);
        let blocks = chat_guard::guard_blocks(&compiled.blocks, &budget);
        let mut rendered = String::new();
        let mut out = machinery::make_string_output(&mut rendered);
        let result = machinery::Vm::new(&self.env).eval(
            &code,
            ctx,
            &blocks,
            &mut out,
            compiled.initial_auto_escape,
        );
        if let Err(e) = result {
            // However the deadline error surfaced (wrapped by a macro or filter call), the render
            // failed because of it.
            if budget
                .downcast_object_ref::<Budget>()
                .is_some_and(Budget::timed_out)
            {
                return Err(Error::Template(Budget::time_limit_message(self.time_limit)));
            }
            if e.kind() == ErrorKind::OutOfFuel {
                return Err(Error::Template(
                    "template ran out of fuel (too many instructions; endless loop?)".into(),
                ));
            }
            return Err(template_error(&e));
        }
        if rendered.len() > limit {
            return Err(Error::Template(format!(
                "rendered prompt exceeds the output limit of {limit} bytes"
            )));
        }
        Ok(rendered)
    }
}

/// Removes `{% generation %}` / `{% endgeneration %}` (HF's assistant-mask markers, which render
/// nothing), whitespace-control dashes included.
fn strip_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        let (before, tag) = rest.split_at(start);
        out.push_str(before);
        let end = tag.find("%}").map(|e| e + 2);
        let is_marker = end
            .and_then(|e| tag.get(2..e - 2))
            .map(|inner| inner.trim_matches(|c: char| c == '-' || c == '+' || c.is_whitespace()))
            .is_some_and(|word| word == "generation" || word == "endgeneration");
        match end {
            Some(e) if is_marker => rest = &tag[e..],
            _ => {
                out.push_str("{%");
                rest = &tag[2..];
            }
        }
    }
    out.push_str(rest);
    out
}

fn special_strings(tok: &Tokenizer) -> (String, String) {
    let text = |id: Option<u32>| id.and_then(|id| tok.token_text(id)).unwrap_or_default();
    (text(tok.bos_id()), text(tok.eos_id()))
}

fn named_default(list: &[serde_json::Value]) -> Result<String> {
    let mut names = Vec::new();
    for entry in list {
        let name = entry.get("name").and_then(|v| v.as_str());
        let template = entry.get("template").and_then(|v| v.as_str());
        match (name, template) {
            (Some("default"), Some(t)) => return Ok(t.to_string()),
            (Some(n), Some(_)) => names.push(n.to_string()),
            _ => {
                return Err(Error::Template(
                    "tokenizer_config.json chat_template list entries need \"name\" and \"template\" strings".into(),
                ));
            }
        }
    }
    Err(Error::Template(format!(
        "tokenizer_config.json has no chat template named \"default\" (found: {})",
        names.join(", ")
    )))
}

pub(crate) fn sandbox_env(fuel: u64) -> Environment<'static> {
    let mut env = Environment::new();
    env.set_fuel(Some(fuel));
    env.set_recursion_limit(RECURSION_LIMIT);
    env.set_undefined_behavior(UndefinedBehavior::Chainable);
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_unknown_method_callback(|state, value, method, args| {
        if method == "replace"
            && let Some(s) = value.as_str()
        {
            return checked_replace_args(s, args);
        }
        if method == "format"
            && let Some(s) = value.as_str()
        {
            check_format_widths(s)?;
        }
        minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
    });
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", strftime_now);
    env.add_filter("tojson", tojson);
    env.add_filter("replace", replace_filter);
    env.add_filter("indent", indent_filter);
    env.add_filter("format", format_filter);
    chat_guard::register(&mut env);
    env
}

fn too_large(what: &str, size: usize, limit: usize) -> minijinja::Error {
    minijinja::Error::new(
        ErrorKind::InvalidOperation,
        format!("{what} would build a {size}-byte string (limit {limit})"),
    )
}

/// Refuses a printf / str.format string with a field width or precision over
/// [`MAX_FORMAT_WIDTH`] (`'%01000000000000d'` would allocate a terabyte).
fn check_format_widths(fmt: &str) -> std::result::Result<(), minijinja::Error> {
    let mut digits = 0usize;
    let mut value = 0usize;
    for c in fmt.chars().chain(std::iter::once(' ')) {
        if let Some(d) = c.to_digit(10) {
            digits += 1;
            value = value.saturating_mul(10).saturating_add(d as usize);
            continue;
        }
        if digits > 0 && value > MAX_FORMAT_WIDTH {
            return Err(minijinja::Error::new(
                ErrorKind::InvalidOperation,
                format!("format width {value} is over the limit of {MAX_FORMAT_WIDTH}"),
            ));
        }
        digits = 0;
        value = 0;
    }
    Ok(())
}

fn format_filter(
    state: &minijinja::State,
    format_str: &Value,
    args: minijinja::value::Rest<Value>,
) -> std::result::Result<Value, minijinja::Error> {
    if let Some(s) = format_str.as_str() {
        check_format_widths(s)?;
        // minijinja 2.24 panics on a `%(` key followed by a multi-byte character (it slices
        // inside it; found by the chat_template fuzzer): refused before the call.
        if s.contains("%(") && !s.is_ascii() {
            return Err(minijinja::Error::new(
                ErrorKind::InvalidOperation,
                "a format string with %(key) fields must be ASCII",
            ));
        }
    }
    // Any other panic inside the filter fails the render too: a template from a model file
    // must never panic the request's thread.
    let call = std::panic::AssertUnwindSafe(|| minijinja::filters::format(state, format_str, args));
    std::panic::catch_unwind(call).unwrap_or_else(|_| {
        Err(minijinja::Error::new(
            ErrorKind::InvalidOperation,
            "the format string is malformed",
        ))
    })
}

/// Jinja's `indent(width=4, first=false, blank=false)`, refusing a result over
/// [`MAX_INDENT_OUTPUT`] before building it.
fn indent_filter(
    value: String,
    width: Option<usize>,
    first: Option<bool>,
    blank: Option<bool>,
    kwargs: Kwargs,
) -> std::result::Result<Value, minijinja::Error> {
    let width = match width {
        Some(w) => w,
        None => kwargs.get::<Option<usize>>("width")?.unwrap_or(4),
    };
    let first = match first {
        Some(f) => f,
        None => kwargs.get::<Option<bool>>("first")?.unwrap_or(false),
    };
    let blank = match blank {
        Some(b) => b,
        None => kwargs.get::<Option<bool>>("blank")?.unwrap_or(false),
    };
    kwargs.assert_all_used()?;
    let lines = value.matches('\n').count().saturating_add(1);
    let size = value.len().saturating_add(width.saturating_mul(lines));
    if size > MAX_INDENT_OUTPUT {
        return Err(too_large("indent", size, MAX_INDENT_OUTPUT));
    }
    let strip = |s: &str| -> usize {
        let s = s.strip_suffix('\n').unwrap_or(s);
        s.strip_suffix('\r').unwrap_or(s).len()
    };
    let input = &value[..strip(&value)];
    let pad = " ".repeat(width);
    let mut out = String::with_capacity(size);
    let mut it = input.split('\n');
    if !first {
        out.push_str(it.next().unwrap_or_default());
        out.push('\n');
    }
    for line in it {
        if !line.is_empty() || blank {
            out.push_str(&pad);
        }
        out.push_str(line);
        out.push('\n');
    }
    out.truncate(strip(&out));
    Ok(Value::from(out))
}

fn raise_exception(msg: String) -> std::result::Result<Value, minijinja::Error> {
    Err(minijinja::Error::new(
        ErrorKind::InvalidOperation,
        format!("raise_exception: {msg}"),
    ))
}

fn checked_replace(
    s: &str,
    from: &str,
    to: &str,
    count: Option<usize>,
) -> std::result::Result<Value, minijinja::Error> {
    let n = if from.is_empty() {
        s.chars().count() + 1
    } else {
        s.matches(from).count()
    };
    let n = count.map_or(n, |c| c.min(n));
    let size = s
        .len()
        .saturating_add(n.saturating_mul(to.len()))
        .saturating_sub(n.saturating_mul(from.len()));
    if size > MAX_REPLACE_OUTPUT {
        return Err(minijinja::Error::new(
            ErrorKind::InvalidOperation,
            format!("replace would build a {size}-byte string (limit {MAX_REPLACE_OUTPUT})"),
        ));
    }
    Ok(Value::from(match count {
        Some(c) => s.replacen(from, to, c),
        None => s.replace(from, to),
    }))
}

fn checked_replace_args(s: &str, args: &[Value]) -> std::result::Result<Value, minijinja::Error> {
    let arg = |i: usize| args.get(i).and_then(|v| v.as_str());
    match (arg(0), arg(1)) {
        (Some(from), Some(to)) => {
            let count = args
                .get(2)
                .and_then(|v| i64::try_from(v.clone()).ok())
                .and_then(|c| usize::try_from(c).ok());
            checked_replace(s, from, to, count)
        }
        _ => Err(minijinja::Error::new(
            ErrorKind::InvalidOperation,
            "str.replace takes two strings",
        )),
    }
}

fn replace_filter(
    value: String,
    from: String,
    to: String,
    count: Option<i64>,
) -> std::result::Result<Value, minijinja::Error> {
    checked_replace(
        &value,
        &from,
        &to,
        count.and_then(|c| usize::try_from(c).ok()),
    )
}

/// Python's `json.dumps(value, ensure_ascii=False, indent=indent)`.
fn tojson(value: Value, kwargs: Kwargs) -> std::result::Result<Value, minijinja::Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    kwargs.assert_all_used()?;
    let err = |e: serde_json::Error| {
        minijinja::Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}"))
    };
    let mut out = Vec::new();
    match indent {
        Some(n) => {
            let pad = vec![b' '; n.min(64)];
            let fmt = serde_json::ser::PrettyFormatter::with_indent(&pad);
            let mut ser = serde_json::Serializer::with_formatter(&mut out, fmt);
            value.serialize(&mut ser).map_err(err)?;
        }
        None => {
            let mut ser = serde_json::Serializer::with_formatter(&mut out, PyCompact);
            value.serialize(&mut ser).map_err(err)?;
        }
    }
    let s = String::from_utf8(out)
        .map_err(|_| minijinja::Error::new(ErrorKind::InvalidOperation, "tojson: bad UTF-8"))?;
    Ok(Value::from_safe_string(s))
}

/// serde_json formatter with Python's default separators `", "` and `": "`.
struct PyCompact;

impl serde_json::ser::Formatter for PyCompact {
    fn begin_array_value<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> io::Result<()> {
        if first { Ok(()) } else { w.write_all(b", ") }
    }

    fn begin_object_key<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> io::Result<()> {
        if first { Ok(()) } else { w.write_all(b", ") }
    }

    fn begin_object_value<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        w.write_all(b": ")
    }
}

/// `strftime_now(fmt)`: the current UTC time formatted with the common strftime codes
/// (%Y %y %m %d %e %H %I %M %S %p %j %b %B %a %A %%, and %-d %-m %-H %-I %-M %-S).
fn strftime_now(fmt: String) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    format_time(secs, &fmt)
}

/// Formats UNIX time `secs` (UTC); public for tests through `chat::format_unix_time`.
pub fn format_unix_time(secs: u64, fmt: &str) -> String {
    format_time(secs, fmt)
}

fn format_time(secs: u64, fmt: &str) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = [
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
    ];
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let (hour, minute, second) = (rem / 3600, rem % 3600 / 60, rem % 60);
    let (year, month, day) = civil_from_days(days);
    // 1970-01-01 was a Thursday (index 3 from Monday).
    let weekday = (days + 3).rem_euclid(7) as usize;
    let yday = days - days_from_civil(year, 1, 1) + 1;
    let month_name = MONTHS.get(month as usize - 1).copied().unwrap_or("");
    let day_name = DAYS.get(weekday).copied().unwrap_or("");
    let hour12 = if hour % 12 == 0 { 12 } else { hour % 12 };
    let mut out = String::new();
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let mut code = chars.next();
        let no_pad = code == Some('-');
        if no_pad {
            code = chars.next();
        }
        let num = |v: u64, w: usize| {
            if no_pad {
                v.to_string()
            } else {
                format!("{v:0w$}")
            }
        };
        let piece = match code {
            Some('Y') => year.to_string(),
            Some('y') => format!("{:02}", year.rem_euclid(100)),
            Some('m') => num(month as u64, 2),
            Some('d') => num(day as u64, 2),
            Some('e') => format!("{day:>2}"),
            Some('H') => num(hour, 2),
            Some('I') => num(hour12, 2),
            Some('M') => num(minute, 2),
            Some('S') => num(second, 2),
            Some('p') => (if hour < 12 { "AM" } else { "PM" }).to_string(),
            Some('j') => num(yday as u64, 3),
            Some('b') => month_name.chars().take(3).collect(),
            Some('B') => month_name.to_string(),
            Some('a') => day_name.chars().take(3).collect(),
            Some('A') => day_name.to_string(),
            Some('%') => "%".to_string(),
            Some(other) => format!("%{}{other}", if no_pad { "-" } else { "" }),
            None => "%".to_string(),
        };
        out.push_str(&piece);
    }
    out
}

/// Days since 1970-01-01 -> (year, month 1..=12, day 1..=31) (proleptic Gregorian).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}
