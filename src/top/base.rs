//! What the top summaries share, below both stores: their bounds, the minute, and how keys are shown.

use std::sync::OnceLock;

use crate::key::Key;
use crate::observe::{Redactor, ShownKey};

/// Counters per summary: the heaviest keys of a policy in a minute. A key refused more than
/// `refusals / CAPACITY` times in it is always counted.
pub const CAPACITY: usize = 1024;
/// Minutes a read covers: this one and the ones before.
pub const WINDOW_MINUTES: u64 = 5;
/// The most keys one read answers.
pub const MAX_TOP: usize = CAPACITY;

pub(super) fn show(key: &Key, redactor: &OnceLock<Redactor>) -> String {
    ShownKey {
        key,
        redact: redactor.get(),
    }
    .to_string()
}

pub(super) fn unix_minute() -> u64 {
    crate::clock::unix_secs() / 60
}
