//! [`Overrides`]: the overrides and timed bans in force in this process, as a snapshot the request
//! path reads without a lock, rebuilt from the records table by table when one changes.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;

use super::{bans_table, decode_until, overrides_table, InForce, Override};
use crate::backend::{OnRecordsChange, Records, RecordsFuture};
use crate::error::BackendError;
use crate::key::Key;

/// At most this many patterns per policy and table (overrides, bans). A byte-string key finds its
/// pattern in one hash lookup per distinct pattern length, whatever their number; an address's
/// key is compared with each pattern of addresses, so their number bounds that scan.
pub const MAX_PATTERNS: usize = 10_000;

/// The overrides and timed bans of every policy, as this process knows them, and where they are
/// kept.
pub(crate) struct Overrides {
    /// Whether any policy has one: the whole cost for a layer without any.
    any: AtomicBool,
    snapshot: ArcSwap<Snapshot>,
    store: Arc<dyn Records>,
    /// Installs one at a time, so that each builds on the snapshot it replaces; and, per table,
    /// the ticket of the read last put in force.
    installing: Mutex<HashMap<String, u64>>,
    /// Each read of a table takes the next ticket before it is sent. A read's answer is put in
    /// force only if no later read's already is: two reads of one table may answer out of order
    /// (a change heard while this process's own write reads it back), and the older answer, which
    /// may miss the change, must not replace the newer.
    tickets: AtomicU64,
    /// The policies in force and the names of their limits: which tables to read when any may
    /// have changed, and which cached decisions a change of a policy's makes stale.
    policies: Mutex<Vec<(String, Vec<String>)>>,
}

#[derive(Default)]
struct Snapshot {
    policies: HashMap<Box<str>, Arc<Entries>>,
}

#[derive(Default)]
struct Entries {
    overrides: Matcher<Override>,
    bans: Matcher<SystemTime>,
}

impl Entries {
    /// How long `key`'s timed ban runs yet at `now`, if it has one.
    fn ban_of(&self, key: &Key, now: SystemTime) -> Option<Duration> {
        let until = self.bans.find(key)?;
        until
            .duration_since(now)
            .ok()
            .filter(|rest| !rest.is_zero())
    }
}

/// The entries of one table: exact keys, patterns and `*`. A byte-string key's patterns are
/// found by its own prefixes, one hash lookup per distinct pattern length (longest first), however
/// many patterns there are; an address's, by its rendering against each (few, in practice).
struct Matcher<T> {
    exact: HashMap<Key, T>,
    byte_prefixes: HashMap<Box<[u8]>, T>,
    /// The lengths of `byte_prefixes`, longest first, each once.
    lengths: Vec<usize>,
    text_prefixes: Vec<(String, T)>,
    all: Option<T>,
    /// Every entry as the records keep it, for listing.
    listed: BTreeMap<String, T>,
}

impl<T> Default for Matcher<T> {
    fn default() -> Self {
        Matcher {
            exact: HashMap::new(),
            byte_prefixes: HashMap::new(),
            lengths: Vec::new(),
            text_prefixes: Vec::new(),
            all: None,
            listed: BTreeMap::new(),
        }
    }
}

/// What a field of the records names.
pub(crate) enum Field<'a> {
    Exact(Key),
    Prefix(&'a str),
    All,
}

impl Field<'_> {
    /// The entry `field` names: `*`, a pattern `prefix*`, or a key as [`Key::render`] writes it.
    pub(crate) fn of(field: &str) -> Field<'_> {
        if field == "*" {
            return Field::All;
        }
        if let Some(prefix) = field.strip_suffix('*') {
            return Field::Prefix(prefix);
        }
        Field::Exact(Key::from_rendered(field).unwrap_or_else(|| Key::from(field)))
    }
}

