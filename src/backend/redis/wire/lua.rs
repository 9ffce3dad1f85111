//! The Lua scripts' sources, assembled at build time: a shebang, `prelude.lua`, the script's body.
//!
//! The shebang (`#!lua`, Redis 7.0+) declares each script a writer, so Redis refuses the whole call
//! over `maxmemory` before it runs. Without it Redis refuses a script only at its first command that
//! may grow memory: the sliding log and concurrency paths (a `ZREMRANGEBYSCORE` first) grew memory
//! past the cap while the GCRA script was refused.
//!
//! No `use` and no paths but the scripts': the Redis tests include this file as it is.

/// `#!lua`, the prelude and a script's body.
macro_rules! script {
    ($($body:literal),+) => {
        concat!("#!lua\n", include_str!("prelude.lua"), $(include_str!($body)),+)
    };
}

/// The line that runs `limits.lua`'s function on the script's own keys and arguments.
macro_rules! run_limits {
    () => {
        "return limits(KEYS, ARGV)\n"
    };
}

/// The single-limit GCRA (`gcra.lua`).
pub(crate) const GCRA: &str = script!("gcra.lua");
/// Several GCRA decisions in one call (`gcra_batch.lua`).
pub(crate) const GCRA_BATCH: &str = script!("gcra_batch.lua");
/// A slice of a hot key's budget (`budget.lua`).
pub(crate) const BUDGET: &str = script!("budget.lua");
/// Every algorithm, and stacks (`limits.lua`, whose `limits(keys, argv)` this runs).
pub(crate) const LIMITS: &str = concat!(script!("limits.lua"), run_limits!());
/// `limits.lua` after the prelude, without the shebang: the body of the peek's read-only function.
pub(crate) const LIMITS_BODY: &str = concat!(
    include_str!("prelude.lua"),
    include_str!("limits.lua"),
    run_limits!()
);
/// Several `limits.lua` calls in one (`limits_batch.lua`, after `limits.lua`'s body).
pub(crate) const LIMITS_BATCH: &str = script!("limits.lua", "limits_batch.lua");
/// Refunds by outcome and metered costs settled after the response (`settle.lua`, after
/// `limits.lua`'s body, whose accessors it reads the states with).
pub(crate) const SETTLE: &str = script!("limits.lua", "settle.lua");
/// Concurrency lease renewal (`renew.lua`).
pub(crate) const RENEW: &str = script!("renew.lua");
/// `CL.THROTTLE` from a script that declares its key (`cell.lua`): a writer, without the prelude.
pub(crate) const CELL: &str = concat!("#!lua\n", include_str!("cell.lua"));
