//! The general store's entries out and back in, for a state file kept across a restart
//! ([`MemoryBackend::save_state`](crate::MemoryBackend::save_state)): windows, logs and stacks.
//! Concurrency slots are not kept: a process that stopped holds no request in flight.

use super::entries::{Cell, Cells, Entry, State};
use super::general::{lock, GeneralStore};
use crate::key::Key;
use crate::limit::Limit;

impl GeneralStore {
    /// Every live entry (first limit's id, key, cells) but its concurrency cells, every time in
    /// Unix nanoseconds (TATs and expiries moved by `origin`, the Unix time of the clock's zero;
    /// the windows' numbers and the log's times are Unix time already).
    pub(super) fn records(&self, now: u64, origin: u64) -> Vec<(u32, Key, Vec<Cell>)> {
        let mut out = Vec::new();
        for shard in self.shards.iter() {
            let shard = lock(shard);
            for entry in shard.table.iter() {
                let cells: Vec<Cell> = entry
                    .cells
                    .iter()
                    .filter(|c| c.expires_at > now && c.expires_at != u64::MAX)
                    .filter_map(|c| {
                        let state = match &c.state {
                            State::Gcra(tat) => State::Gcra(tat + origin),
                            State::InFlight(..) => return None,
                            state => state.clone(),
                        };
                        let expires_at = c.expires_at + origin;
                        Some(Cell {
                            state,
                            expires_at,
                            ..*c
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

    /// Puts back `key`'s entry under `first` (the first limit of its stack, which names the entry)
    /// from `saved` cells in Unix time, unless the store already has one (a newer state). Only
    /// `first`'s scale is noted for eviction: the stack's other limits are noted at their next new
    /// key in the shard, and until then rank as fully used (forgotten last). Whether it put one
    /// back (not when every cell has expired).
    pub(super) fn restore(
        &self,
        first: &Limit,
        key: &Key,
        saved: Vec<Cell>,
        now: u64,
        origin: u64,
    ) -> bool {
        let cells: Vec<Cell> = saved
            .into_iter()
            .filter_map(|c| {
                let expires_at = c.expires_at.checked_sub(origin).filter(|t| *t > now)?;
                let state = match c.state {
                    State::Gcra(tat) => State::Gcra(tat.checked_sub(origin)?),
                    // Kept by a clock ahead of this one: a time past now would come before the
                    // next one this clock appends, and a log is in order (as a file must be).
                    State::Log(times) => {
                        let unix_now = now.saturating_add(origin);
                        State::Log(times.into_iter().map(|t| t.min(unix_now)).collect())
                    }
                    state => state,
                };
                Some(Cell {
                    expires_at,
                    state,
                    ..c
                })
            })
            .collect();
        let cells = match cells.len() {
            0 => return false,
            1 => Cells::One(cells.into_iter().next().expect("one cell")),
            _ => Cells::Many(cells),
        };
        let (hash, mut shard) = self.locate(first.id(), key);
        if shard.table.find(hash, Entry::is(first.id(), key)).is_some() {
            return false;
        }
        // `insert` leaves out the cells that expired by `now`, and the entry if all did.
        let limits = std::slice::from_ref(first);
        self.insert(&mut shard, hash, limits, key, cells, now, origin);
        true
    }
}
