//! The capture archive format: the KFD topology files of a real node packed into one text
//! file (see `tools/pack_capture.py`), so the repository holds one file per capture
//! instead of thousands.

use std::fmt;

/// One file of a capture, path relative to `topology/nodes`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArchiveEntry<'a> {
    /// E.g. `2/properties` or `2/io_links/0/properties`.
    pub path: &'a str,
    /// The file's text, as the driver would return it.
    pub contents: &'a str,
}

/// Why an archive could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArchiveError(pub String);

impl fmt::Display for ArchiveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "capture archive: {}", self.0)
    }
}

impl std::error::Error for ArchiveError {}

const HEADER: &str = "# hami-sysfs-fixtures KFD capture archive v1\n";

/// Splits an archive into its files.
pub fn parse_archive(text: &str) -> Result<Vec<ArchiveEntry<'_>>, ArchiveError> {
    let mut rest = text
        .strip_prefix(HEADER)
        .ok_or_else(|| ArchiveError("missing header line".into()))?;
    let mut entries = Vec::new();
    while !rest.is_empty() {
        let (line, after) = rest
            .split_once('\n')
            .ok_or_else(|| ArchiveError("truncated entry header".into()))?;
        let header = line
            .strip_prefix("=== ")
            .ok_or_else(|| ArchiveError(format!("expected '=== <path> <len>', got {line:?}")))?;
        let (path, len) = header
            .rsplit_once(' ')
            .ok_or_else(|| ArchiveError(format!("entry header {line:?} lacks a length")))?;
        let len: usize = len
            .parse()
            .map_err(|_| ArchiveError(format!("entry header {line:?}: bad length")))?;
        if path.split('/').any(|part| part == ".." || part.is_empty()) {
            return Err(ArchiveError(format!("entry path {path:?} leaves the tree")));
        }
        let contents = after
            .get(..len)
            .ok_or_else(|| ArchiveError(format!("entry {path:?} is truncated")))?;
        rest = after[len..]
            .strip_prefix('\n')
            .ok_or_else(|| ArchiveError(format!("entry {path:?} is not followed by a newline")))?;
        entries.push(ArchiveEntry { path, contents });
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_entries_and_refuses_damage() {
        let text = format!("{HEADER}=== 1/properties 6\nab\ncd\n\n=== 2/name 0\n\n");
        let entries = parse_archive(&text).unwrap();
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[0].contents, "ab\ncd\n");
        assert_eq!(entries[1].path, "2/name");
        assert!(parse_archive("nope").is_err());
        assert!(parse_archive(&format!("{HEADER}=== a 9\nab\n")).is_err());
        assert!(parse_archive(&format!("{HEADER}=== ../a 1\nx\n")).is_err());
        assert!(parse_archive(&format!("{HEADER}=== a x\nx\n")).is_err());
    }
}
