//! API errors as a person reads them, on one line: kubelet copies a failed prepare's error
//! into the pod's Events, and kube-rs formats `Error::Api` as `ApiError: <message>: <reason>
//! (Status { status: Some(Failure), code: 409, … })`. Here: code, reason and the server's
//! message, as the scheduler's `kube_error::text` does (that crate is not a dependency of
//! the driver), with any line break or control character a server sent made a space.

/// One line for `e`.
pub fn text(e: &kube::Error) -> String {
    let raw = match e {
        kube::Error::Api(s) => {
            let reason = if s.reason.is_empty() {
                String::new()
            } else {
                format!(" {}", s.reason)
            };
            let message = if s.message.is_empty() {
                "no message"
            } else {
                s.message.as_str()
            };
            format!("the API server answered {}{reason}: {message}", s.code)
        }
        other => other.to_string(),
    };
    one_line(&raw)
}

/// `s` with every control character (newlines included) replaced by a space.
pub fn one_line(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_debug_dump_and_one_line() {
        let e = kube::Error::Api(
            kube::core::Status::failure("resourceclaims \"c\" not found", "NotFound")
                .with_code(404)
                .boxed(),
        );
        assert_eq!(
            text(&e),
            "the API server answered 404 NotFound: resourceclaims \"c\" not found"
        );
        // What kube-rs itself prints, for contrast.
        assert!(e.to_string().contains("Status {"));
        let e = kube::Error::Api(kube::core::Status::failure("a\nb\r\x1b[2J", "").boxed());
        assert_eq!(text(&e), "the API server answered 0: a b  [2J");
    }
}
