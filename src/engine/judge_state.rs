//! Peek, reset and reload: what the layer's handle asks of the in-process state a [`Judge`] keeps
//! (the penalty boxes, and the local limiter of `OnBackendError::Local`).

use std::time::Duration;

use crate::engine::verdict::Judge;
use crate::key::Key;

impl Judge {
    /// Takes over the in-process state of `previous` (the judge of the table a reload replaces) for
    /// the policies it shares with it: a policy of the same name and penalty keeps its strikes and
    /// bans, and the local limiter keeps its keys (it keys them by limit name, as backends do).
    pub(crate) fn carry_over(&mut self, previous: &Judge) {
        for rules in self.policies.iter_mut() {
            let Some(mine) = &rules.penalty else { continue };
            let same = previous.policies.iter().find_map(|old| {
                old.penalty
                    .as_ref()
                    .filter(|b| old.name == rules.name && b.penalty() == mine.penalty())
            });
            if let Some(same) = same {
                rules.penalty = Some(same.clone());
            }
        }
        #[cfg(feature = "memory")]
        if let (Some(local), Some(old)) = (&mut self.local, &previous.local) {
            *local = old.clone();
        }
    }

    /// The rest of `key`'s ban by the penalty box of policy `policy`, if this judge keeps one and
    /// the key is banned.
    pub(crate) fn ban_of(&self, policy: usize, key: &Key) -> Option<Duration> {
        self.policies[policy].penalty.as_ref()?.banned(key)
    }

    /// Forgets `key` under policy `policy` in this judge's state: its strikes and ban, and its state
    /// in the local limiter (every tier).
    pub(crate) fn forget(&self, policy: usize, key: &Key) {
        let rules = &self.policies[policy];
        if let Some(penalty) = &rules.penalty {
            penalty.forget(key);
        }
        #[cfg(feature = "memory")]
        if let Some(local) = &self.local {
            for tier in rules.tiers.iter() {
                // The local limiter holds what the layer's policies allow: it cannot refuse them.
                let _ = local.reset_now(&tier.limits, key);
            }
        }
    }
}
