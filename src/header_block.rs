//! Header values of one decision (`RateLimit`, the `X-RateLimit-*` numbers) without an allocation
//! per response: each thread writes them into a block of its own, and every value shares the block.
//!
//! `HeaderValue::from_bytes` copies its bytes into a new allocation, one (or four, with the legacy
//! fields) for every response. Here a value is a slice of the thread's 8 KiB block (shared by
//! reference count), so a block serves hundreds of values; once the values of a full block are all
//! dropped (their responses written), the block is reused from its start, and a thread whose
//! responses do not outlive the next one's decision never allocates again. A response that lives
//! long (a stream) keeps at most one block of 8 KiB alive.

use std::cell::RefCell;

use bytes::{Bytes, BytesMut};
use http::HeaderValue;

/// The size of a block: a few hundred `RateLimit` values of one quota (about 20 bytes each).
const BLOCK: usize = 8 * 1024;

thread_local! {
    static BLOCKS: RefCell<BytesMut> = RefCell::new(BytesMut::new());
}

/// `bytes` as a header value in the thread's block, or `None` if they are not a valid one.
pub(crate) fn value(bytes: &[u8]) -> Option<HeaderValue> {
    values([bytes]).map(|[value]| value)
}

/// Header values of `parts`, written together into the thread's block (so that one value never
/// makes room for the next while alive: the block is started over only between decisions), or
/// `None` if a part is not a valid value.
pub(crate) fn values<const N: usize>(parts: [&[u8]; N]) -> Option<[HeaderValue; N]> {
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
    let values = parts.map(|part| {
        at += part.len();
        HeaderValue::from_maybe_shared(all.slice(at - part.len()..at))
    });
    if values.iter().any(Result::is_err) {
        return None;
    }
    Some(values.map(|value| value.expect("checked above")))
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
        let [a, b] = values([b"one", b"two"]).unwrap();
        assert_eq!(a, "one");
        assert_eq!(b, "two");
        assert!(values([&b"fine"[..], &b"not\0fine"[..]]).is_none());
        assert_eq!(value(b"\"api\";r=9;t=1").unwrap(), "\"api\";r=9;t=1");
        assert!(value(b"bad\nvalue").is_none());
        let long = vec![b'x'; BLOCK];
        assert_eq!(value(&long).unwrap().as_bytes(), &long[..]);
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
