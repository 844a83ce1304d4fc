//! The one place where validation, auth, limit and engine errors become an HTTP status and an
//! OpenAI error object `{"error":{"message","type","param","code"}}`.
//!
//! Messages are capped at [`MAX_MESSAGE`] bytes so an error never echoes a large input back.

use hyper::StatusCode;
use memra_engine::request::SubmitError;
use serde_json::json;

/// Longest error message sent to a client, in bytes.
pub const MAX_MESSAGE: usize = 320;

/// An error as the client sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// OpenAI `type` (`invalid_request_error`, ...).
    pub kind: &'static str,
    /// The request parameter at fault, if one is.
    pub param: Option<String>,
    pub code: Option<&'static str>,
    /// Seconds for a `Retry-After` header (429 / 503).
    pub retry_after: Option<u64>,
}

/// Cuts `s` to at most `max` bytes on a character boundary, marking the cut.
pub fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end])
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: truncate(&message.into(), MAX_MESSAGE),
            kind,
            param: None,
            code: None,
            retry_after: None,
        }
    }

    fn with_code(mut self, code: &'static str) -> ApiError {
        self.code = Some(code);
        self
    }

    fn with_param(mut self, param: &str) -> ApiError {
        self.param = Some(truncate(param, 64));
        self
    }

    fn retry(mut self, s: u64) -> ApiError {
        self.retry_after = Some(s);
        self
    }

    /// 400 for a request that is wrong as a whole (not JSON, wrong content type).
    pub fn invalid(message: impl Into<String>) -> ApiError {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    /// 400 naming the parameter at fault.
    pub fn param(param: &str, message: impl Into<String>) -> ApiError {
        Self::invalid(message)
            .with_param(param)
            .with_code("invalid_value")
    }

    pub fn model_not_found(model: &str) -> ApiError {
        Self::invalid(format!(
            "the model `{}` does not exist; GET /v1/models lists the served models",
            truncate(model, 64)
        ))
        .with_param("model")
        .with_code("model_not_found")
    }

    /// 400 `context_length_exceeded`, naming the request's prompt parameter (`prompt` or
    /// `messages`).
    pub fn context_length(param: &str, prompt: usize, max_tokens: usize, ctx: usize) -> ApiError {
        let e = SubmitError::ContextLength {
            prompt,
            max_tokens,
            ctx,
        };
        Self::invalid(e.to_string())
            .with_param(param)
            .with_code("context_length_exceeded")
    }

    /// 400 `context_length_exceeded` before tokenizing: the prompt has more bytes than the
    /// context could hold as tokens.
    pub fn prompt_too_many_bytes(param: &str, bytes: usize, limit: usize, ctx: usize) -> ApiError {
        Self::invalid(format!(
            "the prompt is {bytes} bytes; a context of {ctx} tokens takes at most {limit} bytes \
             of prompt; shorten it"
        ))
        .with_param(param)
        .with_code("context_length_exceeded")
    }

    /// 408: the client did not send its body in time.
    pub fn body_timeout(secs: u64) -> ApiError {
        Self::new(
            StatusCode::REQUEST_TIMEOUT,
            "invalid_request_error",
            format!("the request body did not arrive within {secs} s"),
        )
        .with_code("body_timeout")
    }

    /// 503: too many open connections.
    pub fn too_many_connections(limit: usize) -> ApiError {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "overloaded_error",
            format!("the server has {limit} open connections, its limit; retry shortly"),
        )
        .with_code("too_many_connections")
        .retry(1)
    }

    pub fn missing_key() -> ApiError {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            "missing API key: send `Authorization: Bearer KEY`",
        )
        .with_code("missing_api_key")
    }

    pub fn invalid_key() -> ApiError {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            "invalid API key",
        )
        .with_code("invalid_api_key")
    }

    pub fn revoked_key() -> ApiError {
        Self::new(
            StatusCode::FORBIDDEN,
            "permission_error",
            "this API key has been revoked",
        )
        .with_code("revoked_api_key")
    }

    pub fn body_too_large(limit: usize) -> ApiError {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            format!("the request body exceeds the limit of {limit} bytes"),
        )
        .with_code("body_too_large")
    }

    pub fn not_found(path: &str) -> ApiError {
        Self::new(
            StatusCode::NOT_FOUND,
            "not_found_error",
            format!("no route for {}", truncate(path, 64)),
        )
    }

    pub fn method_not_allowed(allowed: &str) -> ApiError {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request_error",
            format!("method not allowed; use {allowed}"),
        )
    }

    /// 503 while the models are still loading.
    pub fn loading() -> ApiError {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "overloaded_error",
            "the models are still loading; retry shortly (GET /ready turns 200 when they are)",
        )
        .with_code("loading")
        .retry(5)
    }

    /// 500: the engine failed (before or during generation).
    pub fn engine(message: impl Into<String>) -> ApiError {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
            .with_code("engine_error")
    }

    /// The JSON error object.
    pub fn body(&self) -> serde_json::Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

