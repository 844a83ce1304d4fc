//! A request's output side: incremental text with stop strings held back, and logprobs.

use crate::error::Result;
use crate::generate::top_k;
use crate::sampling::{SamplingParams, apply_penalties};
use crate::tokenizer::{StreamDecoder, Tokenizer};

/// The text side of one request: incremental detokenization, then stop strings.
pub(crate) struct RequestText {
    decoder: StreamDecoder,
    stop: StopText,
}

impl RequestText {
    pub(crate) fn new(tok: &Tokenizer, stops: Vec<String>) -> RequestText {
        RequestText {
            decoder: StreamDecoder::new(tok),
            stop: StopText::new(stops),
        }
    }

    /// A generated token: the text it releases and whether a stop string ended the text.
    /// `last`: no token follows, so everything held back is released.
    pub(crate) fn token(&mut self, id: u32, last: bool) -> Result<(String, bool)> {
        let mut piece = self.decoder.push(id)?;
        if last {
            piece.push_str(&self.decoder.finish());
        }
        Ok(self.stop.feed(&piece, last))
    }

    /// The end of sequence (not part of the output): the text still held back, cut at a stop
    /// string if the flushed text completes one.
    pub(crate) fn end_of_sequence(&mut self) -> String {
        let tail = self.decoder.finish();
        self.stop.feed(&tail, true).0
    }
}

/// Stop-string matching over streamed text. Text that could be the start of a stop string is
/// held back until it is known not to be; a match ends the text before the stop string.
#[derive(Debug, Default)]
pub(crate) struct StopText {
    stops: Vec<String>,
    pending: String,
}

impl StopText {
    pub(crate) fn new(stops: Vec<String>) -> StopText {
        StopText {
            stops,
            pending: String::new(),
        }
    }

    /// Adds `piece`; returns the text that can be emitted and whether a stop string matched
    /// (then nothing after its start is ever emitted). `end` flushes everything held back.
    pub(crate) fn feed(&mut self, piece: &str, end: bool) -> (String, bool) {
        self.pending.push_str(piece);
        let hit = self
            .stops
            .iter()
            .filter_map(|s| self.pending.find(s.as_str()))
            .min();
        if let Some(at) = hit {
            let out = self.pending.get(..at).unwrap_or_default().to_string();
            self.pending.clear();
            return (out, true);
        }
        if end {
            return (std::mem::take(&mut self.pending), false);
        }
        let hold = self
            .stops
            .iter()
            .map(|s| held_suffix(&self.pending, s))
            .max()
            .unwrap_or(0);
        let cut = self.pending.len() - hold;
        let out = self.pending.get(..cut).unwrap_or_default().to_string();
        self.pending.drain(..cut.min(self.pending.len()));
        (out, false)
    }
}

/// Length of the longest suffix of `text` that is a proper prefix of `stop`.
fn held_suffix(text: &str, stop: &str) -> usize {
    let max = (stop.len().saturating_sub(1)).min(text.len());
    (1..=max)
        .rev()
        .find(|&n| {
            text.get(text.len() - n..)
                .is_some_and(|suffix| stop.starts_with(suffix))
        })
        .unwrap_or(0)
}

