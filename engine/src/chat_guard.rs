//! Size guards for chat-template rendering: a compiled template's instructions are rewritten so that
//! every operation that can build a large value in a few instructions is checked first.
//!
//! Why: minijinja's fuel counts instructions, not bytes, and several instructions build values of
//! any size in one step: `seq * n` is a lazy iterable of `len * n` items (no cap in minijinja
//! 2.24), `seq + seq` a lazy concatenation (doubling in a loop gives 2^k items in k steps), and list
//! or map literals nest (`[a, a]` k times refers to `a` 2^k times). None of these allocate, but
//! `~`, `join`, `string`, `tojson`, `format`, ... then format such a value into one `String`, which
//! grows until the allocator fails and the process aborts (fuzz finding
//! `chat_template/oom-sequence-repeat-concat`). Strings doubled with `~` or `+` in a loop, or
//! emitted into a capture (`{% set x %}`, a macro call) in a loop, grow the same way.
//!
//! How: minijinja has no hook on operators, so [`guard_instructions`] rewrites the compiled
//! instructions (its `unstable_machinery` API, no patch to minijinja) and the render runs them
//! through minijinja's own VM:
//!
//! - `+`, `*`, `~` and namespace assignment first call a check with both operands (the check hands
//!   them back, the operator itself still runs in minijinja, so its semantics are unchanged): the
//!   result's formatted size is estimated from the operands without building it (for `seq * n`
//!   from the operand's size times `n`), and over [`Budget::cap`] the render fails;
//! - a list or map literal and the result of any function, method or filter call is checked after
//!   it is built (its size estimated by a walk that stops as soon as it passes the cap), so no value
//!   the template can reach is larger than the cap, whatever filter formats it later;
//! - every `{{ ... }}` and every piece of template text is counted against a per-render emission
//!   budget before it is written, captures included, so output cannot grow without bound in a
//!   capture either (the final output is then held to the exact output limit by the caller);
//! - a per-render deadline ([`Budget::tick`]): every check above that looks at a value or counts
//!   output, and a bare check (a method call on the budget, loaded as a constant) before each loop
//!   iteration (`Iterate`) and each operation whose cost grows with its operands (`in`,
//!   comparisons, tests, indexing, slicing), fails the render once its time limit has passed.
//!   No loop iteration, call or value-scaling operation runs without a check, so the render stops
//!   within a few operations (each bounded by the value cap) of the deadline, however the
//!   template spends its time (filters over large values, string products, long loops under the
//!   fuel limit). The clock is read on every [`CLOCK_STRIDE`]th check only.
//!
//! The cap is the render's output limit (1 MiB plus 4x the message text by default): a real
//! template builds its output from values no larger than the output itself, so real templates
//! render exactly as before, a few extra instructions per operator aside. Sizes are estimates
//! (nested strings count 2 bytes for quotes and separators; numbers 48), within a small constant
//! factor of the real formatted size, and a walk is also refused past [`MAX_DEPTH`] levels of
//! nesting. The template cannot reach the guard functions or the budget: their names start with
//! [`RESERVED`], which a template source may not contain.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use minijinja::machinery::{Instruction, Instructions};
use minijinja::value::{Object, Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind, State};

/// Prefix of the guard functions and the budget variable; refused in template sources.
pub(crate) const RESERVED: &str = "__memra";
/// Name of the per-render [`Budget`] in the render context.
pub(crate) const BUDGET_VAR: &str = "__memra_budget";
const CHECK_ADD: &str = "__memra_add";
const CHECK_MUL: &str = "__memra_mul";
const CHECK_CONCAT: &str = "__memra_concat";
const CHECK_SET_ATTR: &str = "__memra_set_attr";
const CHECK_VALUE: &str = "__memra_value";
const CHECK_EMIT: &str = "__memra_emit";
const CHECK_RAW: &str = "__memra_raw";
/// The budget's method that checks the deadline alone (see [`expand`]).
const TICK: &str = "tick";
/// Checks per clock read: a clock read costs ~25 ns (more on a VM without a fast clock source),
/// about as much as a bare check, and the 15 operations that may follow the deadline unchecked
/// take a few milliseconds at most.
pub(crate) const CLOCK_STRIDE: u32 = 16;
/// Deepest nesting of lists and maps a value may have (request JSON stops at 128).
pub(crate) const MAX_DEPTH: usize = 256;
/// Formatted-size estimate of a float, bool, none or other scalar (an integer counts its digits).
pub(crate) const SCALAR_SIZE: usize = 48;
/// Largest count `batch` and `slice` take (they allocate `count` slots up front).
pub(crate) const MAX_BATCH: usize = 100_000;

