//! One call of `limits.lua` as data: keys, arguments, reply length. Sent alone (scripts.rs) or as
//! an item of a `limits_batch.lua` call (batch.rs) alike, so that both paths decide alike.

use super::args::{penalty_args, Spec};
use crate::penalty::Penalty;

/// `quantity` units under each of `specs` (or `each[i]` under `specs[i]`), with the first limit's
/// penalty box (on `base:strikes`, `base:ban`), adding units named by `token`.
pub(crate) struct LimitsCall {
    pub(crate) specs: Vec<Spec>,
    pub(crate) penalty: Option<(Penalty, String)>,
    pub(crate) quantity: u64,
    pub(crate) each: Option<Vec<u64>>,
    pub(crate) token: u64,
}

impl LimitsCall {
    /// The call's keys, in the script's order: each limit's, then the penalty box's.
    pub(crate) fn keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = self.specs.iter().map(|s| s.key.clone()).collect();
        if let Some((_, base)) = &self.penalty {
            // Same hash tag as the state: one slot, one atomic call.
            keys.push(format!("{base}:strikes"));
            keys.push(format!("{base}:ban"));
        }
        keys
    }

    /// The call's first key: every other carries its hash tag (one Cluster slot).
    pub(crate) fn first_key(&self) -> &str {
        self.specs.first().map_or("", |s| &s.key)
    }

    /// The call's arguments (see the script's header).
    pub(crate) fn args(&self) -> Vec<u64> {
        let mut args = vec![self.specs.len() as u64, self.quantity, self.token];
        args.extend(penalty_args(self.penalty.as_ref().map(|(p, _)| p)));
        for spec in &self.specs {
            args.extend([u64::from(spec.kind), spec.limit, spec.a, spec.b]);
        }
        // The optional sections: the ceilings, then a quantity per limit.
        if self.each.is_some() || self.specs.iter().any(Spec::is_metered) {
            args.extend(self.specs.iter().map(|s| s.ceiling));
        }
        args.extend(self.each.iter().flatten());
        args
    }

    /// How many integers the script answers: `banned`, then five per limit.
    pub(crate) fn reply_len(&self) -> usize {
        1 + 5 * self.specs.len()
    }
}
