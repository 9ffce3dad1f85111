//! The wire format: what a limit becomes on Redis (keys, arguments), the Lua scripts (`*.lua`,
//! assembled in `lua.rs`), and the calls that run them and read their replies.

pub(crate) mod args;
pub(crate) mod limits_call;
pub(crate) mod lua;
pub(crate) mod mode;
pub(crate) mod scripts;
