//! The `[[route]]` table mapped onto [`PolicyBuilder`], in one place: each row of
//! [`ROUTE_OPTIONS`] ties the TOML keys it reads to the builder options it sets and the function
//! that sets them. A new option is one field in [`RouteConfig`] and one row here.
//!
//! `tests/middleware/config_builder.rs` reads this table's text: it fails when a key of `[[route]]`
//! has no row, or a public builder option is named by no row and not on its allow-list. So keep
//! each row on one line, in the form `row(&[keys], &[options], how)`.

use http::{Method, StatusCode};

use super::policies::{bind_client_ip, quotas_of};
use super::schema::{one_of, set, try_set, QuotaConfig, RouteConfig, TierConfig};
use crate::error::BuildError;
use crate::key::{ClientIp, KeySpec, PeerIp};
use crate::limit::Algorithm;
use crate::outcome::StatusSet;
use crate::penalty::Penalty;
use crate::policy::{Condition, MissingKey, Policy, PolicyBuilder};
use crate::rollout::parse_percent;
use crate::window::{CalendarPeriod, CalendarWindow, WindowStart};

/// The builder every row works on.
pub(super) type Builder = PolicyBuilder<KeySpec>;

/// How a row sets its options: the route, the client-IP extractor that `client-ip` keys read
/// behind, and the builder so far. An error is the reason alone; the caller names the policy.
type Apply = fn(&RouteConfig, &ClientIp, Builder) -> Result<Builder, String>;

/// One row of [`ROUTE_OPTIONS`]: the `[[route]]` keys it reads (each in one row only), the builder
/// options it sets, and how. Only the test reads the first two, from this file's text.
const fn row(_keys: &[&str], _options: &[&str], apply: Apply) -> Apply {
    apply
}

/// Every `[[route]]` key, in the order they are applied (so the order in which errors are found).
#[rustfmt::skip]
pub(super) const ROUTE_OPTIONS: &[Apply] = &[
    // TOML keys                                    builder options                        how
    row(&["name"], &["Policy::builder"], |_, _, b| Ok(b)), // the builder starts from the name
    row(&["key", "on_duplicate", "ipv6_prefix", "ipv4_prefix"], &["key", "body_key"], key),
    row(&["max_body", "body_timeout"], &["max_body", "body_timeout"], |r, _, b| Ok(set(set(b, r.max_body, Builder::max_body), r.body_timeout, Builder::body_timeout))),
    row(&["algorithm"], &["algorithm", "Limit::with_algorithm"], |r, _, b| Ok(b.algorithm(algorithm(r)?))),
    row(&["count", "period", "max_burst", "quotas"], &["quotas", "shadow", "quota_keyed"], quotas),
    row(&["cost"], &["cost"], |r, _, b| Ok(b.cost(r.cost.unwrap_or(1)))),
    row(&["mode", "max_delay"], &["dry_run", "delay", "Limit::with_delay", "under_pressure_only"], mode),
    row(&["lease"], &["lease", "Limit::with_lease"], |r, _, b| Ok(set(b, r.lease, Builder::lease))),
    row(&["tiers"], &["tier"], tiers),
    row(&["tier_header"], &["tier_header"], |r, _, b| Ok(set(b, r.tier_header.clone(), Builder::tier_header))),
    row(&["path"], &["route"], |r, _, b| Ok(set(b, r.path.clone(), Builder::route))),
    row(&["methods"], &["methods"], |r, _, b| methods(b, r.methods.as_deref(), Builder::methods)),
    row(&["custom_methods"], &["custom_methods"], |r, _, b| methods(b, r.custom_methods.as_deref(), Builder::custom_methods)),
    row(&["when"], &["when"], when),
    row(&["budget"], &["budget", "Limit::with_budget"], |r, _, b| Ok(set(b, r.budget_settings(), Builder::budget))),
    row(&["penalty"], &["penalty", "Limit::with_penalty"], penalty),
    row(&["window_start"], &["window_start", "Limit::with_window_start"], window_start),
    row(&["calendar", "timezone", "anchor_day"], &["calendar", "Limit::with_calendar"], |r, _, b| Ok(set(b, calendar_of(r)?, Builder::calendar))),
    row(&["retry_after_jitter"], &["retry_after_jitter"], |r, _, b| Ok(set(b, r.retry_after_jitter, Builder::retry_after_jitter))),
    row(&["near_limit", "near_limit_header"], &["near_limit", "near_limit_header"], |r, _, b| Ok(set(set(b, r.near_limit, Builder::near_limit), r.near_limit_header, Builder::near_limit_header))),
    row(&["count_statuses"], &["count_only"], |r, _, b| Ok(set(b, statuses(r.count_statuses.as_deref(), "count_statuses")?, Builder::count_only))),
    row(&["refund_statuses"], &["refund_on"], |r, _, b| Ok(set(b, statuses(r.refund_statuses.as_deref(), "refund_statuses")?, Builder::refund_on))),
    row(&["on_missing_key"], &["on_missing_key"], on_missing_key),
    row(&["enforce"], &["enforce_fraction"], |r, _, b| Ok(set(b, r.enforce.as_deref().map(parse_percent).transpose()?, Builder::enforce_fraction))),
    row(&["metered"], &["metered", "usage_header", "Limit::with_max_debt"], |r, _, b| match &r.metered { Some(m) => m.apply(&r.name, b), None => Ok(b) }),
];

