//! A shard's hot key: the one key of the shard that several threads were seen deciding on at once,
//! moved out of the shard's table so that its decisions take no lock at all.
//!
//! Under the read lock, every decision writes the lock's word twice (lock, unlock): when sixteen
//! threads decide on one key (one client or one NAT flooding), that word and the TAT bounce between
//! their cores three times a decision. Here a decision loads the slot (arc-swap's load writes only
//! the thread's own debt slot) and swaps the TAT: one shared write, as few as the TAT itself needs.
//!
//! The protocol. A key moves into the slot when a decision under the read lock had to retry its
//! compare-and-swap (another thread swapped between its load and its swap), or when two threads'
//! sampled decisions ([`Sampler`]) found it one after the other, under the shard's write lock: its
//! record leaves the table and its TAT goes into the slot. It moves out (a later hot key once this
//! one is idle, [`forget`](super::GcraTable::forget), an explicit sweep) under the write lock too: the
//! TAT is swapped for [`MOVED`], which no decision's compare-and-swap can expect, so that a decision
//! that loaded the record before it left retries, finds `MOVED`, and decides through the table
//! (under the read lock, which waits for the write lock's holder to put the record back). While a
//! key is hot, a decision that misses the table takes the write lock and looks in the slot again
//! before inserting it: one key never has two states.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use arc_swap::ArcSwapOption;

use crate::clock::Clock;
use crate::decision::Decision;
use crate::gcra;
use crate::key::Key;

/// The TAT of a record that has left the slot: never a real TAT (a TAT so far ahead fails the
/// admission test's overflow check first).
pub(super) const MOVED: u64 = u64::MAX;

/// A hot key in its compact form, as its table stores it.
#[derive(Clone, PartialEq, Eq)]
pub(super) enum HotKey {
    V4(u32),
    V6([u8; 16]),
    Other(Key),
}

pub(super) struct HotRecord {
    pub(super) limit: u32,
    pub(super) key: HotKey,
    pub(super) tat: AtomicU64,
}

/// At most one hot key per shard.
#[derive(Default)]
pub(super) struct HotSlot {
    /// Whether the slot holds a record: one relaxed load (of a line written only by samples and
    /// moves) spares every decision in a shard without a hot key the slot's load.
    occupied: AtomicBool,
    record: ArcSwapOption<HotRecord>,
}

impl HotSlot {
    /// `f` of the TAT of `limit`'s `key` when it is this slot's hot key.
    #[inline]
    pub(super) fn with<R>(
        &self,
        limit: u32,
        is_key: impl FnOnce(&HotKey) -> bool,
        f: impl FnOnce(&AtomicU64) -> R,
    ) -> Option<R> {
        if !self.occupied.load(Relaxed) {
            return None;
        }
        let guard = self.record.load();
        match guard.as_deref() {
            Some(record) if record.limit == limit && is_key(&record.key) => Some(f(&record.tat)),
            _ => None,
        }
    }

    /// The hot record's TAT: exact under the write lock (no record leaves meanwhile), a hint
    /// without it.
    pub(super) fn current_tat(&self) -> Option<u64> {
        self.record.load().as_deref().map(|r| r.tat.load(Relaxed))
    }

    /// Takes the hot record out, under the write lock: its limit, key and last TAT, after which a
    /// decision still holding it finds [`MOVED`].
    pub(super) fn take(&self) -> Option<(u32, HotKey, u64)> {
        self.occupied.store(false, Relaxed);
        let record = self.record.swap(None)?;
        let tat = record.tat.swap(MOVED, Relaxed);
        Some((record.limit, record.key.clone(), tat))
    }

    /// Makes `key` of `limit`, with `tat`, the hot key (the slot empty), under the write lock.
    pub(super) fn put(&self, limit: u32, key: HotKey, tat: u64) {
        self.record.store(Some(Arc::new(HotRecord {
            limit,
            key,
            tat: AtomicU64::new(tat),
        })));
        self.occupied.store(true, Relaxed);
    }

    pub(super) fn len(&self) -> usize {
        usize::from(self.record.load().is_some())
    }

    /// The hot record, if any: its limit, key and TAT (exact under the shard's lock, read or
    /// write: no record leaves the slot meanwhile).
    pub(super) fn snapshot(&self) -> Option<(u32, HotKey, u64)> {
        let guard = self.record.load();
        let record = guard.as_deref()?;
        Some((record.limit, record.key.clone(), record.tat.load(Relaxed)))
    }

    /// Decides on this slot's hot key, if `is_key` says it is the key (of the limit `id`) and it
    /// has not just left the slot.
    #[inline]
    pub(super) fn decide<C: Clock>(
        &self,
        params: &gcra::GcraParams,
        id: u32,
        is_key: impl FnOnce(&HotKey) -> bool,
        quantity: u64,
        clock: &C,
    ) -> Option<Decision> {
        self.with(id, is_key, |record| {
            let now = clock.now_nanos();
            let mut current = record.load(Relaxed);
            // Between the load and the swap only the new TAT is computed (a few additions): with
            // every thread on this key, a longer window makes more swaps fail and retry. The
            // decision, with its division, comes after.
            let live = loop {
                if current == MOVED {
                    return None;
                }
                let live = (current > now).then_some(current);
                let store = gcra::stored_tat(live, now, params, quantity)
                    .filter(|tat| *tat > now && *tat != current);
                let Some(tat) = store else {
                    break live;
                };
                match record.compare_exchange_weak(current, tat, Relaxed, Relaxed) {
                    Ok(_) => break live,
                    Err(actual) => current = actual,
                }
            };
            Some(gcra::decide(live, now, params, quantity).decision)
        })
        .flatten()
    }
}

/// The threads' numbers for [`Sampler`], from 1.
static THREADS: AtomicU64 = AtomicU64::new(1);

std::thread_local! {
    /// This thread's number (0 until its first sample).
    static THREAD: Cell<u64> = const { Cell::new(0) };
}

/// A shard's last sampled decision: its record and its thread.
#[derive(Default)]
pub(super) struct Sampler {
    hash: AtomicU64,
    thread: AtomicU64,
}

impl Sampler {
    /// Whether a decision on the record of `hash` at `now` is sampled (`now`'s six low bits are 0:
    /// one in 64, nothing to count) and the shard's previous sample was the same record from
    /// another thread. A thread alone never moves a key (the slot would only cost it instructions),
    /// and a shard's many keys seldom meet twice in a row; the shared write is one a sample, not
    /// one a decision. The compare-and-swap itself seldom sees contention: under the read lock the
    /// threads queue on the lock's word, and the TAT's window is a few instructions long.
    #[inline]
    pub(super) fn another_thread_too(&self, hash: u64, now: u64) -> bool {
        now & 63 == 0 && self.sample(hash)
    }

    #[cold]
    fn sample(&self, hash: u64) -> bool {
        let me = THREAD.with(|thread| {
            if thread.get() == 0 {
                thread.set(THREADS.fetch_add(1, Relaxed));
            }
            thread.get()
        });
        let another = self.hash.load(Relaxed) == hash && self.thread.load(Relaxed) != me;
        self.hash.store(hash, Relaxed);
        self.thread.store(me, Relaxed);
        another
    }
}
