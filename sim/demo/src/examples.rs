//! The repository's `examples/` pods, built into the binary so that `hami demo` works
//! anywhere; `--examples DIR` submits a directory instead.

/// What `--examples` says for the built-in examples (its default).
pub(crate) const BUILT_IN_NAME: &str = "built-in";

/// Whether `--examples` names the built-in examples.
pub(crate) fn is_built_in(dir: &std::path::Path) -> bool {
    dir.as_os_str() == BUILT_IN_NAME
}

/// `(file name, YAML)`, in file-name order.
pub(crate) const BUILT_IN: &[(&str, &str)] = &[
    (
        "01-share-a.yaml",
        include_str!("../../../examples/01-share-a.yaml"),
    ),
    (
        "02-share-b.yaml",
        include_str!("../../../examples/02-share-b.yaml"),
    ),
    (
        "03-memory-only.yaml",
        include_str!("../../../examples/03-memory-only.yaml"),
    ),
    (
        "04-init-container.yaml",
        include_str!("../../../examples/04-init-container.yaml"),
    ),
    (
        "05-xgmi-pair.yaml",
        include_str!("../../../examples/05-xgmi-pair.yaml"),
    ),
    (
        "06-cannot-fit.yaml",
        include_str!("../../../examples/06-cannot-fit.yaml"),
    ),
    (
        "07-rejected.yaml",
        include_str!("../../../examples/07-rejected.yaml"),
    ),
    (
        "08-nvidia-share.yaml",
        include_str!("../../../examples/08-nvidia-share.yaml"),
    ),
    (
        "09-cpx-partitions.yaml",
        include_str!("../../../examples/09-cpx-partitions.yaml"),
    ),
    (
        "10-dra-slice.yaml",
        include_str!("../../../examples/10-dra-slice.yaml"),
    ),
    (
        "11-dra-hami-api.yaml",
        include_str!("../../../examples/11-dra-hami-api.yaml"),
    ),
];

#[cfg(test)]
mod tests {
    /// Every YAML file of examples/ is built in (a new example cannot be forgotten).
    #[test]
    fn every_example_file_is_built_in() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples");
        let mut files: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|f| f.ends_with(".yaml") || f.ends_with(".yml"))
            .collect();
        files.sort();
        let built: Vec<&str> = super::BUILT_IN.iter().map(|(f, _)| *f).collect();
        assert_eq!(files, built);
        for (file, text) in super::BUILT_IN {
            assert_eq!(
                std::fs::read_to_string(format!("{dir}/{file}")).unwrap(),
                *text
            );
        }
    }
}
