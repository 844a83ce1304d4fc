//! The n-gram (prompt lookup) drafter: find the longest recent suffix of the sequence (prompt +
//! output) that occurred before, and propose the tokens that followed its latest earlier
//! occurrence. No weights; pays off when the output copies from the prompt (edits, summaries,
//! code).

use super::{DraftReq, Drafter};
use crate::error::Result;

/// Prompt-lookup drafter.
#[derive(Clone, Debug)]
pub struct NgramDrafter {
    /// Longest suffix tried first.
    pub max_n: usize,
    /// Shortest suffix accepted.
    pub min_n: usize,
    /// How far back to search (tokens), bounding the cost per step.
    pub window: usize,
}

impl Default for NgramDrafter {
    fn default() -> Self {
        NgramDrafter {
            max_n: 4,
            min_n: 1,
            window: 4096,
        }
    }
}

impl NgramDrafter {
    /// Up to `k` tokens continuing `tokens`.
    pub fn propose(&self, tokens: &[u32], k: usize) -> Vec<u32> {
        self.propose_matched(tokens, k).0
    }

    /// [`Self::propose`] with the length of the suffix match that proposed the tokens (0 with
    /// no proposal).
    pub fn propose_matched(&self, tokens: &[u32], k: usize) -> (Vec<u32>, usize) {
        let len = tokens.len();
        let lo = len.saturating_sub(self.window);
        for n in (self.min_n.max(1)..=self.max_n).rev() {
            if n >= len {
                continue;
            }
            let suffix = &tokens[len - n..];
            // Latest earlier occurrence: starts at i, i + n <= len - 1 (so it is followed by
            // at least one token).
            let found = (lo..len - n).rev().find(|&i| &tokens[i..i + n] == suffix);
            if let Some(i) = found {
                let from = i + n;
                return (tokens[from..(from + k).min(len)].to_vec(), n);
            }
        }
        (Vec::new(), 0)
    }
}

impl Drafter for NgramDrafter {
    fn name(&self) -> String {
        "ngram".into()
    }

    fn draft(&mut self, reqs: &[DraftReq]) -> Result<Vec<Vec<u32>>> {
        Ok(reqs.iter().map(|r| self.propose(r.tokens, r.k)).collect())
    }

    fn matches(&self) -> bool {
        true
    }

    fn draft_matched(&mut self, reqs: &[DraftReq]) -> Result<Vec<(Vec<u32>, Option<usize>)>> {
        Ok(reqs
            .iter()
            .map(|r| {
                let (d, n) = self.propose_matched(r.tokens, r.k);
                (d, (n > 0).then_some(n))
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proposes_what_followed_the_longest_latest_match() {
        let d = NgramDrafter::default();
        // Suffix [2, 3] occurred at 1..3 (followed by 4, 5) and the 1-gram [3] also at 6.
        let t = [1, 2, 3, 4, 5, 9, 3, 7, 2, 3];
        assert_eq!(d.propose(&t, 2), vec![4, 5]);
        assert_eq!(d.propose(&t, 10), vec![4, 5, 9, 3, 7, 2, 3]);
        // Only a 1-gram matches: its latest earlier occurrence (6) wins over 2.
        let t = [3, 8, 1, 3, 6, 3];
        assert_eq!(d.propose(&t, 1), vec![6]);
    }

    #[test]
    fn reports_the_length_of_the_match_that_proposed() {
        let mut d = NgramDrafter::default();
        let t = [1, 2, 3, 4, 5, 9, 3, 7, 2, 3];
        assert_eq!(d.propose_matched(&t, 2), (vec![4, 5], 2));
        assert_eq!(d.propose_matched(&[3, 8, 1, 3, 6, 3], 1), (vec![6], 1));
        // A repeated 5-gram: the longest suffix tried (max_n = 4) matches.
        let t = [1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5];
        assert_eq!(d.propose_matched(&t, 3), (vec![6, 1, 2], 4));
        assert_eq!(d.propose_matched(&[1, 2, 3], 3), (Vec::new(), 0));
        let req = |tokens| DraftReq {
            id: 0,
            tokens,
            k: 2,
            params: &crate::sampling::SamplingParams::GREEDY,
        };
        let got = d
            .draft_matched(&[req(&t[..]), req(&[1, 2, 3][..])])
            .unwrap();
        assert_eq!(got, vec![(vec![6, 1], Some(4)), (Vec::new(), None)]);
        assert!(d.matches());
    }

    #[test]
    fn no_match_and_tiny_inputs_give_nothing() {
        let d = NgramDrafter::default();
        assert!(d.propose(&[], 4).is_empty());
        assert!(d.propose(&[7], 4).is_empty());
        assert!(d.propose(&[1, 2, 3, 4], 4).is_empty());
        assert!(d.propose(&[1, 2, 1], 0).is_empty());
    }

    #[test]
    fn window_bounds_the_search() {
        let d = NgramDrafter {
            window: 3,
            ..Default::default()
        };
        assert!(d.propose(&[5, 6, 0, 0, 0, 5], 2).is_empty());
        assert_eq!(
            NgramDrafter::default().propose(&[5, 6, 0, 0, 0, 5], 2),
            vec![6, 0]
        );
    }
}
