//! The CEL selectors this driver's classes and the webhook write, read as a conjunction
//! (`&&`) of these terms:
//! - `device.driver == "<d>"`;
//! - `device.attributes["<domain>"].<name> == <lit>` (string, int or bool literal);
//! - `device.attributes["<domain>"].<name> in [<lit>, ...]` (literals of one type, as
//!   Kubernetes' CEL environment requires homogeneous list literals);
//! - `device.capacity["<domain>"].<name>.compareTo(quantity("<q>")) <op> 0`, `<op>` one of
//!   `==`, `<`, `>`, `<=`, `>=` (the capacity is a Kubernetes quantity);
//! - `!(<term>)`, the negation of any of these.
//!
//! That is what the allocator model evaluates; any other CEL is refused with an error that
//! names it (the real kube-scheduler evaluates full CEL; our stand-in does not pretend to).
//! Evaluation follows upstream's: a lookup of an attribute or capacity the device lacks is a
//! runtime error (upstream: "any reference to an unknown field will cause an evaluation error
//! and allocation to abort"), `&&` is CEL's (false wins over an error, an error over true),
//! and `!` of an error is an error.
//!
//! Hand-written rather than a CEL library (none is a workspace dependency): only the
//! selectors this driver writes are read, and a full evaluator would accept expressions the
//! allocator model could not mirror. Quantity literals are whole numbers with an optional
//! suffix ([`hami_dra_core::quantity`]); a fraction (`1.5Gi`, valid upstream) is refused by name.

use std::cmp::Ordering;

use hami_dra_core::api::{Device, DeviceAttribute};
use hami_dra_core::quantity;

/// How a capacity compares to a quantity literal (`compareTo(...) <op> 0`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cmp {
    /// `== 0`.
    Eq,
    /// `< 0`.
    Lt,
    /// `> 0`.
    Gt,
    /// `<= 0`.
    Le,
    /// `>= 0`.
    Ge,
}

impl Cmp {
    fn holds(self, o: Ordering) -> bool {
        match self {
            Cmp::Eq => o.is_eq(),
            Cmp::Lt => o.is_lt(),
            Cmp::Gt => o.is_gt(),
            Cmp::Le => o.is_le(),
            Cmp::Ge => o.is_ge(),
        }
    }
    fn text(self) -> &'static str {
        match self {
            Cmp::Eq => "==",
            Cmp::Lt => "<",
            Cmp::Gt => ">",
            Cmp::Le => "<=",
            Cmp::Ge => ">=",
        }
    }
}

/// One conjunct of a selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Term {
    /// `device.driver == "<d>"`.
    Driver(String),
    /// Fully qualified attribute name (`<domain>/<name>`) equals the value.
    Attribute {
        /// `<domain>/<name>`.
        name: String,
        /// The literal it must equal.
        value: DeviceAttribute,
    },
    /// Fully qualified attribute name is one of the values.
    AttributeIn {
        /// `<domain>/<name>`.
        name: String,
        /// The list literal (one type).
        values: Vec<DeviceAttribute>,
    },
    /// Fully qualified capacity name compared to a quantity.
    Capacity {
        /// `<domain>/<name>`.
        name: String,
        /// The comparison with `compareTo`'s result.
        cmp: Cmp,
        /// The quantity literal as written.
        quantity: String,
        /// Its value.
        value: u64,
    },
    /// `!(<term>)`.
    Not(Box<Term>),
}

