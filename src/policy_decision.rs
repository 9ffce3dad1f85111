//! What a layer decided for a request it let through, as handlers see it: [`PolicyDecision`]
//! (one layer's), each limit's [`LimitDecision`], and [`RequestDecisions`] (every layer's, side
//! by side in the request's extensions).

use std::sync::Arc;
use std::time::Duration;

use http::Extensions;

use crate::decision::Decision;

/// What a layer decided for a request it let through, as a request extension the application can
/// read (`Extension<PolicyDecision>` in axum). Inserted for dry-run and delay-mode policies, and
/// for every policy of a layer built with
/// [`decision_extension(true)`](crate::ThrottleLayerBuilder::decision_extension). In
/// [dry-run](crate::PolicyBuilder::dry_run) mode this is how a handler learns that the request *would* have
/// been limited.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct PolicyDecision {
    /// The policy's name.
    pub policy: Arc<str>,
    /// The tier whose quota applied (`None`: the default).
    pub tier: Option<Arc<str>>,
    /// The decision (for stacked quotas, the combined one: see [`Decision::combine`](crate::Decision::combine)).
    pub decision: Decision,
    /// `false` in dry-run mode: the decision was not enforced (look at `decision.allowed`).
    pub enforced: bool,
    /// How long the request waited for its turn in delay mode (zero otherwise); in a dry run, how
    /// long it would have waited.
    pub delayed: Duration,
    /// Each limit's own decision: one per stacked quota (`decision` combines them), else one.
    pub limits: Box<[LimitDecision]>,
}

/// One limit's decision within a [`PolicyDecision`]: for stacked quotas, each quota's own (named
/// like its limit, `api.1s`, `api.1d`); for a single quota, the one decision.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LimitDecision {
    /// The limit's name (the policy's, `{policy}.{period}` in a stack, `{policy}.{tier}` in a tier).
    pub name: Arc<str>,
    /// What the limit decided.
    pub decision: Decision,
}

/// Every [`PolicyDecision`] made for a request, one per layer that exposed its decision, in the
/// order they decided (the outermost layer first): a request extension, read in axum with
/// `Extension<RequestDecisions>`.
///
/// Each layer appends to it, so a per-IP layer and a per-user layer stacked on one route both
/// show. The single [`PolicyDecision`] extension is still inserted as before; with several layers
/// it holds the last (innermost) layer's decision, the one that overwrote the others.
///
/// ```
/// use axum::{body::Body, routing::get, Extension, Router};
/// use http::Request;
/// use tower::ServiceExt;
/// use tower_throttle::key::{Global, Header};
/// use tower_throttle::{policy::RequestDecisions, Policy, Quota, ThrottleLayer};
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let per_user = ThrottleLayer::builder()
///     .policy(Policy::builder("user").quota(Quota::per_minute(10)).key(Header::new("x-user")).build().unwrap())
///     .decision_extension(true)
///     .build()
///     .unwrap();
/// let site = ThrottleLayer::builder()
///     .policy(Policy::builder("site").quotas([Quota::per_second(100), Quota::per_day(100_000)]).key(Global).build().unwrap())
///     .decision_extension(true)
///     .build()
///     .unwrap();
/// let app = Router::new()
///     .route("/", get(|Extension(all): Extension<RequestDecisions>| async move {
///         all.iter()
///             .flat_map(|d| d.limits.iter().map(|l| format!("{}={}", l.name, l.decision.remaining)))
///             .collect::<Vec<_>>()
///             .join(" ")
///     }))
///     .layer(per_user)
///     .layer(site); // the outer layer decides first
/// let request = Request::get("/").header("x-user", "7").body(Body::empty()).unwrap();
/// let body = app.oneshot(request).await.unwrap().into_body();
/// let text = axum::body::to_bytes(body, 1024).await.unwrap();
/// assert_eq!(text, "site.1s=99 site.1d=99999 user=9");
/// # });
/// ```
#[derive(Clone, Debug, Default)]
pub struct RequestDecisions {
    decisions: Vec<PolicyDecision>,
}

impl RequestDecisions {
    /// The decisions, the outermost layer's first.
    pub fn iter(&self) -> std::slice::Iter<'_, PolicyDecision> {
        self.decisions.iter()
    }

    /// The decision of the policy called `policy` (the first, if two layers share a policy name).
    pub fn get(&self, policy: &str) -> Option<&PolicyDecision> {
        self.decisions.iter().find(|d| &*d.policy == policy)
    }

    /// How many decisions there are.
    pub fn len(&self) -> usize {
        self.decisions.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.decisions.is_empty()
    }
}

impl<'a> IntoIterator for &'a RequestDecisions {
    type Item = &'a PolicyDecision;
    type IntoIter = std::slice::Iter<'a, PolicyDecision>;

    fn into_iter(self) -> Self::IntoIter {
        self.decisions.iter()
    }
}

impl PolicyDecision {
    /// The decision of `policy` (its tier, and the names of the tier's limits), for `decisions`
    /// one per limit combined into `decision`; `delayed`: delay mode's wait, made only if the
    /// decision is `enforced` (a dry run reports it).
    pub(crate) fn of(
        (policy, tier, names): (&Arc<str>, Option<Arc<str>>, &[Arc<str>]),
        (decision, decisions): (Decision, &[Decision]),
        (delayed, enforced): (Duration, bool),
    ) -> Self {
        PolicyDecision {
            policy: policy.clone(),
            tier,
            decision,
            enforced,
            delayed,
            limits: (names.iter().zip(decisions))
                .map(|(name, decision)| LimitDecision {
                    name: name.clone(),
                    decision: *decision,
                })
                .collect(),
        }
    }
}

pub(crate) fn record(extensions: &mut Extensions, decision: PolicyDecision) {
    match extensions.get_mut::<RequestDecisions>() {
        Some(all) => all.decisions.push(decision.clone()),
        None => {
            extensions.insert(RequestDecisions {
                decisions: vec![decision.clone()],
            });
        }
    }
    extensions.insert(decision);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decision_of(policy: &str, remaining: u64) -> PolicyDecision {
        let decision = Decision::allowed(10, remaining, Duration::from_secs(1));
        let names: [Arc<str>; 1] = [format!("{policy}.1s").into()];
        let name: Arc<str> = policy.into();
        PolicyDecision::of(
            (&name, None, &names),
            (decision, &[decision]),
            (Duration::ZERO, true),
        )
    }

    #[test]
    fn each_layer_adds_its_decision_and_the_last_is_the_extension_too() {
        let mut extensions = Extensions::new();
        assert!(extensions.get::<RequestDecisions>().is_none());
        record(&mut extensions, decision_of("site", 9));
        let all = extensions.get::<RequestDecisions>().unwrap();
        assert_eq!((all.len(), all.is_empty()), (1, false));
        record(&mut extensions, decision_of("user", 4));
        let all = extensions.get::<RequestDecisions>().unwrap();
        assert_eq!(all.len(), 2);
        let names: Vec<&str> = all.iter().map(|d| &*d.policy).collect();
        assert_eq!(names, ["site", "user"], "the outermost layer's first");
        assert_eq!(all.get("user").unwrap().decision.remaining, 4);
        assert_eq!(all.get("site").unwrap().limits[0].decision.remaining, 9);
        assert!(all.get("other").is_none());
        assert_eq!(all.into_iter().count(), 2);
        let last = extensions.get::<PolicyDecision>().unwrap();
        assert_eq!(&*last.policy, "user");
        assert!(RequestDecisions::default().is_empty());
    }
}
