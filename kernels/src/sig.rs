//! Kernel signatures read from the CUDA sources themselves, so the host's launches are checked
//! against one table that cannot drift from the kernels: every `extern "C" __global__` function of
//! a module, directly declared or stamped out by a `#define X_KERNEL(suffix, ...)` macro and its
//! invocations, with the kind of each parameter. The tests hold every module's kernel list to
//! its source; the CUDA backend refuses a launch whose arguments do not match (a clear error
//! instead of undefined behaviour).

/// The kind of one kernel parameter, as the host passes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Param {
    /// Any pointer (a device address).
    Ptr,
    U32,
    U64,
    F32,
}

/// One kernel: its name and parameters in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Signature {
    pub name: String,
    pub params: Vec<Param>,
}

/// `src` without comments, with macro line continuations joined.
fn clean(src: &str) -> String {
    let mut out = String::with_capacity(src.len());
    let b = src.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
            i += 2;
            while i + 1 < b.len() && !(b[i] == b'*' && b[i + 1] == b'/') {
                i += 1;
            }
            i += 2;
        } else if b[i] == b'\\' && b.get(i + 1) == Some(&b'\n') {
            out.push(' ');
            i += 2;
        } else {
            out.push(b[i] as char);
            i += 1;
        }
    }
    out
}

/// The text inside the parentheses that open at byte `open` of `s`, and the index after them.
fn parens(s: &str, open: usize) -> Option<(&str, usize)> {
    let b = s.as_bytes();
    if b.get(open) != Some(&b'(') {
        return None;
    }
    let mut depth = 0usize;
    for (i, &c) in b.iter().enumerate().skip(open) {
        match c {
            b'(' => depth += 1,
            b')' => {
                depth -= 1;
                if depth == 0 {
                    return Some((&s[open + 1..i], i + 1));
                }
            }
            _ => {}
        }
    }
    None
}

fn skip_ws(s: &str, mut i: usize) -> usize {
    while s.as_bytes().get(i).is_some_and(|c| c.is_ascii_whitespace()) {
        i += 1;
    }
    i
}

fn ident(s: &str, i: usize) -> (&str, usize) {
    let b = s.as_bytes();
    let mut j = i;
    while j < b.len() && (b[j].is_ascii_alphanumeric() || b[j] == b'_' || b[j] == b'#') {
        j += 1;
    }
    (&s[i..j], j)
}

/// The kind of one parameter declaration (`const float* __restrict__ X`, `u32 n`).
fn param_kind(decl: &str) -> Result<Param, String> {
    if decl.contains('*') {
        return Ok(Param::Ptr);
    }
    let words: Vec<&str> = decl
        .split_whitespace()
        .filter(|w| !matches!(*w, "const" | "__restrict__"))
        .collect();
    match words.as_slice() {
        [ty, _name] => match *ty {
            "u32" | "unsigned" | "uint32_t" => Ok(Param::U32),
            "u64" | "uint64_t" => Ok(Param::U64),
            "float" => Ok(Param::F32),
            other => Err(format!(
                "parameter `{decl}`: type `{other}` has no host kind"
            )),
        },
        _ => Err(format!("parameter `{decl}`: not `TYPE NAME`")),
    }
}

fn params_of(list: &str) -> Result<Vec<Param>, String> {
    if list.trim().is_empty() {
        return Ok(Vec::new());
    }
    list.split(',').map(|d| param_kind(d.trim())).collect()
}

/// After `extern "C" __global__ void` at `i`: the (possibly `##`-templated) name and the
/// parameter list text.
/// Attributes between `void` and the name are skipped: `__launch_bounds__(..)`,
/// `__cluster_dims__(..)` and upper-case macros that stand for them (`MWS_ATTRS`).
fn declaration(s: &str, i: usize) -> Result<(String, &str), String> {
    let mut j = skip_ws(s, i);
    loop {
        let (word, after) = ident(s, j);
        if word == "__launch_bounds__" || word == "__cluster_dims__" {
            let (_, end) = parens(s, after).ok_or_else(|| format!("unbalanced {word}"))?;
            j = skip_ws(s, end);
            continue;
        }
        let next = skip_ws(s, after);
        let upper = word
            .bytes()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == b'_');
        if !word.is_empty() && upper && s.as_bytes().get(next) != Some(&b'(') {
            j = next;
            continue;
        }
        break;
    }
    let (name, after) = ident(s, j);
    let (list, _) =
        parens(s, skip_ws(s, after)).ok_or_else(|| format!("kernel {name}: no parameter list"))?;
    Ok((name.to_string(), list))
}