/// A selector this model cannot read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "selector {expression:?}: {problem}; supported: `device.driver == \"…\"`, `device.attributes[\"<domain>\"].<name> == <string|int|bool>`, `device.attributes[\"<domain>\"].<name> in [<literals of one type>]`, `device.capacity[\"<domain>\"].<name>.compareTo(quantity(\"<q>\")) <==|<|>|<=|>=> 0` and `!(<one of these>)`, joined by &&"
)]
pub struct SelectorError {
    /// The expression.
    pub expression: String,
    /// What is not supported in it.
    pub problem: String,
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    Str(String),
    Int(i64),
    Punct(&'static str),
}

fn show(t: Option<&Tok>) -> String {
    match t {
        None => "the end".into(),
        Some(Tok::Ident(s)) => format!("`{s}`"),
        Some(Tok::Str(s)) => format!("\"{s}\""),
        Some(Tok::Int(i)) => format!("`{i}`"),
        Some(Tok::Punct(p)) => format!("`{p}`"),
    }
}

const PUNCT: &[&str] = &[
    "&&", "||", "==", "!=", "<=", ">=", "<", ">", "!", "(", ")", "[", "]", ".", ",", "?", ":", "+",
    "*", "/", "%", "{", "}",
];

fn lex(s: &str) -> Result<Vec<Tok>, String> {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c.is_ascii_whitespace() {
            i += 1;
        } else if c == b'"' {
            let (text, len) = string(&s[i + 1..])?;
            out.push(Tok::Str(text));
            i += 1 + len;
        } else if c == b'\'' {
            return Err("single-quoted strings are not supported (use \"…\")".into());
        } else if c.is_ascii_digit() || (c == b'-' && b.get(i + 1).is_some_and(u8::is_ascii_digit))
        {
            let start = i;
            i += 1;
            while i < b.len() && b[i].is_ascii_alphanumeric() {
                i += 1;
            }
            let text = &s[start..i];
            let n = text
                .parse::<i64>()
                .map_err(|_| format!("`{text}` is not a decimal int literal"))?;
            out.push(Tok::Int(n));
        } else if c.is_ascii_alphabetic() || c == b'_' {
            let start = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
            out.push(Tok::Ident(s[start..i].to_string()));
        } else if let Some(p) = PUNCT.iter().find(|p| s[i..].starts_with(**p)) {
            out.push(Tok::Punct(p));
            i += p.len();
        } else {
            let ch = s[i..].chars().next().unwrap_or('?');
            return Err(format!("unexpected character {ch:?}"));
        }
    }
    Ok(out)
}

/// A double-quoted string's contents after the opening quote: the text and the bytes it
/// took, closing quote included. CEL's escapes `\\ \" \' \n \r \t \xHH \uHHHH
/// \UHHHHHHHH` are read (what a webhook escaping names writes); others are refused.
fn string(s: &str) -> Result<(String, usize), String> {
    let mut out = String::new();
    let mut chars = s.char_indices();
    while let Some((at, c)) = chars.next() {
        match c {
            '"' => return Ok((out, at + 1)),
            '\\' => {
                let Some((_, e)) = chars.next() else { break };
                let hex = |chars: &mut std::str::CharIndices, n: usize| {
                    let digits: String = chars.by_ref().take(n).map(|(_, c)| c).collect();
                    u32::from_str_radix(&digits, 16)
                        .ok()
                        .filter(|_| digits.len() == n)
                        .and_then(char::from_u32)
                        .ok_or_else(|| format!("bad escape \\{e}{digits} in a string"))
                };
                out.push(match e {
                    '\\' | '"' | '\'' => e,
                    'n' => '\n',
                    'r' => '\r',
                    't' => '\t',
                    'x' => hex(&mut chars, 2)?,
                    'u' => hex(&mut chars, 4)?,
                    'U' => hex(&mut chars, 8)?,
                    other => {
                        return Err(format!("unsupported escape \\{other} in a string"));
                    }
                });
            }
            c => out.push(c),
        }
    }
    Err("unterminated string".into())
}

