//! Which examples need `--dra`, and which device-plugin examples run a second time in DRA
//! mode beside their device-plugin run (issue 20: "the same examples" in both modes).
//!
//! A DRA example is a file with ResourceClaimTemplates (a claim written by hand) or a pod
//! annotated `hami.io/amd-mode: dra` (HAMi's API, converted by the scheduler's webhook).
//! A twin is the same pod, renamed `<name>-dra` and annotated `hami.io/amd-mode: dra`: the
//! webhook's default stays `device-plugin`, so the original runs on a device-plugin node and
//! the twin on the DRA node, from one YAML.

use hami_protocol::dra::{AMD_MODE_ANNOTATION, AMD_MODE_DRA};
use k8s_openapi::api::core::v1::Pod;

use crate::dra_node::ExampleDocuments;

/// The built-in examples that also run in DRA mode with `--dra`. Only memory-only: its
/// claim takes every CU of a GPU (memory-only reserves 100 % of the cores), so it never
/// shares a GPU with the other DRA pods and cannot crowd them; share-a's twin is
/// `11-dra-hami-api.yaml`, written out as an example of its own.
pub const TWINS: &[&str] = &["03-memory-only.yaml"];

/// What a twin's pod name ends with.
pub const TWIN_SUFFIX: &str = "-dra";

/// Whether `pod` asks for the webhook's DRA mode.
pub fn asks_for_dra(pod: &Pod) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(AMD_MODE_ANNOTATION))
        .is_some_and(|v| v == AMD_MODE_DRA)
}

/// Whether an example file needs the DRA node (`--dra`).
pub fn is_dra_example(docs: &ExampleDocuments) -> bool {
    docs.templates.is_some() || asks_for_dra(&docs.pod)
}

/// `pod` renamed `<name>-dra` and annotated for the webhook's DRA mode.
pub fn twin(pod: &Pod) -> Pod {
    let mut twin = pod.clone();
    let name = pod.metadata.name.clone().unwrap_or_default();
    twin.metadata.name = Some(format!("{name}{TWIN_SUFFIX}"));
    twin.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(AMD_MODE_ANNOTATION.into(), AMD_MODE_DRA.into());
    twin
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dra_node::example_documents;
    use crate::examples::BUILT_IN;

    fn built_in(file: &str) -> ExampleDocuments {
        let text = BUILT_IN.iter().find(|(f, _)| *f == file).unwrap().1;
        example_documents(file, text).unwrap()
    }

    #[test]
    fn the_dra_examples_are_the_template_one_and_the_annotated_one() {
        let dra: Vec<&str> = BUILT_IN
            .iter()
            .filter(|(f, t)| is_dra_example(&example_documents(f, t).unwrap()))
            .map(|(f, _)| *f)
            .collect();
        assert_eq!(dra, ["10-dra-slice.yaml", "11-dra-hami-api.yaml"]);
    }

    #[test]
    fn a_twin_is_the_same_pod_renamed_and_annotated() {
        for file in TWINS {
            let docs = built_in(file);
            assert!(!is_dra_example(&docs), "{file} runs without --dra too");
            let twin = twin(&docs.pod);
            assert!(asks_for_dra(&twin));
            assert_eq!(
                twin.metadata.name.as_deref(),
                Some(format!("{}-dra", docs.pod.metadata.name.as_deref().unwrap()).as_str())
            );
            // Everything else as written: the original's annotations, the whole spec.
            let original = docs.pod.metadata.annotations.clone().unwrap_or_default();
            let mut annotations = twin.metadata.annotations.clone().unwrap();
            assert_eq!(
                annotations.remove(AMD_MODE_ANNOTATION).as_deref(),
                Some("dra")
            );
            assert_eq!(annotations, original);
            assert_eq!(twin.spec, docs.pod.spec);
        }
    }

    #[test]
    fn a_pod_with_no_annotations_gets_the_mode_one() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"}, "spec": {"containers": []}
        }))
        .unwrap();
        assert!(!asks_for_dra(&pod));
        let twin = twin(&pod);
        assert_eq!(twin.metadata.name.as_deref(), Some("p-dra"));
        assert!(asks_for_dra(&twin));
        // Another value is not DRA mode (the webhook would refuse it by name).
        let mut other = twin.clone();
        other
            .metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(AMD_MODE_ANNOTATION.into(), "device-plugin".into());
        assert!(!asks_for_dra(&other));
    }
}