/// One render's limits: the largest value (estimated formatted bytes), the bytes left to emit and
/// the deadline.
#[derive(Debug)]
pub(crate) struct Budget {
    cap: usize,
    emit_left: AtomicUsize,
    /// `None`: the time limit is too far away to represent.
    deadline: Option<Instant>,
    time_limit: Duration,
    /// Checks so far (the clock is read on every [`CLOCK_STRIDE`]th).
    checks: AtomicU32,
    /// Set when a check found the deadline passed; every later check fails at once.
    timed_out: AtomicBool,
}

impl Budget {
    /// `cap` bounds each value; emission (captures included) may total `emit` bytes; the render
    /// may run until `start + time_limit`.
    pub(crate) fn new(cap: usize, emit: usize, start: Instant, time_limit: Duration) -> Budget {
        Budget {
            cap,
            emit_left: AtomicUsize::new(emit),
            deadline: start.checked_add(time_limit),
            time_limit,
            checks: AtomicU32::new(0),
            timed_out: AtomicBool::new(false),
        }
    }

    /// The message of the error a render that ran past its deadline fails with.
    pub(crate) fn time_limit_message(time_limit: Duration) -> String {
        format!(
            "template render exceeded its time limit of {} ms",
            time_limit.as_millis()
        )
    }

    /// Whether a check found the deadline passed (the render then failed).
    pub(crate) fn timed_out(&self) -> bool {
        self.timed_out.load(Ordering::Relaxed)
    }

    /// Fails once the deadline has passed (the clock is read every [`CLOCK_STRIDE`] calls, the
    /// first included).
    pub(crate) fn tick(&self) -> Result<(), Error> {
        if !self.timed_out.load(Ordering::Relaxed) {
            let n = self.checks.fetch_add(1, Ordering::Relaxed);
            if !n.is_multiple_of(CLOCK_STRIDE) || self.deadline.is_none_or(|d| Instant::now() < d) {
                return Ok(());
            }
            self.timed_out.store(true, Ordering::Relaxed);
        }
        Err(Error::new(
            ErrorKind::InvalidOperation,
            Self::time_limit_message(self.time_limit),
        ))
    }

    fn spend(&self, n: usize) -> Result<(), Error> {
        let left = self.emit_left.load(Ordering::Relaxed);
        if n > left {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!(
                    "the template writes more than its output limit allows ({} bytes, captures \
                     included)",
                    self.cap
                ),
            ));
        }
        self.emit_left.store(left - n, Ordering::Relaxed);
        Ok(())
    }
}

impl Object for Budget {
    /// `tick()`, the bare deadline check that [`expand`] inserts (the template cannot reach it).
    fn call_method(
        self: &Arc<Self>,
        _state: &State<'_, '_>,
        method: &str,
        _args: &[Value],
    ) -> Result<Value, Error> {
        if method != TICK {
            return Err(Error::from(ErrorKind::UnknownMethod));
        }
        self.tick()?;
        Ok(Value::UNDEFINED)
    }
}

/// Registers the guard functions and the bounded `batch` / `slice` filters.
pub(crate) fn register(env: &mut Environment<'static>) {
    env.add_function(CHECK_ADD, check_add);
    env.add_function(CHECK_MUL, check_mul);
    env.add_function(CHECK_CONCAT, check_concat);
    env.add_function(CHECK_SET_ATTR, check_set_attr);
    env.add_function(CHECK_VALUE, check_value);
    env.add_function(CHECK_EMIT, check_emit);
    env.add_function(CHECK_RAW, check_raw);
    env.add_filter("batch", batch_filter);
    env.add_filter("slice", slice_filter);
}