/// `s` as a CEL string literal (escaping what [`string`] reads back).
fn quote(s: &str) -> String {
    let mut out = String::from('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// How deep `!(…)` may nest: the parser, the evaluator, rendering and dropping a term all
/// recurse per level, and a 10 KiB selector (upstream's limit) of `!(` would otherwise
/// overflow a thread's stack (the fuzz target dra_selector's replay). No selector needs more
/// than a few.
pub const MAX_NEGATION_DEPTH: usize = 32;

struct Parser {
    toks: Vec<Tok>,
    at: usize,
    depth: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.at)
    }
    fn next(&mut self) -> Option<Tok> {
        let t = self.toks.get(self.at).cloned();
        self.at += 1;
        t
    }
    fn punct(&mut self, p: &str, what: &str) -> Result<(), String> {
        match self.next() {
            Some(Tok::Punct(q)) if q == p => Ok(()),
            t => Err(format!("expected `{p}` {what}, found {}", show(t.as_ref()))),
        }
    }
    fn ident(&mut self, what: &str) -> Result<String, String> {
        match self.next() {
            Some(Tok::Ident(s)) => Ok(s),
            t => Err(format!("expected {what}, found {}", show(t.as_ref()))),
        }
    }
    fn string(&mut self, what: &str) -> Result<String, String> {
        match self.next() {
            Some(Tok::Str(s)) => Ok(s),
            t => Err(format!(
                "expected {what} (a string), found {}",
                show(t.as_ref())
            )),
        }
    }
    fn is_punct(&self, p: &str) -> bool {
        matches!(self.peek(), Some(Tok::Punct(q)) if *q == p)
    }

    fn expression(&mut self) -> Result<Vec<Term>, String> {
        let mut terms = vec![self.unary()?];
        while self.is_punct("&&") {
            self.at += 1;
            terms.push(self.unary()?);
        }
        match self.peek() {
            None => Ok(terms),
            Some(Tok::Punct("||")) => Err("`||` is not supported".into()),
            t => Err(format!("unexpected {} after a term", show(t))),
        }
    }

    fn unary(&mut self) -> Result<Term, String> {
        if self.is_punct("!") {
            self.at += 1;
            if !self.is_punct("(") {
                return Err("negation must be written `!(<term>)`".into());
            }
            self.at += 1;
            self.depth += 1;
            if self.depth > MAX_NEGATION_DEPTH {
                return Err(format!(
                    "negations nest deeper than {MAX_NEGATION_DEPTH} levels"
                ));
            }
            let inner = self.unary()?;
            self.depth -= 1;
            if self.is_punct("&&") {
                return Err("`!(…)` negates one term, not a conjunction".into());
            }
            self.punct(")", "to close `!(`")?;
            return Ok(Term::Not(Box::new(inner)));
        }
        self.term()
    }

    /// `<domain>"].<name>` after `device.<map>["`.
    fn qualified(&mut self, map: &str) -> Result<String, String> {
        self.punct("[", &format!("after device.{map}"))?;
        let domain = self.string("a domain")?;
        self.punct("]", "after the domain")?;
        self.punct(".", &format!("after device.{map}[\"{domain}\"]"))?;
        let name = self.ident("a name")?;
        if domain.is_empty() {
            return Err("empty domain".into());
        }
        Ok(format!("{domain}/{name}"))
    }

    fn term(&mut self) -> Result<Term, String> {
        let root = self.ident("`device`")?;
        if root != "device" {
            return Err(format!("unknown variable `{root}` (only `device` exists)"));
        }
        self.punct(".", "after `device`")?;
        let field = self.ident("a field of device")?;
        match field.as_str() {
            "driver" => {
                self.punct("==", "after device.driver")?;
                let d = self.string("device.driver's literal")?;
                Ok(Term::Driver(d))
            }
            "attributes" => {
                let name = self.qualified("attributes")?;
                match self.next() {
                    Some(Tok::Punct("==")) => Ok(Term::Attribute {
                        name,
                        value: self.literal()?,
                    }),
                    Some(Tok::Ident(i)) if i == "in" => Ok(Term::AttributeIn {
                        name,
                        values: self.list()?,
                    }),
                    t => Err(format!(
                        "expected `==` or `in` after an attribute, found {}",
                        show(t.as_ref())
                    )),
                }
            }
            "capacity" => {
                let name = self.qualified("capacity")?;
                self.punct(
                    ".",
                    "after a capacity (only .compareTo(quantity(…)) is read)",
                )?;
                let f = self.ident("a method")?;
                if f != "compareTo" {
                    return Err(format!(
                        "unknown function `{f}` on a capacity (only compareTo is read)"
                    ));
                }
                self.punct("(", "after compareTo")?;
                let q = self.ident("quantity(…)")?;
                if q != "quantity" {
                    return Err(format!(
                        "unknown function `{q}` (compareTo takes quantity(\"…\"))"
                    ));
                }
                self.punct("(", "after quantity")?;
                let text = self.string("quantity's argument")?;
                let value = quantity::parse(&text)
                    .map_err(|e| format!("quantity(\"{text}\") does not parse: {e}"))?;
                self.punct(")", "to close quantity(")?;
                self.punct(")", "to close compareTo(")?;
                let cmp = match self.next() {
                    Some(Tok::Punct("==")) => Cmp::Eq,
                    Some(Tok::Punct("<")) => Cmp::Lt,
                    Some(Tok::Punct(">")) => Cmp::Gt,
                    Some(Tok::Punct("<=")) => Cmp::Le,
                    Some(Tok::Punct(">=")) => Cmp::Ge,
                    t => {
                        return Err(format!(
                            "expected ==, <, >, <= or >= after compareTo(…), found {}",
                            show(t.as_ref())
                        ));
                    }
                };
                match self.next() {
                    Some(Tok::Int(0)) => {}
                    t => {
                        return Err(format!(
                            "compareTo's result must be compared with 0, found {}",
                            show(t.as_ref())
                        ));
                    }
                }
                Ok(Term::Capacity {
                    name,
                    cmp,
                    quantity: text,
                    value,
                })
            }
            other => Err(format!(
                "unknown field device.{other} (read: driver, attributes, capacity)"
            )),
        }
    }

    fn literal(&mut self) -> Result<DeviceAttribute, String> {
        match self.next() {
            Some(Tok::Str(s)) => Ok(DeviceAttribute::string(s)),
            Some(Tok::Int(i)) => Ok(DeviceAttribute::int(i)),
            Some(Tok::Ident(i)) if i == "true" => Ok(DeviceAttribute::bool(true)),
            Some(Tok::Ident(i)) if i == "false" => Ok(DeviceAttribute::bool(false)),
            Some(Tok::Ident(i)) if self.is_punct("(") => Err(format!("unknown function `{i}`")),
            t => Err(format!(
                "expected a string, int or bool literal, found {}",
                show(t.as_ref())
            )),
        }
    }

    fn list(&mut self) -> Result<Vec<DeviceAttribute>, String> {
        self.punct("[", "after `in` (a list literal)")?;
        let mut values: Vec<DeviceAttribute> = Vec::new();
        loop {
            match self.peek() {
                None => return Err("unterminated list (no `]`)".into()),
                Some(Tok::Punct("]")) => {
                    self.at += 1;
                    break;
                }
                _ => {}
            }
            let v = self.literal()?;
            if let Some(first) = values.first()
                && kind(first) != kind(&v)
            {
                return Err("a list literal mixes types (CEL lists are homogeneous)".into());
            }
            values.push(v);
            match self.next() {
                Some(Tok::Punct(",")) => {}
                Some(Tok::Punct("]")) => break,
                None => return Err("unterminated list (no `]`)".into()),
                t => {
                    return Err(format!(
                        "expected `,` or `]` in a list, found {}",
                        show(t.as_ref())
                    ));
                }
            }
        }
        Ok(values)
    }
}

