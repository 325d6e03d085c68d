//! `scripts/build-images.sh` (issue 29): the images of `deploy/docker/` built as OCI archives
//! without a container daemon are what their Dockerfiles say — entrypoint, user, env, and
//! every installed file's path, owner, mode and bytes —, under the names the manifests run
//! (`--registry localhost --tag dev`); their binaries load in them, the node image runs the
//! chart's hook installers, the pause program reaps orphans and stops on SIGTERM, a hook
//! above the glibc 2.34 baseline is refused, and a second run reuses the cached base.
//!
//! The archives are built from the dev binaries the workspace's `cargo test` built (never a
//! release build), hard-linked into a private directory first so that a concurrent cargo
//! build cannot change them between the build and the comparison. Root only (buildah,
//! `mmdebstrap --mode=root`, chroot); as another user it is skipped, naming the install step.

use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use hami_manifests::{Settings, names, objects};
use serde_json::Value;

/// The images the script builds, as `deploy/docker/<image>.Dockerfile`.
const IMAGES: [&str; 4] = ["scheduler", "node", "pause", "workload"];

/// mmdebstrap downloads the bases on a fresh machine; generous for a slow mirror.
const BUILD_LIMIT: Duration = Duration::from_secs(20 * 60);

/// A wait on a process or a condition on a loaded 2-core machine.
const WAIT_LIMIT: Duration = Duration::from_secs(60);

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A private directory, removed with everything in it.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        let dir = std::env::temp_dir().join(format!("hami-{tag}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn effective_uid() -> u32 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    line.split_whitespace().nth(2).unwrap().parse().unwrap()
}

/// A Dockerfile's final stage as the Dockerfile says it, read here independently of the
/// script (which interprets the same lines).
#[derive(Debug, Default)]
struct FinalStage {
    from: String,
    /// `(--chmod, build-stage source, destination)` of each `COPY --from=build`.
    copies: Vec<(Option<u32>, String, String)>,
    user: Option<String>,
    entrypoint: Option<Vec<String>>,
    env: Vec<String>,
}

fn final_stage(image: &str) -> FinalStage {
    let path = repo().join(format!("deploy/docker/{image}.Dockerfile"));
    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let start = lines
        .iter()
        .rposition(|l| l.starts_with("FROM "))
        .expect("a FROM");
    let mut stage = FinalStage::default();
    for line in &lines[start..] {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (instruction, rest) = line.split_once(' ').unwrap();
        match instruction {
            "FROM" => stage.from = rest.to_owned(),
            "COPY" => {
                let words: Vec<&str> = rest.split_whitespace().collect();
                let (chmod, source, dest) = match words.as_slice() {
                    ["--from=build", source, dest] => (None, source, dest),
                    ["--from=build", chmod, source, dest] => {
                        let octal = chmod.strip_prefix("--chmod=").expect(line);
                        (Some(u32::from_str_radix(octal, 8).unwrap()), source, dest)
                    }
                    _ => panic!("{image}: unexpected COPY: {line}"),
                };
                stage
                    .copies
                    .push((chmod, source.to_string(), dest.to_string()));
            }
            "USER" => stage.user = Some(rest.to_owned()),
            "ENTRYPOINT" => stage.entrypoint = Some(serde_json::from_str(rest).unwrap()),
            "ENV" => stage.env.push(rest.to_owned()),
            _ => panic!("{image}: unexpected instruction in the final stage: {line}"),
        }
    }
    stage
}

/// The file name of a COPY source, as cargo names its output.
fn file_name(source: &str) -> &str {
    source.rsplit('/').next().unwrap()
}

/// The dev build's directory (`target/debug`): this test binary is in its `deps/`.
fn dev_bin_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().to_path_buf()
}

