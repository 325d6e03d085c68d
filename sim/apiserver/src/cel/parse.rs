//! CEL's expression grammar into an AST: `?:`, `||`, `&&`, relations (`== != < <= > >= in`),
//! `+ -`, `* / %`, unary `! -`, member selection, calls and indexing, list and map literals,
//! and the macros `has`, `all`, `exists`, `exists_one`, `map`, `filter` expanded as cel-go
//! does. Message construction (`T{...}`) and the optional syntax (`.?f`) are refused by name.

use super::CompileError;
use super::lex::{Tok, Token, lex};
use super::value::Val;

/// An expression node and the byte offset it starts at (for error positions).
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    /// Byte offset in the expression.
    pub at: usize,
    /// What it is.
    pub kind: Kind,
}

/// The comprehension macros.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Macro {
    /// `r.all(x, p)`.
    All,
    /// `r.exists(x, p)`.
    Exists,
    /// `r.exists_one(x, p)`.
    ExistsOne,
    /// `r.map(x, f)` or `r.map(x, p, f)`.
    Map,
    /// `r.filter(x, p)`.
    Filter,
}

/// Binary operators other than `&&`/`||` (which have their own error-absorbing nodes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinOp {
    /// `==`.
    Eq,
    /// `!=`.
    Ne,
    /// `<`.
    Lt,
    /// `<=`.
    Le,
    /// `>`.
    Gt,
    /// `>=`.
    Ge,
    /// `in`.
    In,
    /// `+`.
    Add,
    /// `-`.
    Sub,
    /// `*`.
    Mul,
    /// `/`.
    Div,
    /// `%`.
    Rem,
}

impl BinOp {
    /// cel-go's name of the operator's function (used in its error messages).
    pub fn function(self) -> &'static str {
        match self {
            BinOp::Eq => "_==_",
            BinOp::Ne => "_!=_",
            BinOp::Lt => "_<_",
            BinOp::Le => "_<=_",
            BinOp::Gt => "_>_",
            BinOp::Ge => "_>=_",
            BinOp::In => "@in",
            BinOp::Add => "_+_",
            BinOp::Sub => "_-_",
            BinOp::Mul => "_*_",
            BinOp::Div => "_/_",
            BinOp::Rem => "_%_",
        }
    }
}

/// The expression forms.
#[derive(Debug, Clone, PartialEq)]
pub enum Kind {
    /// A literal.
    Lit(Val),
    /// A variable.
    Ident(String),
    /// `e.f`.
    Select(Box<Node>, String),
    /// `has(e.f)`.
    Has(Box<Node>, String),
    /// `e[i]`.
    Index(Box<Node>, Box<Node>),
    /// `f(args)` or `target.f(args)`.
    Call {
        /// The receiver of a member call.
        target: Option<Box<Node>>,
        /// The function.
        name: String,
        /// The arguments.
        args: Vec<Node>,
    },
    /// `!e`.
    Not(Box<Node>),
    /// `-e`.
    Neg(Box<Node>),
    /// `a && b`.
    And(Box<Node>, Box<Node>),
    /// `a || b`.
    Or(Box<Node>, Box<Node>),
    /// `c ? a : b`.
    Cond(Box<Node>, Box<Node>, Box<Node>),
    /// A binary operator.
    Binary(BinOp, Box<Node>, Box<Node>),
    /// `[a, b]`.
    List(Vec<Node>),
    /// `{k: v}`.
    Map(Vec<(Node, Node)>),
    /// A comprehension macro over `range` binding `var`.
    Comprehension {
        /// Which macro.
        kind: Macro,
        /// The list or map iterated (a map's keys).
        range: Box<Node>,
        /// The iteration variable.
        var: String,
        /// The predicate (or, for `map(x, f)`, the transform).
        body: Box<Node>,
        /// `map(x, p, f)`'s transform.
        transform: Option<Box<Node>>,
    },
}

fn node(at: usize, kind: Kind) -> Node {
    Node { at, kind }
}

