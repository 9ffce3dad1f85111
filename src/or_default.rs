//! [`OrDefault`]: a builder's value that the caller gave, or the default, made only when the builder
//! builds: a default that costs something to make (the default clock calibrates for 10 to 200 ms;
//! the default layer backend makes that clock) is never made when the caller replaces it.

use std::fmt;

pub(crate) enum OrDefault<T> {
    Given(T),
    // Only the memory backend's defaults are made this way (its clock, and the layer's default
    // backend): without the `memory` feature nothing builds one.
    #[cfg_attr(not(feature = "memory"), allow(dead_code))]
    Default(fn() -> T),
}

impl<T> OrDefault<T> {
    pub(crate) fn get(self) -> T {
        match self {
            OrDefault::Given(value) => value,
            OrDefault::Default(make) => make(),
        }
    }
}

impl<T: fmt::Debug> fmt::Debug for OrDefault<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OrDefault::Given(value) => value.fmt(f),
            OrDefault::Default(_) => f.write_str("(the default)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_is_made_only_when_nothing_was_given() {
        fn never() -> u32 {
            panic!("the default was made although a value was given")
        }
        assert_eq!(OrDefault::Given(7).get(), 7);
        let _ = OrDefault::<u32>::Default(never);
        assert_eq!(OrDefault::Default(|| 3).get(), 3);
    }
}
