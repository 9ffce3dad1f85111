//! Header values of one decision (`RateLimit`, the `X-RateLimit-*` numbers) without an allocation
//! per response: each thread writes them into a block of its own, and every value shares the block.
//!
//! `HeaderValue::from_bytes` copies its bytes into a new allocation, one (or four, with the legacy
//! fields) for every response. Here a value is a slice of the thread's 8 KiB block (shared by
//! reference count); once the values of a full block are all dropped, the block is reused from its
//! start, so a thread whose responses do not outlive the next one's decision never allocates again.
//! A response that lives long (a stream) keeps at most one block alive.

use std::cell::RefCell;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use http::HeaderValue;

/// The size of a block: a few hundred `RateLimit` values of one quota (about 20 bytes each).
const BLOCK: usize = 8 * 1024;

thread_local! {
    static BLOCKS: RefCell<BytesMut> = RefCell::new(BytesMut::new());
}

/// How many recent values of one-limit `RateLimit` fields a thread keeps (see [`recent_or`]).
const RECENT: usize = 16;

/// A `RateLimit` value this thread made: for the limit called `name` (this very `Arc`, which the
/// entry keeps alive, so no other limit's name can take its address), `remaining` and `reset`.
struct Recent {
    name: Arc<str>,
    remaining: u64,
    reset: u64,
    value: HeaderValue,
}

thread_local! {
    static RECENT_VALUES: RefCell<[Option<Recent>; RECENT]> =
        const { RefCell::new([const { None }; RECENT]) };
}

/// The `RateLimit` value of one limit's decision: the one this thread made last for the same name
/// and numbers, or `make`'s (kept for the next request). Most admitted requests of a key well under
/// its quota show the same numbers, so they share one value (a clone is a reference count) instead
/// of each writing and validating its own. Each kept value holds its block: at most `RECENT` blocks
/// of 8 KiB a thread beyond the one in use.
pub(crate) fn recent_or(
    name: &Arc<str>,
    remaining: u64,
    reset: u64,
    make: impl FnOnce() -> Option<HeaderValue>,
) -> Option<HeaderValue> {
    let at = slot_of(name, remaining, reset);
    let found = RECENT_VALUES.try_with(|recent| {
        let recent = recent.borrow();
        match &recent[at] {
            Some(r)
                if r.remaining == remaining && r.reset == reset && Arc::ptr_eq(&r.name, name) =>
            {
                Some(r.value.clone())
            }
            _ => None,
        }
    });
    if let Ok(Some(value)) = found {
        return Some(value);
    }
    let value = make()?;
    // A thread that is exiting has no cache: the value is only not kept.
    let _ = RECENT_VALUES.try_with(|recent| {
        recent.borrow_mut()[at] = Some(Recent {
            name: name.clone(),
            remaining,
            reset,
            value: value.clone(),
        });
    });
    Some(value)
}

fn slot_of(name: &Arc<str>, remaining: u64, reset: u64) -> usize {
    let address = Arc::as_ptr(name).cast::<u8>() as usize as u64;
    let mixed =
        (remaining ^ reset.rotate_left(21) ^ (address >> 4)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (mixed >> 60) as usize % RECENT
}

/// A header value of `bytes`, written into the thread's block (`None`: not a header value).
pub(crate) fn value(bytes: &[u8]) -> Option<HeaderValue> {
    let [bytes] = shared([bytes]);
    HeaderValue::from_maybe_shared(bytes).ok()
}

/// `parts` written together into the thread's block, each a slice of it (not checked as header
/// values: [`value`] checks its one).
pub(crate) fn shared<const N: usize>(parts: [&[u8]; N]) -> [Bytes; N] {
    let total: usize = parts.iter().map(|part| part.len()).sum();
    let all = if total > BLOCK / 4 {
        // Not worth a block (only many stacked quotas with long names come here).
        None
    } else {
        BLOCKS
            .try_with(|block| {
                let mut block = block.borrow_mut();
                // The rest of the block is too short: start it over if no value in it is alive any
                // more, else take a new one (the old one is freed with its last value).
                if block.capacity() < total && !block.try_reclaim(BLOCK) {
                    *block = BytesMut::with_capacity(BLOCK);
                }
                for part in parts {
                    block.extend_from_slice(part);
                }
                block.split().freeze()
            })
            .ok()
    };
    // Without a block (too long, or the thread is exiting and its block is gone): one allocation.
    let all = all.unwrap_or_else(|| Bytes::from(parts.concat()));
    let mut at = 0;
    parts.map(|part| {
        at += part.len();
        all.slice(at - part.len()..at)
    })
}

/// A non-negative integer in decimal, on the stack.
pub(crate) struct Digits {
    digits: [u8; 20],
    at: usize,
}

impl Digits {
    pub(crate) fn of(mut n: u64) -> Self {
        let mut digits = [0u8; 20];
        let mut at = digits.len();
        loop {
            at -= 1;
            digits[at] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        Digits { digits, at }
    }

    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.digits[self.at..]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn int(n: u64) -> HeaderValue {
        value(Digits::of(n).as_bytes()).unwrap()
    }

    #[test]
    fn values_are_the_bytes_given() {
        for n in [0, 7, 10, 999, u64::MAX] {
            assert_eq!(int(n), HeaderValue::from(n));
        }
        assert_eq!(value(b"\"api\";r=9;t=1").unwrap(), "\"api\";r=9;t=1");
        assert!(value(b"bad\nvalue").is_none());
        let long = vec![b'x'; BLOCK];
        assert_eq!(value(&long).unwrap().as_bytes(), &long[..]);
    }

    #[test]
    fn a_recent_value_is_only_shared_with_the_same_name_and_numbers() {
        let api: Arc<str> = "api".into();
        let other: Arc<str> = "api".into();
        let made = std::cell::Cell::new(0);
        let make = |text: &str| {
            made.set(made.get() + 1);
            value(text.as_bytes())
        };
        let first = recent_or(&api, 9, 1, || make("\"api\";r=9;t=1")).unwrap();
        assert_eq!(first, "\"api\";r=9;t=1");
        let again = recent_or(&api, 9, 1, || make("never")).unwrap();
        assert_eq!((again, made.get()), (first, 1));
        // Another number, or another limit of the same name (another `Arc`): made anew.
        assert_eq!(recent_or(&api, 8, 1, || make("r8")).unwrap(), "r8");
        assert_eq!(recent_or(&api, 9, 2, || make("t2")).unwrap(), "t2");
        assert_eq!(recent_or(&other, 9, 1, || make("other")).unwrap(), "other");
        assert_eq!(made.get(), 4);
        assert!(recent_or(&api, 7, 7, || None).is_none());
        assert_eq!(recent_or(&api, 7, 7, || make("r7")).unwrap(), "r7");
    }

    #[test]
    fn values_outlive_their_block() {
        // Fill several blocks while keeping every value: none is overwritten by a later one.
        let kept: Vec<(u64, HeaderValue)> = (0..5 * BLOCK as u64).map(|n| (n, int(n))).collect();
        for (n, value) in &kept {
            assert_eq!(value.to_str().unwrap(), n.to_string());
        }
        drop(kept);
        // Dropped: the block starts over.
        for n in 0..BLOCK as u64 {
            assert_eq!(int(n).to_str().unwrap(), n.to_string());
        }
    }
}
