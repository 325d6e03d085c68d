//! Writes HAMi-core region files byte by byte at the offsets of SPEC Appendix A, as
//! HAMi-core (and its CUDA sampler) would. The offsets are literals here on purpose:
//! the tests must not share constants with the reader they check.

pub(crate) const MAGIC: i32 = 19_920_718;

/// One process slot to write.
#[derive(Clone, Copy, Default)]
pub(crate) struct Proc {
    pub pid: i32,
    pub hostpid: i32,
    pub status: i32,
    /// (device, context, module, data, total)
    pub used: [(usize, u64, u64, u64, u64); 2],
    /// (device, sm_util)
    pub sm: [(usize, u64); 2],
}

fn put(buf: &mut [u8], at: usize, bytes: &[u8]) {
    buf[at..at + bytes.len()].copy_from_slice(bytes);
}

/// A v1 region (1.1 or 1.2), `sizeof + 1` bytes as HAMi-core writes it.
pub(crate) fn v1_region(
    minor: u32,
    uuids: &[&str],
    limits: &[u64],
    procs: &[Proc],
    last_kernel: u64,
) -> Vec<u8> {
    let mut b = vec![0u8; 2_008_952 + 1];
    put(&mut b, 0, &MAGIC.to_le_bytes());
    put(&mut b, 4, &1u32.to_le_bytes());
    put(&mut b, 8, &minor.to_le_bytes());
    put(&mut b, 56, &(uuids.len() as u64).to_le_bytes());
    for (i, u) in uuids.iter().enumerate() {
        put(&mut b, 64 + 96 * i, u.as_bytes());
    }
    for (i, l) in limits.iter().enumerate() {
        put(&mut b, 1600 + 8 * i, &l.to_le_bytes());
        put(&mut b, 1728 + 8 * i, &100u64.to_le_bytes());
    }
    for (i, p) in procs.iter().enumerate() {
        let s = 1856 + 1960 * i;
        put(&mut b, s, &p.pid.to_le_bytes());
        put(&mut b, s + 4, &p.hostpid.to_le_bytes());
        for (dev, ctx, module, data, total) in p.used {
            let at = s + 8 + 64 * dev;
            put(&mut b, at, &ctx.to_le_bytes());
            put(&mut b, at + 8, &module.to_le_bytes());
            put(&mut b, at + 16, &data.to_le_bytes());
            put(&mut b, at + 32, &total.to_le_bytes());
        }
        for (dev, sm) in p.sm {
            put(&mut b, s + 1160 + 48 * dev + 16, &sm.to_le_bytes());
        }
        put(&mut b, s + 1928, &p.status.to_le_bytes());
    }
    put(&mut b, 2_008_896, &(procs.len() as i32).to_le_bytes());
    put(&mut b, 2_008_900, &1i32.to_le_bytes());
    put(&mut b, 2_008_904, &2i32.to_le_bytes());
    put(&mut b, 2_008_908, &1i32.to_le_bytes());
    put(&mut b, 2_008_912, &last_kernel.to_le_bytes());
    b
}

/// A v0 region (no version words), `sizeof + 1` bytes.
pub(crate) fn v0_region(uuids: &[&str], limits: &[u64], procs: &[Proc]) -> Vec<u8> {
    let mut b = vec![0u8; 1_197_896 + 1];
    put(&mut b, 0, &MAGIC.to_le_bytes());
    put(&mut b, 4, &1i32.to_le_bytes()); // sm_init_flag
    put(&mut b, 48, &(uuids.len() as u64).to_le_bytes());
    for (i, u) in uuids.iter().enumerate() {
        put(&mut b, 56 + 96 * i, u.as_bytes());
    }
    for (i, l) in limits.iter().enumerate() {
        put(&mut b, 1592 + 8 * i, &l.to_le_bytes());
    }
    for (i, p) in procs.iter().enumerate() {
        let s = 1848 + 1168 * i;
        put(&mut b, s, &p.pid.to_le_bytes());
        put(&mut b, s + 4, &p.hostpid.to_le_bytes());
        for (dev, ctx, module, data, total) in p.used {
            let at = s + 8 + 40 * dev;
            put(&mut b, at, &ctx.to_le_bytes());
            put(&mut b, at + 8, &module.to_le_bytes());
            put(&mut b, at + 16, &data.to_le_bytes());
            put(&mut b, at + 32, &total.to_le_bytes());
        }
        for (dev, sm) in p.sm {
            put(&mut b, s + 776 + 24 * dev + 16, &sm.to_le_bytes());
        }
        put(&mut b, s + 1160, &p.status.to_le_bytes());
    }
    put(&mut b, 1_197_880, &(procs.len() as i32).to_le_bytes());
    b
}

pub(crate) fn proc(
    hostpid: i32,
    status: i32,
    dev_used: [(usize, u64); 2],
    sm: [(usize, u64); 2],
) -> Proc {
    Proc {
        pid: hostpid % 1000 + 1,
        hostpid,
        status,
        used: dev_used.map(|(d, t)| (d, t / 4, t / 4, t / 2, t)),
        sm,
    }
}

/// Runs the test `name` (its path in this binary, e.g. `nvidia_host::some_test`) again in a
/// child process of this binary with `env` set, and returns `true` there, where the body
/// runs; in the parent it waits for the child, fails with its output if it failed, and
/// returns `false`. Why: the stand-in libraries this process loads read their settings with
/// `getenv`, and setting the environment while other tests' threads run is undefined
/// behaviour; a child started with `Command::env` has them from its first instruction.
pub(crate) fn in_child_with_env(name: &str, env: &[(&str, &std::ffi::OsStr)]) -> bool {
    const MARKER: &str = "HAMI_IT_CHILD_TEST";
    if std::env::var(MARKER).as_deref() == Ok(name) {
        return true;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .envs(env.iter().copied())
        .env(MARKER, name)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "{name} in its child process failed:\n{text}"
    );
    // The child's harness says how many tests it ran: exactly this one, not a filter miss.
    assert!(
        text.contains("1 passed"),
        "{name} did not run in the child:\n{text}"
    );
    false
}

/// The body of one `GET /metrics` of the monitor on `port`; `None` while it does not listen
/// yet. Fails on any status but 200.
pub(crate) async fn scrape(port: u16) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut out = String::new();
    stream.read_to_string(&mut out).await.unwrap();
    assert!(out.contains(" 200 "), "{out}");
    Some(out.split_once("\r\n\r\n").unwrap().1.to_owned())
}

/// `/proc/<pid>/cgroup` of a process in container `cid` of pod `pod_uid` (cgroup v2, the
/// systemd driver, containerd), as kubelet and the runtime name them.
pub(crate) fn kubepods_cgroup(pod_uid: &str, cid: &str) -> String {
    format!(
        "0::/kubepods.slice/kubepods-pod{}.slice/cri-containerd-{cid}.scope\n",
        pod_uid.replace('-', "_")
    )
}
