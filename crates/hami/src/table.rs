//! Plain-text tables with columns sized to their content, as kubectl prints them, and the
//! one way text from the cluster reaches the terminal: [`shown`].
//!
//! Names, Event messages and reasons are written by whoever may create those objects.
//! Printed raw, an escape sequence recolours or clears the operator's terminal, a carriage
//! return overwrites the line before it, a line feed forges table rows, and a bidi
//! override shows a name reversed. So every cell and every foreign part of a line is
//! passed through [`shown`], which writes such characters as visible escapes and keeps a
//! cell on one line.

use std::borrow::Cow;

pub(crate) struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub(crate) fn new(header: &[&str]) -> Self {
        Self {
            header: header.iter().map(|h| h.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    /// Adds a row; each cell is [`shown`], so a cell is one line of printable text.
    pub(crate) fn row(&mut self, cells: Vec<String>) {
        self.rows.push(
            cells
                .into_iter()
                .map(|c| match shown(&c) {
                    Cow::Borrowed(_) => c,
                    Cow::Owned(clean) => clean,
                })
                .collect(),
        );
    }

    pub(crate) fn render(&self) -> String {
        let columns = self.header.len();
        let mut widths: Vec<usize> = self.header.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (i, cell) in row.iter().enumerate().take(columns) {
                widths[i] = widths[i].max(cell.chars().count());
            }
        }
        let mut out = String::new();
        for row in std::iter::once(&self.header).chain(&self.rows) {
            let mut line = String::new();
            for (i, width) in widths.iter().enumerate() {
                let cell = row.get(i).map(String::as_str).unwrap_or("");
                line.push_str(cell);
                if i + 1 < columns {
                    line.extend(std::iter::repeat_n(' ', width - cell.chars().count() + 2));
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

/// Whether `c` must not reach a terminal as itself: C0 controls (ESC, CR, LF, TAB, NUL …),
/// DEL and the C1 controls (CSI `U+009B` starts an escape sequence on many terminals),
/// line and paragraph separators, the bidi embeddings, overrides, isolates and marks
/// (which reorder what follows them), and zero-width characters (which hide text).
fn hidden(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061c}'
                | '\u{200b}'..='\u{200f}'
                | '\u{2028}'..='\u{202e}'
                | '\u{2060}'..='\u{2069}'
                | '\u{feff}'
        )
}

/// `text` as it may be printed: each character of [`hidden`] written as a visible escape
/// (`\e`, `\r`, `\n`, `\t`, `\0`, otherwise `\u{202e}` style), everything else as is.
/// Borrowed when nothing needed escaping (the usual case).
pub(crate) fn shown(text: &str) -> Cow<'_, str> {
    if !text.chars().any(hidden) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\u{1b}' => out.push_str("\\e"),
            '\r' => out.push_str("\\r"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\0' => out.push_str("\\0"),
            c if hidden(c) => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligns_columns() {
        let mut t = Table::new(&["A", "LONG HEADER", "C"]);
        t.row(vec!["wide cell".into(), "x".into(), "y".into()]);
        t.row(vec!["z".into()]);
        assert_eq!(
            t.render(),
            "A          LONG HEADER  C\nwide cell  x            y\nz\n"
        );
    }

    #[test]
    fn control_and_bidi_characters_are_escaped_visibly() {
        assert!(matches!(shown("ml/pod-1 ok: GPU ü 64Gi"), Cow::Borrowed(_)));
        assert_eq!(
            shown("a\u{1b}[2Jb\rc\nd\te\0f\u{7f}g\u{9b}h\u{202e}i\u{2066}j\u{200b}k\u{2028}l"),
            "a\\e[2Jb\\rc\\nd\\te\\0f\\u{7f}g\\u{9b}h\\u{202e}i\\u{2066}j\\u{200b}k\\u{2028}l"
        );
        let mut t = Table::new(&["A", "B"]);
        t.row(vec!["x\ny  fake row".into(), "\u{1b}[31mred".into()]);
        let text = t.render();
        assert_eq!(text.lines().count(), 2, "{text}");
        assert!(!text.contains('\u{1b}'), "{text}");
    }

    #[test]
    fn nothing_hidden_survives_any_text() {
        // Every code point of the ranges that matter, and around them.
        let all: String = (0u32..0x3000).filter_map(char::from_u32).collect();
        let out = shown(&all);
        assert!(!out.chars().any(hidden), "{out}");
        assert!(!out.contains(['\n', '\r', '\u{1b}', '\u{7f}', '\u{9b}', '\u{202e}']));
    }
}