impl<T: Copy> Matcher<T> {
    fn of(fields: &[(String, T)]) -> Matcher<T> {
        let mut made = Matcher::default();
        for (field, value) in fields {
            match Field::of(field) {
                Field::All => made.all = Some(*value),
                Field::Prefix(prefix) if made.patterns() < MAX_PATTERNS => {
                    // The bytes a byte-string key starts with, as the pattern renders them.
                    match Key::from_rendered(prefix).as_ref().and_then(Key::bytes) {
                        Some(bytes) => {
                            made.byte_prefixes.insert(bytes.into(), *value);
                        }
                        None => made.text_prefixes.push((prefix.to_owned(), *value)),
                    }
                }
                Field::Prefix(prefix) => {
                    tracing::warn!(
                        prefix,
                        "more than {MAX_PATTERNS} patterns: this one is ignored"
                    );
                    continue;
                }
                Field::Exact(key) => {
                    made.exact.insert(key, *value);
                }
            }
            made.listed.insert(field.clone(), *value);
        }
        made.lengths = made.byte_prefixes.keys().map(|p| p.len()).collect();
        made.lengths.sort_unstable_by(|a, b| b.cmp(a));
        made.lengths.dedup();
        made.text_prefixes
            .sort_by_key(|(p, _)| std::cmp::Reverse(p.len()));
        made
    }

    fn patterns(&self) -> usize {
        self.byte_prefixes.len() + self.text_prefixes.len()
    }

    fn find(&self, key: &Key) -> Option<T> {
        if let Some(value) = self.exact.get(key) {
            return Some(*value);
        }
        let by_pattern = match key.bytes() {
            Some(bytes) => self
                .lengths
                .iter()
                .filter(|&&len| len <= bytes.len())
                .find_map(|&len| self.byte_prefixes.get(&bytes[..len]).copied()),
            None if self.text_prefixes.is_empty() => None,
            None => {
                let rendered = key.to_string();
                let mut text = self.text_prefixes.iter();
                text.find(|(p, _)| rendered.starts_with(p.as_str()))
                    .map(|(_, value)| *value)
            }
        };
        by_pattern.or(self.all)
    }

    fn is_empty(&self) -> bool {
        self.listed.is_empty()
    }
}

impl Overrides {
    /// Kept in `store`: the backend's records, or (`None`) the layer's own.
    pub(crate) fn new(store: Option<Arc<dyn Records>>) -> Self {
        Overrides {
            any: AtomicBool::new(false),
            snapshot: ArcSwap::default(),
            store: store.unwrap_or_else(|| Arc::new(InProcess::default())),
            installing: Mutex::default(),
            tickets: AtomicU64::new(0),
            policies: Mutex::default(),
        }
    }

    /// The policies in force (at build and at each reload), with the names of their limits.
    pub(crate) fn know(&self, policies: Vec<(String, Vec<String>)>) {
        *self.policies.lock().unwrap_or_else(|p| p.into_inner()) = policies;
    }

    /// Keeps these overrides current: when the store hears that a table changed (in any process),
    /// reads it again; when it may have missed changes, reads every policy's. On a spawned task:
    /// the store tells from its listener. Also reads every policy's tables once now, when the
    /// store is shared and a runtime is there (the layer is being built in one).
    pub(crate) fn listen(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        let on_change: OnRecordsChange = Arc::new(move |table: Option<&str>| {
            let Some(overrides) = weak.upgrade() else {
                return false;
            };
            let Ok(runtime) = tokio::runtime::Handle::try_current() else {
                return true;
            };
            let table = table.map(str::to_owned);
            runtime.spawn(async move {
                let refreshed = match table {
                    Some(table) => overrides.refresh(&table).await,
                    None => overrides.refresh_all().await,
                };
                if let Err(e) = refreshed {
                    tracing::warn!(error = %e, "could not read the overrides and bans again");
                }
            });
            true
        });
        self.store.on_change(on_change);
        self.reread();
    }

    /// Reads every policy's tables again, on a spawned task, when the store is shared and a
    /// runtime is there.
    pub(crate) fn reread(self: &Arc<Self>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.store.in_process() {
            return;
        }
        let overrides = self.clone();
        runtime.spawn(async move {
            if let Err(e) = overrides.refresh_all().await {
                tracing::warn!(error = %e, "could not read the overrides and bans");
            }
        });
    }

    /// Reads every table of every policy in force again.
    pub(crate) async fn refresh_all(&self) -> Result<(), BackendError> {
        let names: Vec<String> = {
            let policies = self.policies.lock().unwrap_or_else(|p| p.into_inner());
            policies.iter().map(|(name, _)| name.clone()).collect()
        };
        for name in names {
            self.refresh(&overrides_table(&name)).await?;
            self.refresh(&bans_table(&name)).await?;
        }
        Ok(())
    }

    pub(crate) fn store(&self) -> &Arc<dyn Records> {
        &self.store
    }

