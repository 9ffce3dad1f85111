//! Peek, reset and reload: what the layer's handle asks of the in-process state a [`Judge`] and a
//! [`CompiledPolicy`] keep (the penalty boxes, and the local limiter of `OnBackendError::Local`).

use std::time::Duration;

use crate::engine::verdict::Judge;
use crate::key::Key;
use crate::policy::CompiledPolicy;

impl Judge {
    /// Takes over the local limiter of `previous` (the judge of the table a reload replaces): it
    /// keeps its keys, as it keys them by limit name, as backends do. (The penalty boxes carry
    /// over with their policies: [`CompiledPolicy::new`].)
    pub(crate) fn carry_over(&mut self, previous: &Judge) {
        self.fallback.carry_over(&previous.fallback);
    }

    /// The rest of `key`'s ban by the penalty box of `policy`, if the layer keeps one and the key
    /// is banned.
    pub(crate) fn ban_of(&self, policy: &CompiledPolicy, key: &Key) -> Option<Duration> {
        policy.penalty.as_ref()?.banned(key)
    }

    /// Forgets `key` under `policy` in the layer's state: its strikes and ban, and its state in the
    /// local limiter (every tier).
    pub(crate) fn forget(&self, policy: &CompiledPolicy, key: &Key) {
        if let Some(penalty) = &policy.penalty {
            penalty.forget(key);
        }
        let tiers = policy.tiers.iter().map(|tier| &tier.limits[..]);
        self.fallback.forget(tiers, key);
    }
}
