//! Allow and deny lists: by client network and by key, set in configuration, changed at run time, and
//! (feature `redis`) shared through Redis sets by every process.

use std::collections::HashSet;
use std::fmt;
use std::net::IpAddr;
use std::sync::{Arc, RwLock};

use ipnet::IpNet;

// `net`: a network or an address, in canonical form (as trusted proxies are parsed).
use crate::key::{parse_net as net, ClientIp, InvalidCidr, Key, PeerIp};

/// What the lists say of a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// On an allow list: no limit applies.
    Allow,
    /// On a deny list (and no allow list): `403 Forbidden`.
    Deny,
    /// On no list: the policies decide.
    Limit,
}

/// Allow and deny lists of client networks and keys. Cheap to clone; clones share the lists, so a
/// handle kept by the application changes what a running layer does.
///
/// The allow lists win (as Rack::Attack's safelists do): an address or key on both is allowed.
/// Networks are matched against the client address (see [`ThrottleLayerBuilder::access_list`]), keys
/// against the key of the policy that matches the request.
///
/// [`ThrottleLayerBuilder::access_list`]: crate::ThrottleLayerBuilder::access_list
///
/// ```
/// use tower_throttle::ops::{Access, AccessList};
/// use tower_throttle::Key;
///
/// let lists = AccessList::new();
/// lists.allow_network("10.0.0.0/8").unwrap();
/// lists.deny_network("203.0.113.0/24").unwrap();
/// lists.deny_key("abuser-api-key");
/// assert_eq!(lists.check(Some("10.1.2.3".parse().unwrap()), None), Access::Allow);
/// assert_eq!(lists.check(Some("203.0.113.9".parse().unwrap()), None), Access::Deny);
/// assert_eq!(lists.check(None, Some(&Key::from("abuser-api-key"))), Access::Deny);
/// lists.remove_key("abuser-api-key");
/// assert_eq!(lists.check(None, Some(&Key::from("abuser-api-key"))), Access::Limit);
/// ```
#[derive(Clone, Default)]
pub struct AccessList {
    inner: Arc<RwLock<Lists>>,
}

#[derive(Default)]
struct Lists {
    /// Set in code or configuration.
    local: Entries,
    /// Mirrored from Redis sets, replaced whole at each refresh.
    remote: Entries,
}

/// The allow list ([`ALLOW`]) and the deny list ([`DENY`]).
#[derive(Default, Clone)]
pub(crate) struct Entries([List; 2]);

const ALLOW: usize = 0;
const DENY: usize = 1;

#[derive(Default, Clone)]
pub(crate) struct List {
    nets: Vec<IpNet>,
    keys: HashSet<Key>,
}

impl Entries {
    fn is_empty(&self) -> bool {
        self.0
            .iter()
            .all(|l| l.nets.is_empty() && l.keys.is_empty())
    }
}

impl AccessList {
    /// Empty lists.
    pub fn new() -> Self {
        Self::default()
    }

    fn edit(&self, f: impl FnOnce(&mut Entries)) {
        let mut lists = self.inner.write().unwrap_or_else(|e| e.into_inner());
        f(&mut lists.local);
    }

    fn add_network(&self, list: usize, cidr: &str) -> Result<(), InvalidCidr> {
        let n = net(cidr)?;
        self.edit(|e| {
            if !e.0[list].nets.contains(&n) {
                e.0[list].nets.push(n);
            }
        });
        Ok(())
    }

    /// Allows a network (`"10.0.0.0/8"`) or an address.
    pub fn allow_network(&self, cidr: &str) -> Result<(), InvalidCidr> {
        self.add_network(ALLOW, cidr)
    }

    /// Denies a network or an address.
    pub fn deny_network(&self, cidr: &str) -> Result<(), InvalidCidr> {
        self.add_network(DENY, cidr)
    }