    /// Whether policy `policy` has any override or timed ban.
    #[inline]
    pub(crate) fn touches(&self, policy: &str) -> bool {
        self.any.load(Ordering::Relaxed) && self.snapshot.load().policies.contains_key(policy)
    }

    /// What applies to `key` under policy `policy` at `now`: a timed ban still running, else an
    /// override.
    pub(crate) fn find(&self, policy: &str, key: &Key, now: SystemTime) -> Option<InForce> {
        if !self.any.load(Ordering::Relaxed) {
            return None;
        }
        let snapshot = self.snapshot.load();
        let entries = snapshot.policies.get(policy)?;
        match entries.ban_of(key, now) {
            Some(rest) => Some(InForce::Banned(rest)),
            None => entries.overrides.find(key).map(InForce::Override),
        }
    }

    /// The override of `key` under policy `policy`, and how long its timed ban runs yet (each
    /// apart, as a peek shows them).
    pub(crate) fn both(
        &self,
        policy: &str,
        key: &Key,
        now: SystemTime,
    ) -> (Option<Override>, Option<Duration>) {
        let snapshot = self.snapshot.load();
        match snapshot.policies.get(policy) {
            Some(entries) => (entries.overrides.find(key), entries.ban_of(key, now)),
            None => (None, None),
        }
    }

    /// Whether policy `policy`'s table of overrides (or of bans) may take `field`: a pattern past
    /// [`MAX_PATTERNS`] may not (the scan of a request's key is bounded), unless it replaces one.
    pub(crate) fn has_room(&self, policy: &str, bans: bool, field: &str) -> bool {
        if !matches!(Field::of(field), Field::Prefix(_)) {
            return true;
        }
        let snapshot = self.snapshot.load();
        let Some(entries) = snapshot.policies.get(policy) else {
            return true;
        };
        let (patterns, has) = match bans {
            true => (
                entries.bans.patterns(),
                entries.bans.listed.contains_key(field),
            ),
            false => (
                entries.overrides.patterns(),
                entries.overrides.listed.contains_key(field),
            ),
        };
        has || patterns < MAX_PATTERNS
    }

    /// Policy `policy`'s overrides, by field.
    pub(crate) fn overrides_of(&self, policy: &str) -> Vec<(String, Override)> {
        let snapshot = self.snapshot.load();
        let Some(entries) = snapshot.policies.get(policy) else {
            return Vec::new();
        };
        entries
            .overrides
            .listed
            .iter()
            .map(|(f, o)| (f.clone(), *o))
            .collect()
    }

    /// Policy `policy`'s timed bans that have not ended at `now`, by field.
    pub(crate) fn bans_of(&self, policy: &str, now: SystemTime) -> Vec<(String, SystemTime)> {
        let snapshot = self.snapshot.load();
        let Some(entries) = snapshot.policies.get(policy) else {
            return Vec::new();
        };
        entries
            .bans
            .listed
            .iter()
            .filter(|(_, until)| **until > now)
            .map(|(f, until)| (f.clone(), *until))
            .collect()
    }

