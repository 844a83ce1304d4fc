//! `x-memra-cache-key`: a routing key for cache-affine gateways (`--cache-key-header`).
//!
//! A request's prefix-cache entries live on the replica that served it, under its tenant and
//! `cache_salt`. The key names what a later turn of the same conversation will share with this
//! one, so a gateway that hashes on it (or remembers key -> replica) sends the next turn to the
//! replica holding the cache. It is the first 8 bytes, as 16 lowercase hex digits, of the
//! SHA-256 of, each part length-prefixed (u64 little-endian):
//!
//! `memra-cache-key-v1`, the model alias, the tenant, the `cache_salt` (empty when absent),
//! then the first that applies of:
//! - `k` and the request's `prompt_cache_key`;
//! - `u` and the request's `user`;
//! - chat: `m` and the role and content of each message up to and including the first `user`
//!   message (all of them when there is none): the part of a conversation that every later
//!   turn repeats;
//! - completions: `p` and the first prefix-cache block of the prompt's token ids (u32
//!   little-endian; the whole prompt when it is shorter).
//!
//! The key carries no prompt text and cannot be reversed into it; it does not change the
//! output or what the cache may share (tenant and `cache_salt` do).

use sha2::{Digest, Sha256};

use crate::validation::PromptInput;

/// The response header's name.
pub const HEADER: &str = "x-memra-cache-key";

/// What the key is computed from.
pub struct KeyInput<'a> {
    pub model: &'a str,
    pub tenant: &'a str,
    pub cache_salt: Option<&'a str>,
    pub prompt_cache_key: Option<&'a str>,
    pub user: Option<&'a str>,
    pub prompt: &'a PromptInput,
    /// The prompt's token ids (for completions).
    pub ids: &'a [u32],
    /// Tokens per prefix-cache block.
    pub block: usize,
}

fn part(h: &mut Sha256, bytes: &[u8]) {
    h.update((bytes.len() as u64).to_le_bytes());
    h.update(bytes);
}

/// The key: 16 lowercase hex digits.
pub fn cache_key(k: &KeyInput) -> String {
    let mut h = Sha256::new();
    for p in [
        "memra-cache-key-v1",
        k.model,
        k.tenant,
        k.cache_salt.unwrap_or(""),
    ] {
        part(&mut h, p.as_bytes());
    }
    if let Some(key) = k.prompt_cache_key {
        part(&mut h, b"k");
        part(&mut h, key.as_bytes());
    } else if let Some(user) = k.user {
        part(&mut h, b"u");
        part(&mut h, user.as_bytes());
    } else if let PromptInput::Chat(messages) = k.prompt {
        part(&mut h, b"m");
        for m in messages {
            part(&mut h, m.role.as_bytes());
            part(&mut h, m.content.as_bytes());
            if m.role == "user" {
                break;
            }
        }
    } else {
        part(&mut h, b"p");
        let n = k.ids.len().min(k.block.max(1));
        let bytes: Vec<u8> = k.ids[..n].iter().flat_map(|t| t.to_le_bytes()).collect();
        part(&mut h, &bytes);
    }
    crate::keys::to_hex(&h.finalize()[..8])
}

#[cfg(test)]
mod tests {
    use memra_engine::chat::ChatMessage;

    use super::*;

    fn msg(role: &str, content: &str) -> ChatMessage {
        ChatMessage::new(role, content)
    }

    fn key(tenant: &str, salt: Option<&str>, pck: Option<&str>, p: &PromptInput) -> String {
        cache_key(&KeyInput {
            model: "m",
            tenant,
            cache_salt: salt,
            prompt_cache_key: pck,
            user: None,
            prompt: p,
            ids: &[1, 2, 3, 4, 5],
            block: 4,
        })
    }

    #[test]
    fn later_turns_of_a_conversation_share_the_key_and_others_do_not() {
        let turn1 = PromptInput::Chat(vec![msg("system", "be brief"), msg("user", "hi")]);
        let turn2 = PromptInput::Chat(vec![
            msg("system", "be brief"),
            msg("user", "hi"),
            msg("assistant", "hello"),
            msg("user", "and then?"),
        ]);
        let other = PromptInput::Chat(vec![msg("system", "be brief"), msg("user", "yo")]);
        let k1 = key("t", None, None, &turn1);
        assert_eq!(k1.len(), 16);
        assert!(
            k1.chars()
                .all(|c| c.is_ascii_hexdigit() && !c.is_uppercase())
        );
        assert_eq!(k1, key("t", None, None, &turn2));
        assert_ne!(k1, key("t", None, None, &other));
        // Tenant and salt namespace the key like the cache itself.
        assert_ne!(k1, key("u", None, None, &turn1));
        assert_ne!(k1, key("t", Some("s"), None, &turn1));
        // prompt_cache_key wins over the messages.
        assert_eq!(
            key("t", None, Some("conv-1"), &turn1),
            key("t", None, Some("conv-1"), &other)
        );
    }

    #[test]
    fn completions_hash_the_first_block_of_ids() {
        let text = PromptInput::Text("x".into());
        let a = key("t", None, None, &text);
        let b = cache_key(&KeyInput {
            model: "m",
            tenant: "t",
            cache_salt: None,
            prompt_cache_key: None,
            user: None,
            prompt: &text,
            ids: &[1, 2, 3, 4, 99],
            block: 4,
        });
        assert_eq!(a, b, "only the first block counts");
    }
}
