//! A request's output side, run by whoever reads its stream (the server's task for that request),
//! never by the model thread: the thread sends engine facts ([`Msg`]: token ids, logprob values,
//! how the sequence ended) and [`OutputStage`] turns them into [`Event`]s: incremental text, stop
//! strings held back and matched, the usage of a stop-string end.

use std::collections::VecDeque;
use std::sync::mpsc::Sender;

use super::Command;

use crate::error::Result;
use crate::generate::FinishReason;
use crate::request::{Event, TokenEvent, Usage, ValidRequest};
use crate::scheduler::SeqId;
use crate::tokenizer::{StreamDecoder, Tokenizer};

/// What a model thread sends a request's stream.
#[derive(Debug)]
pub(crate) enum Msg {
    /// A generated token (never the EOS that ended the sequence).
    Token(RawToken),
    /// The sequence ended by EOS (`Stop`) or by its length (`Length`).
    End {
        finish_reason: FinishReason,
        usage: Usage,
    },
    /// An event as it is (errors).
    Event(Event),
}

/// A generated token as the engine knows it.
#[derive(Debug)]
pub(crate) struct RawToken {
    pub(crate) id: u32,
    pub(crate) logprob: Option<f32>,
    pub(crate) top_logprobs: Vec<(u32, f32)>,
    /// No token follows (length or context): everything held back goes out with this one.
    pub(crate) last: bool,
    /// Prompt tokens served from the prefix cache (the usage of a stop-string end).
    pub(crate) cached_tokens: usize,
    /// Draft tokens checked and accepted so far (the usage of a stop-string end).
    pub(crate) spec: (usize, usize),
}

/// Tells a model thread that a request's stream ended it (a stop string matched).
pub(crate) struct EndRequest {
    pub(crate) tx: Sender<Command>,
    pub(crate) id: SeqId,
}

/// Turns one request's [`Msg`]s into its [`Event`]s.
pub(crate) struct OutputStage {
    text: RequestText,
    prompt_tokens: usize,
    generated: usize,
    done: bool,
    end: EndRequest,
}

impl OutputStage {
    pub(crate) fn new(tok: &Tokenizer, req: &ValidRequest, end: EndRequest) -> OutputStage {
        OutputStage {
            text: RequestText::new(tok, req.stop.clone()),
            prompt_tokens: req.prompt.len(),
            generated: 0,
            done: false,
            end,
        }
    }

    /// The request has had its `Done` or `Error`: later messages are ignored.
    pub(crate) fn is_done(&self) -> bool {
        self.done
    }

    /// Ends the request on this side: the model thread ends the sequence before its next step.
    fn finish_here(&mut self) {
        self.done = true;
        let _ = self.end.tx.send(Command::End(self.end.id));
    }

    /// Appends the events of `m` to `out`.
    pub(crate) fn on(&mut self, m: Msg, out: &mut VecDeque<Event>) {
        if self.done {
            return;
        }
        match m {
            Msg::Token(t) => {
                self.generated += 1;
                let (text, stopped) = match self.text.token(t.id, t.last) {
                    Ok(x) => x,
                    Err(e) => {
                        self.finish_here();
                        out.push_back(Event::Error(e.to_string()));
                        return;
                    }
                };
                out.push_back(Event::Token(TokenEvent {
                    id: t.id,
                    text,
                    logprob: t.logprob,
                    top_logprobs: t.top_logprobs,
                }));
                if stopped {
                    self.finish_here();
                    out.push_back(Event::Done {
                        finish_reason: FinishReason::Stop,
                        usage: Usage {
                            prompt_tokens: self.prompt_tokens,
                            completion_tokens: self.generated,
                            cached_tokens: t.cached_tokens,
                            drafted_tokens: t.spec.0,
                            accepted_tokens: t.spec.1,
                        },
                    });
                }
            }
            Msg::End {
                finish_reason,
                usage,
            } => {
                self.done = true;
                if finish_reason == FinishReason::Stop {
                    // End of sequence: the text held back goes out as text only.
                    let tail = self.text.end_of_sequence();
                    if !tail.is_empty() {
                        out.push_back(Event::Text(tail));
                    }
                }
                out.push_back(Event::Done {
                    finish_reason,
                    usage,
                });
            }
            Msg::Event(e) => {
                self.done = matches!(e, Event::Done { .. } | Event::Error(_));
                out.push_back(e);
            }
        }
    }
}

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
}