/// Parses a CEL expression.
pub fn parse(src: &str) -> Result<Node, CompileError> {
    let toks = lex(src)?;
    let mut p = Parser {
        toks,
        pos: 0,
        end: src.len(),
        depth: 0,
    };
    let e = p.expr()?;
    if let Some(t) = p.toks.get(p.pos) {
        return Err(CompileError::syntax(
            t.at,
            format!("mismatched input {}", show(&t.tok)),
        ));
    }
    Ok(e)
}

fn show(t: &Tok) -> String {
    match t {
        Tok::Ident(s) => format!("'{s}'"),
        Tok::Str(s) => format!("'\"{s}\"'"),
        Tok::Int(i) => format!("'{i}'"),
        Tok::Uint(u) => format!("'{u}u'"),
        Tok::Double(d) => format!("'{d}'"),
        Tok::Punct(p) => format!("'{p}'"),
        Tok::MinIntMagnitude => "'9223372036854775808'".into(),
    }
}

/// cel-go's parser refuses deeper nesting; a bound also keeps recursion off the stack's edge.
const MAX_DEPTH: usize = 100;

struct Parser {
    toks: Vec<Token>,
    pos: usize,
    end: usize,
    depth: usize,
}

impl Parser {
    fn at(&self) -> usize {
        self.toks.get(self.pos).map_or(self.end, |t| t.at)
    }
    fn is(&self, p: &str) -> bool {
        matches!(self.toks.get(self.pos), Some(Token { tok: Tok::Punct(q), .. }) if *q == p)
    }
    fn is_ident(&self, w: &str) -> bool {
        matches!(self.toks.get(self.pos), Some(Token { tok: Tok::Ident(q), .. }) if q == w)
    }
    fn eat(&mut self, p: &str) -> bool {
        let yes = self.is(p);
        if yes {
            self.pos += 1;
        }
        yes
    }
    fn expect(&mut self, p: &str) -> Result<(), CompileError> {
        if self.eat(p) {
            return Ok(());
        }
        Err(match self.toks.get(self.pos) {
            Some(t) => CompileError::syntax(
                t.at,
                format!("mismatched input {} expecting '{p}'", show(&t.tok)),
            ),
            None => CompileError::syntax(self.end, format!("missing '{p}' at '<EOF>'")),
        })
    }

