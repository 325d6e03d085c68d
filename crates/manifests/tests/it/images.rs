//! The Dockerfiles build packages and binaries that exist and install them where the
//! manifests run them (no container daemon here, so this is what can be checked).

use std::path::{Path, PathBuf};

use hami_manifests::{Object, Settings, names, objects};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// `(package, binary or None for the library)` pairs a `cargo build` line names.
fn built(dockerfile: &str) -> Vec<(String, Option<String>)> {
    let joined = dockerfile.replace("\\\n", " ");
    let line = joined
        .lines()
        .find(|l| l.contains("cargo build"))
        .expect("a cargo build step");
    let words: Vec<&str> = line.split_whitespace().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < words.len() {
        if words[i] == "-p" {
            let pkg = words[i + 1].to_string();
            let target = match words.get(i + 2) {
                Some(&"--bin") => Some(words[i + 3].to_string()),
                _ => None,
            };
            out.push((pkg, target));
        }
        i += 1;
    }
    out
}

fn crate_manifest(package: &str) -> String {
    for entry in std::fs::read_dir(repo().join("crates")).unwrap() {
        let path = entry.unwrap().path().join("Cargo.toml");
        if let Ok(text) = std::fs::read_to_string(&path)
            && text.contains(&format!("name = \"{package}\""))
        {
            return text;
        }
    }
    panic!("no crate named {package}");
}

fn commands(settings: &Settings) -> Vec<String> {
    let mut out = Vec::new();
    for o in objects::all(settings, false).unwrap() {
        let spec = match &o {
            Object::Deployment(d) => d.spec.as_ref().unwrap().template.spec.clone().unwrap(),
            Object::DaemonSet(d) => d.spec.as_ref().unwrap().template.spec.clone().unwrap(),
            _ => continue,
        };
        for c in spec.containers {
            if c.image.as_deref().is_some_and(|i| i.contains("/hami-rs/")) {
                out.push(c.command.unwrap()[0].clone());
            }
        }
    }
    out
}

#[test]
fn dockerfiles_build_existing_binaries_into_the_paths_the_manifests_run() {
    let scheduler = read("deploy/docker/scheduler.Dockerfile");
    let node = read("deploy/docker/node.Dockerfile");
    for (df, text) in [("scheduler", &scheduler), ("node", &node)] {
        for (pkg, bin) in built(text) {
            let manifest = crate_manifest(&pkg);
            match bin {
                Some(b) => assert!(
                    manifest.contains(&format!("name = \"{b}\"")),
                    "{df}: {pkg} has no binary {b}"
                ),
                None => assert!(manifest.contains("cdylib"), "{df}: {pkg} builds no cdylib"),
            }
        }
    }
    // Every hami-rs container command is installed by one of the images.
    let mut all = Settings::default();
    all.values.nvidia_device_plugin.enabled = true;
    all.values.dra_plugin.enabled = true;
    all.kube_version = hami_manifests::KubeVersion::parse("v1.34.0").unwrap();
    for cmd in commands(&all) {
        let installed = scheduler.lines().chain(node.lines()).any(|l| {
            l.starts_with("COPY --from=build") && l.trim_end().ends_with(&format!(" {cmd}"))
        });
        assert!(installed, "no image installs {cmd}");
    }
    // The hook lands where the install init container takes it from, built on glibc 2.34.
    assert!(
        node.lines()
            .any(|l| l.starts_with("COPY") && l.ends_with(&format!(" {}", names::HOOK_IN_IMAGE)))
    );
    assert!(
        node.contains("libamvgpu.so")
            && node.contains("GLIBC_2.34")
            && node.contains("almalinux:9")
    );
    assert!(hami_manifests::objects::hook_install_script().contains(names::HOOK_IN_IMAGE));
    // The CUDA hook too, under the same glibc baseline check.
    assert!(node.lines().any(
        |l| l.starts_with("COPY") && l.ends_with(&format!(" {}", names::NVIDIA_HOOK_IN_IMAGE))
    ));
    assert!(
        hami_manifests::objects::nvidia_hook_install_script().contains(names::NVIDIA_HOOK_IN_IMAGE)
    );
    assert!(node.contains("for lib in target/release/libamvgpu.so target/release/libvgpu.so"));
    // Control plane: static and non-root.
    assert!(
        scheduler.contains("x86_64-unknown-linux-musl") && scheduler.contains("distroless/static")
    );
    assert!(scheduler.contains("USER 65532"));
}
