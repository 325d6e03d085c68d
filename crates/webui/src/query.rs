//! The list pages' query strings (`/`, `/cards`, `/pods`): form-decoded fields, a choice
//! among words, pages of rows (`?page=&per=`), and the links that keep every other field, so
//! sorting, filtering and paging work with plain links and forms (no JavaScript).

use std::fmt::Write;
use std::ops::Range;

use crate::html::{esc, url_segment};

/// The query's fields in order, form-decoded, values trimmed; an undecodable one is an
/// error naming its key.
pub fn fields(raw: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    for pair in raw.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let decode = |s: &str| {
            crate::whatif::form_decode(s.as_bytes())
                .and_then(|b| String::from_utf8(b).ok())
                .ok_or_else(|| format!("the query's {key:?} is not valid form encoding"))
        };
        out.push((decode(key)?, decode(value)?.trim().to_owned()));
    }
    Ok(out)
}

/// The index in `words` of `value`, or an error naming `key` and the words it may be.
pub fn choose(key: &str, value: &str, words: &[&str]) -> Result<usize, String> {
    words
        .iter()
        .position(|w| *w == value)
        .ok_or_else(|| format!("{key}={value:?} is not one of {}", words.join(", ")))
}

/// The most rows a page may be asked to show (`?per=`).
pub const MAX_PER_PAGE: usize = 1000;

/// Which page of rows, and how many a page holds (`?page=&per=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Paging {
    /// 1-based; past the last page reads as the last.
    pub page: usize,
    /// Rows per page, 1 to [`MAX_PER_PAGE`].
    pub per: usize,
    /// The page's default `per` (a link leaves `per` out while it is this).
    pub default_per: usize,
}

impl Paging {
    /// Page 1 of `per` rows.
    pub fn new(per: usize) -> Paging {
        Paging {
            page: 1,
            per,
            default_per: per,
        }
    }

