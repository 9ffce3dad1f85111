//! The configuration file's serde schema: the `[backend]`, `[access]` and `[[route]]` tables and
//! the helpers that parse their durations, keys and failure policies. What they build lives in
//! [`policies`](super::policies) and [`backend`](super::backend).

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Deserializer};

use crate::error::{redact_urls, BuildError};
use crate::failure::OnBackendError;
use crate::key::{BodyField, KeySpec};

/// The `[backend]` table.
// Parsed once per file: the size of the Redis variant costs nothing worth a `Box` in the API.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
#[non_exhaustive]
pub enum BackendConfig {
    /// `kind = "memory"`: the in-memory backend.
    #[non_exhaustive]
    Memory {
        /// The most live keys (default 1,000,000).
        max_keys: Option<usize>,
        /// A file the live keys are kept in across a restart: read when the layer is built,
        /// written by [`Config::save_state`](crate::config::Config::save_state) (the example server
        /// calls it on SIGTERM and SIGINT).
        state_file: Option<std::path::PathBuf>,
    },
    /// `kind = "redis"`: the Redis backend (feature `redis`).
    Redis(RedisConfig),
}

/// The `[backend]` table with `kind = "redis"`; every key is in the
/// [configuration reference](crate::guide::configuration#backend-with-kind--redis).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct RedisConfig {
    /// One server or Cluster seed: `redis://[user:password@]host:port/[db]` (TLS: `rediss://`).
    pub url: Option<String>,
    /// Seed nodes of a Cluster (implies `cluster = true`).
    pub urls: Option<Vec<String>>,
    /// `"auto"` (default), `"cell"` or `"lua"`.
    pub mode: Option<String>,
    /// The first part of every key (default `"throttle"`).
    pub prefix: Option<String>,
    /// The longest a decision may take, in milliseconds (default 100).
    pub timeout_ms: Option<u64>,
    /// `"allow"`, `"deny"` or `"local"` on a Redis failure (default: top-level `on_backend_error`).
    #[serde(deserialize_with = "some_on_backend_error")]
    pub on_error: Option<OnBackendError>,
    /// Whether `url` / `urls` name a Redis Cluster.
    pub cluster: bool,
    /// Reject keys that Redis limited locally until their retry time (default true).
    pub deny_cache: Option<bool>,
    /// Sentinel URLs: find the primary through them instead of `url` (needs `sentinel_service`).
    pub sentinels: Option<Vec<String>>,
    /// The name the sentinels monitor the primary under (`sentinel monitor <name> ...`).
    pub sentinel_service: Option<String>,
    /// With `sentinels`: the password of the primary and of its replicas, when one is promoted.
    pub primary_password: Option<String>,
    /// With `sentinels`: the ACL user to log in to the primary as (default: `default`).
    pub primary_username: Option<String>,
    /// Its `backend` label on `throttle_backend_up` in metrics (default: where it connects).
    pub name: Option<String>,
    /// `"lazy"` (default: connect in the background) or `"eager"` (fail at start if Redis is down).
    pub connect: Option<String>,
}

impl RedisConfig {
    /// A configuration for one server at `url`, everything else default.
    pub fn new(url: impl Into<String>) -> Self {
        RedisConfig {
            url: Some(url.into()),
            ..Default::default()
        }
    }

    /// The URLs to connect to, with the password hidden: for messages.
    pub fn describe(&self) -> String {
        let mode = self.mode.as_deref().unwrap_or("auto");
        if let Some(sentinels) = &self.sentinels {
            return format!(
                "redis sentinel {:?} via {} (mode {mode})",
                self.sentinel_service.as_deref().unwrap_or(""),
                redact_urls(sentinels)
            );
        }
        let urls = redact_urls(self.url.iter().chain(self.urls.iter().flatten()));
        let cluster = if self.cluster || self.urls.is_some() {
            "cluster "
        } else {
            ""
        };
        format!("redis {cluster}{urls} (mode {mode})")
    }
}

impl Default for BackendConfig {
    fn default() -> Self {
        BackendConfig::Memory {
            max_keys: None,
            state_file: None,
        }
    }
}

