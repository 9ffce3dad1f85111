//! [`Overrides`]: the overrides and timed bans in force in this process, as a snapshot the request
//! path reads without a lock, rebuilt from the records table by table when one changes.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;

use super::{bans_table, decode_until, ipv6, overrides_table, InForce, Override};
use crate::backend::{OnRecordsChange, Records, RecordsFuture};
use crate::backoff::Backoff;
use crate::error::BackendError;
use crate::key::Key;

/// At most this many patterns per policy and table (overrides, bans). A byte-string key finds its
/// pattern in one hash lookup per distinct pattern length, whatever their number; an address's
/// key is compared with each pattern of addresses, so their number bounds that scan.
pub const MAX_PATTERNS: usize = 10_000;

const REREAD: Backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));

pub(crate) struct Overrides {
    /// Whether any policy has one: the whole cost for a layer without any.
    any: AtomicBool,
    snapshot: ArcSwap<Snapshot>,
    store: Arc<dyn Records>,
    /// Installs one at a time, so that each builds on the snapshot it replaces; and, per table,
    /// the ticket of the read last put in force and its fields' fingerprint.
    installing: Mutex<HashMap<String, (u64, u64)>>,
    /// Each read of a table takes the next ticket before it is sent; its answer is put in force
    /// only if no later read's already is: two reads of a table may answer out of order (a change
    /// heard while this process's own write reads it back), and the older one may miss the change.
    tickets: AtomicU64,
    /// The policies in force and the names of their limits: which tables to read when any may
    /// have changed, and which cached decisions a change of a policy's makes stale.
    policies: Mutex<Vec<(String, Vec<String>)>>,
    /// The reads failed since the task reading every table again until it can began
    /// ([`Overrides::reread_until_read`]); 0 when no task is.
    failures: AtomicU64,
    /// The tables a heard change is being read for, each with whether another was heard meanwhile:
    /// a burst of changes is read once or twice by each process, not once per change.
    heard: Mutex<HashMap<String, bool>>,
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
        // The ban that ends last: an ended exact ban hides no pattern's ban still running.
        let until = self.bans.matching(key).max()?;
        until
            .duration_since(now)
            .ok()
            .filter(|rest| !rest.is_zero())
    }
}