const KERNEL: &str = "extern \"C\" __global__ void";

/// Every kernel `src` defines, in source order (macro-stamped ones at their invocations). Two
/// macro forms are understood: a kernel macro (`#define K(suffix, ...)` whose body declares a
/// kernel named with `##suffix`), invoked as `K(q4_0, ...)`; and a list macro (`#define
/// EACH(M) M(a, ...) M(b, ...)`) applied to a kernel macro as `EACH(K)`.
pub fn signatures(src: &str) -> Result<Vec<Signature>, String> {
    let s = clean(src);
    let mut out = Vec::new();
    // Kernel macros: (macro name, name template with `##suffix`, suffix parameter, parameters).
    let mut kmacros: Vec<(String, String, String, Vec<Param>)> = Vec::new();
    // List macros: (macro name, its parameter, body).
    let mut lists: Vec<(String, String, String)> = Vec::new();
    let mut calls: Vec<(String, String)> = Vec::new();
    for line in s.lines() {
        let t = line.trim_start();
        if let Some(rest) = t.strip_prefix("#define ") {
            let (mname, after) = ident(rest, 0);
            let Some((margs, body_at)) = parens(rest, after) else {
                continue;
            };
            let first = margs.split(',').next().unwrap_or("").trim().to_string();
            if let Some(k) = rest.find(KERNEL) {
                let (name, list) = declaration(rest, k + KERNEL.len())?;
                let params = params_of(list).map_err(|e| format!("kernel {name}: {e}"))?;
                kmacros.push((mname.to_string(), name, first, params));
            } else if !margs.contains(',') && rest[body_at..].contains(&format!("{first}(")) {
                lists.push((mname.to_string(), first, rest[body_at..].to_string()));
            }
            continue;
        }
        if t.starts_with('#') {
            continue;
        }
        let (name, after) = ident(t, 0);
        if name.is_empty() {
            continue;
        }
        if let Some((args, _)) = parens(t, after) {
            calls.push((name.to_string(), args.to_string()));
        }
    }
    // Expand list macros into kernel macro calls.
    let mut expanded = Vec::new();
    for (name, args) in calls {
        match lists.iter().find(|l| l.0 == name) {
            Some((_, p, body)) => {
                let pat = format!("{p}(");
                let mut i = 0;
                while let Some(k) = body[i..].find(&pat) {
                    let open = i + k + p.len();
                    let (inner, next) = parens(body, open).ok_or("unbalanced list macro")?;
                    expanded.push((args.trim().to_string(), inner.to_string()));
                    i = next;
                }
            }
            None => expanded.push((name, args)),
        }
    }
    for (name, args) in expanded {
        if let Some(m) = kmacros.iter().find(|m| m.0 == name) {
            let arg = args.split(',').next().unwrap_or("").trim();
            out.push(Signature {
                name: m.1.replace(&format!("##{}", m.2), arg).replace("##", ""),
                params: m.3.clone(),
            });
        }
    }
    // Direct declarations (outside #define lines).
    let mut at = 0;
    for line in s.split_inclusive('\n') {
        let here = at;
        at += line.len();
        if line.trim_start().starts_with('#') {
            continue;
        }
        let Some(k) = line.find(KERNEL) else {
            continue;
        };
        let (name, list) = declaration(&s, here + k + KERNEL.len())?;
        let params = params_of(list).map_err(|e| format!("kernel {name}: {e}"))?;
        out.push(Signature { name, params });
    }
    Ok(out)
}