fn kind(a: &DeviceAttribute) -> u8 {
    if a.string.is_some() {
        0
    } else if a.int.is_some() {
        1
    } else if a.bool.is_some() {
        2
    } else {
        3
    }
}

/// Parses an expression into its conjuncts.
pub fn parse(expression: &str) -> Result<Vec<Term>, SelectorError> {
    let err = |problem: String| SelectorError {
        expression: expression.into(),
        problem,
    };
    let toks = lex(expression).map_err(err)?;
    if toks.is_empty() {
        return Err(err("empty".into()));
    }
    Parser {
        toks,
        at: 0,
        depth: 0,
    }
    .expression()
    .map_err(err)
}

/// A capacity by fully qualified name: unqualified keys belong to the driver's domain (as
/// attributes, see [`crate::allocator::attribute`]).
fn capacity<'a>(driver: &str, device: &'a Device, name: &str) -> Option<&'a str> {
    if let Some(short) = name.strip_prefix(driver).and_then(|r| r.strip_prefix('/'))
        && let Some(c) = device.capacity.get(short)
    {
        return Some(&c.value);
    }
    device.capacity.get(name).map(|c| c.value.as_str())
}

fn no_such(kind: &str, name: &str) -> String {
    let (domain, short) = name.rsplit_once('/').unwrap_or(("", name));
    format!("no such key: the device has no {kind} {short:?} in domain {domain:?}")
}

