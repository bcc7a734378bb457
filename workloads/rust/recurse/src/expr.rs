//! Generated arithmetic expressions and two independent evaluators.
//!
//! Arithmetic is on wrapping `u64`, so every expression has exactly one value
//! and the evaluators must agree bit for bit. Binary operators are applied
//! through a table of function pointers (indirect calls).

use common::Rng;

/// A binary operator on wrapping integers.
type BinOp = fn(u64, u64) -> u64;

/// The operators, in table order: `+`, `-`, `*`.
const OPS: [(u8, BinOp); 3] = [
    (b'+', u64::wrapping_add),
    (b'-', u64::wrapping_sub),
    (b'*', u64::wrapping_mul),
];

fn apply(op: u8, a: u64, b: u64) -> u64 {
    let f = OPS.iter().find(|(c, _)| *c == op).map(|(_, f)| *f);
    f.expect("operator from the table")(a, b)
}

fn precedence(op: u8) -> u8 {
    if op == b'*' {
        2
    } else {
        1
    }
}

/// An expression with a spine of `nesting` nested parentheses and short
/// random side branches; its size is linear in `nesting`.
pub fn generate(rng: &mut Rng, nesting: u32) -> String {
    let mut out = String::new();
    gen(rng, nesting, &mut out);
    out
}

fn gen(rng: &mut Rng, depth: u32, out: &mut String) {
    if depth == 0 {
        out.push_str(&(rng.below(1000)).to_string());
        return;
    }
    let op = OPS[rng.below(3) as usize].0 as char;
    let side = rng.below(4);
    out.push('(');
    if side == 0 {
        gen(rng, depth.min(3) - 1, out);
        out.push(op);
        gen(rng, depth - 1, out);
    } else {
        gen(rng, depth - 1, out);
        out.push(op);
        out.push_str(&rng.below(100).to_string());
        if side == 1 {
            out.push('*');
            out.push_str(&(rng.below(9) + 1).to_string());
        }
    }
    out.push(')');
}

/// Recursive descent: expr := term (('+'|'-') term)*, term := factor ('*' factor)*,
/// factor := number | '(' expr ')'. Returns None on malformed input.
pub fn eval_recursive(s: &[u8]) -> Option<u64> {
    let mut pos = 0;
    let v = expr(s, &mut pos)?;
    (pos == s.len()).then_some(v)
}

fn expr(s: &[u8], pos: &mut usize) -> Option<u64> {
    let mut acc = term(s, pos)?;
    while let Some(&op @ (b'+' | b'-')) = s.get(*pos) {
        *pos += 1;
        acc = apply(op, acc, term(s, pos)?);
    }
    Some(acc)
}

fn term(s: &[u8], pos: &mut usize) -> Option<u64> {
    let mut acc = factor(s, pos)?;
    while s.get(*pos) == Some(&b'*') {
        *pos += 1;
        acc = apply(b'*', acc, factor(s, pos)?);
    }
    Some(acc)
}

fn factor(s: &[u8], pos: &mut usize) -> Option<u64> {
    match s.get(*pos)? {
        b'(' => {
            *pos += 1;
            let v = expr(s, pos)?;
            (s.get(*pos) == Some(&b')')).then(|| *pos += 1)?;
            Some(v)
        }
        c if c.is_ascii_digit() => {
            let mut v = 0u64;
            while let Some(c @ b'0'..=b'9') = s.get(*pos) {
                v = v.wrapping_mul(10).wrapping_add(u64::from(c - b'0'));
                *pos += 1;
            }
            Some(v)
        }
        _ => None,
    }
}

/// Shunting-yard with explicit stacks (no recursion); input assumed well formed.
pub fn eval_iterative(s: &[u8]) -> u64 {
    let mut vals: Vec<u64> = Vec::new();
    let mut ops: Vec<u8> = Vec::new();
    fn reduce(vals: &mut Vec<u64>, op: u8) {
        let b = vals.pop().expect("right operand");
        let a = vals.pop().expect("left operand");
        vals.push(apply(op, a, b));
    }
    let mut i = 0;
    while i < s.len() {
        match s[i] {
            b'(' => ops.push(b'('),
            b')' => {
                while let Some(op) = ops.pop().filter(|&o| o != b'(') {
                    reduce(&mut vals, op);
                }
            }
            c if c.is_ascii_digit() => {
                let mut v = 0u64;
                while i < s.len() && s[i].is_ascii_digit() {
                    v = v.wrapping_mul(10).wrapping_add(u64::from(s[i] - b'0'));
                    i += 1;
                }
                vals.push(v);
                continue;
            }
            op => {
                while let Some(&top) = ops.last() {
                    if top == b'(' || precedence(top) < precedence(op) {
                        break;
                    }
                    reduce(&mut vals, top);
                    ops.pop();
                }
                ops.push(op);
            }
        }
        i += 1;
    }
    while let Some(op) = ops.pop() {
        reduce(&mut vals, op);
    }
    vals.pop().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evaluators_agree_with_hand_computed_values() {
        for (text, want) in [
            ("1+2*3", 7u64),
            ("(1+2)*3", 9),
            ("2-5", 2u64.wrapping_sub(5)),
            ("((7))", 7),
            ("10-2-3", 5),
            ("2*3*4-1", 23),
        ] {
            assert_eq!(eval_recursive(text.as_bytes()), Some(want), "{text}");
            assert_eq!(eval_iterative(text.as_bytes()), want, "{text}");
        }
    }

    #[test]
    fn recursive_evaluator_rejects_malformed_input() {
        for bad in ["(1+2", "1+", "", "1)", "x"] {
            assert_eq!(eval_recursive(bad.as_bytes()), None, "{bad}");
        }
    }

    #[test]
    fn generated_expressions_nest_and_agree() {
        let mut rng = Rng::new(3);
        let text = generate(&mut rng, 200);
        let depth = text.bytes().fold((0i32, 0i32), |(d, m), c| match c {
            b'(' => (d + 1, m.max(d + 1)),
            b')' => (d - 1, m),
            _ => (d, m),
        });
        assert_eq!(depth, (0, 200));
        assert_eq!(
            eval_recursive(text.as_bytes()),
            Some(eval_iterative(text.as_bytes()))
        );
    }
}
