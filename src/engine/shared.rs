//! What every service of one layer shares ([`Shared`]: the backend, the policy [`Table`] in force,
//! the access lists), and the small steps both request paths take with it: the readied inner
//! service, the release of a concurrency slot.

use std::sync::{Arc, Mutex};

use crate::access::{AccessList, AddressSource};
use crate::backend::{Adjustment, Backend, Charges};
use crate::engine::in_force::InForce;
use crate::engine::settings::Settings;
use crate::engine::slot::{Release, SlotOwner};
use crate::engine::verdict::Judge;
use crate::key::Key;
use crate::overrides::cache::Overrides;
use crate::policy::CompiledPolicy;

/// What every service of one layer shares: the backend, the policy table, the access lists, and
/// what a reload builds the next table with.
pub(crate) struct Shared<K, B> {
    pub(crate) backend: B,
    /// The policies in force. A request reads the table once, in `call`, and uses that table (its
    /// policies, judge and reporters) to its end; a reload swaps in a new one atomically, so no
    /// request is decided by a half-applied table, and requests in flight keep the one they read.
    pub(crate) table: InForce<K>,
    pub(crate) access: Option<(AccessList, AddressSource)>,
    /// The layer's settings, for the judge of a reloaded table.
    pub(crate) settings: Settings,
    /// Reloads one at a time, so that each builds on the table it replaces.
    pub(crate) reloading: Mutex<()>,
    /// The overrides and timed bans in force (`overrides/`), kept in the backend's records or in
    /// the layer.
    pub(crate) overrides: Arc<Overrides>,
}

impl<K, B> Shared<K, B> {
    /// The `Debug` of a layer or a handle over these: its type name and the policies in force.
    pub(crate) fn debug_as(&self, f: &mut std::fmt::Formatter<'_>, name: &str) -> std::fmt::Result {
        let table = self.table.load_full();
        let names: Vec<&str> = table.policies.iter().map(|p| p.limit().name()).collect();
        f.debug_struct(name)
            .field("policies", &names)
            .finish_non_exhaustive()
    }
}

/// The release of a concurrency slot of tier `tier` of `policy`, for `key`: given back under the
/// policy (and judge) the request was admitted by, even if a reload has replaced them since.
pub(crate) fn releaser<K, B>(
    shared: &Arc<Shared<K, B>>,
    judge: &Arc<Judge>,
    policy: &Arc<CompiledPolicy>,
    tier: usize,
    key: Key,
) -> Release
where
    K: Send + Sync + 'static,
    B: Backend,
{
    let (shared, policy) = (shared.clone(), policy.clone());
    #[cfg(feature = "memory")]
    let judge = judge.clone();
    #[cfg(not(feature = "memory"))]
    let _ = judge;
    Box::new(move |owner| match owner {
        SlotOwner::Backend { lease } => {
            let limit = &policy.tiers()[tier].limits[0];
            let charge = Charges::one(limit, &key, policy.cost());
            shared.backend.adjust(charge, Adjustment::Release { lease });
        }
        #[cfg(feature = "memory")]
        SlotOwner::Local => judge.release_local(&policy, tier, &key),
    })
}