/// Hard-links (or copies, across file systems) the dev build's file `name` into `dir`: the
/// newest of `target/debug/<name>` and `target/debug/deps/<name>`, as the script chooses.
fn snapshot(name: &str, dir: &Path) {
    let built = dev_bin_dir();
    let newest = [built.join(name), built.join("deps").join(name)]
        .into_iter()
        .filter_map(|p| Some((std::fs::metadata(&p).ok()?.modified().ok()?, p)))
        .max()
        .map(|(_, p)| p)
        .unwrap_or_else(|| {
            panic!(
                "{name} is not built in {}: build the workspace (cargo test --workspace builds \
                 every binary and hook) before this test",
                built.display()
            )
        });
    let into = dir.join(name);
    if std::fs::hard_link(&newest, &into).is_err() {
        std::fs::copy(&newest, &into).unwrap();
    }
}

/// Runs the script with `args` (output to files, so nothing blocks on a full pipe) within
/// [`BUILD_LIMIT`]: its exit status and its stdout + stderr.
fn build_images(args: &[&str], logs: &Path) -> (ExitStatus, String) {
    let out = std::fs::File::create(logs.join("out.log")).unwrap();
    let err = std::fs::File::create(logs.join("err.log")).unwrap();
    let status = Group::spawn(
        Command::new("bash")
            .arg(repo().join("scripts/build-images.sh"))
            .args(args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err),
    )
    .wait(BUILD_LIMIT, "scripts/build-images.sh");
    let text = std::fs::read_to_string(logs.join("out.log")).unwrap()
        + &std::fs::read_to_string(logs.join("err.log")).unwrap();
    (status, text)
}

/// A child in its own process group, killed with its whole group when dropped unfinished:
/// a failed assertion leaves no build, pause or orphan behind.
struct Group(Child);

impl Group {
    fn spawn(command: &mut Command) -> Group {
        Group(command.process_group(0).spawn().unwrap())
    }

    /// Its exit status within `limit` (else the test fails, and the drop kills the group).
    fn wait(&mut self, limit: Duration, what: &str) -> ExitStatus {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.0.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "{what} still running after {limit:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let group = format!("-{}", self.0.id());
            let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
            let _ = self.0.wait();
        }
    }
}

