//! `RedisMode`: which implementation of the GCRA a `RedisBackend` is configured to run.

use std::fmt;

use crate::error::BuildError;

/// Which implementation of the GCRA the [`RedisBackend`](crate::redis::RedisBackend) runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RedisMode {
    /// The faster path for the deployment, by a static rule: the Lua scripts, coalesced, when
    /// [`coalesce`](crate::redis::RedisBackendBuilder::coalesce) is on (the default), whether or not the
    /// redis-cell module is loaded; with coalescing off, `CL.THROTTLE` when the module is loaded (on
    /// every primary of a Cluster), the Lua script otherwise. The default.
    ///
    /// Why: measured side by side on one hot key (BENCHMARKS.md, section 10), the coalesced Lua
    /// path costs Redis less CPU per decision than `CL.THROTTLE` (a batch pays the call, `TIME`,
    /// `GET` and `SET` once; each `CL.THROTTLE` is its own module call, pipelined or not) and serves
    /// more requests a second; on a Cluster `CL.THROTTLE` must go through a script that declares its
    /// key, which costs more again. A lone check (no concurrency) goes alone on `gcra.lua` and is a
    /// little slower than on `CL.THROTTLE` (one client: 0.345× against 0.377× bare, section 8),
    /// where Redis is far from busy. Without coalescing one `CL.THROTTLE` costs Redis a third of
    /// one `gcra.lua` call, so the module wins there.
    ///
    /// With coalescing off the module is detected at connect and again after the connection was
    /// lost, so a server that restarts with or without it is followed; with coalescing on nothing
    /// asks for it (no `COMMAND INFO` at connect). `Cell` still forces `CL.THROTTLE`.
    ///
    /// ```
    /// use tower_throttle::redis::{RedisBackend, RedisMode};
    ///
    /// // The default: the coalesced Lua path, module or not.
    /// let lua = RedisBackend::builder().url("redis://127.0.0.1:6379/");
    /// // CL.THROTTLE where the module is loaded, each check its own call.
    /// let cell_if_loaded = RedisBackend::builder()
    ///     .url("redis://127.0.0.1:6379/")
    ///     .mode(RedisMode::Auto)
    ///     .coalesce(false);
    /// # drop((lua, cell_if_loaded));
    /// ```
    #[default]
    Auto,
    /// `CL.THROTTLE`: requires the redis-cell module; decisions report whole seconds. Peeks
    /// (quantity 0) and quantities beyond the limit, which redis-cell 0.2.2 mishandles (a key without
    /// expiry; an overflow that crashes the server), run the Lua script instead, as do limits with a
    /// penalty box or a delay, other algorithms than the GCRA, and stacks.
    Cell,
    /// Always the Lua script (`EVALSHA`): any Redis 7.0 or newer, nanosecond results.
    Lua,
}

impl RedisMode {
    /// `"auto"`, `"cell"` or `"lua"`.
    pub fn as_str(self) -> &'static str {
        match self {
            RedisMode::Auto => "auto",
            RedisMode::Cell => "cell",
            RedisMode::Lua => "lua",
        }
    }
}

impl fmt::Display for RedisMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for RedisMode {
    type Err = BuildError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(RedisMode::Auto),
            "cell" => Ok(RedisMode::Cell),
            "lua" => Ok(RedisMode::Lua),
            other => Err(BuildError::Invalid(format!(
                "unknown Redis mode {other:?}: expected \"auto\", \"cell\" or \"lua\""
            ))),
        }
    }
}

/// A path as one byte (for atomics): not known yet, `CL.THROTTLE`, the Lua script.
pub(crate) const UNKNOWN: u8 = 0;
pub(crate) const CELL: u8 = 1;
pub(crate) const LUA: u8 = 2;

/// The path a byte stands for, and back.
pub(crate) fn path_of(code: u8) -> Option<RedisMode> {
    match code {
        CELL => Some(RedisMode::Cell),
        LUA => Some(RedisMode::Lua),
        _ => None,
    }
}

pub(crate) fn path_code(path: Option<RedisMode>) -> u8 {
    match path {
        Some(RedisMode::Cell) => CELL,
        Some(RedisMode::Lua) => LUA,
        _ => UNKNOWN,
    }
}

/// `"cell"`, `"lua"` or `"unknown"`: the path a backend decides on, as logs and health name it.
pub(crate) fn path_name(path: Option<RedisMode>) -> &'static str {
    match path {
        Some(RedisMode::Cell) => "cell",
        Some(RedisMode::Lua) => "lua",
        _ => "unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_named() {
        assert_eq!(path_name(Some(RedisMode::Cell)), "cell");
        assert_eq!(path_name(Some(RedisMode::Lua)), "lua");
        assert_eq!(path_name(None), "unknown");
    }
}
