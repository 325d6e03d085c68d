//! The parser: a conjunction of the supported terms, negation depth bounded, each term's
//! shape checked (literal types, homogeneous lists, quantity literals) with an error that
//! names what is not supported.

use hami_dra_core::api::DeviceAttribute;
use hami_dra_core::quantity;

use super::lex::{Tok, lex, show};
use super::{Cmp, SelectorError, Term};

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
