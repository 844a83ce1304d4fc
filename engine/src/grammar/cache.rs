//! A small least-recently-used map from a grammar's key to its compiled form.

use std::collections::VecDeque;

pub(crate) struct Lru<V> {
    cap: usize,
    /// Most recently used last.
    items: VecDeque<(String, V)>,
}

impl<V: Clone> Lru<V> {
    pub(crate) fn new(cap: usize) -> Lru<V> {
        Lru {
            cap: cap.max(1),
            items: VecDeque::new(),
        }
    }

    pub(crate) fn get(&mut self, key: &str) -> Option<V> {
        let i = self.items.iter().position(|(k, _)| k == key)?;
        let item = self.items.remove(i)?;
        let v = item.1.clone();
        self.items.push_back(item);
        Some(v)
    }

    pub(crate) fn put(&mut self, key: String, v: V) {
        if let Some(i) = self.items.iter().position(|(k, _)| *k == key) {
            self.items.remove(i);
        }
        if self.items.len() >= self.cap {
            self.items.pop_front();
        }
        self.items.push_back((key, v));
    }

    pub(crate) fn len(&self) -> usize {
        self.items.len()
    }
}

#[cfg(test)]
mod tests {
    use super::Lru;

    #[test]
    fn keeps_the_most_recently_used() {
        let mut c = Lru::new(2);
        c.put("a".into(), 1);
        c.put("b".into(), 2);
        assert_eq!(c.get("a"), Some(1));
        c.put("c".into(), 3);
        assert_eq!(c.get("b"), None, "b was the least recently used");
        assert_eq!(c.get("a"), Some(1));
        assert_eq!(c.get("c"), Some(3));
        assert_eq!(c.len(), 2);
    }
}
