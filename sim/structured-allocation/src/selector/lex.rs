//! The selector's tokens: identifiers, string and int literals, punctuation; strings with
//! CEL's escapes, and quoting back for rendering and messages.

#[derive(Debug, Clone, PartialEq)]
pub(super) enum Tok {
    Ident(String),
    Str(String),
    Int(i64),
    Punct(&'static str),
}

pub(super) fn show(t: Option<&Tok>) -> String {
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

pub(super) fn lex(s: &str) -> Result<Vec<Tok>, String> {
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
pub(super) fn quote(s: &str) -> String {
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