fn until<T>(what: &str, mut probe: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + WAIT_LIMIT;
    loop {
        if let Some(value) = probe() {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not within {WAIT_LIMIT:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn run(command: &mut Command) -> std::process::Output {
    let output = command.output().unwrap();
    assert!(
        output.status.success(),
        "{command:?}: {}\n{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// An OCI archive unpacked: its reference name, image config and root filesystem.
struct Unpacked {
    ref_name: String,
    config: Value,
    rootfs: PathBuf,
}

fn unpack(archive: &Path, dir: &Path) -> Unpacked {
    let oci = dir.join("oci");
    let rootfs = dir.join("rootfs");
    std::fs::create_dir_all(&oci).unwrap();
    std::fs::create_dir_all(&rootfs).unwrap();
    run(Command::new("tar")
        .arg("-xf")
        .arg(archive)
        .arg("-C")
        .arg(&oci));
    let json = |path: PathBuf| -> Value {
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap()
    };
    let blob = |digest: &Value| {
        let digest = digest.as_str().unwrap();
        oci.join("blobs/sha256")
            .join(digest.strip_prefix("sha256:").unwrap())
    };
    let index = json(oci.join("index.json"));
    let manifests = index["manifests"].as_array().unwrap();
    assert_eq!(manifests.len(), 1, "{}: {index}", archive.display());
    let ref_name = manifests[0]["annotations"]["org.opencontainers.image.ref.name"]
        .as_str()
        .unwrap()
        .to_owned();
    let manifest = json(blob(&manifests[0]["digest"]));
    let config = json(blob(&manifest["config"]["digest"]));
    for layer in manifest["layers"].as_array().unwrap() {
        let gzip = layer["mediaType"].as_str().unwrap().ends_with("+gzip");
        run(Command::new("tar")
            .args(["--numeric-owner", "-xp"])
            .args(gzip.then_some("-z"))
            .arg("-f")
            .arg(blob(&layer["digest"]))
            .arg("-C")
            .arg(&rootfs));
    }
    Unpacked {
        ref_name,
        config,
        rootfs,
    }
}

/// `Some(dynamic)` for an x86-64 ELF file (dynamic: it has a PT_DYNAMIC segment, so the
/// image's loader must resolve its libraries), `None` for anything else.
fn elf_is_dynamic(bytes: &[u8]) -> Option<bool> {
    if bytes.len() < 64 || &bytes[..4] != b"\x7fELF" || bytes[4] != 2 {
        return None;
    }
    let u16_at = |at: usize| u16::from_le_bytes([bytes[at], bytes[at + 1]]) as usize;
    let phoff = u64::from_le_bytes(bytes[0x20..0x28].try_into().unwrap()) as usize;
    let (entry, count) = (u16_at(0x36), u16_at(0x38));
    Some((0..count).any(|i| {
        let at = phoff + i * entry;
        u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) == 2
    }))
}

/// `chroot [--userspec=<user>] <rootfs>` with only PATH in the environment.
fn chroot(rootfs: &Path, user: Option<&str>) -> Command {
    let mut command = Command::new("chroot");
    command
        .env_clear()
        .env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        )
        .args(user.map(|u| format!("--userspec={u}")))
        .arg(rootfs);
    command
}

/// Each Dockerfile's `cargo build` step as cargo's own argument parser reads it, pointed at
/// a manifest that does not exist so that it stops there (no lock, no build). The node
/// image's step once named `--lib` twice, which cargo refuses ("cannot be used multiple
/// times"): that image had never been built.
#[test]
fn the_dockerfiles_cargo_build_steps_are_accepted_by_cargo() {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let missing = std::env::temp_dir().join("hami-no-such-directory/Cargo.toml");
    for image in IMAGES {
        let path = repo().join(format!("deploy/docker/{image}.Dockerfile"));
        let joined = std::fs::read_to_string(&path).unwrap().replace("\\\n", " ");
        let Some(line) = joined.lines().find(|l| l.contains("cargo build")) else {
            continue;
        };
        let args: Vec<&str> = line
            .split_whitespace()
            .skip_while(|w| *w != "build")
            .skip(1)
            .collect();
        let output = Command::new(&cargo)
            .arg("build")
            .args(&args)
            .arg("--manifest-path")
            .arg(&missing)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains("does not exist"),
            "{image}.Dockerfile: cargo build {}:\n{stderr}",
            args.join(" ")
        );
    }
}

#[test]
fn an_unknown_image_is_refused_naming_the_images() {
    let output = Command::new("bash")
        .arg(repo().join("scripts/build-images.sh"))
        .arg("nosuch")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("no image 'nosuch'") && stderr.contains("scheduler node pause workload"),
        "{stderr}"
    );
}

#[test]
fn images_built_without_a_daemon_are_what_the_dockerfiles_say() {
    if effective_uid() != 0 {
        eprintln!(
            "skipped: scripts/build-images.sh needs root (buildah, mmdebstrap --mode=root, \
             chroot): run this test as root with `apt-get install buildah mmdebstrap binutils \
             gcc libc6-dev util-linux` (scripts/test.sh installs them)"
        );
        return;
    }
    let scratch = Scratch::new("image-archives");
    let bins = scratch.0.join("bin");
    let out = scratch.0.join("images");
    std::fs::create_dir_all(&bins).unwrap();
    let stages: Vec<(&str, FinalStage)> = IMAGES.iter().map(|i| (*i, final_stage(i))).collect();
    for (_, stage) in &stages {
        for (_, source, _) in &stage.copies {
            // The pause program is compiled by the script from deploy/docker/pause.c.
            if file_name(source) != "pause" && !bins.join(file_name(source)).exists() {
                snapshot(file_name(source), &bins);
            }
        }
    }

    let started = Instant::now();
    let args = ["--profile", "debug", "--bin-dir", path_str(&bins), "--out"];
    let (status, log) = build_images(&[&args[..], &[path_str(&out)]].concat(), &scratch.0);
    assert!(status.success(), "scripts/build-images.sh: {status}\n{log}");
    eprintln!("built the four images in {:?}", started.elapsed());
    let node_base = base_tarball(&log, "debian-essential");

    // The names `hami manifests --registry localhost --tag dev` runs.
    let mut settings = Settings::default();
    settings.values.images.registry = "localhost".into();
    settings.values.images.tag = "dev".into();
    let referenced = [
        ("scheduler", settings.values.scheduler_image().reference()),
        ("node", settings.values.node_image().reference()),
    ];

    for (image, stage) in &stages {
        let dir = Scratch::new(&format!("image-{image}"));
        let unpacked = unpack(&out.join(format!("{image}.oci.tar")), &dir.0);
        let expected_name = format!("localhost/hami-rs/hami-{image}:dev");
        assert_eq!(unpacked.ref_name, expected_name);
        if let Some((_, reference)) = referenced.iter().find(|(i, _)| i == image) {
            assert_eq!(&unpacked.ref_name, reference, "the manifests' image name");
        }
        check_config(image, stage, &unpacked.config);
        check_files(image, stage, &unpacked.rootfs, &bins);
        match *image {
            "scheduler" => check_scheduler(&unpacked.rootfs),
            "node" => check_node(&unpacked.rootfs),
            "pause" => check_pause(&unpacked.rootfs),
            "workload" => check_workload(&unpacked.rootfs, &unpacked.config),
            _ => unreachable!(),
        }
    }

    // A hook needing a glibc newer than 2.34 is refused (arc4random is GLIBC_2.36), and
    // this second run takes the node base from the cache instead of making it again.
    let before = std::fs::metadata(&node_base).unwrap();
    let refused_bins = scratch.0.join("refused-bin");
    std::fs::create_dir_all(&refused_bins).unwrap();
    for (_, source, _) in &stages[1].1.copies {
        let name = file_name(source);
        if name != "libamvgpu.so" {
            std::fs::hard_link(bins.join(name), refused_bins.join(name)).unwrap();
        }
    }
    let c_file = scratch.0.join("newer.c");
    std::fs::write(
        &c_file,
        "#include <stdlib.h>\nunsigned int newer(void) { return arc4random(); }\n",
    )
    .unwrap();
    run(Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(refused_bins.join("libamvgpu.so"))
        .arg(&c_file));
    let refused_out = scratch.0.join("refused");
    let args = ["--profile", "debug", "--bin-dir", path_str(&refused_bins)];
    let (status, log) = build_images(
        &[&args[..], &["--out", path_str(&refused_out), "node"]].concat(),
        &scratch.0,
    );
    assert_eq!(status.code(), Some(2), "{log}");
    assert!(
        log.contains("/opt/hami/lib/amd/libamvgpu.so needs GLIBC_2.36, newer than the hooks' GLIBC_2.34 baseline"),
        "{log}"
    );
    assert!(!refused_out.join("node.oci.tar").exists());
    assert!(
        log.contains(&format!(
            "base debian-essential: cached {}",
            node_base.display()
        )),
        "{log}"
    );
    let after = std::fs::metadata(&node_base).unwrap();
    assert_eq!(
        (before.ino(), before.mtime(), before.mtime_nsec()),
        (after.ino(), after.mtime(), after.mtime_nsec()),
        "the cached base was made again"
    );
}

fn path_str(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// The cached tarball of `base` the script's log names (made or reused).
fn base_tarball(log: &str, base: &str) -> PathBuf {
    let prefix = format!("base {base}: ");
    let line = log
        .lines()
        .find(|l| l.starts_with(&prefix) && !l.contains(" made in "))
        .unwrap_or_else(|| panic!("no {prefix}line in\n{log}"));
    let rest = &line[prefix.len()..];
    let path = rest
        .strip_prefix("cached ")
        .or_else(|| rest.strip_prefix("making "))
        .unwrap()
        .split(' ')
        .next()
        .unwrap();
    PathBuf::from(path)
}

/// Entrypoint, user and env as the final stage says; a PATH wherever there is a base.
fn check_config(image: &str, stage: &FinalStage, config: &Value) {
    assert_eq!(config["os"], "linux", "{image}");
    assert_eq!(config["architecture"], "amd64", "{image}");
    let inner = &config["config"];
    let entrypoint: Option<Vec<String>> = serde_json::from_value(inner["Entrypoint"].clone()).ok();
    assert_eq!(entrypoint, stage.entrypoint, "{image}: Entrypoint");
    let user = inner["User"].as_str().filter(|u| !u.is_empty());
    assert_eq!(user, stage.user.as_deref(), "{image}: User");
    let env: Vec<String> = serde_json::from_value(inner["Env"].clone()).unwrap_or_default();
    for wanted in &stage.env {
        assert!(env.contains(wanted), "{image}: {wanted} not in {env:?}");
    }
    if stage.from != "scratch" {
        assert!(
            env.iter()
                .any(|e| e.starts_with("PATH=") && e.contains("/usr/bin")),
            "{image}: no PATH in {env:?}"
        );
    }
}

/// Every COPY destination: a regular file owned by root with the Dockerfile's mode (the
/// build's, less group/other write, without --chmod) and the built bytes, in directories
/// owned by root and mode 0755; a dynamic ELF's libraries all found by the image's loader.
fn check_files(image: &str, stage: &FinalStage, rootfs: &Path, bins: &Path) {
    for (chmod, source, dest) in &stage.copies {
        let path = rootfs.join(dest.trim_start_matches('/'));
        let meta =
            std::fs::symlink_metadata(&path).unwrap_or_else(|e| panic!("{image}: {dest}: {e}"));
        assert!(meta.is_file(), "{image}: {dest} is not a regular file");
        assert_eq!((meta.uid(), meta.gid()), (0, 0), "{image}: {dest} owner");
        let bytes = std::fs::read(&path).unwrap();
        let name = file_name(source);
        let mode = if name == "pause" {
            assert!(chmod.is_some(), "pause: its mode is the Dockerfile's");
            chmod.unwrap()
        } else {
            let built = bins.join(name);
            assert!(
                bytes == std::fs::read(&built).unwrap(),
                "{image}: {dest} is not the built {name}"
            );
            chmod.unwrap_or(std::fs::metadata(&built).unwrap().mode() & 0o7777 & !0o022)
        };
        assert_eq!(
            meta.mode() & 0o7777,
            mode,
            "{image}: {dest} mode {:o}",
            meta.mode() & 0o7777
        );
        let mut dir = PathBuf::from("/");
        for part in Path::new(dest).parent().unwrap().components().skip(1) {
            dir.push(part);
            let meta =
                std::fs::symlink_metadata(rootfs.join(dir.strip_prefix("/").unwrap())).unwrap();
            if meta.file_type().is_symlink() {
                continue; // merged /usr: /lib -> usr/lib
            }
            assert!(meta.is_dir(), "{image}: {}", dir.display());
            assert_eq!(
                (meta.uid(), meta.mode() & 0o7777),
                (0, 0o755),
                "{image}: {} owner and mode",
                dir.display()
            );
        }
        match elf_is_dynamic(&bytes) {
            Some(true) => {
                assert_ne!(stage.from, "scratch", "{image}: {dest} needs a loader");
                let listed =
                    run(chroot(rootfs, None).args(["/lib64/ld-linux-x86-64.so.2", "--list", dest]));
                let libraries = String::from_utf8_lossy(&listed.stdout);
                assert!(
                    !libraries.contains("not found"),
                    "{image}: {dest}:\n{libraries}"
                );
            }
            Some(false) => {}
            None => panic!("{image}: {dest} is not an x86-64 ELF file"),
        }
    }
}

/// distroless's nonroot user and a world-writable /tmp, as the scheduler runs as 65532.
fn check_scheduler(rootfs: &Path) {
    let passwd = std::fs::read_to_string(rootfs.join("etc/passwd")).unwrap();
    assert!(passwd.contains("nonroot:x:65532:65532:"), "{passwd}");
    let tmp = std::fs::metadata(rootfs.join("tmp")).unwrap();
    assert_eq!(tmp.mode() & 0o7777, 0o1777);
    run(chroot(rootfs, Some("65532:65532"))
        .args(["/hami-scheduler", "--help"])
        .stdout(Stdio::null()));
}

/// The device-plugin DaemonSets' init containers install the hooks with the image's own
/// shell and tools: run each install script in the image, twice (the second finds the hook
/// in place and leaves it).
fn check_node(rootfs: &Path) {
    for (script, hook) in [
        (objects::hook_install_script(), names::HOOK_IN_IMAGE),
        (
            objects::nvidia_hook_install_script(),
            names::NVIDIA_HOOK_IN_IMAGE,
        ),
    ] {
        let hook_dir = rootfs.join("hook-dir");
        std::fs::create_dir_all(&hook_dir).unwrap();
        for _ in 0..2 {
            run(chroot(rootfs, None)
                .env("HOOK_DIR", "/hook-dir")
                .args(["/bin/sh", "-c", &script]));
        }
        let installed: Vec<PathBuf> = std::fs::read_dir(&hook_dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        assert_eq!(installed.len(), 1, "{hook}: {installed:?}");
        assert_eq!(
            std::fs::read(&installed[0]).unwrap(),
            std::fs::read(rootfs.join(hook.trim_start_matches('/'))).unwrap()
        );
        assert_eq!(
            std::fs::metadata(&installed[0]).unwrap().mode() & 0o7777,
            0o555
        );
        std::fs::remove_dir_all(&hook_dir).unwrap();
    }
}

/// The image's pause as PID 1 of a new PID namespace: an orphan of the namespace is
/// re-parented to it and reaped once it exits; SIGTERM ends it with status 0.
fn check_pause(rootfs: &Path) {
    let pause = rootfs.join("pause");
    let mut unshare = Group::spawn(
        Command::new("unshare")
            .args(["--pid", "--fork", "--kill-child"])
            .arg(&pause)
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    );
    let children = |pid: u32| -> Vec<u32> {
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
            .unwrap_or_default()
            .split_whitespace()
            .map(|p| p.parse().unwrap())
            .collect()
    };
    let pause_pid = until("pause started", || {
        children(unshare.0.id()).first().copied()
    });
    // A process in the namespace whose parent exits at once: `cat` reads our pipe (fd 3,
    // since a background job's stdin is /dev/null) until we close it.
    let mut entered = Group::spawn(
        Command::new("nsenter")
            .arg("-t")
            .arg(pause_pid.to_string())
            .args(["-p", "--", "/bin/sh", "-c"])
            .arg("exec 3<&0; cat <&3 >/dev/null & exit 0")
            .stdin(Stdio::piped()),
    );
    let writer = entered.0.stdin.take().unwrap();
    assert!(entered.wait(WAIT_LIMIT, "nsenter").success());
    let orphan = until("the orphan re-parented to pause", || {
        children(pause_pid).first().copied()
    });
    drop(writer);
    until("the exited orphan reaped by pause", || {
        (!Path::new(&format!("/proc/{orphan}")).exists()).then_some(())
    });
    assert!(unshare.0.try_wait().unwrap().is_none(), "pause ended early");
    run(Command::new("kill").args(["-TERM", &pause_pid.to_string()]));
    let status = unshare.wait(WAIT_LIMIT, "pause after SIGTERM");
    assert!(status.success(), "pause after SIGTERM: {status}");
}

/// A sliced pod runs the workload as `runAsUser: 1000`: the entrypoint runs as that user.
fn check_workload(rootfs: &Path, config: &Value) {
    let entrypoint = config["config"]["Entrypoint"][0].as_str().unwrap();
    run(chroot(rootfs, Some("1000:1000"))
        .args([entrypoint, "--help"])
        .stdout(Stdio::null()));
}
