//! A group of `gcra_batch.lua` (a run of identical GCRA checks): its arguments ([`group_args`]),
//! and its items' replies from the backlog the script answers, by the prelude's `gcra_step` in the
//! same integer arithmetic: exactly what `gcra.lua` answers alone.
//! No `use` and no paths: the Redis tests include this file as it is (as lua.rs).

/// A group's arguments (the script's header; `last`: the group before's quota). The increment
/// saturates at `u64::MAX`: any past the tolerance admits nothing, whatever its size.
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

/// Pushes `count` items' replies (`gcra.lua`'s five numbers), decided in turn from `backlog` (ns,
/// rebased), in 128 bits where the script's doubles are exact below 2^52: the same answers.
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