/// Logprob of `token` and the `top` most likely alternatives under the penalized logits:
/// log-softmax in f64, summed in index order, then f32.
pub(crate) fn logprobs(
    logits: &[f32],
    history: &[u32],
    params: &SamplingParams,
    token: u32,
    top: usize,
) -> (f32, Vec<(u32, f32)>) {
    let mut l = logits.to_vec();
    apply_penalties(&mut l, history, params);
    let max = l
        .iter()
        .filter(|v| !v.is_nan())
        .fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
    let mut sum = 0.0f64;
    for &v in &l {
        if !v.is_nan() {
            sum += (v as f64 - max).exp();
        }
    }
    let lse = max + sum.ln();
    let lp = |v: f32| (v as f64 - lse) as f32;
    let own = l.get(token as usize).map_or(f32::NEG_INFINITY, |&v| lp(v));
    let alts = if top > 0 {
        top_k(&l, top)
            .into_iter()
            .map(|(i, v)| (i, lp(v)))
            .collect()
    } else {
        Vec::new()
    };
    (own, alts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let mut s = StopText::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = String::new();
        for (i, p) in pieces.iter().enumerate() {
            let (t, stop) = s.feed(p, i + 1 == pieces.len());
            out.push_str(&t);
            if stop {
                return (out, true);
            }
        }
        (out, false)
    }

    #[test]
    fn stop_strings_are_cut_and_never_emitted() {
        assert_eq!(
            run(&["END"], &["ab", "cE", "N", "Dxyz"]),
            ("abc".into(), true)
        );
        assert_eq!(
            run(&["END"], &["ab", "cE", "N", "x"]),
            ("abcENx".into(), false)
        );
        assert_eq!(
            run(&["\n\n", "##"], &["a\n", "#", "\n"]),
            ("a\n#\n".into(), false)
        );
        assert_eq!(run(&["\n\n", "##"], &["a\n", "\nb"]), ("a".into(), true));
        assert_eq!(run(&["é!"], &["caf", "é", "!"]), ("caf".into(), true));
    }

    #[test]
    fn held_text_is_released_as_soon_as_it_cannot_match() {
        let mut s = StopText::new(vec!["STOP".into()]);
        assert_eq!(s.feed("aST", false), ("a".into(), false));
        assert_eq!(s.feed("x", false), ("STx".into(), false));
    }

    fn real_tokenizer() -> Tokenizer {
        let g = crate::formats::gguf::Gguf::open(&crate::testing::real_model()).unwrap();
        Tokenizer::from_gguf(&g).unwrap()
    }

    /// The id of a byte-level vocabulary entry.
    fn id(tok: &Tokenizer, piece: &str) -> u32 {
        tok.inner().token_to_id(piece).unwrap()
    }

    #[test]
    fn end_of_sequence_flushes_an_unfinished_character() {
        let tok = real_tokenizer();
        // 0xE4 0xB8 (the first two bytes of U+4E2D) are the byte-level pieces "ä" and "¸".
        let (e4, b8) = (id(&tok, "ä"), id(&tok, "¸"));
        let mut t = RequestText::new(&tok, Vec::new());
        assert_eq!(
            t.token(id(&tok, "Hi"), false).unwrap(),
            ("Hi".into(), false)
        );
        assert_eq!(t.token(e4, false).unwrap(), (String::new(), false));
        assert_eq!(t.token(b8, false).unwrap(), (String::new(), false));
        assert_eq!(t.end_of_sequence(), "\u{FFFD}");
        // Ending by length instead: the last token releases it.
        let mut t = RequestText::new(&tok, Vec::new());
        assert_eq!(t.token(e4, false).unwrap(), (String::new(), false));
        assert_eq!(t.token(b8, true).unwrap(), ("\u{FFFD}".into(), false));
    }

    #[test]
    fn end_of_sequence_flushes_a_stop_string_start() {
        let tok = real_tokenizer();
        let mut t = RequestText::new(&tok, vec![".X".into(), "中!".into()]);
        assert_eq!(
            t.token(id(&tok, "Hi"), false).unwrap(),
            ("Hi".into(), false)
        );
        assert_eq!(
            t.token(id(&tok, "."), false).unwrap(),
            (String::new(), false)
        );
        assert_eq!(t.end_of_sequence(), ".");
        // A multi-byte stop string whose first character arrives in byte tokens.
        let ids = tok.encode("a中!b", false).unwrap();
        let mut t = RequestText::new(&tok, vec!["中!".into()]);
        let mut out = String::new();
        let mut stopped = false;
        for &i in &ids {
            let (s, stop) = t.token(i, false).unwrap();
            out.push_str(&s);
            if stop {
                stopped = true;
                break;
            }
        }
        assert_eq!((out.as_str(), stopped), ("a", true));
    }

    #[test]
    fn logprobs_normalize() {
        let logits = [1.0f32, 2.0, 3.0];
        let (lp, top) = logprobs(&logits, &[], &SamplingParams::default(), 2, 2);
        let total: f64 = logits.iter().map(|&v| ((v - 3.0) as f64).exp()).sum();
        assert_eq!(lp, (-(total.ln())) as f32);
        assert_eq!(top.len(), 2);
        assert_eq!(top[0].0, 2);
        assert!(top[0].1 > top[1].1);
    }
}
