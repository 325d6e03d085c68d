//! A minimal W3C WebDriver client (blocking HTTP/1.1, one request per connection) driving
//! chromedriver and headless Chromium: pages, scripts, screenshots, console logs, axe-core.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

fn http(port: u16, method: &str, path: &str, body: Option<&Value>) -> Value {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("chromedriver reachable");
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let payload = body.map(|b| b.to_string()).unwrap_or_default();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{payload}",
        payload.len()
    );
    stream.write_all(request.as_bytes()).unwrap();
    // Read the head, then exactly Content-Length bytes (chromedriver may keep the
    // connection open), or chunks until the last one.
    let mut raw = Vec::new();
    let mut buf = [0u8; 65536];
    let head_end = loop {
        if let Some(i) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = stream.read(&mut buf).expect("chromedriver answers");
        assert!(n > 0, "{method} {path}: connection closed before the head");
        raw.extend_from_slice(&buf[..n]);
    };
    let head = String::from_utf8_lossy(&raw[..head_end]).to_ascii_lowercase();
    let length = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse::<usize>().ok());
    let chunked = head.contains("transfer-encoding: chunked");
    loop {
        let have = raw.len() - head_end;
        let complete = match length {
            Some(n) => have >= n,
            None if chunked => raw.ends_with(b"0\r\n\r\n"),
            None => false,
        };
        if complete {
            break;
        }
        let n = stream.read(&mut buf).expect("chromedriver answers");
        if n == 0 {
            break;
        }
        raw.extend_from_slice(&buf[..n]);
    }
    let rest = String::from_utf8_lossy(&raw[head_end..]).into_owned();
    let body = if chunked { dechunk(&rest) } else { rest };
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{method} {path}: {e}: {body}"))
}

fn dechunk(mut text: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = text.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&rest[..n]);
        text = &rest[n + 2..];
    }
    out
}

fn base64_decode(text: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        _ => 63,
    };
    let bytes: Vec<u8> = text
        .bytes()
        .filter(|c| *c != b'=' && !c.is_ascii_whitespace())
        .collect();
    let mut out = Vec::with_capacity(bytes.len() * 3 / 4);
    for chunk in bytes.chunks(4) {
        let n = chunk.iter().enumerate().fold(0u32, |acc, (i, c)| {
            acc | (u32::from(value(*c)) << (18 - 6 * i))
        });
        out.push((n >> 16) as u8);
        if chunk.len() > 2 {
            out.push((n >> 8) as u8);
        }
        if chunk.len() > 3 {
            out.push(n as u8);
        }
    }
    out
}

/// A chromedriver process and its session.
pub(super) struct Browser {
    driver: Child,
    port: u16,
    session: String,
    shots: PathBuf,
}

