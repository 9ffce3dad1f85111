//! Space-Saving (Metwally, Agrawal, El Abbadi 2005): the heaviest keys of a stream in a fixed
//! number of counters. A key not counted takes the place of the smallest counter and inherits its
//! count as its possible over-count (`error`), so every key seen more than `total / capacity` times
//! is in the summary, and no count is too high by more than the smallest one.
//!
//! The counters form a binary min-heap in one `Vec`, with a map from key to heap position: adding
//! to a counted key only raises it (it sinks towards the leaves), and replacing the smallest is a
//! write at the root. Each step is O(log capacity), with no allocation once the heap is full.

use std::collections::HashMap;
use std::hash::Hash;

/// A counted key: its estimated count, of which at most `error` may be over-count.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Counter<K> {
    pub(crate) key: K,
    pub(crate) count: u64,
    pub(crate) error: u64,
}

#[derive(Clone, Debug)]
pub(crate) struct SpaceSaving<K> {
    capacity: usize,
    heap: Vec<Counter<K>>,
    index: HashMap<K, usize>,
}

impl<K: Hash + Eq + Clone> SpaceSaving<K> {
    pub(crate) fn new(capacity: usize) -> Self {
        SpaceSaving {
            capacity: capacity.max(1),
            heap: Vec::new(),
            index: HashMap::new(),
        }
    }

    pub(crate) fn add(&mut self, key: &K, weight: u64) {
        if let Some(&i) = self.index.get(key) {
            self.heap[i].count = self.heap[i].count.saturating_add(weight);
            self.sift_down(i);
            return;
        }
        if self.heap.len() < self.capacity {
            self.heap.push(Counter {
                key: key.clone(),
                count: weight,
                error: 0,
            });
            let last = self.heap.len() - 1;
            self.index.insert(key.clone(), last);
            self.sift_up(last);
            return;
        }
        // Full: the new key takes the smallest counter, and its count as possible over-count.
        let root = &mut self.heap[0];
        let evicted = std::mem::replace(&mut root.key, key.clone());
        root.error = root.count;
        root.count = root.count.saturating_add(weight);
        self.index.remove(&evicted);
        self.index.insert(key.clone(), 0);
        self.sift_down(0);
    }

    /// The counters, in no particular order.
    pub(crate) fn counters(&self) -> &[Counter<K>] {
        &self.heap
    }

    fn swap(&mut self, a: usize, b: usize) {
        self.heap.swap(a, b);
        for i in [a, b] {
            if let Some(at) = self.index.get_mut(&self.heap[i].key) {
                *at = i;
            }
        }
    }

    fn sift_up(&mut self, mut i: usize) {
        while i > 0 {
            let parent = (i - 1) / 2;
            if self.heap[parent].count <= self.heap[i].count {
                break;
            }
            self.swap(parent, i);
            i = parent;
        }
    }

    fn sift_down(&mut self, mut i: usize) {
        loop {
            let (left, right) = (2 * i + 1, 2 * i + 2);
            let mut smallest = i;
            if left < self.heap.len() && self.heap[left].count < self.heap[smallest].count {
                smallest = left;
            }
            if right < self.heap.len() && self.heap[right].count < self.heap[smallest].count {
                smallest = right;
            }
            if smallest == i {
                return;
            }
            self.swap(i, smallest);
            i = smallest;
        }
    }
}

/// The `n` largest of `(key, count)` pairs summed by key (summaries merge by sum-then-trim), largest
/// first (ties in any order).
pub(crate) fn largest<K: Hash + Eq>(
    pairs: impl IntoIterator<Item = (K, u64)>,
    n: usize,
) -> Vec<(K, u64)> {
    let mut sums: HashMap<K, u64> = HashMap::new();
    for (key, count) in pairs {
        let sum = sums.entry(key).or_default();
        *sum = sum.saturating_add(count);
    }
    let mut all: Vec<(K, u64)> = sums.into_iter().collect();
    all.sort_unstable_by_key(|pair| std::cmp::Reverse(pair.1));
    all.truncate(n);
    all
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::top::zipf::{true_top, zipf_stream, Rng};

    #[test]
    fn the_true_top_10_of_a_zipf_stream_are_in_the_top_20() {
        for seed in [1, 2, 3] {
            let (stream, exact) = zipf_stream(200_000, seed);
            let mut sketch = SpaceSaving::new(1024);
            for client in &stream {
                sketch.add(client, 1);
            }
            let top: Vec<usize> = largest(sketch.counters().iter().map(|c| (c.key, c.count)), 20)
                .into_iter()
                .map(|(k, _)| k)
                .collect();
            for client in true_top(&exact, 10) {
                assert!(
                    top.contains(&client),
                    "seed {seed}: {client} not in {top:?}"
                );
            }
            // The bound of the algorithm: no count is off by more than its error, nor by more than
            // total / capacity.
            for c in sketch.counters() {
                assert!(c.count >= exact[c.key] && c.count - c.error <= exact[c.key]);
                assert!(c.error <= 200_000 / 1024, "{c:?}");
            }
        }
    }

    #[test]
    fn exact_while_there_is_room_and_bounded_after() {
        let mut sketch = SpaceSaving::new(3);
        for (key, weight) in [("a", 5), ("b", 1), ("a", 2), ("c", 3)] {
            sketch.add(&key, weight);
        }
        let exact: Vec<(&str, u64)> =
            largest(sketch.counters().iter().map(|c| (c.key, c.count)), 10);
        assert_eq!(exact, [("a", 7), ("c", 3), ("b", 1)]);
        // A fourth key takes the smallest counter (b's 1) and inherits it as error.
        sketch.add(&"d", 1);
        assert_eq!(sketch.counters().len(), 3);
        let d = sketch.counters().iter().find(|c| c.key == "d").unwrap();
        assert_eq!((d.count, d.error), (2, 1));
        assert!(sketch.counters().iter().all(|c| c.key != "b"));
        // The heap and its index agree after any sequence.
        let mut rng = Rng::new(7);
        let mut sketch = SpaceSaving::new(16);
        for _ in 0..10_000 {
            sketch.add(&(rng.next_u64() % 64), 1 + rng.next_u64() % 3);
            for (i, c) in sketch.counters().iter().enumerate() {
                assert_eq!(sketch.index[&c.key], i);
                if i > 0 {
                    assert!(sketch.counters()[(i - 1) / 2].count <= c.count);
                }
            }
        }
    }
}
