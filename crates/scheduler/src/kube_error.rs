//! API errors as a person reads them. kube-rs formats `Error::Api` as
//! `ApiError: <message>: <reason> (Status { status: Some(Failure), code: 409, … })`; that
//! debug dump reached kube-scheduler's pod conditions and Events. Here: code, reason and
//! the server's message, nothing else.

/// One line for `e`.
pub fn text(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => {
            let reason = if s.reason.is_empty() {
                String::new()
            } else {
                format!(" {}", s.reason)
            };
            let message = if s.message.is_empty() {
                "no message".to_owned()
            } else {
                s.message.clone()
            };
            format!("the API server answered {}{reason}: {message}", s.code)
        }
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_debug_dump() {
        let e = kube::Error::Api(
            kube::core::Status::failure("Operation cannot be fulfilled", "Conflict")
                .with_code(409)
                .boxed(),
        );
        let t = text(&e);
        assert_eq!(
            t,
            "the API server answered 409 Conflict: Operation cannot be fulfilled"
        );
        // What kube-rs itself prints, for contrast.
        assert!(e.to_string().contains("Status {"));
    }
}
