//! The extended path of [`Throttle`]: requests of a policy that uses per-customer quotas, an async
//! key or counting by outcome. One boxed future finds the key and the quota, checks the access
//! lists, the ban and the backend, and makes the verdict; the response future then carries it out
//! with the guard that settles the request by its outcome. Policies that use none of this never come
//! here: for them the whole cost is the `Option` check in `Throttle::call`.

use std::sync::Arc;
use std::time::Instant;

use http::request::Parts;
use http::Request;
use tower_service::Service;

use crate::access::Access;
use crate::backend::Backend;
use crate::key::{Found, Key, KeyExtractor};
use crate::limit::Limit;
use crate::middleware::admitted::{Admitted, Verdict};
use crate::middleware::future::{BackendCheck, Prepared, ResponseFuture};
use crate::middleware::shared::{releaser, take_readied, Shared};
use crate::middleware::table::Table;
use crate::middleware::verdict::{Checked, RequestContext};
use crate::observe::{RequestRef, MEASURE_LATENCY};
use crate::outcome::{OutcomeGuard, Refund};
use crate::per_customer::{CustomTier, PolicyExtras};
use crate::timer::within;

/// The extended path for a request that policy `policy` of `table` (with `extras`) applies to.
pub(super) fn call_extended<S, K, B, ReqBody>(
    inner: &mut S,
    shared: &Arc<Shared<K, B>>,
    table: Arc<Table<K>>,
    policy: usize,
    extras: Arc<PolicyExtras>,
    request: Request<ReqBody>,
) -> ResponseFuture<S, ReqBody, B::Future>
where
    S: Service<Request<ReqBody>> + Clone,
    K: KeyExtractor<ReqBody> + Send + Sync + 'static,
    B: Backend,
{
    let rules = &table.policies[policy];
    // A synchronous key is read here, where the body's type is known; an async one later.
    let (key, missing) = match extras.async_key {
        Some(ref async_key) => (None, Missing::Expected(async_key.what().to_owned())),
        None => {
            let key = rules.key().extract(&request);
            let missing = Missing::Expected(if key.is_none() {
                rules.key().describe()
            } else {
                String::new()
            });
            (key, missing)
        }
    };
    let (parts, body) = request.into_parts();
    let shared = shared.clone();
    let service = take_readied(inner);
    let prepare = prepare(shared, table, policy, extras, key, missing, parts);
    ResponseFuture::preparing(Box::pin(prepare), service, body)
}

/// The verdict on a request of the extended path; `key` is its synchronous key (`None` with an
/// async key, or when it has none: `missing` then says what was expected).
async fn prepare<K, B>(
    shared: Arc<Shared<K, B>>,
    table: Arc<Table<K>>,
    policy: usize,
    extras: Arc<PolicyExtras>,
    key: Option<Key>,
    missing: Missing,
    parts: Parts,
) -> Prepared
where
    K: Send + Sync + 'static,
    B: Backend,
{
    let (parts, key, missing) = match &extras.async_key {
        None => (parts, key, missing),
        Some(async_key) => {
            let (parts, found) = async_key.extract(parts).await;
            match found {
                Found::Key(key) => (parts, Some(key), missing),
                Found::Nothing => (parts, None, missing),
                Found::TimedOut => {
                    let why = format!("no key within {:?}", async_key.timeout_value());
                    extras
                        .log
                        .record(extras.name(), "async key", &why, "the failure policy");
                    (parts, None, Missing::Late)
                }
            }
        }
    };
    if let Some((lists, source)) = &shared.access {
        if !lists.is_empty() {
            let head = Request::from_parts(parts, ());
            let access = lists.check(source.address(&head), key.as_ref());
            let parts = head.into_parts().0;
            match access {
                Access::Allow => return through(parts),
                Access::Deny => {
                    let request = request_ref(&parts);
                    let verdict = table.judge.forbidden(Some(policy), key.as_ref(), request);
                    return answered(parts, verdict);
                }
                Access::Limit => {
                    return decide(&shared, &table, policy, &extras, key, missing, parts).await
                }
            }
        }
    }
    decide(&shared, &table, policy, &extras, key, missing, parts).await
}

/// After the access lists: the missing key, the quota, the ban, the backend and the verdict.
async fn decide<K, B>(
    shared: &Arc<Shared<K, B>>,
    table: &Arc<Table<K>>,
    policy: usize,
    extras: &Arc<PolicyExtras>,
    key: Option<Key>,
    missing: Missing,
    parts: Parts,
) -> Prepared
where
    K: Send + Sync + 'static,
    B: Backend,
{
    let rules = &table.policies[policy];
    let judge = &table.judge;
    let Some(key) = key else {
        let what = match missing {
            Missing::Expected(what) => what,
            // The application's key service is slow: not the client's fault (no 400).
            Missing::Late => {
                let verdict = judge.key_unavailable(policy, request_ref(&parts));
                return Prepared {
                    parts,
                    verdict,
                    release: None,
                    outcome: None,
                };
            }
        };
        let verdict = judge.missing_key(policy, &what, request_ref(&parts));
        return answered(parts, verdict);
    };
    let custom = custom_quota(shared, rules.cost(), extras, &parts, &key).await;
    let tier = match custom {
        Some(_) => 0,
        None => rules.tier_in(&parts.headers, &parts.extensions),
    };
    let verdict = {
        let cx = RequestContext {
            policy,
            tier,
            key: &key,
            request: request_ref(&parts),
            custom: custom.as_deref().map(|c| &c.rules),
        };
        if let Some(banned) = judge.banned(cx) {
            banned
        } else {
            let limits = limits_of(table, policy, tier, custom.as_deref());
            let asked = Instant::now();
            let check = match limits {
                [one] => BackendCheck::One(shared.backend.check(one, &key, rules.cost())),
                all => BackendCheck::Stack(shared.backend.check_all(all, &key, rules.cost())),
            };
            let answer = check.await;
            if MEASURE_LATENCY {
                judge.latency(policy, asked.elapsed());
            }
            // What the backend took, and how long it counts there (the shortest `reset_after`):
            // only that can be given back, and only until then. (A failed backend took nothing,
            // whatever `OnBackendError` then does.)
            let counts_for = match &answer {
                Ok(Checked::One(d)) if d.allowed => Some(d.reset_after),
                Ok(Checked::Stack(all)) if all.iter().all(|d| d.allowed) => {
                    all.iter().map(|d| d.reset_after).min()
                }
                _ => None,
            };
            let verdict = judge.verdict(cx, answer);
            let taken = Taken { asked, counts_for };
            return settle_later(
                shared, table, policy, tier, extras, custom, key, taken, verdict, parts,
            );
        }
    };
    Prepared {
        parts,
        verdict,
        release: None,
        outcome: None,
    }
}

