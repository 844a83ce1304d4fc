//! The raw bytes of one token (OpenAI logprobs' `bytes`): what the token adds to the output
//! before the decoder turns bytes into (lossy) text and cleans up (SentencePiece's leading-space
//! strip). A byte-level or `<0xNN>` token that holds part of a character has bytes that are not
//! UTF-8 on their own.

use tokenizers::decoders::DecoderWrapper;

/// The bytes of `id`: added (special) tokens as their text; byte-level pieces mapped back through
/// the GPT-2 byte table; `<0xNN>` byte-fallback pieces as that byte; `▁` as a space for
/// SentencePiece-style vocabularies; any other decoder: the token decoded alone. `None` outside
/// the vocabulary.
pub(crate) fn token_bytes(t: &tokenizers::Tokenizer, id: u32) -> Option<Vec<u8>> {
    if let Some(s) = t.get_added_vocabulary().simple_id_to_token(id) {
        return Some(s.into_bytes());
    }
    let piece = t.id_to_token(id)?;
    let dec = t.get_decoder();
    if any(dec, &|d| matches!(d, DecoderWrapper::ByteLevel(_))) {
        let mut out = Vec::with_capacity(piece.len());
        for c in piece.chars() {
            match byte_level_byte(c) {
                Some(b) => out.push(b),
                None => out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
            }
        }
        return Some(out);
    }
    if any(dec, &|d| matches!(d, DecoderWrapper::ByteFallback(_)))
        && let Some(b) = fallback_byte(&piece)
    {
        return Some(vec![b]);
    }
    if any(dec, &|d| {
        matches!(d, DecoderWrapper::Metaspace(_) | DecoderWrapper::Replace(_))
    }) {
        return Some(piece.replace('▁', " ").into_bytes());
    }
    t.decode(&[id], false).ok().map(String::into_bytes)
}

/// Whether `d` or a decoder inside it satisfies `f`.
fn any(d: Option<&DecoderWrapper>, f: &dyn Fn(&DecoderWrapper) -> bool) -> bool {
    match d {
        None => false,
        Some(DecoderWrapper::Sequence(s)) => s.get_decoders().iter().any(|x| any(Some(x), f)),
        Some(d) => f(d),
    }
}

/// The byte a GPT-2 byte-level character stands for: printable bytes map to themselves, the
/// others (in increasing order) to U+0100, U+0101, ...
fn byte_level_byte(c: char) -> Option<u8> {
    let printable = |b: u32| {
        (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b)
    };
    let u = c as u32;
    if u < 0x100 {
        return printable(u).then_some(u as u8);
    }
    let n = (u - 0x100) as usize;
    (0..=0xFFu32)
        .filter(|&b| !printable(b))
        .nth(n)
        .map(|b| b as u8)
}

/// `<0xNN>` -> NN.
fn fallback_byte(piece: &str) -> Option<u8> {
    let hex = piece.strip_prefix("<0x")?.strip_suffix('>')?;
    (hex.len() == 2).then(|| u8::from_str_radix(hex, 16).ok())?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_level_table_round_trips() {
        // The GPT-2 table: every byte has one character, and distinct bytes distinct ones.
        let mut seen = [false; 256];
        for u in 0..0x200u32 {
            if let Some(b) = char::from_u32(u).and_then(byte_level_byte) {
                assert!(!seen[b as usize], "byte {b} twice");
                seen[b as usize] = true;
            }
        }
        assert!(seen.iter().all(|&s| s));
        assert_eq!(byte_level_byte('Ġ'), Some(b' '));
        assert_eq!(byte_level_byte('Ċ'), Some(b'\n'));
        assert_eq!(byte_level_byte('ä'), Some(0xE4));
        assert_eq!(fallback_byte("<0xE4>"), Some(0xE4));
        assert_eq!(fallback_byte("<0xE4"), None);
    }
}