impl Browser {
    pub(super) fn start(shots: PathBuf) -> Browser {
        for bin in ["chromedriver", "chromium"] {
            let found = Command::new(bin).arg("--version").output();
            assert!(
                found.is_ok_and(|o| o.status.success()),
                "{bin} is not on PATH: install Debian's chromium and chromium-driver (apt-get install -y --no-install-recommends chromium chromium-driver); CI installs them"
            );
        }
        let port = hami_local_ports::free_port();
        let driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver starts");
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "chromedriver did not listen on {port}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let profile =
            std::env::temp_dir().join(format!("hami-webui-chromium-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&profile);
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            // axe-core on a big page takes a while on two loaded cores (30 s by default).
            "timeouts": {"script": 180000},
            "goog:loggingPrefs": {"browser": "ALL"},
            "goog:chromeOptions": {
                "binary": "/usr/bin/chromium",
                "args": ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                    "--disable-background-networking", "--disable-component-update", "--disable-sync",
                    "--disable-dev-shm-usage", "--window-size=1280,1600",
                    format!("--user-data-dir={}", profile.display())]
            }
        }}});
        let created = http(port, "POST", "/session", Some(&caps));
        let session = created["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session: {created}"))
            .to_owned();
        std::fs::create_dir_all(&shots).unwrap();
        Browser {
            driver,
            port,
            session,
            shots,
        }
    }

    pub(super) fn cmd(&self, method: &str, what: &str, body: Option<Value>) -> Value {
        let v = http(
            self.port,
            method,
            &format!("/session/{}/{what}", self.session),
            body.as_ref(),
        );
        assert!(v["value"]["error"].is_null(), "{what}: {v}");
        v["value"].clone()
    }

    pub(super) fn go(&self, url: &str) {
        self.cmd("POST", "url", Some(json!({"url": url})));
    }

    pub(super) fn js(&self, script: &str) -> Value {
        self.cmd(
            "POST",
            "execute/sync",
            Some(json!({"script": script, "args": []})),
        )
    }

    /// Waits for `script` to return true (bounded).
    pub(super) fn wait(&self, script: &str, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.js(script) != Value::Bool(true) {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// A Chrome DevTools command through chromedriver's session.
    fn cdp(&self, cmd: &str, params: Value) -> Value {
        self.cmd(
            "POST",
            "goog/cdp/execute",
            Some(json!({"cmd": cmd, "params": params})),
        )
    }

    /// Lays pages out `width` CSS pixels wide (a phone's 390 or a desktop's 1440) and
    /// reports `prefers-color-scheme` as dark or light, until [`Browser::emulate_reset`].
    pub(super) fn emulate(&self, width: u32, dark: bool) {
        self.cdp(
            "Emulation.setDeviceMetricsOverride",
            json!({"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": false}),
        );
        self.cdp(
            "Emulation.setEmulatedMedia",
            json!({"features": [{"name": "prefers-color-scheme", "value": if dark { "dark" } else { "light" }}]}),
        );
    }

    /// The window's own size and colour scheme again.
    pub(super) fn emulate_reset(&self) {
        self.cdp("Emulation.clearDeviceMetricsOverride", json!({}));
        self.cdp("Emulation.setEmulatedMedia", json!({"features": []}));
    }

    /// CU cells per owner in the CU map(s) under the element `sel` (a JS expression).
    pub(super) fn cu_owners(&self, sel: &str) -> BTreeMap<String, u64> {
        let drawn = self.js(&format!("var m = {{}}; {sel}.querySelectorAll('rect.cu').forEach(function (r) {{ var o = r.getAttribute('data-owner'); if (o) m[o] = (m[o] || 0) + 1; }}); return m;"));
        serde_json::from_value(drawn).unwrap()
    }

    pub(super) fn text(&self) -> String {
        self.js("return document.body.innerText;")
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    /// Console messages at SEVERE level since the last call (JS errors, failed loads).
    pub(super) fn console_errors(&self) -> Vec<String> {
        let logs = self.cmd("POST", "se/log", Some(json!({"type": "browser"})));
        logs.as_array()
            .into_iter()
            .flatten()
            .filter(|e| e["level"] == "SEVERE")
            .map(|e| e["message"].as_str().unwrap_or_default().to_owned())
            .collect()
    }

    pub(super) fn screenshot(&self, name: &str) -> PathBuf {
        let data = self.cmd("GET", "screenshot", None);
        let path = self.shots.join(format!("{name}.png"));
        std::fs::write(&path, base64_decode(data.as_str().unwrap())).unwrap();
        path
    }

    /// axe-core's violations of the checks the issue names (headings, labels, contrast,
    /// and the rest of axe's WCAG A/AA rules), as "rule: target" lines.
    pub(super) fn axe(&self, axe_source: &str) -> Vec<String> {
        self.js(axe_source);
        let script = "var done = arguments[arguments.length - 1]; axe.run(document, {runOnly: {type: 'tag', values: ['wcag2a', 'wcag2aa', 'best-practice']}}).then(function (r) { done(r.violations.map(function (v) { return v.id + ': ' + v.nodes.slice(0, 3).map(function (n) { return n.target.join(' '); }).join(', '); })); }, function (e) { done(['axe failed: ' + e]); });";
        let v = self.cmd(
            "POST",
            "execute/async",
            Some(json!({"script": script, "args": []})),
        );
        v.as_array()
            .into_iter()
            .flatten()
            .map(|s| s.as_str().unwrap_or_default().to_owned())
            .collect()
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = http(
            self.port,
            "DELETE",
            &format!("/session/{}", self.session),
            None,
        );
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}
