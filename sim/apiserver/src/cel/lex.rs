//! CEL's lexical grammar: identifiers, reserved words, int/uint/double literals (decimal
//! and hex), string literals in every quoting CEL has (single, double, triple, raw) with
//! all of its escapes, and the operators. Bytes literals are refused by name.

use super::CompileError;

/// One token and the byte offset it starts at.
#[derive(Debug, Clone, PartialEq)]
pub struct Token {
    /// What it is.
    pub tok: Tok,
    /// Byte offset in the expression.
    pub at: usize,
}

/// A token of CEL.
#[derive(Debug, Clone, PartialEq)]
pub enum Tok {
    /// An identifier (not a reserved word).
    Ident(String),
    /// A string literal's value.
    Str(String),
    /// An int literal.
    Int(i64),
    /// A uint literal (`u` suffix).
    Uint(u64),
    /// A double literal.
    Double(f64),
    /// An operator or punctuation.
    Punct(&'static str),
    /// `9223372036854775808` without a suffix: valid only negated (i64::MIN).
    MinIntMagnitude,
}

/// CEL's reserved words: `in`, `true`, `false`, `null` are language; the rest may not name
/// a variable or function, but may name a field (`request.namespace`), as in cel-go.
pub const RESERVED: &[&str] = &[
    "as",
    "break",
    "const",
    "continue",
    "else",
    "for",
    "function",
    "if",
    "import",
    "let",
    "loop",
    "package",
    "namespace",
    "return",
    "var",
    "void",
    "while",
];

const PUNCT: &[&str] = &[
    "&&", "||", "==", "!=", "<=", ">=", "<", ">", "!", "(", ")", "[", "]", ".", ",", "?", ":", "+",
    "-", "*", "/", "%", "{", "}",
];

/// Splits `src` into tokens.
pub fn lex(src: &str) -> Result<Vec<Token>, CompileError> {
    let b = src.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c.is_ascii_whitespace() {
            i += 1;
        } else if c == b'/' && b.get(i + 1) == Some(&b'/') {
            // A comment runs to the end of the line.
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if c == b'"' || c == b'\'' {
            let (s, len) = string(src, i, false)?;
            out.push(Token {
                tok: Tok::Str(s),
                at: i,
            });
            i += len;
        } else if (c == b'r' || c == b'R') && matches!(b.get(i + 1), Some(b'"' | b'\'')) {
            let (s, len) = string(src, i + 1, true)?;
            out.push(Token {
                tok: Tok::Str(s),
                at: i,
            });
            i += 1 + len;
        } else if (c == b'b' || c == b'B')
            && (matches!(b.get(i + 1), Some(b'"' | b'\''))
                || (matches!(b.get(i + 1), Some(b'r' | b'R'))
                    && matches!(b.get(i + 2), Some(b'"' | b'\''))))
        {
            return Err(CompileError::unsupported(i, "bytes literals"));
        } else if c.is_ascii_digit() || (c == b'.' && b.get(i + 1).is_some_and(u8::is_ascii_digit))
        {
            let (tok, len) = number(src, i)?;
            out.push(Token { tok, at: i });
            i += len;
        } else if c.is_ascii_alphabetic() || c == b'_' {
            let start = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
            let word = &src[start..i];
            out.push(Token {
                tok: Tok::Ident(word.to_string()),
                at: start,
            });
        } else if let Some(p) = PUNCT.iter().find(|p| src[i..].starts_with(**p)) {
            out.push(Token {
                tok: Tok::Punct(p),
                at: i,
            });
            i += p.len();
        } else {
            let ch = src[i..].chars().next().unwrap_or('?');
            return Err(CompileError::syntax(
                i,
                format!("token recognition error at: '{ch}'"),
            ));
        }
    }
    Ok(out)
}

fn number(src: &str, start: usize) -> Result<(Tok, usize), CompileError> {
    let b = src.as_bytes();
    let mut i = start;
    let bad = |text: &str| CompileError::syntax(start, format!("invalid number literal '{text}'"));
    if b[i] == b'0' && matches!(b.get(i + 1), Some(b'x' | b'X')) {
        i += 2;
        let digits = i;
        while i < b.len() && b[i].is_ascii_hexdigit() {
            i += 1;
        }
        let hex = &src[digits..i];
        if matches!(b.get(i), Some(b'u' | b'U')) {
            let v = u64::from_str_radix(hex, 16).map_err(|_| bad(&src[start..=i]))?;
            return Ok((Tok::Uint(v), i + 1 - start));
        }
        let v = i64::from_str_radix(hex, 16).map_err(|_| bad(&src[start..i]))?;
        return Ok((Tok::Int(v), i - start));
    }
    while i < b.len() && b[i].is_ascii_digit() {
        i += 1;
    }
    let mut double = false;
    if b.get(i) == Some(&b'.') && b.get(i + 1).is_some_and(u8::is_ascii_digit) {
        double = true;
        i += 1;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
    }
    if matches!(b.get(i), Some(b'e' | b'E')) {
        let mut j = i + 1;
        if matches!(b.get(j), Some(b'+' | b'-')) {
            j += 1;
        }
        if b.get(j).is_some_and(u8::is_ascii_digit) {
            double = true;
            i = j;
            while i < b.len() && b[i].is_ascii_digit() {
                i += 1;
            }
        }
    }
    let text = &src[start..i];
    if double {
        let v = text.parse::<f64>().map_err(|_| bad(text))?;
        return Ok((Tok::Double(v), i - start));
    }
    if matches!(b.get(i), Some(b'u' | b'U')) {
        let v = text.parse::<u64>().map_err(|_| bad(&src[start..=i]))?;
        return Ok((Tok::Uint(v), i + 1 - start));
    }
    // `-9223372036854775808` lexes as `-` then a literal one past i64::MAX; the parser
    // folds the negation (as cel-go does), so keep the magnitude here.
    match text.parse::<i64>() {
        Ok(v) => Ok((Tok::Int(v), i - start)),
        Err(_) if text == "9223372036854775808" => Ok((Tok::MinIntMagnitude, i - start)),
        Err(_) => Err(bad(text)),
    }
}

/// The string literal whose opening quote is at `start`: its value and the bytes it took
/// (quotes included). Raw strings keep backslashes as they are.
fn string(src: &str, start: usize, raw: bool) -> Result<(String, usize), CompileError> {
    let q = &src[start..start + 1];
    let triple: String = q.repeat(3);
    let (close, body_start) = if src[start..].starts_with(&triple) {
        (triple.as_str(), start + 3)
    } else {
        (q, start + 1)
    };
    let mut out = String::new();
    let mut chars = src[body_start..].char_indices().peekable();
    while let Some((off, c)) = chars.next() {
        let at = body_start + off;
        if src[at..].starts_with(close) {
            return Ok((out, at + close.len() - start));
        }
        if (c == '\n' || c == '\r') && close.len() == 1 {
            return Err(CompileError::syntax(start, "newline in a quoted string"));
        }
        if c != '\\' || raw {
            out.push(c);
            continue;
        }
        let Some((_, e)) = chars.next() else { break };
        let mut hex = |n: usize| -> Result<char, CompileError> {
            let digits: String = (0..n)
                .filter_map(|_| chars.next().map(|(_, c)| c))
                .collect();
            u32::from_str_radix(&digits, 16)
                .ok()
                .filter(|_| digits.len() == n)
                .and_then(char::from_u32)
                .ok_or_else(|| CompileError::syntax(at, format!("invalid escape \\{e}{digits}")))
        };
        out.push(match e {
            '\\' | '"' | '\'' | '`' | '?' => e,
            'a' => '\u{7}',
            'b' => '\u{8}',
            'f' => '\u{c}',
            'n' => '\n',
            'r' => '\r',
            't' => '\t',
            'v' => '\u{b}',
            'x' | 'X' => hex(2)?,
            'u' => hex(4)?,
            'U' => hex(8)?,
            '0'..='3' => {
                let mut v = e.to_digit(8).unwrap_or(0);
                for _ in 0..2 {
                    match chars.next() {
                        Some((_, d)) if d.is_digit(8) => v = v * 8 + d.to_digit(8).unwrap_or(0),
                        _ => return Err(CompileError::syntax(at, "invalid octal escape")),
                    }
                }
                char::from_u32(v).ok_or_else(|| CompileError::syntax(at, "invalid octal escape"))?
            }
            other => {
                return Err(CompileError::syntax(
                    at,
                    format!("invalid escape sequence \\{other}"),
                ));
            }
        });
    }
    Err(CompileError::syntax(start, "unterminated string literal"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(s: &str) -> Vec<Tok> {
        lex(s).unwrap().into_iter().map(|t| t.tok).collect()
    }

    #[test]
    fn literals() {
        assert_eq!(
            toks(r#"'a\'b' "c\"" r'\n' '''x'y''' "\x41\u00e9\101""#),
            [
                Tok::Str("a'b".into()),
                Tok::Str("c\"".into()),
                Tok::Str("\\n".into()),
                Tok::Str("x'y".into()),
                Tok::Str("AéA".into()),
            ]
        );
        assert_eq!(
            toks("1 0x1F 2u 1.5 1e3 .5"),
            [
                Tok::Int(1),
                Tok::Int(31),
                Tok::Uint(2),
                Tok::Double(1.5),
                Tok::Double(1000.0),
                Tok::Double(0.5),
            ]
        );
        assert!(lex("b'x'").unwrap_err().to_string().contains("bytes"));
        assert!(lex("'open").is_err());
        assert!(lex("'\\q'").is_err());
        assert!(lex("a # b").is_err());
    }
}
