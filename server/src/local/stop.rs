//! Stop strings over streamed text: releases text that cannot be the start of a stop string,
//! holds back the rest, and finds the first stop string (which is never released).

/// Streamed-text filter for one request.
pub struct StopFilter {
    stops: Vec<String>,
    /// Text released so far (kept only as far back as a stop string could reach).
    released_tail: String,
    held: String,
}

/// What one push produced.
#[derive(Debug, PartialEq, Eq)]
pub enum Pushed {
    /// Text to release now (may be empty).
    Text(String),
    /// A stop string matched: release this text, then stop.
    Stop(String),
}

impl StopFilter {
    pub fn new(stops: Vec<String>) -> StopFilter {
        StopFilter {
            stops,
            released_tail: String::new(),
            held: String::new(),
        }
    }

    fn max_stop(&self) -> usize {
        self.stops.iter().map(String::len).max().unwrap_or(0)
    }

    pub fn push(&mut self, text: &str) -> Pushed {
        self.held.push_str(text);
        if self.stops.is_empty() {
            return Pushed::Text(std::mem::take(&mut self.held));
        }
        let window = format!("{}{}", self.released_tail, self.held);
        let base = self.released_tail.len();
        let hit = self
            .stops
            .iter()
            .filter_map(|s| window.find(s.as_str()))
            .min();
        if let Some(i) = hit {
            let out = window.get(base.min(i)..i).unwrap_or("").to_string();
            self.held.clear();
            return Pushed::Stop(out);
        }
        // Hold back the longest suffix that is a proper prefix of a stop string.
        let mut keep = 0;
        for (i, _) in self.held.char_indices() {
            let suffix = &self.held[i..];
            if self.stops.iter().any(|s| s.starts_with(suffix)) {
                keep = suffix.len();
                break;
            }
        }
        let cut = self.held.len() - keep;
        let out: String = self.held[..cut].to_string();
        self.held.drain(..cut);
        self.released_tail.push_str(&out);
        let max = self.max_stop();
        if self.released_tail.len() > max {
            let mut from = self.released_tail.len() - max;
            while !self.released_tail.is_char_boundary(from) {
                from -= 1;
            }
            self.released_tail.drain(..from);
        }
        Pushed::Text(out)
    }

    /// The text still held at the end of generation.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let mut f = StopFilter::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = String::new();
        for p in pieces {
            match f.push(p) {
                Pushed::Text(t) => out.push_str(&t),
                Pushed::Stop(t) => {
                    out.push_str(&t);
                    return (out, true);
                }
            }
        }
        out.push_str(&f.finish());
        (out, false)
    }

    #[test]
    fn stops_across_pieces() {
        assert_eq!(
            run(&["END"], &["ab", "cE", "N", "Dxx"]),
            ("abc".into(), true)
        );
        assert_eq!(run(&["END"], &["abEN", "x"]), ("abENx".into(), false));
        assert_eq!(run(&[], &["a", "b"]), ("ab".into(), false));
        assert_eq!(run(&["é!"], &["aé", "!"]), ("a".into(), true));
        assert_eq!(run(&["x", "bc"], &["abc"]), ("a".into(), true));
    }
}