impl RouteConfig {
    /// The policy this route describes, `client-ip` keys read behind `client_ip`'s proxies.
    pub(super) fn policy_behind(
        &self,
        client_ip: &ClientIp,
    ) -> Result<Policy<KeySpec>, BuildError> {
        // `Global` until the `key` row sets the route's key.
        let mut builder = Policy::builder(self.name.clone()).key(KeySpec::Global);
        for apply in ROUTE_OPTIONS {
            builder = apply(self, client_ip, builder)
                .map_err(|why| BuildError::Invalid(format!("policy {:?}: {why}", self.name)))?;
        }
        builder.build()
    }
}

/// `when`'s headers, hosts and query parameters as [`Condition`]s; `"*"` alone means present.
fn when(route: &RouteConfig, _: &ClientIp, mut builder: Builder) -> Result<Builder, String> {
    let Some(when) = &route.when else {
        return Ok(builder);
    };
    let present = |values: &[String]| match values {
        [one] if one == "*" => Ok(true),
        _ if values.iter().any(|v| v == "*") => {
            Err("when: \"*\" (present, any value) stands alone, not in a list of values".to_owned())
        }
        _ => Ok(false),
    };
    for (name, values) in when.header.iter().flatten() {
        builder = builder.when(match present(values)? {
            true => Condition::header_present(name),
            false => Condition::header_in(name, values),
        });
    }
    if let Some(hosts) = &when.host {
        builder = builder.when(Condition::host_in(hosts.iter().map(String::as_str)));
    }
    for (name, values) in when.query.iter().flatten() {
        builder = builder.when(match present(values)? {
            true => Condition::query_present(name),
            false => Condition::query_in(name, values),
        });
    }
    Ok(builder)
}

fn window_start(route: &RouteConfig, _: &ClientIp, builder: Builder) -> Result<Builder, String> {
    let starts = [
        ("aligned", WindowStart::Aligned),
        ("per-key", WindowStart::PerKey),
    ];
    let start = one_of("window_start", route.window_start.as_deref(), &starts)?;
    Ok(builder.window_start(start))
}

/// `algorithm`, default GCRA: read by the quota and tier rows too (`max_burst` is GCRA's).
fn algorithm(route: &RouteConfig) -> Result<Algorithm, String> {
    // Calendar windows are fixed windows: `calendar` alone says so.
    let default = match route.calendar {
        Some(_) => Algorithm::FixedWindow,
        None => Algorithm::Gcra,
    };
    route.algorithm.as_deref().map_or(Ok(default), str::parse)
}

/// `calendar`, `timezone` and `anchor_day`: the route's calendar windows, if `calendar` is set
/// (the others alone are an error). The builder checks the rest.
fn calendar_of(route: &RouteConfig) -> Result<Option<CalendarWindow>, String> {
    let Some(period) = &route.calendar else {
        return match (&route.timezone, route.anchor_day) {
            (None, None) => Ok(None),
            _ => Err(
                "timezone and anchor_day go with calendar = \"day\", \"week\" or \"month\"".into(),
            ),
        };
    };
    let mut window = CalendarWindow::new(period.parse::<CalendarPeriod>()?);
    window = set(window, route.timezone.clone(), CalendarWindow::timezone);
    if let Some(day) = route.anchor_day {
        let day =
            u8::try_from(day).map_err(|_| format!("anchor_day must be 1 to 31, not {day}"))?;
        window = window.anchor_day(day);
    }
    Ok(Some(window))
}