/// What the backend took for a request: when it was asked, and how long the units count there
/// (`None`: it took nothing).
struct Taken {
    asked: Instant,
    counts_for: Option<std::time::Duration>,
}

/// What an admitted request takes along: its concurrency slot's release, and the guard that gives
/// its units back if its response does not count.
#[allow(clippy::too_many_arguments)]
fn settle_later<K, B>(
    shared: &Arc<Shared<K, B>>,
    table: &Arc<Table<K>>,
    policy: usize,
    tier: usize,
    extras: &Arc<PolicyExtras>,
    custom: Option<Arc<CustomTier>>,
    key: Key,
    taken: Taken,
    verdict: Verdict,
    parts: Parts,
) -> Prepared
where
    K: Send + Sync + 'static,
    B: Backend,
{
    let (slot, refundable) = match &verdict {
        Verdict::Admit(admitted) => (admitted.slot.is_some(), taken.counts_for),
        Verdict::Reject(_) => (false, None),
    };
    // A per-customer concurrency limit shares the default limit's name, so its key and lease: the
    // default tier's release gives its slot back.
    let release = slot.then(|| releaser(shared, table, policy, tier, key.clone()));
    let outcome = match (refundable, &extras.outcome) {
        (Some(counts_for), Some(rule)) => {
            let (shared, table) = (shared.clone(), table.clone());
            let cost = table.policies[policy].cost();
            let refund: Refund = Box::new(move |since| {
                let limits = limits_of(&table, policy, tier, custom.as_deref());
                shared.backend.refund(limits, &key, cost, since);
            });
            Some(Box::new(OutcomeGuard::new(
                rule.clone(),
                refund,
                taken.asked,
                counts_for,
            )))
        }
        _ => None,
    };
    Prepared {
        parts,
        verdict,
        release,
        outcome,
    }
}

/// The limits a request is decided under: its per-customer quota's, else its tier's.
fn limits_of<'a, K>(
    table: &'a Table<K>,
    policy: usize,
    tier: usize,
    custom: Option<&'a CustomTier>,
) -> &'a [Limit] {
    match custom {
        Some(custom) => &custom.limits,
        None => &table.policies[policy].tiers()[tier].limits,
    }
}

/// The per-customer quota of `key`, if the policy's closure or resolver gives one that can be
/// enforced; `None` for the policy's own. A resolver that fails or takes longer than its timeout
/// gives `None` too (logged).
async fn custom_quota<K, B>(
    shared: &Shared<K, B>,
    cost: u64,
    extras: &PolicyExtras,
    parts: &Parts,
    key: &Key,
) -> Option<Arc<CustomTier>>
where
    B: Backend,
{
    let quota = if let Some(quota_from) = &extras.quota_from {
        quota_from(parts, key)?
    } else if let Some(resolver) = &extras.resolver {
        let fallback = "the policy's quota";
        match within(extras.resolve_timeout, resolver.resolve(parts, key)).await {
            Some(Ok(quota)) => quota?,
            Some(Err(error)) => {
                extras.log.record(
                    extras.name(),
                    "quota resolver",
                    &error.to_string(),
                    fallback,
                );
                return None;
            }
            None => {
                let why = format!("no quota within {:?}", extras.resolve_timeout);
                extras
                    .log
                    .record(extras.name(), "quota resolver", &why, fallback);
                return None;
            }
        }
    } else {
        return None;
    };
    extras.custom_tier(quota, cost, |limit| shared.backend.validate(limit))
}

/// Through with no limit applied.
fn through(parts: Parts) -> Prepared {
    Prepared {
        parts,
        verdict: Verdict::Admit(Admitted::unlimited()),
        release: None,
        outcome: None,
    }
}

/// Answered before the backend (a refusal, or let through unlimited).
fn answered(parts: Parts, verdict: Verdict) -> Prepared {
    Prepared {
        parts,
        verdict,
        release: None,
        outcome: None,
    }
}

/// The request's parts as the judge reads them.
fn request_ref(parts: &Parts) -> RequestRef<'_> {
    RequestRef {
        method: &parts.method,
        uri: &parts.uri,
        headers: &parts.headers,
        extensions: &parts.extensions,
    }
}

/// Why a request of the extended path has no key.
enum Missing {
    /// The policy's key is not in the request: what was expected (the missing-key answer).
    Expected(String),
    /// The async key did not come within its timeout (the failure policy answers).
    Late,
}
