//! Server-sent events framing: `data: <json>\n\n` per event, `data: [DONE]\n\n` at the end.

use bytes::Bytes;
use serde::Serialize;

/// One `data:` event holding `value` as JSON.
pub fn event<T: Serialize>(value: &T) -> Bytes {
    let json = serde_json::to_string(value).unwrap_or_else(|_| "{}".into());
    let mut s = String::with_capacity(json.len() + 8);
    s.push_str("data: ");
    s.push_str(&json);
    s.push_str("\n\n");
    Bytes::from(s)
}

/// The end-of-stream marker.
pub fn done() -> Bytes {
    Bytes::from_static(b"data: [DONE]\n\n")
}

/// Splits an SSE byte stream into its `data:` payloads (for tests and clients); returns the
/// payloads and whether every event was well formed (`data: ` line followed by a blank line).
pub fn parse_events(text: &str) -> (Vec<String>, bool) {
    let mut out = Vec::new();
    let mut ok = text.ends_with("\n\n");
    for block in text.split("\n\n").filter(|b| !b.is_empty()) {
        match block.strip_prefix("data: ") {
            Some(d) if !d.contains('\n') => out.push(d.to_string()),
            _ => ok = false,
        }
    }
    (out, ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_roundtrip() {
        let mut s = String::new();
        s.push_str(std::str::from_utf8(&event(&serde_json::json!({"a": "x\ny"}))).unwrap());
        s.push_str(std::str::from_utf8(&done()).unwrap());
        let (ev, ok) = parse_events(&s);
        assert!(ok);
        assert_eq!(
            ev,
            vec![r#"{"a":"x\ny"}"#.to_string(), "[DONE]".to_string()]
        );
        assert!(!parse_events("data: {}\n").1);
        assert!(!parse_events("event: x\n\n").1);
    }
}