/// The route's (or a tier's) quota keys, with the calendar's period when `calendar` is set and
/// `count` comes without one.
fn with_calendar_period(route: &RouteConfig, mut keys: TierConfig) -> Result<TierConfig, String> {
    if let (Some(window), Some(_), None) = (calendar_of(route)?, keys.count, keys.period) {
        keys.period = Some(window.period().nominal());
    }
    Ok(keys)
}

/// `key` and the settings that shape it, read behind the trusted proxies.
fn key(route: &RouteConfig, client_ip: &ClientIp, builder: Builder) -> Result<Builder, String> {
    let mut key = route.key.clone();
    bind_client_ip(&mut key, client_ip);
    key = key.for_route(route.path.as_deref())?;
    let on_duplicate = route.on_duplicate.as_deref().map(str::parse).transpose()?;
    key = set(key, on_duplicate, KeySpec::with_on_duplicate);
    let (v6, v4) = (route.ipv6_prefix, route.ipv4_prefix);
    // The prefixes group the route's addresses, and those of a quota keyed by one of its own.
    let quota_ips = (route.own_quota().quotas.iter().flatten())
        .filter_map(|q| q.key.as_ref())
        .any(|key| matches!(key, KeySpec::PeerIp(_) | KeySpec::ClientIp(_)));
    if !grouped(route, &mut key)? && !quota_ips && (v6.is_some() || v4.is_some()) {
        let setting = if v6.is_some() {
            "ipv6_prefix"
        } else {
            "ipv4_prefix"
        };
        return Err(format!(
            "{setting} only applies to key = \"ip\" or \"client-ip\" (the route's or a quota's)"
        ));
    }
    Ok(match key {
        KeySpec::Body(field) => builder.body_key(field),
        key => builder.key(key),
    })
}

/// Groups an address `key` by the route's `ipv4_prefix` and `ipv6_prefix`: whether it is one.
fn grouped(route: &RouteConfig, key: &mut KeySpec) -> Result<bool, String> {
    let (v6, v4) = (route.ipv6_prefix, route.ipv4_prefix);
    match key {
        KeySpec::PeerIp(ip) => {
            let with_v6 = try_set(*ip, v6, PeerIp::with_ipv6_prefix)?;
            *ip = try_set(with_v6, v4, PeerIp::with_ipv4_prefix)?;
        }
        KeySpec::ClientIp(ip) => {
            let with_v6 = try_set(ip.clone(), v6, ClientIp::with_ipv6_prefix)?;
            *ip = try_set(with_v6, v4, ClientIp::with_ipv4_prefix)?;
        }
        _ => return Ok(false),
    }
    Ok(true)
}

/// The route's quotas, with its shadow limits and the keys of quotas that have their own.
fn quotas(route: &RouteConfig, client_ip: &ClientIp, builder: Builder) -> Result<Builder, String> {
    let (algorithm, own) = (
        algorithm(route)?,
        with_calendar_period(route, route.own_quota())?,
    );
    // A metered route may limit its metered units alone (then with no period of its own).
    if route.metered.is_some() && own.count.is_none() && own.quotas.is_none() {
        if own.period.is_some() || own.max_burst.is_some() {
            return Err(
                "period and max_burst go with count (a metered route without count \
                        limits its metered units alone)"
                    .to_owned(),
            );
        }
        return Ok(builder);
    }
    let mut builder = builder.quotas(quotas_of(algorithm, &own, false)?);
    builder.opts.extras.quota_keys = quota_keys(route, client_ip, own.quotas.as_deref())?;
    Ok(quotas_of(algorithm, &own, true)?
        .into_iter()
        .fold(builder, Builder::shadow))
}