/// The entries of one table: exact keys, patterns (longest first) and `*`; [`MAX_PATTERNS`] says
/// what matching a pattern costs.
#[derive(Clone)]
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
                        None => made
                            .text_prefixes
                            .push((ipv6::address_text(prefix), *value)),
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

    /// The entry that decides for `key`: its own, else the longest pattern it starts with, else `*`.
    fn find(&self, key: &Key) -> Option<T> {
        self.matching(key).next()
    }

    /// Every entry that matches `key`, in the order [`Self::find`] prefers them.
    // Lazy: `find` stops at the first, and an exact key renders nothing.
    fn matching<'m>(&'m self, key: &'m Key) -> impl Iterator<Item = T> + 'm {
        let bytes = key.bytes();
        let by_bytes = bytes.into_iter().flat_map(move |bytes| {
            let lengths = self.lengths.iter().filter(move |&&len| len <= bytes.len());
            lengths.filter_map(move |&len| self.byte_prefixes.get(&bytes[..len]).copied())
        });
        let texts = bytes.is_none() && !self.text_prefixes.is_empty();
        let by_text =
            texts
                .then(|| ipv6::pattern_text(key))
                .into_iter()
                .flat_map(move |rendered| {
                    let text = self.text_prefixes.iter();
                    text.filter(move |(p, _)| rendered.starts_with(p.as_str()))
                        .map(|(_, value)| *value)
                });
        let exact = self.exact.get(key).copied();
        exact
            .into_iter()
            .chain(by_bytes)
            .chain(by_text)
            .chain(self.all)
    }

    fn is_empty(&self) -> bool {
        self.listed.is_empty()
    }

    /// Whether `field` may be set: a pattern past [`MAX_PATTERNS`] may not, unless it replaces one.
    /// `counts`: whether a pattern's entry takes room (a ban that ended since the table was read
    /// does not).
    fn has_room(&self, field: &str, counts: impl Fn(&T) -> bool) -> bool {
        let bytes = self.byte_prefixes.values();
        let patterns = bytes.chain(self.text_prefixes.iter().map(|(_, value)| value));
        self.listed.contains_key(field) || patterns.filter(|v| counts(v)).count() < MAX_PATTERNS
    }

    fn listed(&self, keep: impl Fn(&T) -> bool) -> Vec<(String, T)> {
        let listed = self.listed.iter().filter(|(_, v)| keep(v));
        listed.map(|(f, v)| (f.clone(), *v)).collect()
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
            failures: AtomicU64::new(0),
            heard: Mutex::default(),
        }
    }

    /// The policies in force, with the names of their limits.
    pub(crate) fn know(&self, policies: Vec<(String, Vec<String>)>) {
        *self.policies.lock().unwrap_or_else(|p| p.into_inner()) = policies;
    }

    /// Keeps these overrides current: when the store hears that a table changed (in any process),
    /// reads it again on a spawned task; when it may have missed changes, reads every policy's.
    /// Also reads every policy's tables once now, when the store is shared and a runtime is there.
    pub(crate) fn listen(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        let on_change: OnRecordsChange = Arc::new(move |table: Option<&str>| {
            let Some(overrides) = weak.upgrade() else {
                return false;
            };
            let Ok(runtime) = tokio::runtime::Handle::try_current() else {
                return true;
            };
            if let Some(table) = table {
                let mut heard = overrides.heard.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(again) = heard.get_mut(table) {
                    *again = true;
                    return true;
                }
                heard.insert(table.to_owned(), false);
            }
            overrides.spawn_refresh(&runtime, table.map(str::to_owned));
            true
        });
        self.store.on_change(on_change);
        self.reread();
    }

    /// Reads every policy's tables again, on a spawned task, if the store is shared.
    pub(crate) fn reread(self: &Arc<Self>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.store.in_process() {
            return;
        }
        self.clone().spawn_refresh(&runtime, None);
    }

    /// On a task spawned on `runtime`: reads table `table` for a heard change
    /// ([`Overrides::refresh_heard`]), or every policy's tables for `None`; a failure starts
    /// [`Overrides::reread_until_read`].
    fn spawn_refresh(self: Arc<Self>, runtime: &tokio::runtime::Handle, table: Option<String>) {
        runtime.spawn(async move {
            let refreshed = match table {
                Some(table) => self.refresh_heard(&table).await,
                None => self.refresh_all().await,
            };
            if let Err(e) = refreshed {
                self.reread_until_read(e).await;
            }
        });
    }

    /// After a read failed with `error`: every table read again until a read succeeds, at the pace
    /// of [`REREAD`], by one task at a time. A change heard when the store came back is read while
    /// Redis may still be failing fast (its breaker not yet closed): given up, the tables would
    /// keep what Redis no longer holds, or miss what it does, until the next change.
    async fn reread_until_read(self: Arc<Self>, error: BackendError) {
        if self.failures.fetch_add(1, Ordering::AcqRel) > 0 {
            return; // The task already trying reads every table again after this failure too.
        }
        tracing::warn!(error = %error, "could not read the overrides and bans again; retrying until they are read");
        let weak = Arc::downgrade(&self);
        drop(self);
        let mut backoff = REREAD;
        loop {
            tokio::time::sleep(backoff.wait()).await;
            let Some(overrides) = weak.upgrade() else {
                return;
            };
            let failures = overrides.failures.load(Ordering::Acquire);
            match overrides.refresh_all().await {
                // Ended only if no read failed since this one began: a change that read missed
                // may be newer than what this one found.
                Ok(())
                    if (overrides.failures)
                        .compare_exchange(failures, 0, Ordering::AcqRel, Ordering::Acquire)
                        .is_ok() =>
                {
                    tracing::info!("read the overrides and bans again");
                    return;
                }
                Ok(()) => {}
                Err(e) => {
                    tracing::debug!(error = %e, "could not read the overrides and bans again")
                }
            }
        }
    }

    /// Reads table `table` again for a heard change, and again for as long as more are heard
    /// meanwhile (a read that began before a change may miss it).
    async fn refresh_heard(&self, table: &str) -> Result<(), BackendError> {
        loop {
            let read = self.refresh(table).await;
            let mut heard = self.heard.lock().unwrap_or_else(|p| p.into_inner());
            match heard.get_mut(table) {
                Some(again) if *again && read.is_ok() => *again = false,
                _ => {
                    heard.remove(table);
                    return read;
                }
            }
        }
    }

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

    /// Whether policy `policy`'s overrides (or bans) may take `field`: see [`Matcher::has_room`].
    pub(crate) fn has_room(&self, policy: &str, bans: bool, field: &str) -> bool {
        if !matches!(Field::of(field), Field::Prefix(_)) {
            return true;
        }
        let snapshot = self.snapshot.load();
        let now = SystemTime::now();
        snapshot.policies.get(policy).is_none_or(|e| match bans {
            true => e.bans.has_room(field, |until| *until > now),
            false => e.overrides.has_room(field, |_| true),
        })
    }

    /// Policy `policy`'s overrides, by field.
    pub(crate) fn overrides_of(&self, policy: &str) -> Vec<(String, Override)> {
        let snapshot = self.snapshot.load();
        let entries = snapshot.policies.get(policy);
        entries.map_or_else(Vec::new, |e| e.overrides.listed(|_| true))
    }

    /// Whether policy `policy` holds overrides or timed bans here (ended bans aside).
    pub(crate) fn holds(&self, policy: &str) -> bool {
        !self.overrides_of(policy).is_empty() || !self.bans_of(policy, SystemTime::now()).is_empty()
    }

    /// Policy `policy`'s timed bans that have not ended at `now`, by field.
    pub(crate) fn bans_of(&self, policy: &str, now: SystemTime) -> Vec<(String, SystemTime)> {
        let snapshot = self.snapshot.load();
        let entries = snapshot.policies.get(policy);
        entries.map_or_else(Vec::new, |e| e.bans.listed(|until| *until > now))
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
        // After new entries are in force: a decision cached under the old ones would otherwise
        // outlive them (a refusal under a quota just raised). A table read as it was (every table
        // is read again after a reload) drops nothing: the caches hold units Redis took.
        if self.install(table, ticket, &fields) {
            let policies = self.policies.lock().unwrap_or_else(|p| p.into_inner());
            if let Some((_, limits)) = policies.iter().find(|(name, _)| name == policy) {
                let limits: Vec<&str> = limits.iter().map(String::as_str).collect();
                self.store.forget_cached(&limits);
            }
        }
        if kind == "bans" {
            self.remove_ended(table, &fields).await;
        }
        Ok(())
    }

    /// Removes the bans among `fields` (table `table`) that ended over [`REMOVED_AFTER`] ago from
    /// the store, so that bans come and go without the table growing for good; a ban written
    /// again meanwhile is kept. A failure is only logged: they are removed at a later read.
    async fn remove_ended(&self, table: &str, fields: &[(String, String)]) {
        let now = SystemTime::now() - REMOVED_AFTER;
        let ended: Vec<(String, String)> = fields
            .iter()
            .filter(|(_, value)| decode_until(value).is_some_and(|until| until <= now))
            .cloned()
            .collect();
        if ended.is_empty() {
            return;
        }
        if let Err(error) = self.store.remove_unchanged(table, ended).await {
            tracing::debug!(table, %error, "ended bans not removed yet");
        }
    }

    /// Puts `fields`, read with `ticket`, in force as table `table`, unless a later read's are
    /// already; fields this version cannot read are left out (and logged). Whether the fields put
    /// in force differ from the last read's.
    fn install(&self, table: &str, ticket: u64, fields: &[(String, String)]) -> bool {
        let Some((kind, policy)) = table.split_once(':') else {
            return false;
        };
        // In any order (a store may list a table's fields in another order each time).
        let hasher: &std::hash::RandomState = &FINGERPRINT;
        let fingerprint = fields.iter().fold(0u64, |sum, field| {
            sum.wrapping_add(std::hash::BuildHasher::hash_one(hasher, field))
        });
        let mut installed = self.installing.lock().unwrap_or_else(|p| p.into_inner());
        let changed = match installed.get_mut(table) {
            Some((last, _)) if *last > ticket => return false,
            Some(last) => std::mem::replace(last, (ticket, fingerprint)).1 != fingerprint,
            // A first read that finds nothing finds what was in force before it: nothing.
            None => {
                installed.insert(table.to_owned(), (ticket, fingerprint));
                !fields.is_empty()
            }
        };
        // The same fields are in force already (a read every minute mostly finds them): neither
        // parsed nor warned about again.
        if !changed {
            return false;
        }
        let current = self.snapshot.load_full();
        let kept = current.policies.get(policy);
        fn parsed<T: Copy>(
            (policy, kind): (&str, &str),
            fields: &[(String, String)],
            decode: fn(&str) -> Option<T>,
        ) -> Matcher<T> {
            let mut parsed: Vec<(String, T)> = fields
                .iter()
                .filter_map(|(field, value)| match decode(value) {
                    Some(decoded) => Some((field.clone(), decoded)),
                    None => {
                        tracing::warn!(
                            policy,
                            field,
                            value,
                            "an {kind} entry this version cannot read: ignored"
                        );
                        None
                    }
                })
                .collect();
            // In one order in every process, which then keep the same patterns past the cap (a
            // table written past it by several at once; Redis' order is a hash's).
            parsed.sort_unstable_by(|a, b| a.0.cmp(&b.0));
            Matcher::of(&parsed)
        }
        let entries = if kind == "overrides" {
            Entries {
                overrides: parsed((policy, kind), fields, Override::decode),
                bans: kept.map(|e| e.bans.clone()).unwrap_or_default(),
            }
        } else {
            Entries {
                overrides: kept.map(|e| e.overrides.clone()).unwrap_or_default(),
                bans: parsed((policy, kind), fields, running_until),
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
        changed
    }
}

/// The hasher of a table's fingerprint: the same in every read of this process.
static FINGERPRINT: std::sync::LazyLock<std::hash::RandomState> =
    std::sync::LazyLock::new(std::hash::RandomState::new);

/// How long after its end a ban leaves the store: a process whose clock runs ahead of the
/// writer's by less does not remove a ban that the others still enforce.
const REMOVED_AFTER: Duration = Duration::from_secs(60);

/// The end of a timed ban still running: an ended one is left out of the bans in force, so that
/// it takes no room among the policy's patterns and keeps no policy on the extended path.
fn running_until(text: &str) -> Option<SystemTime> {
    decode_until(text).filter(|until| *until > SystemTime::now())
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

    fn remove_unchanged(&self, table: &str, fields: Vec<(String, String)>) -> RecordsFuture<()> {
        let mut tables = self.tables.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(kept) = tables.get_mut(table) {
            for (field, value) in fields {
                if kept.get(&field) == Some(&value) {
                    kept.remove(&field);
                }
            }
        }
        Box::pin(std::future::ready(Ok(())))
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
    use crate::overrides::encode_until;
    use crate::quota::Quota;

    fn field(f: &str, o: Override) -> (String, String) {
        (f.to_owned(), o.encode())
    }

    /// A ban's field: its end in whole milliseconds since the epoch, as the records keep it.
    fn ban(f: &str, until: SystemTime) -> (String, String) {
        let ms = until.duration_since(std::time::UNIX_EPOCH).unwrap();
        (f.to_owned(), ms.as_millis().to_string())
    }

    fn in_a_minute() -> SystemTime {
        SystemTime::now() + Duration::from_secs(60)
    }

    /// Installs `fields` as table `table` with the next ticket (the newest read).
    fn put(o: &Overrides, table: &str, fields: &[(String, String)]) {
        let ticket = o.tickets.fetch_add(1, Ordering::SeqCst);
        o.install(table, ticket, fields);
    }

    /// The override in force for `key` under `policy` at `now` (none under a ban).
    fn found_at(o: &Overrides, policy: &str, key: &Key, now: SystemTime) -> Option<Override> {
        match o.find(policy, key, now) {
            Some(InForce::Override(found)) => Some(found),
            _ => None,
        }
    }

    #[test]
    fn an_exact_key_wins_then_the_longest_pattern_then_every_key() {
        let o = Overrides::new(None);
        let q = |n| Override::Quota(Quota::per_minute(n));
        put(
            &o,
            "overrides:api",
            &[
                field("*", q(1)),
                field("premium_*", q(2)),
                field("premium_gold_*", q(3)),
                field("premium_gold_acme", Override::Unlimited),
                field("user%2042", Override::Blocked),
            ],
        );
        let now = SystemTime::now();
        let found = |key: &str| found_at(&o, "api", &Key::from(key), now);
        for (key, want) in [
            ("premium_gold_acme", Override::Unlimited),
            ("premium_gold_x", q(3)),
            ("premium_x", q(2)),
            ("free", q(1)),
            ("user 42", Override::Blocked),
        ] {
            assert_eq!(found(key), Some(want), "{key}");
        }
        assert_eq!(o.find("other", &Key::from("x"), now), None);
        assert!(o.touches("api") && !o.touches("other"));
        assert!(o.holds("api") && !o.holds("other"));
        assert_eq!(o.overrides_of("api").len(), 5);
        // An address's pattern matches its rendering.
        put(&o, "overrides:ip", &[field("!10.0.*", Override::Blocked)]);
        let ip = Key::from_ip([10, 0, 3, 4].into());
        assert!(o.find("ip", &ip, now).is_some());
        assert!(o
            .find("ip", &Key::from_ip([10, 1, 0, 1].into()), now)
            .is_none());
        // An IPv6 one by its whole groups, however written: they match their network.
        put(
            &o,
            "overrides:ip",
            &[field("!2001:0db8:0:*", Override::Blocked)],
        );
        let v6 = |text: &str| Key::from_ip(text.parse().unwrap());
        assert!(o.find("ip", &v6("2001:db8::7"), now).is_some());
        assert!(o.find("ip", &v6("2001:db8:1::7"), now).is_none());
        // A pattern cut inside an escape names no bytes: it is an address's, and a byte-string
        // key is never matched by its rendering ("user 42" renders as `user%2042`).
        put(&o, "overrides:cut", &[field("user%2*", Override::Blocked)]);
        assert_eq!(o.find("cut", &Key::from("user 42"), now), None);
        put(&o, "overrides:cut", &[]);
        put(&o, "overrides:api", &[]);
        put(&o, "overrides:ip", &[]);
        assert!(!o.touches("api") && !o.any.load(Ordering::Relaxed));
    }

    /// Bans that have ended take no room and keep no policy touched.
    #[test]
    fn ended_bans_are_left_out() {
        let o = Overrides::new(None);
        let ended = SystemTime::now() - Duration::from_secs(1);
        let mut fields = vec![ban("mallory", ended)];
        fields.extend((0..MAX_PATTERNS).map(|i| ban(&format!("p{i}_*"), ended)));
        put(&o, "bans:api", &fields);
        assert!(!o.touches("api") && !o.holds("api"));
        assert!(o.has_room("api", true, "more_*"));
        // Running when read, ended since: no room taken either. (A second for the table to be
        // built and read: a loaded machine's debug build takes a while for 10,000.)
        let soon = SystemTime::now() + Duration::from_secs(1);
        let fields: Vec<_> = (0..MAX_PATTERNS)
            .map(|i| ban(&format!("p{i}_*"), soon))
            .collect();
        put(&o, "bans:api", &fields);
        assert!(!o.has_room("api", true, "more_*"));
        std::thread::sleep(soon.duration_since(SystemTime::now()).unwrap_or_default());
        assert!(o.has_room("api", true, "more_*"));
        put(
            &o,
            "bans:api",
            &[ban("mallory", ended), ban("eve", in_a_minute())],
        );
        assert!(
            o.touches("api") && o.holds("api"),
            "a running ban alone holds the policy"
        );
        assert_eq!(o.bans_of("api", SystemTime::now()).len(), 1);
    }

    #[test]
    fn patterns_are_bounded_and_found_by_the_keys_own_prefixes() {
        let o = Overrides::new(None);
        // Two too many (a pattern of addresses, compared by rendering, counts too): the last two
        // in the fields' order are left out (`p99_*` and `p9_*`), in every process alike.
        let mut fields = vec![
            field("p1_long_*", Override::Unlimited),
            field("!10.0.*", Override::Blocked),
        ];
        fields.extend((0..MAX_PATTERNS).map(|i| field(&format!("p{i}_*"), Override::Blocked)));
        fields.reverse(); // another process reads them in another order
        put(&o, "overrides:api", &fields);
        let entries = o.snapshot.load().policies["api"].clone();
        assert_eq!(entries.overrides.patterns(), MAX_PATTERNS);
        assert!(!o.has_room("api", false, "more_*"));
        assert!(o.has_room("api", false, "p7_*") && o.has_room("api", false, "k"));
        assert!(o.has_room("api", true, "more_*"));
        let now = SystemTime::now();
        let found = |key: &str| found_at(&o, "api", &Key::from(key), now);
        for (key, want) in [
            ("p7_x".to_owned(), Some(Override::Blocked)),
            // The longest pattern a key starts with.
            ("p1_long_x".to_owned(), Some(Override::Unlimited)),
            ("p1_lon".to_owned(), Some(Override::Blocked)),
            (format!("p{}_x", MAX_PATTERNS - 1), Some(Override::Blocked)),
            ("p999_x".to_owned(), Some(Override::Blocked)),
            ("p99_x".to_owned(), None),
            ("p9_x".to_owned(), None),
            ("q7_x".to_owned(), None),
            ("p".to_owned(), None),
        ] {
            assert_eq!(found(&key), want, "{key}");
        }
        let address = Key::from_ip([10, 0, 3, 4].into());
        assert_eq!(found_at(&o, "api", &address, now), Some(Override::Blocked));
    }

    #[test]
    fn an_older_read_answering_late_does_not_replace_a_newer_one() {
        let o = Overrides::new(None);
        let (older, newer) = (7, 8);
        o.install("overrides:api", newer, &[field("bob", Override::Blocked)]);
        o.install("overrides:api", older, &[]);
        assert_eq!(o.overrides_of("api").len(), 1);
        o.install("overrides:api", 9, &[]);
        assert!(o.overrides_of("api").is_empty());
    }

    /// What a read changes (and so which cached decisions it drops): a first read that finds
    /// nothing changes nothing (no override was in force before it either); the same table read
    /// again, nothing; a new entry or one gone, something.
    #[test]
    fn a_read_changes_something_only_if_its_entries_do() {
        let o = Overrides::new(None);
        assert!(!o.install("overrides:api", 1, &[]));
        assert!(!o.install("overrides:api", 2, &[]));
        let bob = [field("bob", Override::Blocked)];
        assert!(o.install("overrides:api", 3, &bob));
        assert!(!o.install("overrides:api", 4, &bob));
        assert!(o.install("overrides:api", 5, &[]));
        assert!(o.install("bans:web", 6, &[ban("eve", in_a_minute())]));
    }

    #[test]
    fn a_ban_ends_at_its_end_comes_before_an_override_and_both_shows_them_apart() {
        let o = Overrides::new(None);
        let until = decode_until(&encode_until(in_a_minute())).unwrap();
        // Bob has an override and a ban, Eve only a ban; the bans are installed after the
        // overrides, and keep them.
        put(&o, "overrides:api", &[field("bob", Override::Unlimited)]);
        put(&o, "bans:api", &[ban("bob", until), ban("eve", until)]);
        let (bob, eve, ann) = (Key::from("bob"), Key::from("eve"), Key::from("ann"));
        let just_before = until - Duration::from_millis(1);
        let (one_ms, unlimited) = (Some(Duration::from_millis(1)), Some(Override::Unlimited));
        // Before its end a ban stands, over an override too.
        for key in [&bob, &eve] {
            assert_eq!(
                o.find("api", key, just_before),
                Some(InForce::Banned(Duration::from_millis(1))),
                "{key:?}"
            );
        }
        assert_eq!(
            o.bans_of("api", just_before),
            [("bob".to_owned(), until), ("eve".to_owned(), until)]
        );
        assert_eq!(o.overrides_of("api").len(), 1);
        // At its end it is over, for a request and in the listing alike: the override is back.
        assert_eq!(
            o.find("api", &bob, until),
            Some(InForce::Override(Override::Unlimited))
        );
        assert_eq!(o.find("api", &eve, until), None);
        assert!(o.bans_of("api", until).is_empty());
        for (policy, key, at, want) in [
            ("api", &bob, just_before, (unlimited, one_ms)),
            ("api", &bob, until, (unlimited, None)),
            ("api", &eve, just_before, (None, one_ms)),
            ("api", &eve, until, (None, None)),
            ("api", &ann, just_before, (None, None)),
            ("web", &eve, just_before, (None, None)),
        ] {
            assert_eq!(o.both(policy, key, at), want, "{policy} {key:?} {at:?}");
        }
        assert!(o.touches("api"));
    }

    /// An exact key's ban that has ended, or ends first, hides no pattern's or `*`'s ban: the key
    /// is banned until the last one ends.
    #[test]
    fn a_key_is_banned_until_its_last_ban_ends() {
        let o = Overrides::new(None);
        let now = decode_until(&encode_until(SystemTime::now())).unwrap();
        let (soon, later) = (
            now + Duration::from_secs(1),
            now + Duration::from_secs(3600),
        );
        let (mallory, ann) = (Key::from("mallory"), Key::from("ann"));
        for pattern in ["mall*", "*"] {
            put(&o, "bans:api", &[ban("mallory", soon), ban(pattern, later)]);
            for at in [now, soon, soon + Duration::from_secs(5)] {
                let rest = later.duration_since(at).unwrap();
                let want = Some(InForce::Banned(rest));
                assert_eq!(o.find("api", &mallory, at), want, "{pattern} {at:?}");
            }
            let banned = o.find("api", &ann, now).is_some();
            assert_eq!(banned, pattern == "*", "{pattern}");
        }
    }

    /// Records shared with other processes, as a test sees them: what was read, what was forgotten,
    /// and the listener the layer left. The next `failing` reads fail, and reads wait for `gate`
    /// while it is there, answering what the table held when they were sent.
    #[derive(Default)]
    struct Shared {
        tables: Mutex<HashMap<String, Vec<(String, String)>>>,
        reads: Mutex<Vec<String>>,
        forgotten: Mutex<Vec<Vec<String>>>,
        listener: Mutex<Option<OnRecordsChange>>,
        failing: std::sync::atomic::AtomicUsize,
        gate: Mutex<Option<Arc<tokio::sync::Semaphore>>>,
    }

    impl Shared {
        fn set(&self, table: &str, fields: Vec<(String, String)>) {
            self.tables.lock().unwrap().insert(table.into(), fields);
        }

        fn reads(&self) -> Vec<String> {
            std::mem::take(&mut *self.reads.lock().unwrap())
        }

        fn sorted_reads(&self) -> Vec<String> {
            let mut reads = self.reads();
            reads.sort();
            reads
        }

        fn forgotten(&self) -> Vec<Vec<String>> {
            std::mem::take(&mut *self.forgotten.lock().unwrap())
        }

        fn changed(&self, table: Option<&str>) -> bool {
            let listener = self.listener.lock().unwrap().clone().unwrap();
            listener(table)
        }
    }

    impl Records for Shared {
        fn write(&self, _: &str, _: &str, _: Option<&str>) -> RecordsFuture<()> {
            unreachable!("the cache only reads")
        }

        fn read(&self, table: &str) -> RecordsFuture<Vec<(String, String)>> {
            self.reads.lock().unwrap().push(table.into());
            let failed = (self.failing)
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
            let fields = self.tables.lock().unwrap().get(table).cloned();
            let gate = self.gate.lock().unwrap().clone();
            Box::pin(async move {
                if let Some(gate) = gate {
                    gate.acquire().await.unwrap().forget();
                }
                match failed {
                    true => Err(BackendError::new("Redis is unreachable")),
                    false => Ok(fields.unwrap_or_default()),
                }
            })
        }

        fn on_change(&self, on_change: OnRecordsChange) {
            *self.listener.lock().unwrap() = Some(on_change);
        }

        fn forget_cached(&self, limits: &[&str]) {
            let limits = limits.iter().map(|l| l.to_string()).collect();
            self.forgotten.lock().unwrap().push(limits);
        }
    }

    fn shared() -> (Arc<Shared>, Arc<Overrides>) {
        let shared = Arc::new(Shared::default());
        let overrides = Arc::new(Overrides::new(Some(shared.clone())));
        overrides.know(vec![
            ("api".into(), vec!["per_minute".into(), "burst".into()]),
            ("web".into(), vec!["pages".into()]),
        ]);
        (shared, overrides)
    }

    /// The override in force for `key` under policy `api` now.
    fn overridden(o: &Overrides, key: &str) -> Option<Override> {
        found_at(o, "api", &Key::from(key), SystemTime::now())
    }

    fn banned(overrides: &Overrides, policy: &str, key: &str) -> bool {
        matches!(
            overrides.find(policy, &Key::from(key), SystemTime::now()),
            Some(InForce::Banned(_))
        )
    }

    #[tokio::test]
    async fn a_refresh_reads_one_table_and_forgets_its_policys_cached_decisions() {
        let (shared, overrides) = shared();
        shared.set("overrides:api", vec![field("bob", Override::Blocked)]);
        shared.set("bans:api", vec![ban("eve", in_a_minute())]);
        let bob_blocked = || overridden(&overrides, "bob") == Some(Override::Blocked);
        overrides.refresh("overrides:api").await.unwrap();
        assert!(bob_blocked());
        assert!(!banned(&overrides, "api", "eve"));
        assert_eq!(shared.reads(), ["overrides:api"]);
        assert_eq!(shared.forgotten(), [["per_minute", "burst"]]);
        overrides.refresh("bans:api").await.unwrap();
        assert!(banned(&overrides, "api", "eve") && bob_blocked());
        assert_eq!(shared.forgotten(), [["per_minute", "burst"]]);
        assert_eq!(shared.reads(), ["bans:api"]);
        // A table of no kind the cache keeps: not read, nothing changed, nothing forgotten.
        for table in ["other:api", "api", ""] {
            overrides.refresh(table).await.unwrap();
        }
        assert!(shared.reads().is_empty());
        assert!(shared.forgotten().is_empty());
        assert!(banned(&overrides, "api", "eve") && bob_blocked());
        // A policy no longer in force: its table is read, no policy's decisions are forgotten.
        overrides.refresh("overrides:gone").await.unwrap();
        assert_eq!(shared.reads(), ["overrides:gone"]);
        assert!(shared.forgotten().is_empty());
    }

    #[tokio::test]
    async fn refresh_all_reads_both_tables_of_every_policy_it_knows() {
        let (shared, overrides) = shared();
        shared.set("overrides:api", vec![field("bob", Override::Unlimited)]);
        shared.set("bans:web", vec![ban("eve", in_a_minute())]);
        overrides.refresh_all().await.unwrap();
        assert_eq!(
            shared.sorted_reads(),
            ["bans:api", "bans:web", "overrides:api", "overrides:web"]
        );
        assert_eq!(overridden(&overrides, "bob"), Some(Override::Unlimited));
        assert!(banned(&overrides, "web", "eve"));
        // A reload that leaves only `web`: only its tables are read again.
        overrides.know(vec![("web".into(), vec!["pages".into()])]);
        overrides.refresh_all().await.unwrap();
        assert_eq!(shared.sorted_reads(), ["bans:web", "overrides:web"]);
    }

    async fn settle() {
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn a_listening_cache_reads_every_table_at_once_then_what_it_hears_changed() {
        let (shared, overrides) = shared();
        shared.set("overrides:api", vec![field("bob", Override::Blocked)]);
        overrides.listen();
        settle().await;
        assert_eq!(overridden(&overrides, "bob"), Some(Override::Blocked));
        assert_eq!(shared.reads().len(), 4);
        // One table changed (in another process): that one is read again.
        shared.set("overrides:api", vec![field("bob", Override::Unlimited)]);
        assert!(shared.changed(Some("overrides:api")));
        settle().await;
        assert_eq!(overridden(&overrides, "bob"), Some(Override::Unlimited));
        assert_eq!(shared.reads(), ["overrides:api"]);
        // A burst of changes to one table: read once, and once more for those heard meanwhile.
        for n in 0..100 {
            let quota = Override::Quota(Quota::per_second(n + 1));
            shared.set("overrides:api", vec![field("bob", quota)]);
            assert!(shared.changed(Some("overrides:api")));
        }
        settle().await;
        let last = Override::Quota(Quota::per_second(100));
        assert_eq!(overridden(&overrides, "bob"), Some(last));
        assert_eq!(shared.reads(), ["overrides:api"; 2]);
        // Any may have changed: every policy's tables are read again.
        shared.set("bans:web", vec![ban("eve", in_a_minute())]);
        assert!(shared.changed(None));
        settle().await;
        assert!(banned(&overrides, "web", "eve"));
        assert_eq!(shared.reads().len(), 4);
        // Heard where no runtime runs: still listening, nothing read.
        let heard = {
            let shared = shared.clone();
            std::thread::spawn(move || shared.changed(Some("overrides:api")))
                .join()
                .unwrap()
        };
        assert!(heard);
        settle().await;
        assert!(shared.reads().is_empty());
        // Once the layer is gone, the listener says so (and the backend drops it).
        drop(overrides);
        assert!(!shared.changed(Some("overrides:api")));
    }

    #[tokio::test]
    async fn the_layers_own_records_read_back_what_was_written_and_are_not_read_at_start() {
        let overrides = Arc::new(Overrides::new(None));
        overrides.know(vec![("api".into(), vec!["per_minute".into()])]);
        overrides.listen();
        let store = overrides.store().clone();
        assert!(store.in_process());
        let (blocked, unlimited) = (Override::Blocked.encode(), Override::Unlimited.encode());
        for (key, value) in [
            ("bob", Some(&blocked)),
            ("ann", Some(&unlimited)),
            ("ann", None),
        ] {
            store
                .write("overrides:api", key, value.map(String::as_str))
                .await
                .unwrap();
        }
        assert_eq!(
            store.read("overrides:api").await.unwrap(),
            [("bob".to_owned(), blocked)]
        );
        assert!(store.read("bans:api").await.unwrap().is_empty());
        // Not read at start, nor when a change is heard (this process made it): nothing is in
        // force until the writer puts it there (as the admin routes do).
        settle().await;
        assert_eq!(overridden(&overrides, "bob"), None);
        overrides.refresh("overrides:api").await.unwrap();
        assert_eq!(overridden(&overrides, "bob"), Some(Override::Blocked));
    }

    /// A read removes the ended bans from the store, but not a ban written again since.
    #[tokio::test]
    async fn ended_bans_are_removed_from_the_store() {
        let overrides = Overrides::new(None);
        let store = overrides.store().clone();
        let ended = encode_until(SystemTime::now() - REMOVED_AFTER - Duration::from_secs(1));
        // Ended, but less than REMOVED_AFTER ago: a clock a little ahead of the writer's would
        // see it ended while others still enforce it.
        let just_ended = encode_until(SystemTime::now() - Duration::from_secs(1));
        let running = encode_until(in_a_minute());
        let bans = [
            ("mallory", &ended),
            ("eve", &running),
            ("trent", &ended),
            ("oscar", &just_ended),
        ];
        for (key, until) in bans {
            store.write("bans:api", key, Some(until)).await.unwrap();
        }
        overrides.refresh("bans:api").await.unwrap();
        let mut kept = store.read("bans:api").await.unwrap();
        kept.sort();
        let want = [("eve", &running), ("oscar", &just_ended)];
        assert_eq!(kept, want.map(|(k, v)| (k.to_owned(), v.clone())));
        // Banned again between the read and the removal: kept.
        store
            .write("bans:api", "mallory", Some(&running))
            .await
            .unwrap();
        let stale = vec![("mallory".to_owned(), ended)];
        store.remove_unchanged("bans:api", stale).await.unwrap();
        assert_eq!(store.read("bans:api").await.unwrap().len(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_read_is_tried_again_until_the_records_answer() {
        let (shared, overrides) = shared();
        shared.failing.store(5, Ordering::SeqCst);
        shared.set("overrides:api", vec![field("bob", Override::Blocked)]);
        // Read at start (fails), then every table again after 100, 200, 400 and 800 ms (the
        // first table's read fails each time but the last); a change heard meanwhile fails too,
        // and starts no second task.
        overrides.listen();
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert!(shared.changed(None));
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(shared.reads().len(), 2);
        assert_eq!(overridden(&overrides, "bob"), None);
        for wait in [100, 200, 400] {
            tokio::time::sleep(Duration::from_millis(wait)).await;
            assert_eq!(overridden(&overrides, "bob"), None, "{wait} ms later");
        }
        assert_eq!(shared.reads().len(), 3);
        tokio::time::sleep(Duration::from_millis(800)).await;
        assert_eq!(overridden(&overrides, "bob"), Some(Override::Blocked));
        // Read: the task has ended, and the next failure starts one again.
        shared.reads();
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(shared.reads().is_empty());
        assert_eq!(overrides.failures.load(Ordering::SeqCst), 0);
        // Gone with its layer: a listener told later says so.
        drop(overrides);
        assert!(!shared.changed(None));
    }

    #[tokio::test(start_paused = true)]
    async fn a_read_failing_while_the_retry_reads_is_tried_again() {
        let (shared, overrides) = shared();
        shared.failing.store(1, Ordering::SeqCst);
        overrides.listen(); // The first read fails: a task tries again in 100 ms.
        tokio::time::sleep(Duration::from_millis(1)).await;
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        *shared.gate.lock().unwrap() = Some(gate.clone());
        tokio::time::sleep(Duration::from_millis(100)).await;
        // The task's read is sent (and finds no override); then bob is blocked and a read of the
        // change fails, before the task's read answers.
        shared.set("overrides:api", vec![field("bob", Override::Blocked)]);
        let unreachable = BackendError::new("Redis is unreachable");
        overrides.clone().reread_until_read(unreachable).await;
        *shared.gate.lock().unwrap() = None;
        gate.add_permits(2);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(overridden(&overrides, "bob"), Some(Override::Blocked));
        assert_eq!(overrides.failures.load(Ordering::SeqCst), 0);
    }
}