    /// Takes a network off both lists.
    pub fn remove_network(&self, cidr: &str) -> Result<(), InvalidCidr> {
        let n = net(cidr)?;
        self.edit(|e| e.0.iter_mut().for_each(|l| l.nets.retain(|x| *x != n)));
        Ok(())
    }

    /// Allows a key (a user id, an API key: what a policy's key extractor returns).
    pub fn allow_key(&self, key: impl Into<Key>) {
        let key = key.into();
        self.edit(|e| _ = e.0[ALLOW].keys.insert(key));
    }

    /// Denies a key.
    pub fn deny_key(&self, key: impl Into<Key>) {
        let key = key.into();
        self.edit(|e| _ = e.0[DENY].keys.insert(key));
    }

    /// Takes a key off both lists.
    pub fn remove_key(&self, key: impl Into<Key>) {
        let key = key.into();
        self.edit(|e| e.0.iter_mut().for_each(|l| _ = l.keys.remove(&key)));
    }

    /// What the lists say of a request from `ip` whose policy key is `key`.
    pub fn check(&self, ip: Option<IpAddr>, key: Option<&Key>) -> Access {
        let lists = self.inner.read().unwrap_or_else(|e| e.into_inner());
        let ip = ip.map(|ip| ip.to_canonical());
        let parts = [&lists.local, &lists.remote];
        let on = |list: usize| {
            parts.iter().map(|e| &e.0[list]).any(|l| {
                ip.is_some_and(|ip| l.nets.iter().any(|n| n.contains(&ip)))
                    || key.is_some_and(|k| l.keys.contains(k))
            })
        };
        if on(ALLOW) {
            Access::Allow
        } else if on(DENY) {
            Access::Deny
        } else {
            Access::Limit
        }
    }

    /// Whether every list is empty (the layer then skips the checks).
    pub fn is_empty(&self) -> bool {
        let lists = self.inner.read().unwrap_or_else(|e| e.into_inner());
        lists.local.is_empty() && lists.remote.is_empty()
    }

    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn set_remote(&self, remote: Entries) {
        let mut lists = self.inner.write().unwrap_or_else(|e| e.into_inner());
        lists.remote = remote;
    }
}

impl fmt::Debug for AccessList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let lists = self.inner.read().unwrap_or_else(|e| e.into_inner());
        let count = |e: &Entries| {
            let [allow, deny] = e.0.each_ref().map(|l| l.nets.len() + l.keys.len());
            (allow, deny)
        };
        f.debug_struct("AccessList")
            .field("local (allow, deny)", &count(&lists.local))
            .field("redis (allow, deny)", &count(&lists.remote))
            .finish()
    }
}

/// The keys a list entry names: the value itself and, for an IP address, also the address as an
/// `ip` / `client-ip` key and the key those extractors give it by default (an IPv6 address's /64).
#[cfg_attr(not(any(feature = "config", feature = "redis")), allow(dead_code))]
pub(crate) fn keys_named(value: &[u8]) -> Vec<Key> {
    let mut keys = vec![Key::from_bytes(value)];
    if let Some(ip) = std::str::from_utf8(value)
        .ok()
        .and_then(|s| s.trim().parse::<IpAddr>().ok())
    {
        keys.push(Key::from_ip(ip.to_canonical()));
        let grouped = PeerIp::new().key_for(ip);
        if !keys.contains(&grouped) {
            keys.push(grouped);
        }
    }
    keys
}

/// Where the layer finds the client address that network lists are matched against.
#[derive(Clone, Debug)]
pub(crate) enum AddressSource {
    Peer,
    Client(ClientIp),
}

impl AddressSource {
    pub(crate) fn address(
        &self,
        headers: &http::HeaderMap,
        extensions: &http::Extensions,
    ) -> Option<IpAddr> {
        let peer = PeerIp::peer(extensions)?;
        Some(match self {
            AddressSource::Peer => peer.to_canonical(),
            AddressSource::Client(client) => client.resolve(peer, headers),
        })
    }
}