    fn deeper(&mut self) -> Result<(), CompileError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(CompileError::syntax(
                self.at(),
                "expression recursion limit exceeded",
            ));
        }
        Ok(())
    }

    /// A left-nested chain (`a + b + c`, `a.b.c`) deepens the tree as nesting does; it
    /// counts against the same bound (evaluation recurses over the tree's height).
    fn grow(&mut self, chain: &mut usize) -> Result<(), CompileError> {
        *chain += 1;
        self.deeper()
    }

    fn expr(&mut self) -> Result<Node, CompileError> {
        self.deeper()?;
        let at = self.at();
        let c = self.or()?;
        let out = if self.eat("?") {
            let a = self.or()?;
            self.expect(":")?;
            let b = self.expr()?;
            node(at, Kind::Cond(Box::new(c), Box::new(a), Box::new(b)))
        } else {
            c
        };
        self.depth -= 1;
        Ok(out)
    }

    fn or(&mut self) -> Result<Node, CompileError> {
        let at = self.at();
        let mut l = self.and()?;
        let mut chain = 0;
        while self.eat("||") {
            self.grow(&mut chain)?;
            let r = self.and()?;
            l = node(at, Kind::Or(Box::new(l), Box::new(r)));
        }
        self.depth -= chain;
        Ok(l)
    }

    fn and(&mut self) -> Result<Node, CompileError> {
        let at = self.at();
        let mut l = self.relation()?;
        let mut chain = 0;
        while self.eat("&&") {
            self.grow(&mut chain)?;
            let r = self.relation()?;
            l = node(at, Kind::And(Box::new(l), Box::new(r)));
        }
        self.depth -= chain;
        Ok(l)
    }

    fn relation(&mut self) -> Result<Node, CompileError> {
        let at = self.at();
        let mut l = self.additive()?;
        let mut chain = 0;
        loop {
            let op = if self.is_ident("in") {
                BinOp::In
            } else {
                match self.toks.get(self.pos).map(|t| &t.tok) {
                    Some(Tok::Punct("==")) => BinOp::Eq,
                    Some(Tok::Punct("!=")) => BinOp::Ne,
                    Some(Tok::Punct("<")) => BinOp::Lt,
                    Some(Tok::Punct("<=")) => BinOp::Le,
                    Some(Tok::Punct(">")) => BinOp::Gt,
                    Some(Tok::Punct(">=")) => BinOp::Ge,
                    _ => {
                        self.depth -= chain;
                        return Ok(l);
                    }
                }
            };
            self.pos += 1;
            self.grow(&mut chain)?;
            let r = self.additive()?;
            l = node(at, Kind::Binary(op, Box::new(l), Box::new(r)));
        }
    }

    fn additive(&mut self) -> Result<Node, CompileError> {
        let at = self.at();
        let mut l = self.multiplicative()?;
        let mut chain = 0;
        loop {
            let op = if self.eat("+") {
                BinOp::Add
            } else if self.eat("-") {
                BinOp::Sub
            } else {
                self.depth -= chain;
                return Ok(l);
            };
            self.grow(&mut chain)?;
            let r = self.multiplicative()?;
            l = node(at, Kind::Binary(op, Box::new(l), Box::new(r)));
        }
    }

    fn multiplicative(&mut self) -> Result<Node, CompileError> {
        let at = self.at();
        let mut l = self.unary()?;
        let mut chain = 0;
        loop {
            let op = if self.eat("*") {
                BinOp::Mul
            } else if self.eat("/") {
                BinOp::Div
            } else if self.eat("%") {
                BinOp::Rem
            } else {
                self.depth -= chain;
                return Ok(l);
            };
            self.grow(&mut chain)?;
            let r = self.unary()?;
            l = node(at, Kind::Binary(op, Box::new(l), Box::new(r)));
        }
    }

    fn unary(&mut self) -> Result<Node, CompileError> {
        let at = self.at();
        if self.eat("!") {
            self.deeper()?;
            let e = self.unary()?;
            self.depth -= 1;
            return Ok(node(at, Kind::Not(Box::new(e))));
        }
        if self.eat("-") {
            // A negative literal is one literal (so i64::MIN is expressible), as in cel-go.
            match self.toks.get(self.pos).map(|t| t.tok.clone()) {
                Some(Tok::Int(i)) if !self.next_is_member(1) => {
                    self.pos += 1;
                    return self.member(node(at, Kind::Lit(Val::Int(-i))));
                }
                Some(Tok::MinIntMagnitude) if !self.next_is_member(1) => {
                    self.pos += 1;
                    return self.member(node(at, Kind::Lit(Val::Int(i64::MIN))));
                }
                Some(Tok::Double(d)) if !self.next_is_member(1) => {
                    self.pos += 1;
                    return self.member(node(at, Kind::Lit(Val::Double(-d))));
                }
                _ => {}
            }
            self.deeper()?;
            let e = self.unary()?;
            self.depth -= 1;
            return Ok(node(at, Kind::Neg(Box::new(e))));
        }
        let p = self.primary()?;
        self.member(p)
    }

    fn next_is_member(&self, ahead: usize) -> bool {
        matches!(
            self.toks.get(self.pos + ahead),
            Some(Token {
                tok: Tok::Punct("." | "["),
                ..
            })
        )
    }

    fn member(&mut self, mut e: Node) -> Result<Node, CompileError> {
        let mut chain = 0;
        loop {
            let at = self.at();
            if self.is(".") || self.is("[") {
                self.grow(&mut chain)?;
            }
            if self.eat(".") {
                if self.is("?") {
                    return Err(CompileError::unsupported(
                        at,
                        "optional field selection (.?)",
                    ));
                }
                let name = match self.toks.get(self.pos).map(|t| t.tok.clone()) {
                    Some(Tok::Ident(n)) => {
                        self.pos += 1;
                        n
                    }
                    Some(t) => {
                        return Err(CompileError::syntax(
                            self.at(),
                            format!("mismatched input {} expecting IDENTIFIER", show(&t)),
                        ));
                    }
                    None => {
                        return Err(CompileError::syntax(
                            self.end,
                            "mismatched input '<EOF>' expecting IDENTIFIER",
                        ));
                    }
                };
                if self.eat("(") {
                    let args = self.args(")")?;
                    e = method(at, e, name, args)?;
                } else {
                    e = node(e.at, Kind::Select(Box::new(e), name));
                }
            } else if self.eat("[") {
                if self.is("?") {
                    return Err(CompileError::unsupported(at, "optional indexing ([?])"));
                }
                let i = self.expr()?;
                self.expect("]")?;
                e = node(e.at, Kind::Index(Box::new(e), Box::new(i)));
            } else if self.is("{") && matches!(e.kind, Kind::Ident(_) | Kind::Select(..)) {
                return Err(CompileError::unsupported(
                    at,
                    "message construction (T{...})",
                ));
            } else {
                self.depth -= chain;
                return Ok(e);
            }
        }
    }

    fn args(&mut self, close: &str) -> Result<Vec<Node>, CompileError> {
        let mut out = Vec::new();
        if self.eat(close) {
            return Ok(out);
        }
        loop {
            out.push(self.expr()?);
            if self.eat(",") {
                // A trailing comma is allowed in list literals and calls alike.
                if self.eat(close) {
                    return Ok(out);
                }
                continue;
            }
            self.expect(close)?;
            return Ok(out);
        }
    }

    fn primary(&mut self) -> Result<Node, CompileError> {
        let at = self.at();
        let Some(t) = self.toks.get(self.pos).map(|t| t.tok.clone()) else {
            return Err(CompileError::syntax(
                self.end,
                "mismatched input '<EOF>' expecting an expression",
            ));
        };
        self.pos += 1;
        Ok(match t {
            Tok::Int(i) => node(at, Kind::Lit(Val::Int(i))),
            Tok::MinIntMagnitude => {
                return Err(CompileError::syntax(at, "invalid int literal"));
            }
            Tok::Uint(u) => node(at, Kind::Lit(Val::Uint(u))),
            Tok::Double(d) => node(at, Kind::Lit(Val::Double(d))),
            Tok::Str(s) => node(at, Kind::Lit(Val::Str(s.into()))),
            Tok::Ident(w) => match w.as_str() {
                "true" => node(at, Kind::Lit(Val::Bool(true))),
                "false" => node(at, Kind::Lit(Val::Bool(false))),
                "null" => node(at, Kind::Lit(Val::Null)),
                "in" => return Err(CompileError::syntax(at, "mismatched input 'in'")),
                _ if super::lex::RESERVED.contains(&w.as_str()) => {
                    return Err(CompileError::syntax(
                        at,
                        format!("reserved identifier: {w}"),
                    ));
                }
                _ if self.eat("(") => {
                    let args = self.args(")")?;
                    global(at, w, args)?
                }
                _ => node(at, Kind::Ident(w)),
            },
            Tok::Punct("(") => {
                let e = self.expr()?;
                self.expect(")")?;
                e
            }
            Tok::Punct("[") => {
                let items = self.args("]")?;
                node(at, Kind::List(items))
            }
            Tok::Punct("{") => {
                let mut entries = Vec::new();
                if !self.eat("}") {
                    loop {
                        let k = self.expr()?;
                        self.expect(":")?;
                        let v = self.expr()?;
                        entries.push((k, v));
                        if self.eat(",") {
                            if self.eat("}") {
                                break;
                            }
                            continue;
                        }
                        self.expect("}")?;
                        break;
                    }
                }
                node(at, Kind::Map(entries))
            }
            Tok::Punct(".") => {
                return Err(CompileError::unsupported(
                    at,
                    "leading-dot (root namespace) identifiers",
                ));
            }
            Tok::Punct(p) => {
                return Err(CompileError::syntax(
                    at,
                    format!("mismatched input '{p}' expecting an expression"),
                ));
            }
        })
    }
}

