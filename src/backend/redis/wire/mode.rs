//! `RedisMode`: which implementation of the GCRA a `RedisBackend` is configured to run.

use std::fmt;

use crate::error::BuildError;

/// Which implementation of the GCRA the [`RedisBackend`](crate::redis::RedisBackend) runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RedisMode {
    /// The default: the coalesced Lua scripts when `coalesce` is on (the default); with it off,
    /// `CL.THROTTLE` where the module is loaded, Lua otherwise ([why](crate::guide::redis#modes)).
    #[default]
    Auto,
    /// `CL.THROTTLE`: requires the redis-cell module; decisions report whole seconds. What it cannot
    /// decide (peeks, oversized quantities, penalties, delays, other algorithms, stacks) runs on Lua;
    /// a quota it cannot express (more than a million a second, a period that is no whole number
    /// of seconds at the same rate) is refused at build.
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
        let modes = [RedisMode::Auto, RedisMode::Cell, RedisMode::Lua];
        modes.into_iter().find(|m| m.as_str() == s).ok_or_else(|| {
            BuildError::Invalid(format!(
                "unknown Redis mode {s:?}: expected \"auto\", \"cell\" or \"lua\""
            ))
        })
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
    path.filter(|p| *p != RedisMode::Auto)
        .map_or("unknown", RedisMode::as_str)
}
