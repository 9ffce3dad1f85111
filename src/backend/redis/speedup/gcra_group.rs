//! The items of one group of `gcra_batch.lua`'s reply: the script answers a run of identical GCRA
//! checks (same key, quota and quantity) with the backlog the first of them was decided on, and
//! this runs the prelude's step (`gcra_step` in prelude.lua) on it once per item, in the same
//! integer arithmetic, for each item's five numbers: exactly what `gcra.lua` answers alone.
//!
//! [`group_args`] makes the other direction: a group's arguments as the script reads them.
//!
//! No `use` and no paths: the Redis tests include this file as it is (as they include lua.rs), so
//! they check the script's answer through this very expansion, on arguments made by this very code.

/// The arguments of one group of `count` identical items for `quantity` units of a quota of
/// `interval`, `tolerance` and `ceiling` (the script's header): the count, negative and followed by
/// the quota's three numbers (increment, tolerance, ceiling) unless they are those of the group
/// before (`last`, which this updates).
///
/// The increment (interval × quantity) is sent exact up to `u64::MAX` and as `u64::MAX` beyond:
/// any increment past the tolerance (below 2^52) admits nothing, whatever its size.
pub(crate) fn group_args(
    last: &mut Option<[u64; 3]>,
    (interval, tolerance, ceiling): (u64, u64, u64),
    quantity: u64,
    count: usize,
) -> (i64, Option<[u64; 3]>) {
    let increment = u128::from(interval) * u128::from(quantity);
    let quota = [
        u64::try_from(increment).unwrap_or(u64::MAX),
        tolerance,
        ceiling,
    ];
    let count = i64::try_from(count).unwrap_or(i64::MAX);
    if *last == Some(quota) {
        (count, None)
    } else {
        *last = Some(quota);
        (-count, Some(quota))
    }
}

/// Pushes the replies of `count` identical items, `{limited, limit, remaining, retry_after (ns, -1
/// = never), reset_after (ns)}` each, decided one after the other from `backlog` (ns ahead of now,
/// already within the ceiling: the script applied the rebase) for `quantity` units of a quota of
/// `interval`, `tolerance` and `limit`.
///
/// The script computes in doubles, exact below 2^53: the backlog and tolerance stay below 2^52
/// (the backend refuses longer tolerances), and an increment past the tolerance is never added.
/// Here the increment is exact (128 bits), so an item whose cost exceeds the tolerance is refused
/// in both, with `retry_after` -1.
pub(crate) fn push_replies(
    out: &mut Vec<[i64; 5]>,
    backlog: u64,
    (interval, tolerance, limit): (u64, u64, u64),
    quantity: u64,
    count: usize,
) {
    let interval = u128::from(interval.max(1));
    let tolerance = u128::from(tolerance);
    let increment = interval * u128::from(quantity);
    let mut backlog = u128::from(backlog);
    let int = |n: u128| i64::try_from(n).unwrap_or(i64::MAX);
    for _ in 0..count {
        let next = backlog + increment;
        if next <= tolerance {
            out.push([
                0,
                int(limit.into()),
                int((tolerance - next) / interval),
                -1,
                int(next),
            ]);
            backlog = next;
        } else {
            // Refused: the backlog stays, so every later item of the group gets this same reply.
            let remaining = (tolerance.saturating_sub(backlog) / interval).min(limit.into());
            let retry_after = if increment <= tolerance {
                int(next - tolerance)
            } else {
                -1
            };
            out.push([
                1,
                int(limit.into()),
                int(remaining),
                retry_after,
                int(backlog),
            ]);
        }
    }
}