#[cfg(feature = "redis")]
pub use self::redis_sync::RedisAccessSync;

#[cfg(feature = "redis")]
mod redis_sync {
    use std::collections::HashSet;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use redis::aio::ConnectionLike;

    use super::{net, AccessList, Entries, List};
    use crate::backend::redis::connection::RedisConnection;
    use crate::error::BackendError;

    /// Mirrors four Redis sets into an [`AccessList`], so that every process shares the lists an
    /// operator edits with `SADD` / `SREM`:
    ///
    /// | set (`prefix` = `throttle`) | members |
    /// |---|---|
    /// | `{throttle}:allow:net` | networks or addresses that bypass limits |
    /// | `{throttle}:deny:net` | networks or addresses answered 403 |
    /// | `{throttle}:allow:key` | keys (as the key extractor returns them: a user id, an API key) |
    /// | `{throttle}:deny:key` | keys answered 403 |
    ///
    /// The braces are part of the names: a hash tag, so that on a Cluster the four sets live in one
    /// slot and are read in one pipeline.
    ///
    /// A member that is not a network is skipped (and logged). The lists are read at start and every
    /// `every` after (default 1 s); while Redis cannot be read, the last lists stay in force.
    #[derive(Clone, Debug)]
    pub struct RedisAccessSync {
        prefix: String,
        every: Duration,
        /// The members skipped at the last read: each is logged once, when first read.
        skipped: Arc<Mutex<HashSet<String>>>,
    }

    impl RedisAccessSync {
        /// Sets named `{prefix}:allow:net` and so on (braces included), read every second.
        pub fn new(prefix: impl Into<String>) -> Self {
            RedisAccessSync {
                prefix: prefix.into(),
                every: Duration::from_secs(1),
                skipped: Arc::default(),
            }
        }

        /// How often to read the sets again (at least every 10 ms: a shorter period reads as 10 ms).
        pub fn every(mut self, every: Duration) -> Self {
            self.every = every.max(Duration::from_millis(10));
            self
        }

        /// Reads the sets once into `lists`.
        pub async fn refresh<C: ConnectionLike>(
            &self,
            conn: &mut C,
            lists: &AccessList,
        ) -> Result<(), BackendError> {
            let mut pipe = redis::pipe();
            for set in ["allow:net", "deny:net", "allow:key", "deny:key"] {
                pipe.cmd("SMEMBERS")
                    .arg(format!("{{{}}}:{set}", self.prefix));
            }
            type Members = Vec<Vec<u8>>;
            let (allow_nets, deny_nets, allow_keys, deny_keys): (
                Members,
                Members,
                Members,
                Members,
            ) = pipe
                .query_async(conn)
                .await
                .map_err(|e| BackendError::with_source("cannot read the access lists", e))?;
            let mut skipped = HashSet::new();
            let mut before = self.skipped.lock().unwrap_or_else(|e| e.into_inner());
            let mut nets = |members: Vec<Vec<u8>>| {
                let parsed = members
                    .iter()
                    .map(|m| String::from_utf8_lossy(m).into_owned());
                parsed
                    .filter_map(|text| match net(&text) {
                        Ok(net) => Some(net),
                        Err(e) => {
                            if !before.contains(&text) {
                                tracing::warn!(%e, "skipping an access-list entry");
                            }
                            skipped.insert(text);
                            None
                        }
                    })
                    .collect()
            };
            let (allow_nets, deny_nets) = (nets(allow_nets), nets(deny_nets));
            *before = skipped;
            let keys =
                |members: Vec<Vec<u8>>| members.iter().flat_map(|m| super::keys_named(m)).collect();
            lists.set_remote(Entries([
                List {
                    nets: allow_nets,
                    keys: keys(allow_keys),
                },
                List {
                    nets: deny_nets,
                    keys: keys(deny_keys),
                },
            ]));
            Ok(())
        }

