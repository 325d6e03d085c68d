//! Reading Kubernetes objects from a file or stdin, as JSON or YAML, with errors that name
//! the field at fault.

use std::io::Read;

use serde::de::DeserializeOwned;
use serde_json::Value;

/// Input the user must fix; the CLI exits with status 2.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct InputError(pub String);

impl From<hami_report::ReportError> for InputError {
    fn from(e: hami_report::ReportError) -> Self {
        InputError(e.0)
    }
}

/// Reads `path` (`-` for stdin).
pub(crate) fn read_source(path: &str) -> Result<String, InputError> {
    let mut text = String::new();
    let result = if path == "-" {
        std::io::stdin().read_to_string(&mut text).map(|_| ())
    } else {
        std::fs::read(path).and_then(|bytes| {
            text = String::from_utf8(bytes).map_err(|_| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    "the file is not UTF-8 text",
                )
            })?;
            Ok(())
        })
    };
    let shown = if path == "-" { "stdin" } else { path };
    result.map_err(|e| InputError(format!("cannot read {shown}: {e}")))?;
    Ok(text)
}

/// Parses a `kind` object from JSON or YAML text.
pub(crate) fn parse_object<T: DeserializeOwned>(text: &str, kind: &str) -> Result<T, InputError> {
    let trimmed = text.trim_start();
    if trimmed.is_empty() {
        return Err(InputError(format!(
            "the input is empty: give a {kind} as JSON or YAML"
        )));
    }
    let value: Value = if trimmed.starts_with('{') {
        serde_json::from_str(text)
            .map_err(|e| InputError(format!("the input is not valid JSON: {e}")))?
    } else {
        serde_saphyr::from_str(text).map_err(|e| {
            let first_line = e.to_string().lines().next().unwrap_or_default().to_owned();
            InputError(format!("the input is not valid YAML: {first_line}"))
        })?
    };
    let Value::Object(map) = &value else {
        return Err(InputError(format!(
            "the input must be one {kind} object, not a list or a scalar"
        )));
    };
    match map.get("kind") {
        Some(Value::String(found)) if found == kind => {}
        Some(Value::String(found)) if found == "List" || found.ends_with("List") => {
            return Err(InputError(format!(
                "kind: the input is a {found}; give a single {kind} (e.g. kubectl get {} NAME -o yaml)",
                kind.to_lowercase()
            )));
        }
        Some(found) => return Err(InputError(format!("kind: expected {kind}, got {found}"))),
        None => {}
    }
    serde_path_to_error::deserialize(&value).map_err(|e| {
        let path = e.path().to_string();
        InputError(format!("{path}: {}", e.into_inner()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;

    #[test]
    fn json_and_yaml() {
        let pod: Pod = parse_object(r#"{"kind":"Pod","metadata":{"name":"a"}}"#, "Pod").unwrap();
        assert_eq!(pod.metadata.name.as_deref(), Some("a"));
        let pod: Pod = parse_object("kind: Pod\nmetadata:\n  name: b\nspec:\n  containers:\n  - name: c\n    resources:\n      limits:\n        amd.com/gpu: 1\n", "Pod").unwrap();
        let limits = pod.spec.unwrap().containers[0]
            .resources
            .clone()
            .unwrap()
            .limits
            .unwrap();
        assert_eq!(limits["amd.com/gpu"].0, "1");
    }

    #[test]
    fn errors_name_the_field() {
        let cases = [
            ("", "empty"),
            ("   \n", "empty"),
            ("{", "not valid JSON"),
            ("a: [", "not valid YAML"),
            ("[1]", "one Pod object"),
            ("42", "one Pod object"),
            ("kind: Node\n", "kind: expected Pod, got \"Node\""),
            ("kind: PodList\nitems: []\n", "give a single Pod"),
            ("kind: Pod\nspec:\n  containers: 3\n", "spec.containers"),
            (
                "kind: Pod\nmetadata:\n  annotations:\n    a: [1]\n",
                "metadata.annotations.a",
            ),
            (
                "kind: Pod\nspec:\n  containers:\n  - name: c\n    resources:\n      limits: [1]\n",
                "spec.containers[0].resources.limits",
            ),
        ];
        for (input, expected) in cases {
            let err = parse_object::<Pod>(input, "Pod").unwrap_err().to_string();
            assert!(err.contains(expected), "{input:?}: {err}");
            assert!(!err.contains('\n'), "one line: {err}");
        }
    }
}
