//! Load-time check of a chat template's constant expressions.
//!
//! minijinja folds constant expressions while it compiles (`(0, 1) * 10**12`, `'' ~ [1, 2] * n`,
//! `'x' * 10**8 ~ 'x' * 10**8`, ...): it evaluates them once, at `template_from_str`, before any
//! render guard (`chat_guard`) can run, and the folded value is then loaded as a constant. So
//! before compiling, [`check`] parses the source itself (minijinja's parser, `unstable_machinery`)
//! and estimates, without evaluating anything large, the size of every expression that the
//! compiler will fold, following minijinja's own folding rules (`Expr::as_const`). A template
//! with a constant expression over [`MAX_CONST_SIZE`] estimated bytes is refused at load.
//! Only a side that is known to be small (a number, at most [`chat_guard::SCALAR_SIZE`] bytes) is
//! evaluated, to learn a repetition count.

use minijinja::machinery::ast::{BinOpKind, CallArg, Expr, Stmt};
use minijinja::machinery::{WhitespaceConfig, parse};
use minijinja::syntax::SyntaxConfig;
use minijinja::{Error, ErrorKind};

use crate::chat_guard::{SCALAR_SIZE, is_scalar, size_of};

/// Largest estimated size of a constant expression (a real template's are a few bytes).
pub(crate) const MAX_CONST_SIZE: usize = 1 << 20;

/// Refuses `source` if it has a constant expression over [`MAX_CONST_SIZE`]. A source that does not
/// parse passes: compiling it reports the syntax error.
pub(crate) fn check(source: &str) -> Result<(), Error> {
    let ws = WhitespaceConfig {
        keep_trailing_newline: false,
        lstrip_blocks: true,
        trim_blocks: true,
    };
    // A unit struct without minijinja's `custom_syntax` feature, a struct with it.
    #[allow(clippy::default_constructed_unit_structs)]
    let syntax = SyntaxConfig::default();
    match parse(source, "<string>", syntax, ws) {
        Ok(ast) => stmt(&ast),
        Err(_) => Ok(()),
    }
}

