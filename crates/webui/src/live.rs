//! What a node's monitor measures now, per container and device: memory used and its
//! limit, utilization. Read from its `/metrics` (the demo's tables, `hami status
//! --monitor`), samples parsed by `hami_protocol::scrape`. Blocking std I/O, for terminal
//! tools; the UI itself scrapes asynchronously (`scrape.rs`).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

use hami_protocol::scrape::parse_samples;

/// `(namespace, pod, container, vdevice index)`.
pub type DeviceKey = (String, String, String, String);

/// A monitor's per-container, per-device readings.
#[derive(Debug, Default, Clone)]
pub struct Live {
    /// Utilization percent (`hami_container_device_utilization_ratio`).
    pub util: BTreeMap<DeviceKey, f64>,
    /// Device memory in use, bytes (`hami_container_device_memory_bytes`).
    pub memory: BTreeMap<DeviceKey, f64>,
    /// The container's memory limit on the device, bytes (`hami_vgpu_memory_limit_bytes`).
    pub limit: BTreeMap<DeviceKey, f64>,
    /// The device's id (`device_uuid`).
    pub device: BTreeMap<DeviceKey, String>,
}

impl Live {
    /// The readings in a `/metrics` body.
    pub fn from_body(body: &str) -> Live {
        let mut out = Live::default();
        for s in parse_samples(body).0 {
            let into = match s.name.as_str() {
                "hami_container_device_utilization_ratio" => &mut out.util,
                "hami_container_device_memory_bytes" => &mut out.memory,
                "hami_vgpu_memory_limit_bytes" => &mut out.limit,
                _ => continue,
            };
            let label = |k: &str| s.label(k).unwrap_or_default().to_owned();
            let key = (
                label("namespace"),
                label("pod"),
                label("container"),
                label("vdevice_index"),
            );
            out.device.insert(key.clone(), label("device_uuid"));
            into.insert(key, s.value);
        }
        out
    }

    /// Adds another monitor's readings.
    pub fn extend(&mut self, other: Live) {
        self.util.extend(other.util);
        self.memory.extend(other.memory);
        self.limit.extend(other.limit);
        self.device.extend(other.device);
    }
}

/// `GET <path>` from `addr` (HTTP/1.1, no TLS): the body of a 200 answer.
fn get(addr: SocketAddr, host: &str, path: &str) -> Result<String, String> {
    let mut stream = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2))
        .map_err(|e| format!("cannot connect to {addr}: {e}"))?;
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nAccept: text/plain;version=0.0.4\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| e.to_string())?;
    let mut raw = String::new();
    stream
        .read_to_string(&mut raw)
        .map_err(|e| format!("{addr}: {e}"))?;
    let (head, body) = raw
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("{addr}: not an HTTP answer"))?;
    if !head.starts_with("HTTP/1.1 200") {
        return Err(format!(
            "{addr}{path}: {}",
            head.lines().next().unwrap_or_default()
        ));
    }
    Ok(body.to_owned())
}

/// A monitor's readings by address (empty when it does not answer).
pub fn scrape(addr: SocketAddr) -> Live {
    get(addr, "localhost", "/metrics")
        .map(|b| Live::from_body(&b))
        .unwrap_or_default()
}

/// A monitor's readings by URL (`http://host:port/metrics`).
pub fn fetch(url: &str) -> Result<Live, String> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| format!("{url:?}: write an http:// URL of a monitor's /metrics"))?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/metrics"),
    };
    let addr = authority
        .to_socket_addrs()
        .map_err(|e| format!("{url:?}: {e}"))?
        .next()
        .ok_or_else(|| format!("{url:?}: no address"))?;
    get(addr, authority, path).map(|b| Live::from_body(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_memory_limit_and_utilization_per_container_device() {
        let body = "# TYPE x gauge\nhami_container_device_memory_bytes{namespace=\"ml\",pod=\"a\",container=\"c\",vdevice_index=\"0\",device_uuid=\"G1\",zone=\"vGPU\"} 1048576\nhami_vgpu_memory_limit_bytes{namespace=\"ml\",pod=\"a\",container=\"c\",vdevice_index=\"0\",device_uuid=\"G1\",zone=\"vGPU\"} 4194304\nhami_container_device_utilization_ratio{namespace=\"ml\",pod=\"a\",container=\"c\",vdevice_index=\"0\",device_uuid=\"G1\",zone=\"vGPU\"} 42.5\nother 1\n";
        let live = Live::from_body(body);
        let key = ("ml".into(), "a".into(), "c".into(), "0".into());
        assert_eq!(live.memory[&key], 1048576.0);
        assert_eq!(live.limit[&key], 4194304.0);
        assert_eq!(live.util[&key], 42.5);
        assert_eq!(live.device[&key], "G1");
    }

    #[test]
    fn urls_must_be_http() {
        assert!(fetch("https://x/metrics").unwrap_err().contains("http://"));
    }
}
