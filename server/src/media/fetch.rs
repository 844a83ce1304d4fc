//! Fetching an image from an allowed host (`--media-allowed-hosts`): plain `http://` only (no
//! TLS is built in), one GET, no redirects, under a time limit and the image byte limit; the
//! response's `Content-Type` is the MIME type the decoder checks against the data.

use std::time::Duration;

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;

/// How long connecting and receiving one image may take.
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(10);

/// `(host, port, path)` of an `http://` URL.
fn parts(url: &str) -> Result<(String, u16, String), String> {
    if url.starts_with("https://") {
        return Err(
            "https image URLs need TLS, which this build does not include; use an http:// \
             URL on an allowed host or a data: URL"
                .into(),
        );
    }
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| "not an http:// URL".to_string())?;
    let (auth, path) = match rest.find(['/', '?']) {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    if auth.contains('@') {
        return Err("image URLs may not carry credentials".into());
    }
    let (host, port) = match auth.rsplit_once(':') {
        Some((h, p)) => (
            h,
            p.parse::<u16>()
                .map_err(|_| format!("invalid port `{p}` in the image URL"))?,
        ),
        None => (auth, 80),
    };
    if host.is_empty() {
        return Err("the image URL has no host".into());
    }
    let path = if path.starts_with('?') {
        format!("/{path}")
    } else {
        path.to_string()
    };
    Ok((host.to_string(), port, path))
}

/// GETs `url`: its MIME type (from `Content-Type`) and bytes.
pub async fn fetch(url: &str, max_bytes: usize) -> Result<(String, Vec<u8>), String> {
    let (host, port, path) = parts(url)?;
    let work = async {
        let stream = tokio::net::TcpStream::connect((host.as_str(), port))
            .await
            .map_err(|e| format!("could not connect to {host}:{port}: {e}"))?;
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| format!("HTTP handshake with {host} failed: {e}"))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let req = hyper::Request::get(path)
            .header(hyper::header::HOST, host.as_str())
            .header(hyper::header::USER_AGENT, "memra-server")
            .body(Empty::<Bytes>::new())
            .map_err(|e| format!("invalid image URL: {e}"))?;
        let resp = send
            .send_request(req)
            .await
            .map_err(|e| format!("fetching the image failed: {e}"))?;
        if resp.status() != hyper::StatusCode::OK {
            return Err(format!(
                "fetching the image answered {} (redirects are not followed)",
                resp.status()
            ));
        }
        let mime = resp
            .headers()
            .get(hyper::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(|v| {
                v.split(';')
                    .next()
                    .unwrap_or("")
                    .trim()
                    .to_ascii_lowercase()
            })
            .unwrap_or_default();
        let mut body = resp.into_body();
        let mut buf = Vec::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| format!("reading the image failed: {e}"))?;
            if let Ok(d) = frame.into_data() {
                if buf.len() + d.len() > max_bytes {
                    return Err(format!(
                        "the image is over the limit of {max_bytes} bytes (--media-max-bytes)"
                    ));
                }
                buf.extend_from_slice(&d);
            }
        }
        Ok((mime, buf))
    };
    tokio::time::timeout(FETCH_TIMEOUT, work)
        .await
        .map_err(|_| format!("fetching the image took over {} s", FETCH_TIMEOUT.as_secs()))?
}

#[cfg(test)]
mod tests {
    use super::parts;

    #[test]
    fn urls_split_into_host_port_path() {
        assert_eq!(
            parts("http://a.example/x.png?s=1").unwrap(),
            ("a.example".into(), 80, "/x.png?s=1".into())
        );
        assert_eq!(
            parts("http://127.0.0.1:8081").unwrap(),
            ("127.0.0.1".into(), 8081, "/".into())
        );
        assert!(parts("https://a.example/x.png").is_err());
        assert!(parts("http://u:p@a.example/x").is_err());
        assert!(parts("http://a.example:99999/x").is_err());
    }
}
