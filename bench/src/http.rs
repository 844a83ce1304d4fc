//! The loopback HTTP/1.1 client of the server benchmarks (`load`, `ttft --server`): one POST
//! per connection (Connection: close), the response read as a line stream.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// An answered request: its status line, the reader past it, and when the request was sent.
pub struct Posted {
    pub status: String,
    pub reader: BufReader<TcpStream>,
    pub sent: Instant,
}

impl Posted {
    /// The status code, or 0 when the status line does not carry one.
    pub fn code(&self) -> u16 {
        self.status
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0)
    }
}

/// POSTs `body` (JSON) to `path` at `addr` with an optional bearer key and reads the status
/// line. Errors name the step that failed (connect, send, read).
pub fn post(addr: &str, path: &str, api_key: Option<&str>, body: &str) -> Result<Posted, String> {
    let mut s = TcpStream::connect(addr).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(300))).ok();
    let auth = api_key
        .map(|k| format!("authorization: Bearer {k}\r\n"))
        .unwrap_or_default();
    let req = format!(
        "POST {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n{auth}content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let sent = Instant::now();
    s.write_all(req.as_bytes())
        .map_err(|e| format!("send: {e}"))?;
    let mut reader = BufReader::new(s);
    let mut status = String::new();
    reader
        .read_line(&mut status)
        .map_err(|e| format!("read: {e}"))?;
    Ok(Posted {
        status: status.trim().to_string(),
        reader,
        sent,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closed_port_is_a_connect_error() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        drop(l);
        let e = post(&addr, "/v1/x", None, "{}").err().unwrap();
        assert!(e.starts_with("connect:"), "{e}");
    }

    #[test]
    fn the_request_and_status_round_trip() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let server = std::thread::spawn(move || {
            let (mut c, _) = l.accept().unwrap();
            let mut r = BufReader::new(c.try_clone().unwrap());
            let mut first = String::new();
            r.read_line(&mut first).unwrap();
            let mut auth = false;
            loop {
                let mut h = String::new();
                r.read_line(&mut h).unwrap();
                auth |= h.eq_ignore_ascii_case("authorization: bearer k1\r\n");
                if h == "\r\n" {
                    break;
                }
            }
            c.write_all(b"HTTP/1.1 429 Too Many Requests\r\n\r\n")
                .unwrap();
            (first, auth)
        });
        let p = post(&addr, "/v1/completions", Some("k1"), "{\"a\":1}").unwrap();
        assert_eq!(p.code(), 429);
        let (first, auth) = server.join().unwrap();
        assert_eq!(first, "POST /v1/completions HTTP/1.1\r\n");
        assert!(auth);
    }
}