/// Tokenizer and template errors come from the client's input: 400.
impl From<memra_engine::Error> for ApiError {
    fn from(e: memra_engine::Error) -> ApiError {
        use memra_engine::Error as E;
        match e {
            E::Template(m) => ApiError::param("messages", format!("chat template: {m}")),
            E::Input(m) | E::Tokenizer(m) => ApiError::invalid(m),
            other => ApiError::engine(other.to_string()),
        }
    }
}

/// The engine's refusals at submission.
impl From<SubmitError> for ApiError {
    fn from(e: SubmitError) -> ApiError {
        let msg = e.to_string();
        match e {
            SubmitError::ModelNotFound(m) => ApiError::model_not_found(&m),
            // Without the route the prompt parameter is unknown: the routes use
            // `context_length` with it.
            SubmitError::ContextLength { .. } => {
                ApiError::invalid(msg).with_code("context_length_exceeded")
            }
            SubmitError::Invalid(_) => ApiError::invalid(msg),
            SubmitError::TenantLimit { retry_after_s, .. } => {
                ApiError::new(StatusCode::TOO_MANY_REQUESTS, "rate_limit_error", msg)
                    .with_code("tenant_limit_exceeded")
                    .retry(retry_after_s)
            }
            SubmitError::Overloaded { retry_after_s } => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "overloaded_error", msg)
                    .with_code("overloaded")
                    .retry(retry_after_s)
            }
            SubmitError::Draining => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "overloaded_error", msg)
                    .with_code("draining")
                    .retry(1)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn submit_errors_map_to_their_status() {
        let cases = [
            (
                SubmitError::ModelNotFound("x".into()),
                400,
                Some("model_not_found"),
            ),
            (
                SubmitError::ContextLength {
                    prompt: 9,
                    max_tokens: 9,
                    ctx: 10,
                },
                400,
                Some("context_length_exceeded"),
            ),
            (SubmitError::Invalid("bad".into()), 400, None),
            (
                SubmitError::TenantLimit {
                    tenant: "t".into(),
                    retry_after_s: 3,
                },
                429,
                Some("tenant_limit_exceeded"),
            ),
            (
                SubmitError::Overloaded { retry_after_s: 2 },
                503,
                Some("overloaded"),
            ),
            (SubmitError::Draining, 503, Some("draining")),
        ];
        for (e, status, code) in cases {
            let a = ApiError::from(e.clone());
            assert_eq!(a.status.as_u16(), status, "{e:?}");
            assert_eq!(a.code, code, "{e:?}");
            assert_eq!(a.retry_after.is_some(), status == 429 || status == 503);
        }
    }

    #[test]
    fn long_messages_are_cut() {
        let big = "x".repeat(10_000);
        let e = ApiError::invalid(big);
        assert!(e.message.len() <= MAX_MESSAGE + 3);
        let e = ApiError::model_not_found(&"é".repeat(500));
        assert!(e.message.len() < 200, "{}", e.message);
    }
}