    /// Takes `page` or `per`; `Ok(false)` for any other key.
    pub fn read(&mut self, key: &str, value: &str) -> Result<bool, String> {
        match key {
            "page" if !value.is_empty() => {
                self.page = value
                    .parse()
                    .ok()
                    .filter(|p| *p >= 1)
                    .ok_or_else(|| format!("page={value:?} is not a page number (1, 2, …)"))?;
            }
            "per" if !value.is_empty() => {
                self.per = value
                    .parse()
                    .ok()
                    .filter(|p| (1..=MAX_PER_PAGE).contains(p))
                    .ok_or_else(|| {
                        format!("per={value:?} is not a number of rows from 1 to {MAX_PER_PAGE}")
                    })?;
            }
            "page" | "per" => {}
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// How many pages `total` rows make (at least one).
    pub fn pages(&self, total: usize) -> usize {
        total.div_ceil(self.per).max(1)
    }

    /// The rows of the page (the last one where the page asked for is past it), and that
    /// page's number.
    pub fn window(&self, total: usize) -> (Range<usize>, usize) {
        let page = self.page.min(self.pages(total));
        let start = (page - 1) * self.per;
        (start..(start + self.per).min(total), page)
    }

    /// `per` as a link field: none while it is the page's default.
    fn field(&self) -> Option<(&'static str, String)> {
        (self.per != self.default_per).then(|| ("per", self.per.to_string()))
    }
}

/// `path?k=v&…` for an `href` (escaped for the attribute), the empty fields left out.
pub fn href(path: &str, fields: &[(&str, String)]) -> String {
    let mut out = path.to_owned();
    let mut first = true;
    for (k, v) in fields.iter().filter(|(_, v)| !v.is_empty()) {
        out.push_str(if first { "?" } else { "&" });
        first = false;
        let _ = write!(out, "{k}={}", url_segment(v));
    }
    esc(&out)
}

/// The page links under a table of `total` rows: first, previous, "page N of M", next and
/// last, each keeping `fields` (the page's other fields); nothing when one page holds all.
pub fn pager(
    what: &str,
    path: &str,
    fields: &[(&str, String)],
    paging: &Paging,
    total: usize,
) -> String {
    let pages = paging.pages(total);
    if pages <= 1 {
        return String::new();
    }
    let (rows, page) = paging.window(total);
    let link = |to: usize, text: &str, rel: &str| {
        let mut all: Vec<(&str, String)> = fields.to_vec();
        if !fields.iter().any(|(k, _)| *k == "per") {
            all.extend(paging.field());
        }
        if to > 1 {
            all.push(("page", to.to_string()));
        }
        format!("<a href=\"{}\"{rel}>{text}</a>", href(path, &all))
    };
    let mut out = format!(
        "<nav class=\"pager\" aria-label=\"Pages of {what}\"><span>{what} {}–{} of {total}</span> ",
        rows.start + 1,
        rows.end
    );
    if page > 1 {
        out.push_str(&link(1, "First", ""));
        out.push(' ');
        out.push_str(&link(page - 1, "Previous", " rel=\"prev\""));
        out.push(' ');
    }
    let _ = write!(
        out,
        "<strong aria-current=\"page\">page {page} of {pages}</strong>"
    );
    if page < pages {
        out.push(' ');
        out.push_str(&link(page + 1, "Next", " rel=\"next\""));
        out.push(' ');
        out.push_str(&link(pages, "Last", ""));
    }
    out.push_str("</nav>");
    out
}

/// The sort links: the current one in bold, each other keeping `fields` (paging restarts).
pub fn sort_links(
    path: &str,
    fields: &[(&str, String)],
    words: &[(&str, &str)],
    current: &str,
) -> String {
    let mut out = String::from("<p class=\"sorts\">Sort by:");
    for (word, label) in words {
        if *word == current {
            let _ = write!(out, " <strong aria-current=\"true\">{label}</strong>");
        } else {
            let mut all = vec![("sort", (*word).to_owned())];
            all.extend(fields.iter().cloned());
            let _ = write!(out, " <a href=\"{}\">{label}</a>", href(path, &all));
        }
    }
    out.push_str("</p>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_decode_and_name_what_is_wrong() {
        assert_eq!(
            fields("a=x+y&b=%3Cz%3E&&c").unwrap(),
            vec![
                ("a".into(), "x y".into()),
                ("b".into(), "<z>".into()),
                ("c".into(), String::new())
            ]
        );
        assert!(fields("a=%zz").unwrap_err().contains("\"a\""));
        assert_eq!(choose("sort", "b", &["a", "b"]), Ok(1));
        assert_eq!(
            choose("sort", "<x>", &["a", "b"]).unwrap_err(),
            "sort=\"<x>\" is not one of a, b"
        );
    }

    #[test]
    fn pages_hold_per_rows_and_hostile_numbers_are_refused() {
        let mut p = Paging::new(100);
        assert_eq!(p.window(250), (0..100, 1));
        assert!(p.read("page", "3").unwrap());
        assert_eq!(p.window(250), (200..250, 3));
        // Past the end: the last page.
        p.read("page", "99").unwrap();
        assert_eq!(p.window(250), (200..250, 3));
        assert_eq!(p.window(0), (0..0, 1));
        assert!(!p.read("sort", "x").unwrap());
        for bad in ["0", "-1", "x", "99999999999999999999999", "1e3"] {
            assert!(p.read("page", bad).is_err(), "{bad}");
        }
        for bad in ["0", "1001", "lots"] {
            assert!(p.read("per", bad).is_err(), "{bad}");
        }
        p.read("per", "1000").unwrap();
        assert_eq!(p.pages(2500), 3);
    }

    #[test]
    fn links_keep_the_other_fields_and_escape_them() {
        assert_eq!(
            href(
                "/pods",
                &[
                    ("sort", "node".into()),
                    ("ns", "a&b\"".into()),
                    ("node", String::new())
                ]
            ),
            "/pods?sort=node&amp;ns=a%26b%22"
        );
        let mut p = Paging::new(10);
        p.read("page", "2").unwrap();
        let nav = pager("pods", "/pods", &[("ns", "x".into())], &p, 35);
        assert!(nav.contains("pods 11–20 of 35"), "{nav}");
        assert!(nav.contains("<a href=\"/pods?ns=x\">First</a>"), "{nav}");
        assert!(
            nav.contains("<a href=\"/pods?ns=x&amp;page=3\" rel=\"next\">Next</a>"),
            "{nav}"
        );
        assert!(
            nav.contains("<a href=\"/pods?ns=x&amp;page=4\">Last</a>"),
            "{nav}"
        );
        assert!(nav.contains("page 2 of 4"), "{nav}");
        p.read("per", "20").unwrap();
        let nav = pager("pods", "/pods", &[], &p, 35);
        assert!(nav.contains("href=\"/pods?per=20\">First"), "{nav}");
        assert!(!nav.contains("Next"), "the last page: {nav}");
        assert_eq!(pager("pods", "/pods", &[], &Paging::new(50), 50), "");
    }
}