/// `code` with the checks described in the module docs inserted; jump targets are moved to match.
/// `budget` is the render's [`Budget`] (the bare deadline checks call it directly).
pub(crate) fn guard_instructions<'s>(code: &Instructions<'s>, budget: &Value) -> Instructions<'s> {
    let n = code.len();
    let groups: Vec<Vec<Instruction<'s>>> = (0..n)
        .filter_map(|i| code.get(i as u32))
        .map(|instr| expand(instr, budget))
        .collect();
    // start[i]: the new index of old instruction i's group (a jump to i runs its checks too).
    let mut start = Vec::with_capacity(groups.len() + 1);
    let mut next = 0u32;
    for g in &groups {
        start.push(next);
        next += g.len() as u32;
    }
    start.push(next);
    let mut out = Instructions::new(code.name(), code.source());
    for (i, group) in groups.into_iter().enumerate() {
        let span = code.get_span(i as u32);
        let line = code.get_line(i as u32);
        for mut instr in group {
            retarget(&mut instr, &start);
            match (span, line) {
                (Some(span), _) => out.add_with_span(instr, span),
                (None, Some(line)) => out.add_with_line(instr, line.min(u16::MAX as usize) as u16),
                (None, None) => out.add(instr),
            };
        }
    }
    out
}

/// [`guard_instructions`] for each block.
pub(crate) fn guard_blocks<'s>(
    blocks: &BTreeMap<&'s str, Instructions<'s>>,
    budget: &Value,
) -> BTreeMap<&'s str, Instructions<'s>> {
    blocks
        .iter()
        .map(|(name, code)| (*name, guard_instructions(code, budget)))
        .collect()
}

/// The instructions that replace `instr`.
fn expand<'s>(instr: &Instruction<'s>, budget: &Value) -> Vec<Instruction<'s>> {
    use Instruction as I;
    let call = |name: &'static str, args: u16| I::CallFunction(name, Some(args));
    // The check takes both operands and returns them as `[b, a]`, which `UnpackList` puts back
    // on the stack as `a, b`.
    let binary = |name: &'static str| vec![call(name, 2), I::UnpackList(2), instr.clone()];
    match instr {
        I::Add => binary(CHECK_ADD),
        I::Mul => binary(CHECK_MUL),
        I::StringConcat => binary(CHECK_CONCAT),
        I::SetAttr(_) => binary(CHECK_SET_ATTR),
        I::Emit => vec![call(CHECK_EMIT, 1), I::Emit],
        I::EmitRaw(s) => vec![
            I::LoadConst(Value::from(s.len())),
            call(CHECK_RAW, 1),
            I::DiscardTop,
            I::EmitRaw(s),
        ],
        // Bare deadline checks, a method call on the budget itself (no name lookup): once per
        // loop iteration (a loop's closing jump goes back to its `Iterate`), and before each
        // operation that may take time in proportion to its operands.
        I::Iterate(_)
        | I::In
        | I::Eq
        | I::Ne
        | I::Lt
        | I::Lte
        | I::Gt
        | I::Gte
        | I::CompareAndPreserve(_)
        | I::PerformTest(..)
        | I::GetItem
        | I::Slice => vec![
            I::LoadConst(budget.clone()),
            I::CallMethod(TICK, Some(1)),
            I::DiscardTop,
            instr.clone(),
        ],
        I::BuildList(_)
        | I::BuildMap(_)
        | I::CallFunction(..)
        | I::CallMethod(..)
        | I::CallObject(_)
        | I::ApplyFilter(..) => vec![instr.clone(), call(CHECK_VALUE, 1)],
        other => vec![other.clone()],
    }
}

fn retarget(instr: &mut Instruction<'_>, start: &[u32]) {
    let end = start.last().copied().unwrap_or(0);
    let map = |t: &mut u32| *t = start.get(*t as usize).copied().unwrap_or(end);
    match instr {
        Instruction::Jump(t)
        | Instruction::JumpIfFalse(t)
        | Instruction::JumpIfFalseOrPop(t)
        | Instruction::JumpIfTrueOrPop(t)
        | Instruction::Iterate(t)
        | Instruction::BuildMacro(_, t, _) => map(t),
        _ => {}
    }
}

/// The render's budget, after its deadline check: every size check goes through here.
fn budget(state: &State) -> Result<Arc<Budget>, Error> {
    let b = state
        .lookup(BUDGET_VAR)
        .and_then(|v| v.downcast_object::<Budget>())
        .ok_or_else(|| Error::new(ErrorKind::InvalidOperation, "render budget missing"))?;
    b.tick()?;
    Ok(b)
}

