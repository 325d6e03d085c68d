//! API errors as a person reads them, on one line. kube-rs formats `Error::Api` as
//! `ApiError: <message>: <reason> (Status { status: Some(Failure), code: 409, … })`; that
//! debug dump reached kube-scheduler's pod conditions and Events (the scheduler), and the
//! pod Events kubelet copies a failed prepare's error into (the DRA driver). Here: code,
//! reason and the server's message, nothing else, with any line break or control character
//! a server sent made a space. The scheduler and the DRA driver both use it.

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
        let e = kube::Error::Api(
            kube::core::Status::failure("Operation cannot be fulfilled", "Conflict")
                .with_code(409)
                .boxed(),
        );
        assert_eq!(
            text(&e),
            "the API server answered 409 Conflict: Operation cannot be fulfilled"
        );
        let e = kube::Error::Api(kube::core::Status::failure("a\nb\r\x1b[2J", "").boxed());
        assert_eq!(text(&e), "the API server answered 0: a b  [2J");
    }
}
