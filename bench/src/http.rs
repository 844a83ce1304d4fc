//! The loopback HTTP/1.1 client of the server benchmarks (`load`, `ttft --server`, the soak):
//! one request per connection (Connection: close), the response read as a line stream or, with
//! [`Posted::body`], whole (chunked transfer coding undone).

use std::io::{BufRead, BufReader, Read, Write};
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

    /// Reads the headers (names lowercased), leaving the reader at the body.
    pub fn headers(&mut self) -> Result<Vec<(String, String)>, String> {
        let mut out = Vec::new();
        loop {
            let mut h = String::new();
            let n = self
                .reader
                .read_line(&mut h)
                .map_err(|e| format!("read: {e}"))?;
            if n == 0 || h == "\r\n" || h == "\n" {
                return Ok(out);
            }
            if let Some((k, v)) = h.split_once(':') {
                out.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
            }
        }
    }

    /// Reads the headers and the whole body (de-chunked when the server sent it chunked).
    pub fn body(mut self) -> Result<String, String> {
        let mut chunked = false;
        loop {
            let mut h = String::new();
            let n = self
                .reader
                .read_line(&mut h)
                .map_err(|e| format!("read: {e}"))?;
            if n == 0 || h == "\r\n" || h == "\n" {
                break;
            }
            let h = h.to_ascii_lowercase();
            chunked |= h.starts_with("transfer-encoding:") && h.contains("chunked");
        }
        let mut raw = Vec::new();
        self.reader
            .read_to_end(&mut raw)
            .map_err(|e| format!("read: {e}"))?;
        let raw = if chunked { dechunk(&raw)? } else { raw };
        String::from_utf8(raw).map_err(|_| "body is not UTF-8".to_string())
    }
}

/// Undoes HTTP/1.1 chunked transfer coding (`size[;ext]\r\n data \r\n` ... `0\r\n\r\n`).
pub fn dechunk(mut raw: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    loop {
        let eol = raw
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or("chunked body: a size line without CRLF")?;
        let line = std::str::from_utf8(&raw[..eol]).map_err(|_| "chunked body: bad size line")?;
        let hex = line.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(hex, 16)
            .map_err(|_| format!("chunked body: bad chunk size `{hex}`"))?;
        raw = &raw[eol + 2..];
        if size == 0 {
            return Ok(out);
        }
        if raw.len() < size + 2 || &raw[size..size + 2] != b"\r\n" {
            return Err(format!("chunked body: truncated chunk of {size} bytes"));
        }
        out.extend_from_slice(&raw[..size]);
        raw = &raw[size + 2..];
    }
}

/// GETs `path` at `addr` (optional bearer key); returns the status code and the whole body.
pub fn get(addr: &str, path: &str, api_key: Option<&str>) -> Result<(u16, String), String> {
    let p = request(addr, "GET", path, api_key, &[], None)?;
    let code = p.code();
    Ok((code, p.body()?))
}

/// POSTs `body` (JSON) to `path` at `addr` with an optional bearer key and reads the status
/// line. Errors name the step that failed (connect, send, read).
pub fn post(addr: &str, path: &str, api_key: Option<&str>, body: &str) -> Result<Posted, String> {
    request(addr, "POST", path, api_key, &[], Some(body))
}

/// [`post`] with extra request headers (name, value).
pub fn post_with(
    addr: &str,
    path: &str,
    api_key: Option<&str>,
    headers: &[(&str, &str)],
    body: &str,
) -> Result<Posted, String> {
    request(addr, "POST", path, api_key, headers, Some(body))
}

fn request(
    addr: &str,
    method: &str,
    path: &str,
    api_key: Option<&str>,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> Result<Posted, String> {
    let mut s = TcpStream::connect(addr).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(300))).ok();
    let mut auth = api_key
        .map(|k| format!("authorization: Bearer {k}\r\n"))
        .unwrap_or_default();
    for (k, v) in headers {
        auth.push_str(&format!("{k}: {v}\r\n"));
    }
    let req = match body {
        Some(body) => format!(
            "{method} {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n{auth}content-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        ),
        None => {
            format!("{method} {path} HTTP/1.1\r\nhost: {addr}\r\n{auth}connection: close\r\n\r\n")
        }
    };
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
    fn chunked_bodies_are_undone_and_bad_ones_refused() {
        let raw = b"5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\n\r\n";
        assert_eq!(dechunk(raw).unwrap(), b"hello, world");
        assert!(dechunk(b"5\r\nhel").unwrap_err().contains("truncated"));
        assert!(dechunk(b"zz\r\n").unwrap_err().contains("bad chunk size"));
        assert!(dechunk(b"5").unwrap_err().contains("without CRLF"));
    }

    /// A loopback server for one connection: reads the request line, then gives the connection,
    /// its reader and that line to `handle` on the server's thread.
    fn serve_one<T: Send + 'static>(
        handle: impl FnOnce(std::net::TcpStream, BufReader<std::net::TcpStream>, String) -> T
        + Send
        + 'static,
    ) -> (String, std::thread::JoinHandle<T>) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let server = std::thread::spawn(move || {
            let (c, _) = l.accept().unwrap();
            let mut r = BufReader::new(c.try_clone().unwrap());
            let mut first = String::new();
            r.read_line(&mut first).unwrap();
            handle(c, r, first)
        });
        (addr, server)
    }

    #[test]
    fn a_get_reads_the_whole_chunked_body() {
        let (addr, server) = serve_one(|mut c, _, first| {
            c.write_all(
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nab \r\n2\r\n 1\r\n0\r\n\r\n",
            )
            .unwrap();
            first
        });
        let (code, body) = get(&addr, "/metrics", None).unwrap();
        assert_eq!((code, body.as_str()), (200, "ab  1"));
        assert_eq!(server.join().unwrap(), "GET /metrics HTTP/1.1\r\n");
    }

    #[test]
    fn the_request_and_status_round_trip() {
        let (addr, server) = serve_one(|mut c, mut r, first| {
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