fn eval_term(driver: &str, device: &Device, term: &Term) -> Result<bool, String> {
    match term {
        Term::Driver(d) => Ok(d == driver),
        Term::Attribute { name, value } => crate::allocator::attribute(driver, device, name)
            .map(|a| a == value)
            .ok_or_else(|| no_such("attribute", name)),
        Term::AttributeIn { name, values } => crate::allocator::attribute(driver, device, name)
            .map(|a| values.contains(a))
            .ok_or_else(|| no_such("attribute", name)),
        Term::Capacity {
            name, cmp, value, ..
        } => {
            let text = capacity(driver, device, name).ok_or_else(|| no_such("capacity", name))?;
            let have = quantity::parse(text).map_err(|e| format!("capacity {name}: {e}"))?;
            Ok(cmp.holds(have.cmp(value)))
        }
        Term::Not(t) => eval_term(driver, device, t).map(|b| !b),
    }
}

/// Evaluates one parsed expression on a device of `driver` as CEL would: `Ok(false)` when a
/// conjunct is false, else `Err` (the runtime error) when one errs, else `Ok(true)`.
pub fn eval(driver: &str, device: &Device, terms: &[Term]) -> Result<bool, String> {
    let mut error = None;
    for t in terms {
        match eval_term(driver, device, t) {
            Ok(false) => return Ok(false),
            Ok(true) => {}
            Err(e) => {
                error.get_or_insert(e);
            }
        }
    }
    error.map_or(Ok(true), Err)
}

fn render_literal(value: &DeviceAttribute) -> String {
    match value {
        DeviceAttribute {
            string: Some(s), ..
        } => quote(s),
        DeviceAttribute { int: Some(i), .. } => i.to_string(),
        DeviceAttribute { bool: Some(b), .. } => b.to_string(),
        DeviceAttribute {
            version: Some(v), ..
        } => quote(v),
        _ => "null".into(),
    }
}

fn render_term(t: &Term) -> String {
    let split = |name: &str| {
        let (domain, short) = name.rsplit_once('/').unwrap_or(("", name));
        (domain.to_string(), short.to_string())
    };
    match t {
        Term::Driver(d) => format!("device.driver == {}", quote(d)),
        Term::Attribute { name, value } => {
            let (domain, short) = split(name);
            format!(
                "device.attributes[{}].{short} == {}",
                quote(&domain),
                render_literal(value)
            )
        }
        Term::AttributeIn { name, values } => {
            let (domain, short) = split(name);
            let list: Vec<String> = values.iter().map(render_literal).collect();
            format!(
                "device.attributes[{}].{short} in [{}]",
                quote(&domain),
                list.join(", ")
            )
        }
        Term::Capacity {
            name,
            cmp,
            quantity,
            ..
        } => {
            let (domain, short) = split(name);
            format!(
                "device.capacity[{}].{short}.compareTo(quantity({})) {} 0",
                quote(&domain),
                quote(quantity),
                cmp.text()
            )
        }
        Term::Not(t) => format!("!({})", render_term(t)),
    }
}

