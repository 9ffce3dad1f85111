//! The general store's entries out and back in, for a state file kept across a restart
//! ([`MemoryBackend::save_state`](crate::MemoryBackend::save_state)): windows, logs and stacks.
//! Concurrency slots are not kept: a process that stopped holds no request in flight.

use std::collections::VecDeque;

use super::entries::{Cell, Cells, Entry, State};
use super::general::GeneralStore;
use crate::key::Key;
use crate::limit::Limit;
use crate::window::{FixedState, SlidingState};

/// One cell of an entry, in wall-clock terms: its limit's id and place in the stack, its state
/// with every time in Unix nanoseconds, and when it expires (Unix nanoseconds).
pub(super) struct SavedCell {
    pub(super) limit: u32,
    pub(super) position: u8,
    pub(super) state: SavedState,
    pub(super) expires_unix: u64,
}

/// A state with its times in Unix nanoseconds (the windows' numbers and the log's times are Unix
/// time already; a TAT is moved there from the backend's clock).
pub(super) enum SavedState {
    Gcra(u64),
    Fixed(FixedState),
    Sliding(SlidingState),
    Log(Vec<u64>),
}

impl GeneralStore {
    /// Every live entry (first limit's id, key, cells), its concurrency cells left out; `origin`:
    /// the Unix time of the backend's clock's zero.
    pub(super) fn records(&self, now: u64, origin: u64) -> Vec<(u32, Key, Vec<SavedCell>)> {
        let mut out = Vec::new();
        for shard in self.shards.iter() {
            let shard = shard
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            for entry in shard.table.iter() {
                let cells: Vec<SavedCell> = entry
                    .cells
                    .iter()
                    .filter(|c| c.expires_at > now && c.expires_at != u64::MAX)
                    .filter_map(|c| {
                        let state = match &c.state {
                            State::Gcra(tat) => SavedState::Gcra(tat + origin),
                            State::Fixed(s) => SavedState::Fixed(*s),
                            State::Sliding(s) => SavedState::Sliding(*s),
                            State::Log(log) => SavedState::Log(log.iter().copied().collect()),
                            State::InFlight(_) => return None,
                        };
                        Some(SavedCell {
                            limit: c.limit,
                            position: c.position,
                            state,
                            expires_unix: c.expires_at + origin,
                        })
                    })
                    .collect();
                if !cells.is_empty() {
                    out.push((entry.limit, entry.key.clone(), cells));
                }
            }
        }
        out
    }

    /// Puts back an entry of `key` under `first` (the first limit of its stack, which names the
    /// entry), unless the store already has one (a newer state). Cells that expired by `now` are
    /// left out. Only `first`'s scale is noted for eviction: the other limits of a stack are noted
    /// at their next new key in the shard, and until then rank as fully used (forgotten last).
    pub(super) fn restore(
        &self,
        first: &Limit,
        key: &Key,
        saved: Vec<SavedCell>,
        now: u64,
        origin: u64,
    ) {
        let cells: Vec<Cell> = saved
            .into_iter()
            .filter_map(|c| {
                let expires_at = c.expires_unix.checked_sub(origin).filter(|t| *t > now)?;
                let state = match c.state {
                    SavedState::Gcra(tat) => State::Gcra(tat.checked_sub(origin)?),
                    SavedState::Fixed(s) => State::Fixed(s),
                    SavedState::Sliding(s) => State::Sliding(s),
                    SavedState::Log(times) => State::Log(VecDeque::from(times)),
                };
                Some(Cell {
                    limit: c.limit,
                    position: c.position,
                    expires_at,
                    state,
                })
            })
            .collect();
        let mut cells = match cells.len() {
            0 => return,
            1 => Cells::One(cells.into_iter().next().expect("one cell")),
            _ => Cells::Many(cells),
        };
        let (hash, mut shard) = self.locate(first.id(), key);
        if shard.table.find(hash, Entry::is(first.id(), key)).is_some() {
            return;
        }
        if !cells.retain_live(now) {
            return;
        }
        self.insert(
            &mut shard,
            hash,
            std::slice::from_ref(first),
            key,
            cells,
            now,
            origin,
        );
    }
}