impl fmt::Display for BackendConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BackendConfig::Memory { max_keys, .. } => {
                write!(f, "memory (max_keys {})", max_keys.unwrap_or(1_000_000))
            }
            BackendConfig::Redis(redis) => f.write_str(&redis.describe()),
        }
    }
}

/// The `[access]` table: allow and deny lists. Networks are matched against the client IP (behind
/// `trusted_proxies` when there are any, else the peer), keys against the matching policy's key
/// ([reference](crate::guide::configuration#access)).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct AccessConfig {
    /// Networks or addresses that bypass every limit.
    pub allow_networks: Vec<String>,
    /// Networks or addresses answered `403 Forbidden`.
    pub deny_networks: Vec<String>,
    /// Keys that bypass every limit (an IP also matches `ip` and `client-ip` keys; IPv6: its /64).
    pub allow_keys: Vec<String>,
    /// Keys answered `403 Forbidden`.
    pub deny_keys: Vec<String>,
    /// Also mirror the Redis sets `{<this>}:allow:net`, `:deny:net`, `:allow:key`, `:deny:key`.
    pub redis_sets: Option<String>,
    /// How often the Redis sets are read again (default 1s).
    #[serde(deserialize_with = "some_duration")]
    pub redis_refresh: Option<Duration>,
}

/// One `[[route]]`: a policy. Each key's values and defaults are in the
/// [configuration reference](crate::guide::configuration#route).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct RouteConfig {
    /// The policy name: the namespace of its keys.
    pub name: String,
    /// The route, in axum path syntax; without it the policy applies to every path.
    pub path: Option<String>,
    /// Standard methods only (default: every method; `GET` also covers `HEAD`); a typo is an error.
    pub methods: Option<Vec<String>>,
    /// Non-standard methods the route also applies to, such as `["PROPFIND"]`.
    pub custom_methods: Option<Vec<String>>,
    /// Conditions a request must meet too, besides `path` and `methods` (see [`WhenConfig`]).
    pub when: Option<WhenConfig>,
    /// The key, such as `"ip"` or `"header:x-api-key"`; an array of keys is a composite key.
    #[serde(deserialize_with = "key_spec")]
    pub key: KeySpec,
    /// A key sent twice: `"refuse"` (default: the missing-key answer), `"first"` or `"last"`.
    pub on_duplicate: Option<String>,
    /// With `key = "ip"` or `"client-ip"`: group IPv6 clients by this prefix (default 64).
    pub ipv6_prefix: Option<u8>,
    /// With `key = "ip"` or `"client-ip"`: group IPv4 clients by this prefix (default 32).
    pub ipv4_prefix: Option<u8>,
    /// With a key or metered estimate from the body: the most bytes read for it (default 16384).
    pub max_body: Option<usize>,
    /// With a key or metered estimate from the body: how long it may take to arrive (default 2s).
    #[serde(default, deserialize_with = "some_duration")]
    pub body_timeout: Option<Duration>,
    /// `CL.THROTTLE`'s max_burst (the limit is max_burst + 1); default count - 1. GCRA only.
    pub max_burst: Option<u64>,
    /// Requests per period (in flight, for `"concurrency"`); required unless `quotas` is given.
    pub count: Option<u64>,
    /// The period, such as `"60s"` or `"1day"`; required with `count` (not for `"concurrency"`).
    #[serde(default, deserialize_with = "some_duration")]
    pub period: Option<Duration>,
    /// Stacked quotas instead of `count`/`period`/`max_burst`: a request must pass every one.
    pub quotas: Option<Vec<QuotaConfig>>,
    /// `"gcra"` (default), `"sliding-log"`, `"fixed-window"`, `"sliding-window"` or `"concurrency"`.
    pub algorithm: Option<String>,
    /// `"enforce"` (default), `"dry-run"`, `"delay"` (GCRA) or `"under-pressure"`.
    pub mode: Option<String>,
    /// With `mode = "delay"`: the longest a request waits, such as `"2s"`.
    #[serde(default, deserialize_with = "some_duration")]
    pub max_delay: Option<Duration>,
    /// With `"concurrency"` on Redis: how long a dead process's slot lives (default 60s).
    #[serde(default, deserialize_with = "some_duration")]
    pub lease: Option<Duration>,
    /// Quotas per plan (`[route.tiers.<name>]`), by a `Tier` request extension or `tier_header`.
    pub tiers: Option<std::collections::BTreeMap<String, TierConfig>>,
    /// The request header naming the tier: only one a trusted proxy sets and strips from clients.
    pub tier_header: Option<String>,
    /// Units each request costs (default 1).
    pub cost: Option<u64>,
    /// `"reject"` (400, the default) or `"allow"`: requests without a key.
    pub on_missing_key: Option<String>,
    /// Staged enforcement: the share of keys refusals are enforced for, `"10%"` (default `"100%"`).
    pub enforce: Option<String>,
    /// With `algorithm = "fixed-window"`: `"aligned"` (default, on the Unix epoch) or `"per-key"`.
    pub window_start: Option<String>,
    /// Calendar windows, `"day"`, `"week"` or `"month"` (implies `algorithm = "fixed-window"`).
    pub calendar: Option<String>,
    /// With `calendar`: the IANA time zone whose midnights cut the windows (default `"UTC"`).
    pub timezone: Option<String>,
    /// With `calendar = "month"`: the day each window starts on, 1 to 31 (default 1).
    pub anchor_day: Option<i64>,
    /// Up to this much added at random to each refusal's `Retry-After` (never shortened).
    #[serde(default, deserialize_with = "some_duration")]
    pub retry_after_jitter: Option<Duration>,
    /// From this share of a limit used (0.8: 80 %), admitted requests count as near the limit.
    pub near_limit: Option<f64>,
    /// With `near_limit`: name those limits to the handler in `x-ratelimit-near` (default false).
    pub near_limit_header: Option<bool>,
    /// `{ after, within, ban }`: a key limited `after` times within `within` is banned for `ban`.
    pub penalty: Option<PenaltyConfig>,
    /// Only responses with these statuses (100–599, or `"4xx"`) count; the others are given back.
    #[serde(default, deserialize_with = "some_statuses")]
    pub count_statuses: Option<Vec<String>>,
    /// Responses with these statuses are given back, such as `["5xx"]`.
    #[serde(default, deserialize_with = "some_statuses")]
    pub refund_statuses: Option<Vec<String>>,
    /// Sliced budgets for hot keys on Redis (GCRA, one quota; [`Budget`](crate::policy::Budget)).
    pub budget: Option<BudgetConfig>,
    /// A limit whose cost, such as tokens, is settled after the response ([`MeteredConfig`]).
    pub metered: Option<MeteredConfig>,
}