/// The kernel definitions in `src` whose body does not begin with the statement `first` (each
/// named by the text of its declaration up to the body): every kernel must run prelude.cuh's
/// `pdl_entry();` before touching memory, because the host launches it while the kernel before
/// it may still be running (programmatic dependent launch).
pub fn kernels_not_starting_with(src: &str, first: &str) -> Vec<String> {
    let s = clean(src);
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(k) = s[i..].find(KERNEL) {
        let at = i + k;
        let Some(b) = s[at..].find('{') else {
            out.push(s[at..].trim().to_string());
            break;
        };
        let body = at + b + 1;
        if !s[body..].trim_start().starts_with(first) {
            out.push(
                s[at..at + b]
                    .split_whitespace()
                    .collect::<Vec<_>>()
                    .join(" "),
            );
        }
        i = body;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_kernels_without_the_entry_statement() {
        let src = r#"
extern "C" __global__ void __launch_bounds__(256) a(u32 n) {
    pdl_entry();
    go(n);
}
#define K(suffix) \
    extern "C" __global__ void k_##suffix(u32 n) { pdl_entry(); go(n); }
extern "C" __global__ void b(u32 n) { /* first */ go(n); pdl_entry(); }
"#;
        let bad = kernels_not_starting_with(src, "pdl_entry();");
        assert_eq!(bad, vec!["extern \"C\" __global__ void b(u32 n)"]);
    }

    #[test]
    fn reads_direct_and_macro_kernels() {
        let src = r#"
// a comment with extern "C" __global__ void fake(int x)
extern "C" __global__ void __launch_bounds__(128, 2) one(const float* __restrict__ a, u32 n,
                                                       float s, u64 m) {
    /* body */
}
#define K(suffix, T)                                     \
    extern "C" __global__ void k_##suffix(u8* w, u32 n) { \
        go<T>(w, n);                                     \
    }
K(q4, A)
K(f16, B<0>)
#define ATTRS __cluster_dims__(1, 2, 1) __launch_bounds__(384, 1)
#define C(suffix, T)                                          \
    extern "C" __global__ void ATTRS c_##suffix(u8* w, u32 n) { \
        go<T>(w, n);                                          \
    }
C(f16, B<0>)
#define EACH(M) \
    M(x, X1)    \
    M(y, Y1)
EACH(K)
"#;
        let got = signatures(src).unwrap();
        let names: Vec<&str> = got.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, vec!["k_q4", "k_f16", "c_f16", "k_x", "k_y", "one"]);
        assert_eq!(got[2].params, vec![Param::Ptr, Param::U32]);
        assert_eq!(
            got[5].params,
            vec![Param::Ptr, Param::U32, Param::F32, Param::U64]
        );
        assert_eq!(got[0].params, vec![Param::Ptr, Param::U32]);
    }

    #[test]
    fn unknown_parameter_types_are_errors() {
        let e = signatures("extern \"C\" __global__ void f(double x) {}").unwrap_err();
        assert!(e.contains("double"), "{e}");
    }
}

#[cfg(test)]
mod modules {
    use super::signatures;

    /// Every module's kernel list is exactly the kernels its source defines, each with host
    /// parameter kinds (a kernel missing from the list is "not built" at run time; one listed
    /// but not defined fails to load).
    #[test]
    fn module_lists_match_their_sources() {
        for m in crate::MODULES {
            let sigs =
                signatures(&crate::full_source(m)).unwrap_or_else(|e| panic!("{}: {e}", m.file));
            let mut defined: Vec<&str> = sigs.iter().map(|s| s.name.as_str()).collect();
            let mut listed: Vec<&str> = m.kernels.to_vec();
            defined.sort();
            listed.sort();
            assert_eq!(defined, listed, "{}", m.file);
        }
    }

    /// Every kernel starts with `pdl_entry();` or `pdl_entry_trigger();` (the host launches with
    /// programmatic dependent launch on sm_90+: a kernel touching memory before that wait would
    /// race the one before). One exception: the dense products (products.cu `mmq_<type>`) start
    /// with `product_early<`, which requests weight tiles (never written while a model is
    /// loaded) before its wait, and waits before anything else.
    #[test]
    fn every_kernel_waits_for_its_predecessor_first() {
        for m in crate::MODULES {
            let lists = ["pdl_entry();", "pdl_entry_trigger();", "product_early<"]
                .map(|first| super::kernels_not_starting_with(m.source, first));
            let bad: Vec<_> = lists[0]
                .iter()
                .filter(|k| lists[1].contains(k) && lists[2].contains(k))
                .collect();
            assert!(bad.is_empty(), "{}: {bad:?}", m.file);
        }
        // product's early wait: right after the first weight requests, before the first tile's
        // activations are read (tile_blocks) and, for a warp without a row tile, before the store.
        let products = crate::MODULES.iter().find(|m| m.name == "products");
        let src = products.map_or("", |m| m.source);
        let body = src.split("void product(").nth(1).unwrap_or("");
        let wait = body.find("if (PRE && s == s0) pdl_entry();");
        let first_read = body.find("tile_blocks<F>(");
        assert!(
            matches!((wait, first_read), (Some(w), Some(r)) if w < r),
            "product must wait before it reads activations"
        );
        assert!(body.contains("if (PRE && !live) pdl_entry();"));
    }
}