fn too_large(what: &str, cap: usize) -> Error {
    Error::new(
        ErrorKind::InvalidOperation,
        format!("{what} would build a value larger than the output limit of {cap} bytes"),
    )
}

/// Whether `v` is a number, bool, none or undefined (nothing that grows).
pub(crate) fn is_scalar(v: &Value) -> bool {
    !matches!(
        v.kind(),
        ValueKind::String
            | ValueKind::Bytes
            | ValueKind::Seq
            | ValueKind::Map
            | ValueKind::Iterable
            | ValueKind::Plain
    )
}

/// Both operands back as `[b, a]` (see [`expand`]).
fn operands(a: Value, b: Value) -> Value {
    Value::from(vec![b, a])
}

fn check_sum(state: &State, what: &str, a: &Value, b: &Value) -> Result<(), Error> {
    if is_scalar(a) && is_scalar(b) {
        return Ok(());
    }
    let cap = budget(state)?.cap;
    let size = size_of(a, cap)?.saturating_add(size_of(b, cap)?);
    if size > cap {
        return Err(too_large(what, cap));
    }
    Ok(())
}

fn check_add(state: &State, a: Value, b: Value) -> Result<Value, Error> {
    check_sum(state, "`+`", &a, &b)?;
    Ok(operands(a, b))
}

fn check_concat(state: &State, a: Value, b: Value) -> Result<Value, Error> {
    check_sum(state, "`~`", &a, &b)?;
    Ok(operands(a, b))
}

fn check_mul(state: &State, a: Value, b: Value) -> Result<Value, Error> {
    let (unit, count) = if is_scalar(&a) { (&b, &a) } else { (&a, &b) };
    // Numbers, or operands minijinja refuses itself (a count that is not a usize).
    if let (false, Some(n)) = (is_scalar(unit), count.as_usize()) {
        let cap = budget(state)?.cap;
        if size_of(unit, cap)?.saturating_mul(n) > cap {
            return Err(too_large("`*` (repetition)", cap));
        }
    }
    Ok(operands(a, b))
}

/// `{% set ns.attr = value %}`: the value is bounded like any other.
fn check_set_attr(state: &State, value: Value, ns: Value) -> Result<Value, Error> {
    let cap = budget(state)?.cap;
    if size_of(&value, cap)? > cap {
        return Err(too_large("namespace assignment", cap));
    }
    Ok(operands(value, ns))
}

fn check_value(state: &State, v: Value) -> Result<Value, Error> {
    let cap = budget(state)?.cap;
    if size_of(&v, cap)? > cap {
        return Err(too_large("an expression", cap));
    }
    Ok(v)
}

fn check_emit(state: &State, v: Value) -> Result<Value, Error> {
    let b = budget(state)?;
    let size = match v.as_str() {
        Some(s) => s.len(),
        None => size_of(&v, b.cap)?,
    };
    if size > b.cap {
        return Err(too_large("`{{ }}`", b.cap));
    }
    b.spend(size)?;
    Ok(v)
}

fn check_raw(state: &State, len: usize) -> Result<Value, Error> {
    budget(state)?.spend(len)?;
    Ok(Value::UNDEFINED)
}

/// An estimate of the bytes `v` formats to (see the module docs); the walk stops as soon as the
/// estimate passes `cap`, so it visits at most about `cap / 2` items.
pub(crate) fn size_of(v: &Value, cap: usize) -> Result<usize, Error> {
    let mut total = leaf_size(v, true);
    if total > cap {
        return Ok(total);
    }
    // Iterators over open containers (a map's keys with the map), innermost last.
    let mut open: Vec<(minijinja::value::ValueIter, Option<Value>)> = Vec::new();
    let mut todo: Vec<Value> = Vec::new();
    push_container(v, &mut open)?;
    loop {
        while let Some(item) = todo.pop() {
            total = total.saturating_add(leaf_size(&item, false));
            if total > cap {
                return Ok(total);
            }
            push_container(&item, &mut open)?;
        }
        let Some((iter, map)) = open.last_mut() else {
            return Ok(total);
        };
        match iter.next() {
            None => {
                open.pop();
            }
            Some(key) => {
                if let Some(map) = map {
                    todo.push(map.get_item(&key).unwrap_or_default());
                }
                todo.push(key);
            }
        }
    }
}