/// A metered limit's `estimate`: a number of units, or a field of the request body.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum EstimateConfig {
    /// `estimate = 1000`.
    Units(u64),
    /// `estimate = "json:max_tokens"`.
    Body(BodyField),
}

fn some_estimate<'de, D: Deserializer<'de>>(d: D) -> Result<Option<EstimateConfig>, D::Error> {
    #[derive(Deserialize)]
    #[serde(
        untagged,
        expecting = "a number of units, or a body field such as \"json:max_tokens\""
    )]
    enum Text {
        Units(u64),
        Field(String),
    }
    Ok(Some(match Text::deserialize(d)? {
        Text::Units(units) => EstimateConfig::Units(units),
        Text::Field(field) => {
            EstimateConfig::Body(field.parse().map_err(serde::de::Error::custom)?)
        }
    }))
}

/// A route's `metered` table: the limit whose cost is settled after the response
/// ([reference](crate::guide::configuration#metered----)).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct MeteredConfig {
    /// `"after-response"`, the only charge of a metered limit (optional; it says the intent).
    pub charge: Option<String>,
    /// What the limit counts, such as `"tokens"`, naming it `{route}.{unit}` (default `"units"`).
    pub unit: Option<String>,
    /// Units per period.
    pub count: u64,
    /// The period, such as `"1m"`.
    #[serde(deserialize_with = "duration")]
    pub period: Duration,
    /// `CL.THROTTLE`'s max_burst: one request may reserve max_burst + 1 (default count - 1).
    pub max_burst: Option<u64>,
    /// Units to reserve (if `estimate_header` is absent or not a number) or a body field; required.
    #[serde(default, deserialize_with = "some_estimate")]
    pub estimate: Option<EstimateConfig>,
    /// A request header holding the units to reserve, such as a client's `"x-max-tokens"`.
    pub estimate_header: Option<String>,
    /// A response header or trailer holding the units used; without it, the handler's `Meter` says.
    pub usage_header: Option<String>,
    /// How many units past its burst a settled cost may push a key (default `count`).
    pub max_debt: Option<u64>,
}

