//! What every service of one layer shares ([`Shared`], with the policy table in force,
//! [`InForce`]), and the release of a concurrency slot under the policy that admitted it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use arc_swap::{ArcSwap, Guard};

use crate::access::{AccessList, AddressSource};
use crate::backend::{Adjustment, Backend, Charges, Uses};
use crate::engine::settings::Settings;
use crate::engine::slot::{Release, SlotOwner};
use crate::engine::table::Table;
use crate::engine::verdict::Judge;
use crate::error::BuildError;
use crate::key::Key;
use crate::limit::Limit;
use crate::overrides::cache::Overrides;
use crate::overrides::Override;
use crate::policy::extras::PolicyExtras;
use crate::policy::CompiledTier;

/// What every service of one layer shares, and what a reload builds the next table with.
pub(crate) struct Shared<K, B> {
    pub(crate) backend: B,
    /// Read once per request, in `call`, and used to its end (see [`InForce`]).
    pub(crate) table: InForce<K>,
    pub(crate) access: Option<(AccessList, AddressSource)>,
    /// The layer's settings, for the judge of a reloaded table.
    pub(crate) settings: Settings,
    /// Reloads one at a time, so that each builds on the table it replaces.
    pub(crate) reloading: Mutex<()>,
    /// The overrides and timed bans in force, kept in the backend's records or in the layer.
    pub(crate) overrides: Arc<Overrides>,
}

impl<K, B> Shared<K, B> {
    /// The `Debug` of a layer or a handle over these.
    pub(crate) fn debug_as(&self, f: &mut std::fmt::Formatter<'_>, name: &str) -> std::fmt::Result {
        let table = self.table.load_full();
        let names: Vec<&str> = table.policies.iter().map(|p| p.limit().name()).collect();
        f.debug_struct(name)
            .field("policies", &names)
            .finish_non_exhaustive()
    }

    /// Whether the backend can take `limit` alone: the check a customer's or an override's quota
    /// passes.
    pub(crate) fn validate_one(&self, limit: &Limit) -> Result<(), BuildError>
    where
        B: Backend,
    {
        self.backend
            .validate(std::slice::from_ref(limit), Uses::NOTHING_MORE)
    }

    /// The tier a key's override `under` gives it in `extras`' policy: an override's quota, if the
    /// policy and the backend take it (else the key keeps the policy's own quota).
    pub(crate) fn override_tier(
        &self,
        extras: &PolicyExtras,
        under: Option<Override>,
        cost: u64,
    ) -> Option<Arc<CompiledTier>>
    where
        B: Backend,
    {
        match under {
            Some(Override::Quota(quota)) => {
                extras.override_tier(quota, cost, |l| self.validate_one(l))
            }
            _ => None,
        }
    }
}

/// The release of `key`'s concurrency slot of `limit` (the one charged: a tier's, a customer's or
/// an override's), under the judge that admitted the request, even if a reload has replaced it.
pub(crate) fn releaser<K, B>(
    shared: &Arc<Shared<K, B>>,
    judge: &Arc<Judge>,
    limit: &Limit,
    cost: u64,
    key: Key,
) -> Release
where
    K: Send + Sync + 'static,
    B: Backend,
{
    let (shared, limit) = (shared.clone(), limit.clone());
    #[cfg(feature = "memory")]
    let judge = judge.clone();
    #[cfg(not(feature = "memory"))]
    let _ = judge;
    Box::new(move |owner| match owner {
        SlotOwner::Backend { lease } => {
            let charge = Charges::one(&limit, &key, cost);
            shared.backend.adjust(charge, Adjustment::Release { lease });
        }
        #[cfg(feature = "memory")]
        SlotOwner::Local { lease } => judge.fallback.release(&limit, &key, cost, lease),
    })
}

/// A table a request loaded (after a reload), held by the request until it ends.
pub(crate) type Loaded<K> = Guard<Arc<Table<K>>>;

/// The policy table in force.
///
/// A reload swaps the whole table at once (an [`ArcSwap`]), so no request is decided by a
/// half-applied table, and a request keeps the table it read to its end. Most layers are never
/// reloaded, and their requests read the first table, kept here, with no load at all: a load of an
/// `ArcSwap` takes a slot of the calling thread's (about 45 instructions a request). The first
/// table stays here until the layer goes: requests still deciding by it may hold it by reference.
pub(crate) struct InForce<K> {
    first: Arc<Table<K>>,
    /// Set (after `current` holds the new table) by the first reload.
    replaced: AtomicBool,
    current: ArcSwap<Table<K>>,
}

impl<K> InForce<K> {
    pub(crate) fn new(table: Table<K>) -> Self {
        let first = Arc::new(table);
        InForce {
            current: ArcSwap::new(first.clone()),
            first,
            replaced: AtomicBool::new(false),
        }
    }

    /// The first table, or after a reload the one loaded into `loaded`.
    #[inline(always)]
    pub(crate) fn read<'a>(&'a self, loaded: &'a mut Option<Loaded<K>>) -> &'a Arc<Table<K>> {
        // Acquire: a request that sees the flag sees the table stored before it. One that does
        // not was concurrent with the reload, and is decided by the table it replaced, as a
        // request that loaded just before the swap is.
        if self.replaced.load(Ordering::Acquire) {
            loaded.insert(self.current.load())
        } else {
            &self.first
        }
    }

    /// The table in force, to keep.
    pub(crate) fn load_full(&self) -> Arc<Table<K>> {
        self.current.load_full()
    }

    /// Puts `table` in force: the requests that read the table after this returns decide by it.
    pub(crate) fn store(&self, table: Table<K>) {
        self.current.store(Arc::new(table));
        self.replaced.store(true, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::MemoryBackend;
    use crate::key::PeerIp;
    use crate::policy::Policy;
    use crate::quota::Quota;

    fn table(per_second: u64) -> Table<PeerIp> {
        let policy = Policy::builder(format!("p{per_second}"))
            .key(PeerIp::new())
            .quota(Quota::per_second(per_second))
            .build()
            .unwrap();
        Table::build(
            &MemoryBackend::new(),
            vec![policy],
            Settings::default(),
            None,
        )
        .unwrap()
    }

    #[test]
    fn requests_read_the_first_table_until_a_reload_then_the_latest() {
        let in_force = InForce::new(table(1));
        let name = |t: &Arc<Table<PeerIp>>| t.policies[0].compiled().name().to_owned();
        let read = |in_force: &InForce<PeerIp>| name(in_force.read(&mut None));
        assert_eq!(read(&in_force), "p1");
        assert_eq!(name(&in_force.load_full()), "p1");
        in_force.store(table(2));
        assert_eq!(read(&in_force), "p2");
        in_force.store(table(3));
        assert_eq!(read(&in_force), "p3");
        assert_eq!(name(&in_force.load_full()), "p3");
    }
}