    /// Reads table `table` from the store again and puts it in force. The policy's name is the
    /// table's after its kind (`overrides:` or `bans:`); another name is ignored.
    pub(crate) async fn refresh(&self, table: &str) -> Result<(), BackendError> {
        let Some((kind, policy)) = table.split_once(':') else {
            return Ok(());
        };
        if kind != "overrides" && kind != "bans" {
            return Ok(());
        }
        let ticket = self.tickets.fetch_add(1, Ordering::SeqCst);
        let fields = self.store.read(table).await?;
        self.install(table, ticket, &fields);
        // After the new entries are in force: a decision cached under the old ones would
        // otherwise outlive them (a refusal under a quota just raised).
        let policies = self.policies.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, limits)) = policies.iter().find(|(name, _)| name == policy) {
            let limits: Vec<&str> = limits.iter().map(String::as_str).collect();
            self.store.forget_cached(&limits);
        }
        Ok(())
    }

    /// Puts `fields`, read with `ticket`, in force as table `table` (`overrides:<policy>` or
    /// `bans:<policy>`), unless a later read's are already; fields this version cannot read are
    /// left out (and logged).
    fn install(&self, table: &str, ticket: u64, fields: &[(String, String)]) {
        let Some((kind, policy)) = table.split_once(':') else {
            return;
        };
        let mut installed = self.installing.lock().unwrap_or_else(|p| p.into_inner());
        match installed.get_mut(table) {
            Some(last) if *last > ticket => return,
            Some(last) => *last = ticket,
            None => {
                installed.insert(table.to_owned(), ticket);
            }
        }
        let current = self.snapshot.load_full();
        let kept = current.policies.get(policy);
        let unread = |field: &str, value: &str| {
            tracing::warn!(
                policy,
                field,
                value,
                "an {kind} entry this version cannot read: ignored"
            );
        };
        let entries = if kind == "overrides" {
            let parsed: Vec<(String, Override)> = fields
                .iter()
                .filter_map(|(f, v)| match Override::decode(v) {
                    Some(o) => Some((f.clone(), o)),
                    None => {
                        unread(f, v);
                        None
                    }
                })
                .collect();
            Entries {
                overrides: Matcher::of(&parsed),
                bans: kept.map(|e| e.bans.clone_all()).unwrap_or_default(),
            }
        } else {
            let parsed: Vec<(String, SystemTime)> = fields
                .iter()
                .filter_map(|(f, v)| match decode_until(v) {
                    Some(until) => Some((f.clone(), until)),
                    None => {
                        unread(f, v);
                        None
                    }
                })
                .collect();
            Entries {
                overrides: kept.map(|e| e.overrides.clone_all()).unwrap_or_default(),
                bans: Matcher::of(&parsed),
            }
        };
        let mut policies = current.policies.clone();
        if entries.overrides.is_empty() && entries.bans.is_empty() {
            policies.remove(policy);
        } else {
            policies.insert(policy.into(), Arc::new(entries));
        }
        self.any.store(!policies.is_empty(), Ordering::Relaxed);
        self.snapshot.store(Arc::new(Snapshot { policies }));
    }
}

impl<T: Copy> Matcher<T> {
    /// A copy, made again from its listing.
    fn clone_all(&self) -> Matcher<T> {
        let fields: Vec<(String, T)> = self.listed.iter().map(|(f, v)| (f.clone(), *v)).collect();
        Matcher::of(&fields)
    }
}

/// Records kept in the layer, for a backend that keeps none (memory): one process hears its own
/// changes, so nothing else is told.
#[derive(Default)]
struct InProcess {
    tables: Mutex<HashMap<String, BTreeMap<String, String>>>,
}

impl Records for InProcess {
    fn write(&self, table: &str, field: &str, value: Option<&str>) -> RecordsFuture<()> {
        let mut tables = self.tables.lock().unwrap_or_else(|p| p.into_inner());
        let fields = tables.entry(table.to_owned()).or_default();
        match value {
            Some(value) => fields.insert(field.to_owned(), value.to_owned()),
            None => fields.remove(field),
        };
        Box::pin(std::future::ready(Ok(())))
    }