/// A route's `budget`: `true`/`false`, or a table of settings (each optional).
///
/// ```
/// use std::time::Duration;
/// use tower_throttle::config::Config;
///
/// let config = Config::from_toml(r#"
///     [[route]]
///     name = "api"
///     key = "header:x-api-key"
///     count = 10000
///     period = "1s"
///     budget = { slice_ttl = "100ms", max_slice = 200 }
///
///     [[route]]
///     name = "search"
///     key = "ip"
///     count = 500
///     period = "1s"
///     budget = true
/// "#).unwrap();
/// let policies = config.policies().unwrap();
/// let budget = policies[0].limits()[0].budget().unwrap();
/// assert_eq!(budget.slice_lifetime(), Duration::from_millis(100));
/// assert_eq!(budget.max_slice_units(), 200);
/// assert!(policies[1].limits()[0].budget().is_some());
///
/// // Refused: a stack cannot take a budget.
/// let stacked = Config::from_toml(r#"
///     [[route]]
///     name = "api"
///     key = "ip"
///     quotas = [{ count = 10, period = "1s" }, { count = 1000, period = "1d" }]
///     budget = true
/// "#).unwrap();
/// assert!(stacked.policies().is_err());
/// ```
#[derive(Clone, Debug, Deserialize)]
#[serde(
    untagged,
    expecting = "true, false, or a table such as { slice_ttl = \"250ms\" }"
)]
#[non_exhaustive]
pub enum BudgetConfig {
    /// `budget = true` (the defaults) or `false` (none).
    On(bool),
    /// `budget = { slice_ttl = "250ms", max_slice = 1000, hot_after = 8 }`.
    Tuned(BudgetTuning),
}

/// The settings of `budget = { .. }`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct BudgetTuning {
    /// How long unused units of a slice live, and the window of the local rate (default 250ms).
    /// `lease` is still read, for one release.
    #[serde(alias = "lease", deserialize_with = "some_duration")]
    pub slice_ttl: Option<Duration>,
    /// The largest slice, in units (default 1000).
    pub max_slice: Option<u64>,
    /// Decisions within a slice TTL that make a key hot (default 8).
    pub hot_after: Option<u32>,
}

/// `count_statuses` / `refund_statuses`: codes (`401`) and classes (`"4xx"`), as strings.
fn some_statuses<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<String>>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Status {
        Code(u64),
        Text(String),
    }
    let entries = Vec::<Status>::deserialize(d)?;
    Ok(Some(
        entries
            .into_iter()
            .map(|s| match s {
                Status::Code(code) => code.to_string(),
                Status::Text(text) => text,
            })
            .collect(),
    ))
}

/// One quota of a stack (`quotas = [...]`; [reference](crate::guide::configuration#quotas----)).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct QuotaConfig {
    /// GCRA only; default count - 1.
    pub max_burst: Option<u64>,
    /// Requests per period.
    pub count: u64,
    /// The period.
    #[serde(deserialize_with = "duration")]
    pub period: Duration,
    /// Counted, never enforced ([`PolicyBuilder::shadow`](crate::PolicyBuilder::shadow)).
    #[serde(default)]
    pub shadow: bool,
    /// Its own key, written as `key` is, an array for a composite key (default: the route's; see
    /// [`PolicyBuilder::quota_keyed`](crate::PolicyBuilder::quota_keyed)).
    #[serde(default, deserialize_with = "some_key_spec")]
    pub key: Option<KeySpec>,
}

