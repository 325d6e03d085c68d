//! What the route tests share: a raw HTTP GET (the whole answer, head and body) and a
//! node's AMD register annotation.

/// `GET path` on `addr`, the answer as text (status line, headers and body).
pub(crate) async fn get(addr: std::net::SocketAddr, path: String) -> String {
    tokio::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: ui\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    })
    .await
    .unwrap()
}

/// `hami.io/node-amd-register` with one MI210 (64 GiB, 104 CUs, 10 shares) per id.
pub(crate) fn register(ids: &[&str]) -> String {
    let entries: Vec<String> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| format!(r#"{{"id":"{id}","index":{i},"count":10,"devmem":65536,"devcore":104,"type":"AMD Instinct MI210","health":true}}"#))
        .collect();
    format!("[{}]", entries.join(","))
}