        /// [`refresh`](Self::refresh), following a Redis Cluster's redirections (a resharding that
        /// moves the sets' slot) when `conn` is a Cluster connection.
        pub(crate) async fn read<C>(
            &self,
            conn: &mut C,
            lists: &AccessList,
        ) -> Result<(), BackendError>
        where
            C: ConnectionLike + 'static,
        {
            // The backend's own connection follows them itself; a Cluster's given as it is, not.
            let any: &mut dyn std::any::Any = conn;
            if let Some(cluster) = any.downcast_mut::<redis::cluster_async::ClusterConnection>() {
                let mut conn = RedisConnection::cluster_of(cluster.clone());
                return self.refresh(&mut conn, lists).await;
            }
            self.refresh(conn, lists).await
        }

        /// Reads the sets now, then keeps reading them in a tokio task until `lists` and every clone
        /// of it are dropped. The first read must succeed.
        pub async fn spawn<C>(self, mut conn: C, lists: &AccessList) -> Result<(), BackendError>
        where
            C: ConnectionLike + Send + 'static,
        {
            self.read(&mut conn, lists).await?;
            let weak = std::sync::Arc::downgrade(&lists.inner);
            tokio::spawn(async move {
                let mut failing = false;
                loop {
                    tokio::time::sleep(self.every).await;
                    let Some(inner) = weak.upgrade() else { return };
                    let lists = AccessList { inner };
                    match self.read(&mut conn, &lists).await {
                        Ok(()) => failing = false,
                        Err(e) if !failing => {
                            failing = true;
                            tracing::warn!(error = %e, "access lists not refreshed; the last ones stay in force");
                        }
                        Err(_) => {}
                    }
                }
            });
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allow_wins_and_networks_compare_canonically() {
        let lists = AccessList::new();
        lists.deny_network("10.0.0.0/8").unwrap();
        lists.allow_network("10.1.0.0/16").unwrap();
        let ip = |s: &str| Some(s.parse::<IpAddr>().unwrap());
        assert_eq!(lists.check(ip("10.1.2.3"), None), Access::Allow);
        assert_eq!(lists.check(ip("10.2.0.1"), None), Access::Deny);
        assert_eq!(lists.check(ip("::ffff:10.2.0.1"), None), Access::Deny);
        assert_eq!(lists.check(ip("192.0.2.1"), None), Access::Limit);
        lists.deny_network("::ffff:192.0.2.0/120").unwrap();
        assert_eq!(lists.check(ip("192.0.2.1"), None), Access::Deny);
        lists.remove_network("10.1.0.0/16").unwrap();
        assert_eq!(lists.check(ip("10.1.2.3"), None), Access::Deny);
        assert!(lists.deny_network("10.0.0.0/40").is_err());
    }

    #[test]
    fn an_address_entry_also_names_the_ip_key() {
        let keys = keys_named(b"::ffff:10.0.0.1");
        assert_eq!(keys.len(), 2);
        assert!(keys.contains(&Key::from_ip("10.0.0.1".parse().unwrap())));
        assert_eq!(keys_named(b"user-42"), [Key::from("user-42")]);
        // An IPv6 address also names its /64, the key `ip` and `client-ip` give it by default.
        let client = "2001:db8::1".parse().unwrap();
        assert!(keys_named(b"2001:db8::1").contains(&PeerIp::new().key_for(client)));
    }

    #[test]
    fn keys_and_the_remote_part() {
        let lists = AccessList::new();
        assert!(lists.is_empty());
        lists.allow_key("vip");
        let mut remote = Entries::default();
        remote.0[DENY].keys = [Key::from("bad"), Key::from("vip")].into_iter().collect();
        lists.set_remote(remote);
        assert_eq!(lists.check(None, Some(&Key::from("bad"))), Access::Deny);
        assert_eq!(lists.check(None, Some(&Key::from("vip"))), Access::Allow);
        lists.set_remote(Entries::default());
        assert_eq!(lists.check(None, Some(&Key::from("bad"))), Access::Limit);
    }
}