/// The size of `v` itself: a string's bytes (plus quotes and separator when nested), a
/// container's brackets plus its length's separators; the items are counted by the walk.
fn leaf_size(v: &Value, top: bool) -> usize {
    let nested = if top { 0 } else { 2 };
    match v.kind() {
        ValueKind::String => v.as_str().map_or(0, str::len) + nested,
        ValueKind::Bytes => v.as_bytes().map_or(0, |b| b.len().saturating_mul(4)) + nested,
        ValueKind::Seq | ValueKind::Iterable | ValueKind::Map => {
            // A sized container counts its separators up front, so `(0,) * 10**12` is refused
            // without iterating.
            2 + nested + v.len().unwrap_or(0).saturating_mul(2)
        }
        ValueKind::Number => v.as_i64().map_or(SCALAR_SIZE, |i| {
            i.unsigned_abs().checked_ilog10().unwrap_or(0) as usize + 2
        }),
        _ => SCALAR_SIZE,
    }
}

fn push_container(
    v: &Value,
    open: &mut Vec<(minijinja::value::ValueIter, Option<Value>)>,
) -> Result<(), Error> {
    let map = match v.kind() {
        ValueKind::Seq | ValueKind::Iterable => None,
        ValueKind::Map => Some(v.clone()),
        _ => return Ok(()),
    };
    if open.len() >= MAX_DEPTH {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("a value is nested more than {MAX_DEPTH} levels deep"),
        ));
    }
    if let Ok(iter) = v.try_iter() {
        open.push((iter, map));
    }
    Ok(())
}

fn check_count(filter: &str, count: usize) -> Result<(), Error> {
    if count > MAX_BATCH {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("{filter} count {count} is over the limit of {MAX_BATCH}"),
        ));
    }
    Ok(())
}

/// minijinja's `batch`, refusing a count over [`MAX_BATCH`] (it reserves `count` slots).
fn batch_filter(
    state: &State,
    value: Value,
    count: usize,
    fill_with: Option<Value>,
) -> Result<Value, Error> {
    check_count("batch", count)?;
    minijinja::filters::batch(state, value, count, fill_with)
}