/// The CEL text of terms joined by `&&` (what the webhook and the DeviceClass write).
pub fn render(terms: &[Term]) -> String {
    let parts: Vec<String> = terms.iter().map(render_term).collect();
    parts.join(" && ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use hami_dra_core::api::DeviceCapacity;

    const D: &str = "amdgpu.hami-rs.io";

    fn dev() -> Device {
        let mut d = Device {
            name: "gpu-0".into(),
            ..Device::default()
        };
        d.attributes
            .insert("uuid".into(), DeviceAttribute::string("GPU-a"));
        d.attributes
            .insert("productName".into(), DeviceAttribute::string("MI210"));
        d.attributes.insert(
            "resource.kubernetes.io/numaNode".into(),
            DeviceAttribute::int(1),
        );
        for (k, v) in [("memory", "64Gi"), ("computeUnits", "104")] {
            d.capacity.insert(
                k.into(),
                DeviceCapacity {
                    value: v.into(),
                    request_policy: None,
                },
            );
        }
        d
    }

    fn ev(expr: &str) -> Result<bool, String> {
        eval(D, &dev(), &parse(expr).unwrap())
    }

    #[test]
    fn negations_nest_at_most_the_limit_even_in_a_10k_selector() {
        let nested = |depth: usize| {
            format!(
                "{}device.driver == \"x\"{}",
                "!(".repeat(depth),
                ")".repeat(depth)
            )
        };
        let deepest = parse(&nested(MAX_NEGATION_DEPTH)).unwrap();
        assert_eq!(parse(&render(&deepest)).unwrap(), deepest);
        assert_eq!(eval(D, &dev(), &deepest), Ok(false));
        // 10 KiB of `!(` (upstream's CEL length limit): an error, not a stack overflow.
        for depth in [MAX_NEGATION_DEPTH + 1, 3400] {
            let e = parse(&nested(depth)).unwrap_err();
            assert!(e.problem.contains("nest deeper than 32"), "{e}");
        }
    }

    #[test]
    fn reads_class_and_webhook_selectors() {
        let t = parse(r#"device.driver == "amdgpu.hami-rs.io" && device.attributes["amdgpu.hami-rs.io"].type == "amdgpu-slice""#).unwrap();
        assert_eq!(t[0], Term::Driver("amdgpu.hami-rs.io".into()));
        assert_eq!(
            t[1],
            Term::Attribute {
                name: "amdgpu.hami-rs.io/type".into(),
                value: DeviceAttribute::string("amdgpu-slice")
            }
        );
        assert_eq!(parse(&render(&t)).unwrap(), t);
        let n = parse(r#"device.attributes["resource.kubernetes.io"].numaNode == 1"#).unwrap();
        assert_eq!(
            n[0],
            Term::Attribute {
                name: "resource.kubernetes.io/numaNode".into(),
                value: DeviceAttribute::int(1)
            }
        );
    }

    #[test]
    fn capacity_compare_to_quantity() {
        let shape = format!(
            "device.attributes[\"{D}\"].productName == \"MI210\" && device.capacity[\"{D}\"].memory.compareTo(quantity(\"64Gi\")) == 0 && device.capacity[\"{D}\"].computeUnits.compareTo(quantity(\"104\")) == 0"
        );
        let t = parse(&shape).unwrap();
        assert_eq!(
            t[1],
            Term::Capacity {
                name: format!("{D}/memory"),
                cmp: Cmp::Eq,
                quantity: "64Gi".into(),
                value: 64 << 30
            }
        );
        assert_eq!(parse(&render(&t)).unwrap(), t);
        assert_eq!(eval(D, &dev(), &t), Ok(true));
        // The same bytes written differently compare equal (quantities, not strings).
        assert_eq!(
            ev(&format!(
                "device.capacity[\"{D}\"].memory.compareTo(quantity(\"65536Mi\")) == 0"
            )),
            Ok(true)
        );
        for (op, want) in [
            ("==", false),
            ("<", true),
            (">", false),
            ("<=", true),
            (">=", false),
        ] {
            let e = format!("device.capacity[\"{D}\"].memory.compareTo(quantity(\"65Gi\")) {op} 0");
            assert_eq!(ev(&e), Ok(want), "{e}");
            assert_eq!(render(&parse(&e).unwrap()), e);
        }
        assert_eq!(
            ev(&format!(
                "device.capacity[\"{D}\"].computeUnits.compareTo(quantity(\"104\")) >= 0"
            )),
            Ok(true)
        );
        // An unknown capacity is a runtime error, as upstream.
        let e = ev(&format!(
            "device.capacity[\"{D}\"].shares.compareTo(quantity(\"1\")) == 0"
        ))
        .unwrap_err();
        assert!(e.contains("no such key") && e.contains("shares"), "{e}");
    }

    #[test]
    fn attribute_in_list() {
        let e = format!("device.attributes[\"{D}\"].uuid in [\"GPU-b\", \"GPU-a\"]");
        let t = parse(&e).unwrap();
        assert_eq!(
            t[0],
            Term::AttributeIn {
                name: format!("{D}/uuid"),
                values: vec![
                    DeviceAttribute::string("GPU-b"),
                    DeviceAttribute::string("GPU-a")
                ]
            }
        );
        assert_eq!(render(&t), e);
        assert_eq!(ev(&e), Ok(true));
        assert_eq!(
            ev(&format!("device.attributes[\"{D}\"].uuid in [\"GPU-b\"]")),
            Ok(false)
        );
        assert_eq!(
            ev(&format!("device.attributes[\"{D}\"].uuid in []")),
            Ok(false)
        );
        assert_eq!(
            ev("device.attributes[\"resource.kubernetes.io\"].numaNode in [0, 1,]"),
            Ok(true)
        );
        // A string list never holds an int attribute (no conversion, as CEL).
        assert_eq!(
            ev("device.attributes[\"resource.kubernetes.io\"].numaNode in [\"1\"]"),
            Ok(false)
        );
        assert!(
            ev(&format!("device.attributes[\"{D}\"].serial in [\"x\"]"))
                .unwrap_err()
                .contains("serial")
        );
    }

    #[test]
    fn negation() {
        let e = format!("!(device.attributes[\"{D}\"].uuid in [\"GPU-a\", \"GPU-c\"])");
        let t = parse(&e).unwrap();
        assert!(matches!(&t[0], Term::Not(inner) if matches!(**inner, Term::AttributeIn { .. })));
        assert_eq!(render(&t), e);
        assert_eq!(ev(&e), Ok(false));
        assert_eq!(
            ev(&format!(
                "!(device.attributes[\"{D}\"].uuid in [\"GPU-c\"])"
            )),
            Ok(true)
        );
        assert_eq!(ev(&format!("!(device.driver == \"{D}\")")), Ok(false));
        assert_eq!(
            ev(&format!(
                "!(device.capacity[\"{D}\"].memory.compareTo(quantity(\"64Gi\")) == 0)"
            )),
            Ok(false)
        );
        assert_eq!(
            ev(&format!(
                "!(!(device.attributes[\"{D}\"].productName == \"MI210\"))"
            )),
            Ok(true)
        );
        // Negating a lookup of a missing attribute stays an error (the device is not "not
        // in the list"): upstream aborts.
        assert!(ev(&format!("!(device.attributes[\"{D}\"].serial in [\"x\"])")).is_err());
    }

    #[test]
    fn string_escapes_read_and_written() {
        let t = parse(
            r#"device.attributes["amdgpu.hami-rs.io"].productName == "A \"B\" \\ \u00e9\x41\n""#,
        )
        .unwrap();
        let want = DeviceAttribute::string("A \"B\" \\ \u{e9}A\n");
        assert_eq!(
            t[0],
            Term::Attribute {
                name: "amdgpu.hami-rs.io/productName".into(),
                value: want
            }
        );
        let text = render(&t);
        assert_eq!(
            text,
            r#"device.attributes["amdgpu.hami-rs.io"].productName == "A \"B\" \\ éA\u000a""#
        );
        assert_eq!(parse(&text).unwrap(), t);
    }

    #[test]
    fn and_is_cels_false_beats_error_beats_true() {
        let missing = format!("device.attributes[\"{D}\"].serial == \"x\"");
        assert_eq!(
            ev(&format!("device.driver == \"other\" && {missing}")),
            Ok(false)
        );
        assert_eq!(
            ev(&format!("{missing} && device.driver == \"other\"")),
            Ok(false)
        );
        assert!(ev(&format!("device.driver == \"{D}\" && {missing}")).is_err());
    }

    #[test]
    fn refuses_other_cel_by_name() {
        for (bad, why) in [
            ("device.driver != \"x\"", "expected `==`"),
            ("device.attributes[\"d\"].a == b", "literal"),
            ("", "empty"),
            (
                "device.attributes[\"d\"].uuid in [\"a\", \"b\"",
                "unterminated list",
            ),
            ("device.attributes[\"d\"].uuid in [\"a\", 1]", "mixes types"),
            (
                "device.capacity[\"d\"].memory.isGreaterThan(quantity(\"1Gi\"))",
                "unknown function `isGreaterThan`",
            ),
            (
                "device.capacity[\"d\"].memory.compareTo(size(\"1Gi\")) == 0",
                "unknown function `size`",
            ),
            (
                "device.attributes[\"d\"].uuid == lower(\"A\")",
                "unknown function `lower`",
            ),
            (
                "device.capacity[\"d\"].memory.compareTo(quantity(\"1.5Gi\")) == 0",
                "quantity(\"1.5Gi\") does not parse",
            ),
            (
                "device.capacity[\"d\"].memory.compareTo(quantity(\"lots\")) == 0",
                "quantity(\"lots\") does not parse",
            ),
            (
                "device.capacity[\"d\"].memory.compareTo(quantity(\"1Gi\")) == 1",
                "compared with 0",
            ),
            (
                "device.capacity[\"d\"].memory.compareTo(quantity(\"1Gi\") == 0",
                "to close compareTo",
            ),
            (
                "!device.attributes[\"d\"].a == 1",
                "negation must be written",
            ),
            (
                "!(device.driver == \"a\" && device.driver == \"b\")",
                "one term",
            ),
            (
                "device.driver == \"a\" || device.driver == \"b\"",
                "`||` is not supported",
            ),
            ("device.attributes[\"d\"].a == \"x", "unterminated string"),
            (
                "device.attributes[\"d\"].a == \"x\\qy\"",
                "unsupported escape \\q",
            ),
            ("device.attributes[\"d\"].a == \"x\\u12\"", "bad escape"),
            ("other.driver == \"x\"", "unknown variable"),
            ("device.name == \"x\"", "unknown field device.name"),
            ("device.attributes[\"\"].a == 1", "empty domain"),
            (
                "device.driver == \"a\" device.driver",
                "unexpected `device`",
            ),
        ] {
            let e = parse(bad).unwrap_err();
            let text = e.to_string();
            assert!(text.contains("supported:"), "{text}");
            assert!(e.problem.contains(why), "{bad}: {}", e.problem);
        }
    }
}
