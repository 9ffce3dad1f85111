//! [`Limit`]: a named, validated quota — what a backend is asked to enforce.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use crate::{gcra, BuildError, Penalty, Quota};

/// The algorithm a [`Limit`] is enforced with. Only the GCRA for now; more are planned, so matches
/// need a wildcard arm.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Algorithm {
    /// The generic cell rate algorithm, exactly as redis-cell's `CL.THROTTLE`.
    #[default]
    Gcra,
}

/// A named quota: the policy as a backend sees it (algorithm and quota; the cost comes with each call).
///
/// The name is the namespace of the keys (the "action" of "user U may do action A N times a
/// period"): two limits with different names never share state, two with the same name share it.
/// Names are 1 to 64 characters of `[A-Za-z0-9_.-]`, so they are safe in Redis keys and in
/// `RateLimit-Policy` headers.
///
/// ```
/// use tower_throttle::{Limit, Quota};
///
/// let limit = Limit::new("login", Quota::per_minute(5)).unwrap();
/// assert_eq!(limit.name(), "login");
/// assert!(Limit::new("log in", Quota::per_minute(5)).is_err());
/// assert!(Limit::new("login", Quota::per_minute(0)).is_err());
/// ```
#[derive(Clone, Debug)]
pub struct Limit {
    name: Arc<str>,
    #[cfg_attr(not(feature = "memory"), allow(dead_code))]
    id: u32,
    quota: Quota,
    params: Params,
    penalty: Option<Penalty>,
}

/// The validated parameters of each algorithm.
#[derive(Clone, Copy, Debug)]
enum Params {
    Gcra(gcra::Params),
}

impl Limit {
    /// A GCRA limit called `name`.
    pub fn new(name: impl Into<String>, quota: Quota) -> Result<Self, BuildError> {
        let name = name.into();
        validate_name(&name)?;
        let gcra = quota.validate().map_err(|source| BuildError::Quota {
            policy: name.clone(),
            source,
        })?;
        Ok(Limit {
            id: intern(&name),
            name: name.into(),
            quota,
            params: Params::Gcra(gcra),
            penalty: None,
        })
    }

    /// With a [`Penalty`]: keys limited often enough are banned for a while.
    pub fn with_penalty(mut self, penalty: Penalty) -> Self {
        self.penalty = Some(penalty);
        self
    }

    /// The penalty, if any.
    pub fn penalty(&self) -> Option<&Penalty> {
        self.penalty.as_ref()
    }

    /// The name (namespace) of the limit.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A number unique to the name within this process (names come from configuration, so the
    /// table behind it stays small).
    #[cfg_attr(not(feature = "memory"), allow(dead_code))]
    pub(crate) fn id(&self) -> u32 {
        self.id
    }

    /// The algorithm.
    pub fn algorithm(&self) -> Algorithm {
        match self.params {
            Params::Gcra(_) => Algorithm::Gcra,
        }
    }

    /// The most units one request may cost and still be admitted some time (for the GCRA, the
    /// limit `max_burst + 1`).
    pub fn max_cost(&self) -> u64 {
        match self.params {
            Params::Gcra(p) => p.limit(),
        }
    }

    /// The quota.
    pub fn quota(&self) -> &Quota {
        &self.quota
    }

    /// The GCRA parameters, when the algorithm is [`Algorithm::Gcra`].
    pub fn gcra(&self) -> Option<&gcra::Params> {
        match &self.params {
            Params::Gcra(p) => Some(p),
        }
    }
}

pub(crate) fn validate_name(name: &str) -> Result<(), BuildError> {
    let reason = if name.is_empty() {
        "is empty"
    } else if name.len() > 64 {
        "is longer than 64 characters"
    } else if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
    {
        "may only contain ASCII letters, digits, '_', '.' and '-'"
    } else {
        return Ok(());
    };
    Err(BuildError::InvalidName {
        name: name.to_owned(),
        reason,
    })
}

/// Gives each distinct name a small number, so the memory backend keys its map by a `u32` instead of
/// hashing and storing the name with every key. Names come from configuration, so the table stays small.
fn intern(name: &str) -> u32 {
    static NAMES: OnceLock<Mutex<HashMap<String, u32>>> = OnceLock::new();
    let mut names = NAMES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    // Past u32::MAX distinct names (never, for names from configuration) ids would be shared, which
    // only merges state in the memory backend; it cannot panic.
    let next = names.len() as u32;
    *names.entry(name.to_owned()).or_insert(next)
}