/// The `key` of each enforced quota, in the order `quotas_of` gives them, read as the route's key
/// is (behind the trusted proxies, with its `on_duplicate`); empty when none has one.
fn quota_keys(
    route: &RouteConfig,
    client_ip: &ClientIp,
    quotas: Option<&[QuotaConfig]>,
) -> Result<Vec<Option<KeySpec>>, String> {
    let quotas = quotas.unwrap_or_default();
    if quotas.iter().any(|q| q.shadow && q.key.is_some()) {
        return Err("a shadow quota counts against the route's key; remove its key".into());
    }
    if quotas.iter().all(|q| q.key.is_none()) {
        return Ok(Vec::new());
    }
    let on_duplicate = route.on_duplicate.as_deref().map(str::parse).transpose()?;
    quotas
        .iter()
        .filter(|q| !q.shadow)
        .map(|q| {
            q.key
                .clone()
                .map(|key| {
                    let mut key = key.for_route(route.path.as_deref())?;
                    bind_client_ip(&mut key, client_ip);
                    grouped(route, &mut key)?;
                    Ok(set(key, on_duplicate, KeySpec::with_on_duplicate))
                })
                .transpose()
        })
        .collect()
}

/// `[route.tiers.<name>]`: each tier's quotas, checked as the route's own are.
fn tiers(route: &RouteConfig, _: &ClientIp, mut builder: Builder) -> Result<Builder, String> {
    let algorithm = algorithm(route)?;
    for (name, tier) in route.tiers.iter().flatten() {
        let tier = &with_calendar_period(route, tier.clone())?;
        let quotas =
            quotas_of(algorithm, tier, false).map_err(|why| format!("tier {name:?}: {why}"))?;
        if !quotas_of(algorithm, tier, true)?.is_empty() {
            return Err(format!(
                "tier {name:?}: shadow = true is for the route's own quotas, not a tier's"
            ));
        }
        if tier.quotas.iter().flatten().any(|q| q.key.is_some()) {
            return Err(format!(
                "tier {name:?}: a quota's own key is for the route's own quotas, not a tier's"
            ));
        }
        builder = builder.tier(name.clone(), quotas);
    }
    Ok(builder)
}

/// `mode`, and the `max_delay` that only `"delay"` takes.
fn mode(route: &RouteConfig, _: &ClientIp, builder: Builder) -> Result<Builder, String> {
    match (route.mode.as_deref(), route.max_delay) {
        (None | Some("enforce"), None) => Ok(builder),
        (Some("dry-run"), None) => Ok(builder.dry_run(true)),
        (Some("under-pressure"), None) => Ok(builder.under_pressure_only(true)),
        (Some("delay"), Some(max_delay)) => Ok(builder.delay(max_delay)),
        (Some("delay"), None) => Err("mode = \"delay\" needs max_delay, such as \"2s\"".into()),
        (None | Some("enforce" | "dry-run" | "under-pressure"), Some(_)) => {
            Err("max_delay is only used with mode = \"delay\"".into())
        }
        (Some(other), _) => Err(format!(
            "mode {other:?} is not \"enforce\", \"dry-run\", \"delay\" or \"under-pressure\""
        )),
    }
}

/// `methods` / `custom_methods`, parsed alike: the builder tells standard from opted-in ones.
fn methods(
    builder: Builder,
    names: Option<&[String]>,
    option: fn(Builder, Vec<Method>) -> Builder,
) -> Result<Builder, String> {
    let Some(names) = names else {
        return Ok(builder);
    };
    let methods = names
        .iter()
        .map(|m| {
            Method::from_bytes(m.to_ascii_uppercase().as_bytes())
                .map_err(|_| format!("method {m:?} is not a valid method"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(option(builder, methods))
}

fn penalty(route: &RouteConfig, _: &ClientIp, builder: Builder) -> Result<Builder, String> {
    let Some(p) = &route.penalty else {
        return Ok(builder);
    };
    let penalty = Penalty::new(p.after, p.within, p.ban).map_err(|e| e.to_string())?;
    Ok(builder.penalty(penalty))
}

/// `count_statuses` / `refund_statuses` (codes, and classes such as `"5xx"`) as a filter.
fn statuses(
    statuses: Option<&[String]>,
    setting: &str,
) -> Result<Option<impl Fn(StatusCode) -> bool + Send + Sync + 'static + use<>>, String> {
    let Some(statuses) = statuses else {
        return Ok(None);
    };
    let set = StatusSet::parse(statuses, setting)?;
    Ok(Some(move |status| set.contains(status)))
}

fn on_missing_key(route: &RouteConfig, _: &ClientIp, builder: Builder) -> Result<Builder, String> {
    let answers = [
        ("reject", MissingKey::Reject(StatusCode::BAD_REQUEST)),
        ("allow", MissingKey::Allow),
    ];
    let answer = one_of("on_missing_key", route.on_missing_key.as_deref(), &answers)?;
    Ok(builder.on_missing_key(answer))
}