/// A tier's quotas (`[route.tiers.<name>]`): `count`/`period`/`max_burst`, or `quotas`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct TierConfig {
    /// GCRA only; default count - 1.
    pub max_burst: Option<u64>,
    /// Requests per period.
    pub count: Option<u64>,
    /// The period.
    #[serde(deserialize_with = "some_duration")]
    pub period: Option<Duration>,
    /// Stacked quotas.
    pub quotas: Option<Vec<QuotaConfig>>,
}

/// A route's `when` table: conditions a request must meet for the route's policy to apply, all of
/// them (see [`Condition`](crate::policy::Condition)). A value is a string or an array of strings
/// (any of them); `"*"` alone means present, with any value.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct WhenConfig {
    /// Headers, by name: `{ "x-client" = "mobile" }`, `{ "x-client" = ["mobile", "tablet"] }`,
    /// `{ "x-beta" = "*" }`.
    #[serde(default, deserialize_with = "some_values_by_name")]
    pub header: Option<BTreeMap<String, Vec<String>>>,
    /// The host: `"api.example.com"`, `"*.example.com"` (every host under it), an IP address
    /// (`"[::1]"`), or an array of these.
    #[serde(default, deserialize_with = "some_values")]
    pub host: Option<Vec<String>>,
    /// Query parameters, by name, compared percent-decoded: `{ plan = "free" }`, `{ debug = "*" }`.
    #[serde(default, deserialize_with = "some_values_by_name")]
    pub query: Option<BTreeMap<String, Vec<String>>>,
}

/// A string or an array of strings.
#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl From<OneOrMany> for Vec<String> {
    fn from(values: OneOrMany) -> Self {
        match values {
            OneOrMany::One(one) => vec![one],
            OneOrMany::Many(many) => many,
        }
    }
}

fn some_values<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<String>>, D::Error> {
    OneOrMany::deserialize(d).map(|v| Some(v.into()))
}

fn some_values_by_name<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<BTreeMap<String, Vec<String>>>, D::Error> {
    let map = BTreeMap::<String, OneOrMany>::deserialize(d)?;
    Ok(Some(map.into_iter().map(|(k, v)| (k, v.into())).collect()))
}

/// A route's `penalty` table.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct PenaltyConfig {
    /// Rejections that earn a ban.
    pub after: u32,
    /// The window they must fall in.
    #[serde(deserialize_with = "duration")]
    pub within: Duration,
    /// The length of the ban.
    #[serde(deserialize_with = "duration")]
    pub ban: Duration,
}

/// `option(builder, value)` if the key is set; the builder's default otherwise.
pub(super) fn set<B, T>(builder: B, value: Option<T>, option: fn(B, T) -> B) -> B {
    match value {
        Some(value) => option(builder, value),
        None => builder,
    }
}

/// [`set`], for an option that may refuse the value (its error is the message).
pub(super) fn try_set<B, T, E>(
    builder: B,
    value: Option<T>,
    option: fn(B, T) -> Result<B, E>,
) -> Result<B, String>
where
    E: ToString,
{
    match value {
        Some(value) => option(builder, value).map_err(|e| e.to_string()),
        None => Ok(builder),
    }
}

/// `value` of setting `setting` as one of `choices`, by name (the first when unset), or an error
/// that lists them: `setting "x" is not "a", "b" or "c"`.
pub(super) fn one_of<T: Clone>(
    setting: &str,
    value: Option<&str>,
    choices: &[(&str, T)],
) -> Result<T, String> {
    let value = value.unwrap_or(choices[0].0);
    if let Some((_, chosen)) = choices.iter().find(|(name, _)| *name == value) {
        return Ok(chosen.clone());
    }
    let names: Vec<String> = choices
        .iter()
        .map(|(name, _)| format!("{name:?}"))
        .collect();
    let (last, first) = names.split_last().expect("a setting has choices");
    let first = first.join(", ");
    Err(format!("{setting} {value:?} is not {first} or {last}"))
}

/// `#[serde(default = "schema::yes")]`: a flag that is on unless set.
pub(super) fn yes() -> bool {
    true
}

