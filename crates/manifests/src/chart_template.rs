//! The subset of Helm's Go templates our chart uses, so the chart can be rendered (and
//! checked against the typed manifests) where no `helm` binary exists. Supported:
//! `{{ .Values.a.b }}`, `{{ .Release.Namespace }}`, `{{ .Release.Name }}`, the pipe
//! `| quote`, `{{ if X }}` / `{{ else }}` / `{{ end }}` with `X` a value, `not X` or
//! `eq X "literal"`, comments `{{/* */}}`, and the trim markers `{{-` / `-}}`. Anything else
//! is an error naming the template and the action, so the chart cannot silently grow a
//! construct this renderer would get wrong. A missing value is an error too (Helm would
//! print `<no value>`).

use serde_json::Value;

/// What `.Release` and `.Values` resolve to.
pub struct Context<'a> {
    pub release_name: &'a str,
    pub release_namespace: &'a str,
    pub values: &'a Value,
}

#[derive(Debug)]
enum Node {
    Text(String),
    Output(String),
    If {
        cond: String,
        then: Vec<Node>,
        otherwise: Vec<Node>,
    },
}

enum Token {
    Text(String),
    Action(String),
}

fn tokenize(src: &str) -> Result<Vec<Token>, String> {
    let mut out = Vec::new();
    let mut rest = src;
    let mut trim_next = false;
    while let Some(start) = rest.find("{{") {
        let mut text = rest[..start].to_string();
        if trim_next {
            text = text.trim_start().to_string();
        }
        let after = &rest[start + 2..];
        let end = after
            .find("}}")
            .ok_or_else(|| format!("unclosed action at {:?}", &rest[start..]))?;
        let mut action = &after[..end];
        if let Some(a) = action.strip_prefix('-') {
            text = text.trim_end().to_string();
            action = a;
        }
        trim_next = false;
        if let Some(a) = action.strip_suffix('-') {
            trim_next = true;
            action = a;
        }
        out.push(Token::Text(text));
        out.push(Token::Action(action.trim().to_string()));
        rest = &after[end + 2..];
    }
    let text = if trim_next { rest.trim_start() } else { rest };
    out.push(Token::Text(text.to_string()));
    Ok(out)
}

/// Parses until `else`/`end` (returned) or the end of input.
fn parse_block(
    tokens: &mut std::vec::IntoIter<Token>,
) -> Result<(Vec<Node>, Option<String>), String> {
    let mut nodes = Vec::new();
    while let Some(t) = tokens.next() {
        match t {
            Token::Text(s) => nodes.push(Node::Text(s)),
            Token::Action(a) if a.starts_with("/*") => {
                if !a.ends_with("*/") {
                    return Err(format!("unterminated comment {a:?}"));
                }
            }
            Token::Action(a) if a == "end" || a == "else" => return Ok((nodes, Some(a))),
            Token::Action(a) => {
                if let Some(cond) = a.strip_prefix("if ") {
                    let (then, stop) = parse_block(tokens)?;
                    let otherwise = match stop.as_deref() {
                        Some("end") => Vec::new(),
                        Some("else") => match parse_block(tokens)? {
                            (o, Some(e)) if e == "end" => o,
                            _ => return Err(format!("`if {cond}`: else without end")),
                        },
                        _ => return Err(format!("`if {cond}` without end")),
                    };
                    nodes.push(Node::If {
                        cond: cond.trim().to_string(),
                        then,
                        otherwise,
                    });
                } else {
                    nodes.push(Node::Output(a));
                }
            }
        }
    }
    Ok((nodes, None))
}

fn lookup(ctx: &Context, path: &str) -> Result<Value, String> {
    match path {
        ".Release.Name" => return Ok(Value::String(ctx.release_name.into())),
        ".Release.Namespace" => return Ok(Value::String(ctx.release_namespace.into())),
        _ => {}
    }
    let Some(rest) = path.strip_prefix(".Values.") else {
        return Err(format!("unsupported reference {path:?}"));
    };
    let mut v = ctx.values;
    for key in rest.split('.') {
        v = v
            .get(key)
            .ok_or_else(|| format!("value .Values.{rest} is not set in values.yaml"))?;
    }
    Ok(v.clone())
}

fn operand(ctx: &Context, word: &str) -> Result<Value, String> {
    if let Some(lit) = word.strip_prefix('"').and_then(|w| w.strip_suffix('"')) {
        return Ok(Value::String(lit.into()));
    }
    lookup(ctx, word)
}

fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64() != Some(0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

fn condition(ctx: &Context, cond: &str) -> Result<bool, String> {
    let words: Vec<&str> = cond.split_whitespace().collect();
    match words.as_slice() {
        [one] => Ok(truthy(&operand(ctx, one)?)),
        ["not", one] => Ok(!truthy(&operand(ctx, one)?)),
        ["eq", a, b] => Ok(operand(ctx, a)? == operand(ctx, b)?),
        _ => Err(format!("unsupported condition {cond:?}")),
    }
}

fn scalar(v: &Value) -> Result<String, String> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Bool(_) | Value::Number(_) => Ok(v.to_string()),
        other => Err(format!("cannot print a non-scalar value {other}")),
    }
}

fn output(ctx: &Context, action: &str) -> Result<String, String> {
    let mut stages = action.split('|').map(str::trim);
    let first = stages.next().unwrap_or_default();
    let mut text = scalar(&operand(ctx, first)?)?;
    for stage in stages {
        match stage {
            "quote" => text = serde_json::to_string(&text).map_err(|e| e.to_string())?,
            other => return Err(format!("unsupported function {other:?}")),
        }
    }
    Ok(text)
}

fn eval(ctx: &Context, nodes: &[Node], out: &mut String) -> Result<(), String> {
    for n in nodes {
        match n {
            Node::Text(t) => out.push_str(t),
            Node::Output(a) => {
                out.push_str(&output(ctx, a).map_err(|e| format!("{{{{ {a} }}}}: {e}"))?)
            }
            Node::If {
                cond,
                then,
                otherwise,
            } => {
                if condition(ctx, cond)? {
                    eval(ctx, then, out)?
                } else {
                    eval(ctx, otherwise, out)?
                }
            }
        }
    }
    Ok(())
}

/// Renders one template file.
pub fn render(name: &str, template: &str, ctx: &Context) -> Result<String, String> {
    let mut tokens = tokenize(template)
        .map_err(|e| format!("{name}: {e}"))?
        .into_iter();
    let (nodes, stop) = parse_block(&mut tokens).map_err(|e| format!("{name}: {e}"))?;
    if let Some(s) = stop {
        return Err(format!("{name}: unexpected {{{{ {s} }}}}"));
    }
    let mut out = String::new();
    eval(ctx, &nodes, &mut out).map_err(|e| format!("{name}: {e}"))?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn r(t: &str, values: Value) -> Result<String, String> {
        render(
            "t",
            t,
            &Context {
                release_name: "rel",
                release_namespace: "ns",
                values: &values,
            },
        )
    }

    #[test]
    fn values_quote_and_trim() {
        let v = json!({"a": {"b": "x y", "n": 3, "t": true}});
        assert_eq!(
            r(
                "k: {{ .Values.a.b | quote }} n: {{ .Values.a.n }} {{ .Release.Namespace }}",
                v.clone()
            )
            .unwrap(),
            "k: \"x y\" n: 3 ns"
        );
        assert_eq!(
            r("a\n  {{- .Values.a.t }}\nb", v.clone()).unwrap(),
            "atrue\nb"
        );
        assert_eq!(r("a\n{{ .Values.a.n -}}\n  b", v).unwrap(), "a\n3b");
    }

    #[test]
    fn conditions() {
        let v = json!({"on": true, "off": false, "mode": "certgen"});
        let t = "{{- if .Values.on }}A{{ else }}B{{ end }}{{ if not .Values.off }}C{{ end }}{{ if eq .Values.mode \"cert-manager\" }}D{{ else }}E{{ end }}";
        assert_eq!(r(t, v).unwrap(), "ACE");
    }

    #[test]
    fn errors_name_the_problem() {
        assert!(
            r("{{ .Values.missing }}", json!({}))
                .unwrap_err()
                .contains("not set")
        );
        assert!(
            r("{{ if .Values.a }}x", json!({"a": 1}))
                .unwrap_err()
                .contains("without end")
        );
        assert!(
            r("{{ .Values.a | upper }}", json!({"a": "x"}))
                .unwrap_err()
                .contains("unsupported function")
        );
        assert!(
            r("{{ include \"x\" . }}", json!({}))
                .unwrap_err()
                .contains("unsupported")
        );
        assert!(
            r("{{ end }}", json!({}))
                .unwrap_err()
                .contains("unexpected")
        );
        assert!(
            r("{{ .Values.m }}", json!({"m": {"k": 1}}))
                .unwrap_err()
                .contains("non-scalar")
        );
    }
}