fn stmts(list: &[Stmt<'_>]) -> Result<(), Error> {
    list.iter().try_for_each(stmt)
}

fn stmt(s: &Stmt<'_>) -> Result<(), Error> {
    match s {
        Stmt::Template(t) => stmts(&t.children),
        Stmt::EmitExpr(e) => expr(&e.expr),
        Stmt::EmitRaw(_) | Stmt::Continue(_) | Stmt::Break(_) => Ok(()),
        Stmt::ForLoop(f) => {
            expr(&f.target)?;
            expr(&f.iter)?;
            f.filter_expr.as_ref().map_or(Ok(()), expr)?;
            stmts(&f.body)?;
            stmts(&f.else_body)
        }
        Stmt::IfCond(c) => {
            expr(&c.expr)?;
            stmts(&c.true_body)?;
            stmts(&c.false_body)
        }
        Stmt::WithBlock(w) => {
            for (a, b) in &w.assignments {
                expr(a)?;
                expr(b)?;
            }
            stmts(&w.body)
        }
        Stmt::Set(s) => {
            expr(&s.target)?;
            expr(&s.expr)
        }
        Stmt::SetBlock(s) => {
            expr(&s.target)?;
            s.filter.as_ref().map_or(Ok(()), expr)?;
            stmts(&s.body)
        }
        Stmt::AutoEscape(a) => {
            expr(&a.enabled)?;
            stmts(&a.body)
        }
        Stmt::FilterBlock(f) => {
            expr(&f.filter)?;
            stmts(&f.body)
        }
        Stmt::Block(b) => stmts(&b.body),
        Stmt::Import(i) => {
            expr(&i.expr)?;
            expr(&i.name)
        }
        Stmt::FromImport(i) => {
            expr(&i.expr)?;
            for (a, b) in &i.names {
                expr(a)?;
                b.as_ref().map_or(Ok(()), expr)?;
            }
            Ok(())
        }
        Stmt::Extends(e) => expr(&e.name),
        Stmt::Include(i) => expr(&i.name),
        Stmt::Macro(m) => {
            m.args.iter().try_for_each(expr)?;
            m.defaults.iter().try_for_each(expr)?;
            stmts(&m.body)
        }
        Stmt::CallBlock(c) => {
            expr(&c.call.expr)?;
            args(&c.call.args)?;
            c.macro_decl.args.iter().try_for_each(expr)?;
            c.macro_decl.defaults.iter().try_for_each(expr)?;
            stmts(&c.macro_decl.body)
        }
        Stmt::Do(d) => {
            expr(&d.call.expr)?;
            args(&d.call.args)
        }
    }
}

fn args(list: &[CallArg<'_>]) -> Result<(), Error> {
    list.iter().try_for_each(|a| match a {
        CallArg::Pos(e) | CallArg::Kwarg(_, e) | CallArg::PosSplat(e) | CallArg::KwargSplat(e) => {
            expr(e)
        }
    })
}

/// Checks every constant subexpression of `e` (the compiler tries to fold each node).
fn expr(e: &Expr<'_>) -> Result<(), Error> {
    if is_const(e) {
        return const_size(e).map(|_| ());
    }
    match e {
        Expr::Var(_) | Expr::Const(_) => Ok(()),
        Expr::Slice(s) => {
            expr(&s.expr)?;
            for part in [&s.start, &s.stop, &s.step].into_iter().flatten() {
                expr(part)?;
            }
            Ok(())
        }
        Expr::UnaryOp(u) => expr(&u.expr),
        Expr::BinOp(b) => {
            expr(&b.left)?;
            expr(&b.right)
        }
        Expr::Compare(c) => {
            expr(&c.expr)?;
            c.ops.iter().try_for_each(|op| expr(&op.expr))
        }
        Expr::IfExpr(i) => {
            expr(&i.test_expr)?;
            expr(&i.true_expr)?;
            i.false_expr.as_ref().map_or(Ok(()), expr)
        }
        Expr::Filter(f) => {
            f.expr.as_ref().map_or(Ok(()), expr)?;
            args(&f.args)
        }
        Expr::Test(t) => {
            expr(&t.expr)?;
            args(&t.args)
        }
        Expr::GetAttr(g) => expr(&g.expr),
        Expr::GetItem(g) => {
            expr(&g.expr)?;
            expr(&g.subscript_expr)
        }
        Expr::Call(c) => {
            expr(&c.expr)?;
            args(&c.args)
        }
        Expr::List(l) => l.items.iter().try_for_each(expr),
        Expr::Map(m) => {
            m.keys.iter().try_for_each(expr)?;
            m.values.iter().try_for_each(expr)
        }
    }
}

/// Whether minijinja's `Expr::as_const` folds `e` (the same rules, nothing evaluated).
fn is_const(e: &Expr<'_>) -> bool {
    match e {
        Expr::Const(_) => true,
        Expr::List(l) => l.items.iter().all(|i| matches!(i, Expr::Const(_))),
        Expr::Map(m) => m
            .keys
            .iter()
            .chain(m.values.iter())
            .all(|i| matches!(i, Expr::Const(_))),
        Expr::UnaryOp(u) => is_const(&u.expr),
        Expr::BinOp(b) => is_const(&b.left) && is_const(&b.right),
        Expr::Compare(c) => is_const(&c.expr) && c.ops.iter().all(|op| is_const(&op.expr)),
        _ => false,
    }
}

fn too_large(size: usize) -> Error {
    Error::new(
        ErrorKind::InvalidOperation,
        format!(
            "a constant expression in the template would build a value of about {size} bytes \
             (limit {MAX_CONST_SIZE})"
        ),
    )
}

/// Estimated formatted size of the constant expression `e` (`is_const(e)`), refusing any node over
/// [`MAX_CONST_SIZE`].
fn const_size(e: &Expr<'_>) -> Result<usize, Error> {
    let size = match e {
        Expr::Const(c) => size_of(&c.value, MAX_CONST_SIZE)?,
        Expr::List(l) => {
            let mut size = 2usize;
            for item in &l.items {
                size = size.saturating_add(const_size(item)?.saturating_add(2));
            }
            size
        }
        Expr::Map(m) => {
            let mut size = 2usize;
            for item in m.keys.iter().chain(m.values.iter()) {
                size = size.saturating_add(const_size(item)?.saturating_add(2));
            }
            size
        }
        Expr::UnaryOp(u) => {
            const_size(&u.expr)?;
            SCALAR_SIZE
        }
        Expr::Compare(c) => {
            const_size(&c.expr)?;
            for op in &c.ops {
                const_size(&op.expr)?;
            }
            SCALAR_SIZE
        }
        Expr::BinOp(b) => {
            let (l, r) = (const_size(&b.left)?, const_size(&b.right)?);
            match b.op {
                BinOpKind::Add | BinOpKind::Concat => l.saturating_add(r),
                BinOpKind::Mul => product_size(&b.left, &b.right, l, r),
                BinOpKind::ScAnd | BinOpKind::ScOr => l.max(r),
                _ => SCALAR_SIZE,
            }
        }
        _ => 0,
    };
    if size > MAX_CONST_SIZE {
        return Err(too_large(size));
    }
    Ok(size)
}

/// Size of `left * right` (sizes `l`, `r`): the non-number side times the number, as
/// minijinja's `ops::mul` repeats a string or sequence; a number is at most `SCALAR_SIZE`, so
/// only sides that small are evaluated.
fn product_size(left: &Expr<'_>, right: &Expr<'_>, l: usize, r: usize) -> usize {
    let small = |e: &Expr<'_>, size: usize| (size <= SCALAR_SIZE).then(|| e.as_const()).flatten();
    let count = |v: &minijinja::Value| v.as_usize().unwrap_or(0);
    match (small(left, l), small(right, r)) {
        (Some(a), Some(b)) if is_scalar(&a) && is_scalar(&b) => SCALAR_SIZE,
        (Some(a), _) if is_scalar(&a) => r.saturating_mul(count(&a)),
        (_, Some(b)) if is_scalar(&b) => l.saturating_mul(count(&b)),
        // Neither side is a number: minijinja refuses the product.
        _ => SCALAR_SIZE,
    }
}