pub(super) fn key_spec<'de, D: Deserializer<'de>>(d: D) -> Result<KeySpec, D::Error> {
    /// A key, or the parts of a composite key.
    #[derive(Deserialize)]
    #[serde(
        untagged,
        expecting = "a key such as \"ip\" or \"header:x-api-key\", or an array of keys"
    )]
    enum KeyText {
        One(String),
        Parts(Vec<String>),
    }
    let parse = |s: &str| s.parse::<KeySpec>().map_err(serde::de::Error::custom);
    match KeyText::deserialize(d)? {
        KeyText::One(s) => parse(&s),
        KeyText::Parts(parts) => {
            let parts = parts
                .iter()
                .map(|p| parse(p))
                .collect::<Result<Vec<_>, _>>()?;
            KeySpec::composite(parts).map_err(serde::de::Error::custom)
        }
    }
}

fn some_key_spec<'de, D: Deserializer<'de>>(d: D) -> Result<Option<KeySpec>, D::Error> {
    key_spec(d).map(Some)
}

pub(super) fn some_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    duration(d).map(Some)
}

pub(super) fn duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let s = String::deserialize(d)?;
    humantime::parse_duration(&s).map_err(|e| {
        serde::de::Error::custom(format!(
            "duration {s:?}: {e} (write e.g. \"60s\", \"1m\", \"500ms\")"
        ))
    })
}

pub(super) fn some_on_backend_error<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<OnBackendError>, D::Error> {
    let choices = [
        ("allow", OnBackendError::Allow),
        ("deny", OnBackendError::Deny),
        ("local", OnBackendError::Local),
    ];
    let value = String::deserialize(d)?;
    let choice = one_of("on_backend_error", Some(&value), &choices);
    choice.map(Some).map_err(serde::de::Error::custom)
}

/// The `[overload]` table: the layer's overload gate (see [`Overload`](crate::overload::Overload)).
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct OverloadConfig {
    /// `"gradient"` (default) or `"aimd"`.
    pub algorithm: Option<String>,
    /// The lowest the limit on requests in flight goes (default 4).
    pub min_limit: Option<u32>,
    /// The highest (default 1,000).
    pub max_limit: Option<u32>,
    /// The limit at start (default: ten times `min_limit`).
    pub initial_limit: Option<u32>,
    /// `"policy"` (default) or `"tier"`: what names a request's partition.
    pub partition_by: Option<String>,
    /// `503` (default) or `429`: the status of a shed request.
    pub status: Option<u16>,
    /// The partitions, highest priority first: `[{ name = "paid", share = 0.8 }, ...]`.
    #[serde(default)]
    pub partitions: Vec<PartitionConfig>,
}

/// One of `[overload]`'s `partitions`.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct PartitionConfig {
    /// The policy's or tier's name the partition counts.
    pub name: String,
    /// Its guaranteed share of the limit, above 0 and at most 1.
    pub share: f64,
}

impl OverloadConfig {
    /// The overload gate's options, validated.
    pub fn overload(&self) -> Result<crate::overload::Overload, BuildError> {
        use crate::overload::{Overload, PartitionBy};
        let invalid = |what: String| BuildError::Invalid(format!("[overload] {what}"));
        let algorithms = [
            ("gradient", Overload::gradient()),
            ("aimd", Overload::aimd()),
        ];
        let mut overload =
            one_of("algorithm", self.algorithm.as_deref(), &algorithms).map_err(invalid)?;
        let (min, max) = (overload.min, overload.max);
        overload = overload.limits(self.min_limit.unwrap_or(min), self.max_limit.unwrap_or(max));
        overload = set(overload, self.initial_limit, Overload::initial_limit);
        let by = [("policy", PartitionBy::Policy), ("tier", PartitionBy::Tier)];
        let by = one_of("partition_by", self.partition_by.as_deref(), &by).map_err(invalid)?;
        overload = overload.partition_by(by);
        if let Some(status) = self.status {
            let status = http::StatusCode::from_u16(status)
                .map_err(|_| invalid(format!("status {status} is not an HTTP status")))?;
            overload = overload.status(status);
        }
        for partition in &self.partitions {
            overload = overload.partition(partition.name.clone(), partition.share);
        }
        overload.validate()?;
        Ok(overload)
    }
}