fn global(at: usize, name: String, args: Vec<Node>) -> Result<Node, CompileError> {
    if name == "has" {
        return match <[Node; 1]>::try_from(args) {
            Ok(
                [
                    Node {
                        kind: Kind::Select(e, f),
                        ..
                    },
                ],
            ) => Ok(node(at, Kind::Has(e, f))),
            _ => Err(CompileError::syntax(at, "invalid argument to has() macro")),
        };
    }
    Ok(node(
        at,
        Kind::Call {
            target: None,
            name,
            args,
        },
    ))
}

fn method(at: usize, target: Node, name: String, args: Vec<Node>) -> Result<Node, CompileError> {
    let kind = match name.as_str() {
        "all" => Some(Macro::All),
        "exists" => Some(Macro::Exists),
        "exists_one" => Some(Macro::ExistsOne),
        "map" => Some(Macro::Map),
        "filter" => Some(Macro::Filter),
        _ => None,
    };
    let Some(kind) = kind else {
        return Ok(node(
            target.at,
            Kind::Call {
                target: Some(Box::new(target)),
                name,
                args,
            },
        ));
    };
    let arity_ok = match kind {
        Macro::Map => args.len() == 2 || args.len() == 3,
        _ => args.len() == 2,
    };
    if !arity_ok {
        // Not a macro call: cel-go would look for a function of that name, which none is.
        return Ok(node(
            target.at,
            Kind::Call {
                target: Some(Box::new(target)),
                name,
                args,
            },
        ));
    }
    let mut args = args.into_iter();
    let var = match args.next() {
        Some(Node {
            kind: Kind::Ident(v),
            ..
        }) => v,
        _ => {
            return Err(CompileError::syntax(at, "argument must be a simple name"));
        }
    };
    let body = args.next().map(Box::new).expect("arity checked");
    let transform = args.next().map(Box::new);
    Ok(node(
        target.at,
        Kind::Comprehension {
            kind,
            range: Box::new(target),
            var,
            body,
            transform,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn precedence_and_macros() {
        let e = parse("a || b && c == 1 + 2 * 3").unwrap();
        let Kind::Or(_, r) = e.kind else { panic!() };
        let Kind::And(_, r) = r.kind else { panic!() };
        let Kind::Binary(BinOp::Eq, _, r) = r.kind else {
            panic!()
        };
        let Kind::Binary(BinOp::Add, _, r) = r.kind else {
            panic!()
        };
        assert!(matches!(r.kind, Kind::Binary(BinOp::Mul, ..)));
        let e = parse("[1, 2,].exists(x, x > 1) ? has(a.b) : !c").unwrap();
        assert!(matches!(e.kind, Kind::Cond(..)));
        assert_eq!(
            parse("-9223372036854775808").unwrap().kind,
            Kind::Lit(Val::Int(i64::MIN))
        );
        assert!(parse("has(a)").is_err());
        assert!(parse("a.exists(1, true)").is_err());
        assert!(parse("(1").is_err());
        assert!(parse("1 2").is_err());
        assert!(parse("9223372036854775808").is_err());
        assert!(parse("request.namespace == 'a'").is_ok());
        assert!(
            parse("namespace == 'a'")
                .unwrap_err()
                .to_string()
                .contains("reserved")
        );
        assert!(parse("a.?b").unwrap_err().to_string().contains("optional"));
        assert!(
            parse("T{a: 1}")
                .unwrap_err()
                .to_string()
                .contains("message")
        );
        let deep = format!("{}1{}", "(".repeat(101), ")".repeat(101));
        assert!(parse(&deep).is_err());
        let ok = format!("{}1{}", "(".repeat(99), ")".repeat(99));
        assert!(parse(&ok).is_ok());
        assert!(parse(&format!("{}true", "!".repeat(101))).is_err());
        let long = vec!["a"; 500].join(" + ");
        assert!(parse(&long).is_err());
    }
}
