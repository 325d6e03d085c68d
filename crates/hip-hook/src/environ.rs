//! The container's pod-spec environment, as pid 1 was started with it (`/proc/1/environ`):
//! NUL-separated `KEY=VALUE` entries.

/// Parses an environ block. Entries without `=` are skipped; the first of a repeated key wins
/// (as `getenv` would find it).
pub fn parse_environ(block: &[u8]) -> Vec<(String, String)> {
    let mut pairs: Vec<(String, String)> = Vec::new();
    for entry in block.split(|b| *b == 0) {
        let Some(eq) = entry.iter().position(|b| *b == b'=') else {
            continue;
        };
        let key = String::from_utf8_lossy(&entry[..eq]).into_owned();
        if key.is_empty() || pairs.iter().any(|(k, _)| *k == key) {
            continue;
        }
        pairs.push((key, String::from_utf8_lossy(&entry[eq + 1..]).into_owned()));
    }
    pairs
}

/// pid 1's environment, or `None` when it cannot be read (another user, hidepid).
pub fn pod_environ() -> Option<Vec<(String, String)>> {
    std::fs::read("/proc/1/environ")
        .ok()
        .map(|block| parse_environ(&block))
}

/// Looks `key` up in a parsed block.
pub fn lookup<'a>(pairs: &'a [(String, String)], key: &str) -> Option<&'a str> {
    pairs
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_nul_separated_pairs() {
        let pairs = parse_environ(b"A=1\0HSA_CU_MASK=0:0-3\0junk\0A=2\0EMPTY=\0=x\0");
        assert_eq!(lookup(&pairs, "A"), Some("1"));
        assert_eq!(lookup(&pairs, "HSA_CU_MASK"), Some("0:0-3"));
        assert_eq!(lookup(&pairs, "EMPTY"), Some(""));
        assert_eq!(lookup(&pairs, "junk"), None);
        assert_eq!(pairs.len(), 3);
    }
}