    fn read(&self, table: &str) -> RecordsFuture<Vec<(String, String)>> {
        let tables = self.tables.lock().unwrap_or_else(|p| p.into_inner());
        let fields = tables
            .get(table)
            .map(|f| f.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default();
        Box::pin(std::future::ready(Ok(fields)))
    }

    fn on_change(&self, on_change: OnRecordsChange) {
        let _ = on_change;
    }

    fn in_process(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quota::Quota;

    fn field(f: &str, o: Override) -> (String, String) {
        (f.to_owned(), o.encode())
    }

    #[test]
    fn an_exact_key_wins_then_the_longest_pattern_then_every_key() {
        let overrides = Overrides::new(None);
        let q = |n| Override::Quota(Quota::per_minute(n));
        overrides.install(
            "overrides:api",
            overrides.tickets.fetch_add(1, Ordering::SeqCst),
            &[
                field("*", q(1)),
                field("premium_*", q(2)),
                field("premium_gold_*", q(3)),
                field("premium_gold_acme", Override::Unlimited),
                field("user%2042", Override::Blocked),
            ],
        );
        let now = SystemTime::now();
        let found = |key: &str| match overrides.find("api", &Key::from(key), now) {
            Some(InForce::Override(o)) => Some(o),
            _ => None,
        };
        assert_eq!(found("premium_gold_acme"), Some(Override::Unlimited));
        assert_eq!(found("premium_gold_x"), Some(q(3)));
        assert_eq!(found("premium_x"), Some(q(2)));
        assert_eq!(found("free"), Some(q(1)));
        assert_eq!(found("user 42"), Some(Override::Blocked));
        assert_eq!(overrides.find("other", &Key::from("x"), now), None);
        assert!(overrides.touches("api") && !overrides.touches("other"));
        assert_eq!(overrides.overrides_of("api").len(), 5);
        // An address's pattern matches its rendering.
        overrides.install(
            "overrides:ip",
            overrides.tickets.fetch_add(1, Ordering::SeqCst),
            &[field("!10.0.*", Override::Blocked)],
        );
        let ip = Key::from_ip([10, 0, 3, 4].into());
        assert!(overrides.find("ip", &ip, now).is_some());
        assert!(overrides
            .find("ip", &Key::from_ip([10, 1, 0, 1].into()), now)
            .is_none());
        // Emptied: gone.
        overrides.install(
            "overrides:api",
            overrides.tickets.fetch_add(1, Ordering::SeqCst),
            &[],
        );
        overrides.install(
            "overrides:ip",
            overrides.tickets.fetch_add(1, Ordering::SeqCst),
            &[],
        );
        assert!(!overrides.touches("api") && !overrides.any.load(Ordering::Relaxed));
    }

    #[test]
    fn patterns_are_bounded_and_found_by_the_keys_own_prefixes() {
        let overrides = Overrides::new(None);
        // One too many: the last is left out.
        let mut fields = vec![field("p1_long_*", Override::Unlimited)];
        fields.extend((0..MAX_PATTERNS).map(|i| field(&format!("p{i}_*"), Override::Blocked)));
        overrides.install(
            "overrides:api",
            overrides.tickets.fetch_add(1, Ordering::SeqCst),
            &fields,
        );
        let entries = overrides.snapshot.load().policies["api"].clone();
        assert_eq!(entries.overrides.patterns(), MAX_PATTERNS);
        assert!(!overrides.has_room("api", false, "more_*"));
        assert!(overrides.has_room("api", false, "p7_*") && overrides.has_room("api", false, "k"));
        assert!(overrides.has_room("api", true, "more_*"));
        let now = SystemTime::now();
        let found = |key: &str| match overrides.find("api", &Key::from(key), now) {
            Some(InForce::Override(o)) => Some(o),
            _ => None,
        };
        assert_eq!(found("p7_x"), Some(Override::Blocked));
        // The longest pattern a key starts with.
        assert_eq!(found("p1_long_x"), Some(Override::Unlimited));
        assert_eq!(found("p1_lon"), Some(Override::Blocked));
        assert_eq!(
            found(&format!("p{}_x", MAX_PATTERNS - 2)),
            Some(Override::Blocked)
        );
        assert_eq!(found(&format!("p{}_x", MAX_PATTERNS - 1)), None);
        assert_eq!(found("q7_x"), None);
        assert_eq!(found("p"), None);
    }

    #[test]
    fn an_older_read_answering_late_does_not_replace_a_newer_one() {
        let overrides = Overrides::new(None);
        let (older, newer) = (7, 8);
        overrides.install("overrides:api", newer, &[field("bob", Override::Blocked)]);
        overrides.install("overrides:api", older, &[]);
        assert_eq!(overrides.overrides_of("api").len(), 1);
        overrides.install("overrides:api", 9, &[]);
        assert!(overrides.overrides_of("api").is_empty());
    }

    #[test]
    fn a_ban_runs_until_its_end_and_comes_before_an_override() {
        let overrides = Overrides::new(None);
        let now = SystemTime::now();
        let until = now + Duration::from_secs(2);
        overrides.install(
            "overrides:api",
            overrides.tickets.fetch_add(1, Ordering::SeqCst),
            &[field("bob", Override::Unlimited)],
        );
        overrides.install(
            "bans:api",
            overrides.tickets.fetch_add(1, Ordering::SeqCst),
            &[("bob".into(), super::super::encode_until(until))],
        );
        let bob = Key::from("bob");
        match overrides.find("api", &bob, now) {
            Some(InForce::Banned(rest)) => assert!(rest <= Duration::from_secs(2)),
            other => panic!("{other:?}"),
        }
        let later = until + Duration::from_millis(1);
        assert_eq!(
            overrides.find("api", &bob, later),
            Some(InForce::Override(Override::Unlimited))
        );
        assert_eq!(overrides.bans_of("api", now).len(), 1);
        assert!(overrides.bans_of("api", later).is_empty());
        // Installing the bans kept the overrides, and the other way round.
        assert_eq!(overrides.overrides_of("api").len(), 1);
    }
}