/// minijinja's `slice`, refusing a count over [`MAX_BATCH`] (it reserves `count` slots).
fn slice_filter(
    state: &State,
    value: Value,
    count: usize,
    fill_with: Option<Value>,
) -> Result<Value, Error> {
    check_count("slice", count)?;
    minijinja::filters::slice(state, value, count, fill_with)
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use minijinja::context;

    use crate::chat::{ChatMessage, ChatTemplate, DEFAULT_FUEL, sandbox_env};
    use crate::error::Error;

    /// The fuzz finding (template, NUL, message), replayed in CI from the corpus too.
    const FINDING: &[u8] =
        include_bytes!("../../fuzz/corpus/chat_template/bad-oom-sequence-repeat-concat");

    fn conversation() -> Vec<ChatMessage> {
        vec![
            ChatMessage::new("system", "  You are terse.  "),
            ChatMessage::new("user", "What is 2+2?"),
            ChatMessage::new("assistant", "<think>\nadd them\n</think>\n\n4  "),
            ChatMessage::new("user", "And 3+3? ünïcode \u{1F600}"),
        ]
    }

    const SMOLLM2: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    /// Renders `src` and returns the error message; each hostile template must fail fast.
    fn refused(src: &str) -> String {
        let t = ChatTemplate::new(src, "<s>", "</s>").expect("compiles");
        let start = Instant::now();
        let r = t.render(&conversation(), true);
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{src}: took {:?}",
            start.elapsed()
        );
        match r {
            Err(Error::Template(msg)) => msg,
            other => panic!("{src}: expected a template error, got {other:?}"),
        }
    }

    /// Peak resident memory of this process (Linux), to show no render allocated gigabytes.
    fn peak_rss_bytes() -> Option<usize> {
        let status = std::fs::read_to_string("/proc/self/status").ok()?;
        let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
        let kb: usize = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kb * 1024)
    }

    fn assert_small_peak() {
        if let Some(peak) = peak_rss_bytes() {
            assert!(peak < 1 << 30, "peak RSS {peak} bytes");
        }
    }

    #[test]
    fn fuzz_finding_sequence_repeat_concat_is_refused() {
        let nul = FINDING.iter().position(|&b| b == 0).expect("NUL");
        let src = std::str::from_utf8(&FINDING[..nul]).expect("UTF-8");
        let msg = refused(src);
        assert!(
            msg.contains("`*` (repetition) would build a value larger than the output limit"),
            "{msg}"
        );
        // The same with the value emitted, joined or converted instead of concatenated.
        for src in [
            "{% set t = (0, 1) %}{{ '' ~ t * 2222222222222 }}",
            "{% set t = (0, 1) %}{{ t * 2222222222222 }}",
            "{% set t = (0, 1) %}{{ (t * 2222222222222)|join }}",
            "{{ 2222222222222 * [messages] }}",
            "{% set s = (0, 'x') %}{{ (s * 100000000)|string }}",
        ] {
            let msg = refused(src);
            assert!(msg.contains("`*` (repetition) would build"), "{src}: {msg}");
        }
        assert_small_peak();
    }

    #[test]
    fn sequence_doubling_is_refused() {
        let unrolled = format!(
            "{{% set x = [0] %}}{}{{{{ '' ~ x }}}}",
            "{% set x = x + x %}".repeat(64)
        );
        for src in [
            unrolled.as_str(),
            "{% set ns = namespace(x=[0]) %}{% for i in range(64) %}{% set ns.x = ns.x + ns.x %}{% endfor %}{{ '' ~ ns.x }}",
            "{% set ns = namespace(x=[0]) %}{% for i in range(64) %}{% set ns.x = ns.x + ns.x %}{% endfor %}{{ ns.x|join }}",
        ] {
            let msg = refused(src);
            assert!(
                msg.contains("`+` would build a value larger than the output limit"),
                "{src}: {msg}"
            );
        }
        assert_small_peak();
    }

    #[test]
    fn string_and_capture_doubling_is_refused() {
        for (src, want) in [
            (
                "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
                "`~` would build",
            ),
            (
                "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
                "`+` would build",
            ),
            (
                "{% macro d(s) %}{{ s }}{{ s }}{% endmacro %}{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = d(ns.s) %}{% endfor %}",
                "output limit",
            ),
            (
                "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set t %}{{ ns.s }}{{ ns.s }}{% endset %}{% set ns.s = t %}{% endfor %}",
                "output limit",
            ),
            (
                "{% macro m() %}{% for i in range(100000) %}{{ 'x' * 100000 }}{% endfor %}{% endmacro %}{% set x = m() %}",
                "output limit",
            ),
            (
                "{% set ns = namespace(a='x' * 1000) %}{% for i in range(64) %}{% set ns.a = [ns.a, ns.a] %}{% endfor %}{{ ns.a|join }}",
                "an expression would build",
            ),
            (
                "{% set ns = namespace(a='x' * 1000) %}{% for i in range(64) %}{% set ns.a = {'k': ns.a, 'v': ns.a} %}{% endfor %}{{ ns.a|tojson }}",
                "an expression would build",
            ),
            (
                "{% set ns = namespace(a=[]) %}{% for i in range(1000) %}{% set ns.a = [ns.a] %}{% endfor %}{{ ns.a }}",
                "nested more than 256 levels",
            ),
            ("{{ [1]|batch(1000000000000) }}", "batch count"),
            ("{{ [1]|slice(1000000000000, 0) }}", "slice count"),
        ] {
            let msg = refused(src);
            assert!(msg.contains(want), "{src}: {msg}");
        }
        assert_small_peak();
    }

    /// minijinja folds constant expressions while compiling: these are refused before that.
    #[test]
    fn huge_constant_expressions_are_refused_at_load() {
        for src in [
            "{{ '' ~ (0, 1) * 2222222222222 }}",
            "{{ ((0, 1) * 2222222222222)|join }}",
            "{{ (0, 1) * (2 * 10 ** 12) }}",
            "{{ 'x' * 100000000 ~ 'x' * 100000000 }}",
            "{{ 5 in (0, 1) * 2222222222222 }}",
            "{% if 'a' ~ (1,) * 10 ** 15 %}{% endif %}",
            "{{ f(x, [1, 2] + (3,) * 10 ** 12) }}",
        ] {
            let start = Instant::now();
            match ChatTemplate::new(src, "", "") {
                Err(Error::Template(msg)) => {
                    assert!(msg.contains("a constant expression"), "{src}: {msg}")
                }
                other => panic!("{src}: {other:?}"),
            }
            assert!(start.elapsed() < Duration::from_secs(5), "{src}");
        }
        // Small constants fold as before.
        let t = ChatTemplate::new("{{ (1, 2) * 2 }}{{ 'ab' * 3 ~ 'c' }}{{ 2 ** 10 }}", "", "")
            .expect("compiles");
        assert_eq!(t.render(&[], false).unwrap(), "[1, 2, 1, 2]abababc1024");
        assert_small_peak();
    }

    #[test]
    fn reserved_names_are_refused_at_load() {
        for src in ["{{ __memra_budget }}", "{% set __memra_add = 1 %}"] {
            match ChatTemplate::new(src, "", "") {
                Err(Error::Template(msg)) => assert!(msg.contains("reserved"), "{msg}"),
                other => panic!("{src}: {other:?}"),
            }
        }
    }

    /// Templates exercising what the rewrite touches (operators, literals, calls, filters,
    /// macros, captures, loops with jumps, recursion) render byte-for-byte as minijinja renders
    /// them without the guard.
    #[test]
    fn guarded_render_matches_unguarded() {
        const LLAMA3: &str = "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";
        const TOUR: &str = r#"{%- set ns = namespace(n=0, parts=[], last=-1) %}
{%- macro show(m, sep='|') -%}[{{ m.role|upper }}{{ sep }}{{ m.content|trim }}]{%- endmacro %}
{%- for m in messages if m.role != 'system' %}
  {%- if loop.index > 2 %}{% break %}{% endif %}
  {%- set ns.n = ns.n + loop.index * 2 - 1 %}
  {%- set ns.parts = ns.parts + [m.role ~ ':' ~ m.content|length] %}
  {{- show(m) }}{{ show(m, sep=' / ') if loop.last else '' }}
{%- else %}none
{%- endfor %}
{%- set block %}{% for x in [3, 1, 2]|sort %}{{ x }}{% if not loop.last %},{% endif %}{% endfor %}{% endset %}
{{ ns.n }} {{ ns.parts|join(';') }} {{ block }} {{ '-' * 5 }} {{ [1, 2] * 2 }} {{ (1, 'a') + [none] }}
{{ 7 // 2 }} {{ 7 % 3 }} {{ 2 ** 10 }} {{ 1.5 + 2 }} {{ 'a' ~ 1 ~ none ~ [1] }} {{ {'k': [1, {'x': 'y'}]} }}
{{ messages|map(attribute='role')|join(',') }} {{ messages|selectattr('role', 'eq', 'user')|list|length }}
{{ messages[1:]|length }} {{ messages[::-1][0].role }} {{ messages|tojson }}
{%- for item in [{'c': [{'c': []}, {'c': []}]}] recursive %}<{{ loop.depth }}{{ loop(item.c) }}>{% endfor %}
{%- if messages[0].content.strip().startswith('You') %} starts{% elif x %} no{% else %} else{% endif %}
{{ 'A-B'.lower().split('-') }} {{ range(3)|list }} {{ [1, 2, 3]|batch(2)|list }} {{ "%s=%d"|format('x', 3) }}
{% if add_generation_prompt %}{{ bos_token + 'go' + eos_token }}{% endif %}"#;
        let sources = [SMOLLM2, LLAMA3, TOUR, crate::models::gemma3::CHAT_TEMPLATE];
        let msgs = conversation();
        let env = sandbox_env(DEFAULT_FUEL);
        for src in sources {
            for gen_prompt in [true, false] {
                let t = ChatTemplate::new(src, "<s>", "</s>").expect("compiles");
                let guarded = t.render(&msgs, gen_prompt).expect("renders");
                let plain = env
                    .template_from_str(src)
                    .and_then(|tmpl| {
                        tmpl.render(context! {
                            messages => &msgs,
                            tools => minijinja::Value::UNDEFINED,
                            add_generation_prompt => gen_prompt,
                            bos_token => "<s>",
                            eos_token => "</s>",
                        })
                    })
                    .expect("renders unguarded");
                assert_eq!(guarded, plain, "{src}");
                assert!(!guarded.is_empty());
            }
        }
    }

    /// Templates that stay within fuel and size limits but would burn CPU for many seconds (one
    /// million iterations of an operation on a ~500 KB value, or 4^12 macro calls) stop at the
    /// deadline with the time-limit error.
    #[test]
    fn slow_templates_hit_the_time_limit() {
        const NESTED: &str =
            "{% for i in range(1000) %}{% for j in range(1000) %}BODY{% endfor %}{% endfor %}";
        let bodies = [
            // `in`: a substring search per iteration, no call, no emission.
            "{% if 'y' in s %}{% endif %}",
            // A filter over a large value.
            "{% set t = s|upper %}",
            // A large string product.
            "{% set t = 'ab' * 200000 %}",
            // Comparison of large lists.
            "{% if l == l2 %}{% endif %}",
            // A test over a large value.
            "{% if 'y' is in s %}{% endif %}",
        ];
        let prelude = "{% set s = 'x' * 500000 %}{% set l = range(50000)|list %}{% set l2 = range(50000)|list %}";
        let mut sources: Vec<String> = bodies
            .iter()
            .map(|b| format!("{prelude}{}", NESTED.replace("BODY", b)))
            .collect();
        // Deep fan-out of macro calls, the deadline surfacing through nested calls.
        sources.push(
            "{% macro m(n) %}{% if n > 0 %}{% for i in range(4) %}{{ m(n - 1) }}{% endfor %}{% endif %}{% endmacro %}{{ m(12) }}"
                .into(),
        );
        let limit = Duration::from_millis(50);
        for src in &sources {
            let t = ChatTemplate::new(src, "<s>", "</s>")
                .expect("compiles")
                .with_time_limit(limit);
            let start = Instant::now();
            let r = t.render(&conversation(), true);
            let took = start.elapsed();
            match r {
                Err(Error::Template(msg)) => assert_eq!(
                    msg, "template render exceeded its time limit of 50 ms",
                    "{src}"
                ),
                other => panic!("{src}: expected the time-limit error, got {other:?}"),
            }
            assert!(took < Duration::from_secs(1), "{src}: took {took:?}");
        }
    }

    /// A time limit too far away to represent is no limit; a short one does not touch a real
    /// template's render.
    #[test]
    fn time_limit_extremes_render_real_templates() {
        let src = crate::models::gemma3::CHAT_TEMPLATE;
        let want = ChatTemplate::new(src, "<s>", "</s>")
            .expect("compiles")
            .render(&conversation(), true)
            .expect("renders");
        for limit in [Duration::MAX, Duration::from_millis(500)] {
            let t = ChatTemplate::new(src, "<s>", "</s>")
                .expect("compiles")
                .with_time_limit(limit);
            assert_eq!(t.render(&conversation(), true).expect("renders"), want);
        }
    }

    /// Render time of real templates, guarded (size checks and deadline) and by plain minijinja
    /// (best of 500 interleaved rounds, 160 messages); run with `--ignored --nocapture`.
    #[test]
    #[ignore]
    fn render_timing() {
        let msgs: Vec<ChatMessage> = (0..40).flat_map(|_| conversation()).collect();
        let env = sandbox_env(DEFAULT_FUEL);
        for (name, src) in [
            ("gemma3", crate::models::gemma3::CHAT_TEMPLATE),
            ("smollm2", SMOLLM2),
        ] {
            let t = ChatTemplate::new(src, "<s>", "</s>").expect("compiles");
            let tmpl = env.template_from_str(src).expect("compiles");
            let (mut guarded, mut plain) = (Duration::MAX, Duration::MAX);
            for _ in 0..500 {
                let start = Instant::now();
                let a = t.render(&msgs, true).expect("renders");
                guarded = guarded.min(start.elapsed());
                let start = Instant::now();
                let b = tmpl
                    .render(context! {
                        messages => &msgs,
                        add_generation_prompt => true,
                        bos_token => "<s>",
                        eos_token => "</s>",
                    })
                    .expect("renders");
                plain = plain.min(start.elapsed());
                assert_eq!(a, b);
            }
            eprintln!("TIMING {name}: guarded {guarded:?}, plain minijinja {plain:?}");
        }
    }
}
