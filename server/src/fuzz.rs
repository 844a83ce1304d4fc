//! The entry point of the request-JSON fuzz target (fuzz/, cargo-fuzz), shared with the stable
//! test that replays its committed seed corpus (server/tests/it/fuzz_replay.rs).

use crate::validation::{Kind, parse};

/// A request body through the chat and the completions parsers. Accepted bodies give `true`;
/// a refused body must be a 4xx naming what is wrong (anything else panics: a finding).
pub fn request_json(body: &[u8]) -> bool {
    let mut accepted = false;
    for kind in [Kind::Chat, Kind::Completion] {
        match parse(kind, body, 4096) {
            Ok(_) => accepted = true,
            Err(e) => {
                assert!(
                    e.status.is_client_error(),
                    "{kind:?}: status {} for a bad body: {}",
                    e.status,
                    e.message
                );
                assert!(!e.message.is_empty(), "{kind:?}: an empty error message");
            }
        }
    }
    accepted
}
