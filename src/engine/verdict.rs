//! The verdict: what the layer does with a request once its backend has decided — admit it (at once
//! or after a delay), reject it (`429`, a ban, or `503` when the backend failed and the layer fails
//! closed). No I/O and no futures: given a [`RequestContext`] and the backend's answer, a [`Judge`]
//! returns a [`Verdict`]; the service and the response future carry it out. The refusals'
//! responses are made in `refusal/respond.rs`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderValue, Request, Response};

use crate::backend::{Charges, Decisions};
use crate::decision::Decision;
use crate::engine::settings::Settings;
use crate::engine::slot::SlotOwner;
use crate::error::BackendError;
use crate::failure::Fallback;
use crate::headers::RateHeaders;
use crate::key::Key;
use crate::limit::Limit;

use crate::observe::{ErrorLog, RedactionSecret, Redactor, RequestRef, ShownKey};
use crate::policy::{CompiledPolicy, CompiledTier, MissingKey};
use crate::policy_decision::PolicyDecision;
use crate::refusal::RefusalKind;
use crate::timer::timers_available;

/// The failure of a backend that answered `limits` stacked limits with `decisions` decisions.
pub(crate) fn not_one_per_limit(decisions: usize, limits: usize) -> BackendError {
    BackendError::new(format!(
        "the backend returned {decisions} decisions for {limits} stacked limits"
    ))
}

pub(crate) enum Verdict {
    Admit(Admitted),
    Reject(Response<Bytes>),
}

/// How a request is let through.
pub(crate) struct Admitted {
    pub(crate) headers: Option<RateHeaders>,
    /// Delay mode: how long to wait before calling the service.
    pub(crate) delay: Duration,
    /// Boxed: it is rarely asked for, and a smaller verdict moves faster on every request.
    pub(crate) decision: Option<Box<PolicyDecision>>,
    /// A concurrency slot to give back when the response ends.
    pub(crate) slot: Option<SlotOwner>,
    /// The limits it came near, for the handler (`near_limit_header`; boxed: rare).
    pub(crate) near: Option<Box<HeaderValue>>,
}

impl Admitted {
    /// Through with no limit applied (and no headers): the backend failed and the layer fails open.
    pub(crate) fn unlimited() -> Self {
        Admitted {
            headers: None,
            delay: Duration::ZERO,
            decision: None,
            slot: None,
            near: None,
        }
    }
}

/// What a request is judged as (`tier`: one of the policy's, or a customer's or override's own).
#[derive(Clone, Copy)]
pub(crate) struct RequestContext<'a> {
    pub(crate) policy: &'a CompiledPolicy,
    pub(crate) tier: &'a CompiledTier,
    pub(crate) key: &'a Key,
    pub(crate) request: RequestRef<'a>,
    /// Whether its policy's limits bite because the overload gate is under pressure
    /// ([`Judge::pressed_for`]): read once, when the request is checked, so that what the backend
    /// is asked and what the verdict makes of its answer agree.
    pub(crate) pressed: bool,
}

impl<'a> RequestContext<'a> {
    /// The request's charges when its tier's limits count its policy's cost under its key (every
    /// request but the extended path's keyed-apart and metered ones).
    pub(crate) fn charges(&self) -> Charges<'a> {
        Charges::stack(&self.tier.limits, self.key, self.policy.cost)
    }

    #[inline(always)]
    pub(crate) fn at(
        policy: &'a CompiledPolicy,
        tier: &'a CompiledTier,
        key: &'a Key,
        request: RequestRef<'a>,
        pressed: bool,
    ) -> Self {
        RequestContext {
            policy,
            tier,
            key,
            request,
            pressed,
        }
    }

    /// A request of `policy` under its tier number `tier`.
    pub(crate) fn new<B>(
        policy: &'a CompiledPolicy,
        tier: usize,
        key: &'a Key,
        request: &'a Request<B>,
        pressed: bool,
    ) -> Self {
        let request = RequestRef::of(request);
        Self::at(policy, &policy.tiers[tier], key, request, pressed)
    }
}

/// Turns backend decisions into verdicts: what a request needs of the configuration after its
/// backend has answered, so that a pending response future holds this and not the backend.
pub(crate) struct Judge {
    pub(crate) settings: Settings,
    /// The failure policy, with its local limiter.
    pub(crate) fallback: Fallback,
    /// Shared with the judge of the table a reload puts in: an outage is one across reloads,
    /// whichever table's requests fail.
    pub(crate) errors: Arc<ErrorLog>,
    /// Keys in logs as pseudonyms, when the layer redacts them.
    pub(crate) redactor: Option<Redactor>,
}

/// What a policy makes of the decisions of its limits ([`Judge::weigh`]).
pub(crate) struct Weighed {
    /// The stack's decisions combined (a strike may have made it a ban).
    pub(crate) decision: Decision,
    /// Whether the policy enforces it (not a dry run, nor a key outside a staged policy's share).
    pub(crate) enforced: bool,
    /// Delay mode's wait for an admitted request.
    pub(crate) delay: Duration,
}

impl Judge {
    pub(crate) fn new(settings: Settings) -> Self {
        Judge {
            fallback: Fallback::new(settings.on_error),
            redactor: settings.redact_keys.then(|| {
                let secret = settings.redaction_secret.clone();
                secret.unwrap_or_else(RedactionSecret::random).hmac()
            }),
            settings,
            errors: Arc::default(),
        }
    }

    /// Whether the layer makes a refusal of `kind` for a request of `policy`, or only reports it:
    /// the one place a dry run is decided, for every refusal and for delay mode's wait. A dry run
    /// makes none of them but a deny list's: the access lists are the layer's, checked before and
    /// apart from any policy, so a policy's dry run does not lift them.
    ///
    /// A staged policy (`enforce_fraction`) makes them for the keys in its share only, and for no
    /// request without a key (nor one whose async key came late), counting the others as
    /// would-limit. (A policy enforced only under pressure:
    /// [`enforces_limits`](Self::enforces_limits).)
    pub(crate) fn enforces(
        &self,
        policy: Option<&CompiledPolicy>,
        kind: RefusalKind,
        key: Option<&Key>,
    ) -> bool {
        match (policy, kind) {
            (_, RefusalKind::Denied) | (None, _) => true,
            (Some(rules), _) => {
                !rules.dry_run
                    && rules
                        .staged
                        .is_none_or(|s| key.is_some_and(|k| s.enforces(k)))
            }
        }
    }

    /// Whether the layer makes the refusals of `rules`'s limits for `key`
    /// ([`enforces`](Self::enforces)), `pressed` being [`pressed_for`](Self::pressed_for) as the
    /// request read it: a policy enforced only under pressure makes them only then, and counts the
    /// others as would-limit.
    fn enforces_limits(&self, rules: &CompiledPolicy, key: &Key, pressed: bool) -> bool {
        (pressed || !rules.under_pressure)
            && self.enforces(Some(rules), RefusalKind::Limited, Some(key))
    }

    /// Whether `rules` is enforced only under pressure and the overload gate says there is some
    /// now. Read once a request, into its [`RequestContext`]: the gate's pressure may change while
    /// the backend decides.
    #[inline]
    pub(crate) fn pressed_for(&self, rules: &CompiledPolicy) -> bool {
        rules.under_pressure
            && self
                .settings
                .overload
                .as_ref()
                .is_some_and(|g| g.is_pressed())
    }

    /// The limits a request of `rules` for `key` asks the backend under `tier`: without their
    /// penalty when the policy does not enforce its refusal (a staged key outside the share, a
    /// policy enforced under pressure only while there is none), so that a backend that keeps
    /// penalties strikes only refusals that are made, as the layer's own penalty box does.
    #[inline(always)]
    pub(crate) fn limits_to_ask<'t>(
        &self,
        rules: &CompiledPolicy,
        tier: &'t CompiledTier,
        key: &Key,
        pressed: bool,
    ) -> &'t [Limit] {
        match &tier.unenforced {
            // Where the layer keeps the penalty box (`rules.penalty`), the backend ignores it.
            Some(unenforced)
                if rules.penalty.is_none() && !self.enforces_limits(rules, key, pressed) =>
            {
                unenforced
            }
            _ => &tier.limits,
        }
    }

    /// The verdict on the backend's answer (or failure) to `cx`'s `charges`, asked at `asked`.
    pub(crate) fn verdict(
        &self,
        cx: RequestContext<'_>,
        charges: Charges<'_>,
        asked: Option<Instant>,
        answer: Result<Decisions, BackendError>,
    ) -> Verdict {
        self.backend_answered(cx.policy, asked, answer.is_ok());
        let tier = cx.tier;
        let from_backend = |d: &Decision| SlotOwner::Backend {
            lease: d.lease.unwrap_or(0),
        };
        match answer {
            Ok(Decisions::One(decision)) if tier.limits.len() == 1 => {
                let slot = from_backend(&decision);
                self.decided(cx, &mut [decision], true, slot)
            }
            Ok(Decisions::Many(mut decisions)) if decisions.len() == tier.limits.len() => {
                let slot = from_backend(&decisions[0]);
                self.decided(cx, &mut decisions, true, slot)
            }
            Ok(other) => {
                let error = not_one_per_limit(other.len(), tier.limits.len());
                self.failed(cx, charges, error)
            }
            Err(error) => self.failed(cx, charges, error),
        }
    }

    /// The answer to a key the penalty box has banned, asked before the backend. (A dry run has no
    /// penalty box: its limits carry no penalty, so that a backend that keeps them bans no one.)
    pub(crate) fn banned(&self, cx: RequestContext<'_>) -> Option<Verdict> {
        let rest = cx.policy.penalty.as_ref()?.banned(cx.key)?;
        self.banned_for(cx, rest)
    }

    /// The refusal of a request whose key is banned for `rest` yet (by the penalty box, or an
    /// operator's timed ban); `None` when the policy does not enforce it (a dry run, a key outside
    /// a staged share): the request goes on to the backend, whose decision is the one reported.
    pub(crate) fn banned_for(&self, cx: RequestContext<'_>, rest: Duration) -> Option<Verdict> {
        if !self.enforces_limits(cx.policy, cx.key, cx.pressed) {
            return None;
        }
        let mut decisions = cx.tier.banned_for(rest);
        match self.decided(cx, &mut decisions, false, SlotOwner::Backend { lease: 0 }) {
            Verdict::Reject(response) => Some(Verdict::Reject(response)),
            Verdict::Admit(_) => None,
        }
    }

    /// `key` as logs show it (a pseudonym when the layer redacts keys).
    #[inline]
    pub(crate) fn shown<'k>(&'k self, key: &'k Key) -> ShownKey<'k> {
        ShownKey {
            key,
            redact: self.redactor.as_ref(),
        }
    }

    /// Reports the backend's latency; `decided`: it decided (the failure policy no longer answers).
    #[inline(always)]
    pub(crate) fn backend_answered(
        &self,
        policy: &CompiledPolicy,
        asked: Option<Instant>,
        decided: bool,
    ) {
        if decided {
            self.errors.decided();
        }
        if let Some(asked) = asked {
            policy.reporter.latency(&policy.name, asked.elapsed());
        }
    }

    /// The judge's first step: whether `decision` admits a request whose policy asks nothing of an
    /// admission (one limit, no wait, slot, [`PolicyDecision`] or near-limit rule) but its fields;
    /// reported if so. `Throttle::call` asks it directly, to build no verdict for such a request.
    // Inlined: most requests end here, and out of line the context is passed through memory.
    #[inline(always)]
    pub(crate) fn admitted_plainly(&self, cx: RequestContext<'_>, decision: &Decision) -> bool {
        let rules = cx.policy;
        if !(decision.allowed && rules.plain_admission && cx.tier.plain_admission) {
            return false;
        }
        let shown = self.shown(cx.key);
        rules
            .reporter
            .decision(&rules.name, shown, decision, Duration::ZERO);
        true
    }

    #[inline]
    pub(crate) fn sends_fields(&self) -> bool {
        let options = self.settings.headers;
        options.ratelimit || options.legacy || options.openai
    }

    /// The fields of `decisions` (one per limit of `tier`), the legacy ones showing `combined`.
    pub(crate) fn fields(
        &self,
        tier: &CompiledTier,
        decisions: &[Decision],
        combined: &Decision,
    ) -> RateHeaders {
        let options = self.settings.headers;
        let mut fields = RateHeaders::new(
            options,
            &tier.names,
            &tier.policy_field,
            decisions,
            combined,
        );
        fields.add_openai(options, &tier.limits, decisions);
        fields
    }

    /// The verdict on the decisions of every limit of the tier. `strike`: a refusal counts towards
    /// a ban (not for a ban itself); `slot`: who takes back an admitted request's concurrency slot.
    pub(crate) fn decided(
        &self,
        cx: RequestContext<'_>,
        decisions: &mut [Decision],
        strike: bool,
        slot: SlotOwner,
    ) -> Verdict {
        let rules = cx.policy;
        let tier = cx.tier;
        if let [decision] = &*decisions
            && self.admitted_plainly(cx, decision)
        {
            let mut admitted = Admitted::unlimited();
            admitted.headers = Some(self.fields(tier, decisions, decision));
            return Verdict::Admit(admitted);
        }
        let mut weighed = self.weigh(rules, tier, cx.key, decisions, (strike, cx.pressed));
        let Weighed {
            enforced, delay, ..
        } = weighed;
        // A dry run reports the wait it would have made, but does not wait.
        let wait = if enforced { delay } else { Duration::ZERO };
        if !wait.is_zero() {
            // No timer to wait on: a misconfigured server, not the client's fault. Admitting at
            // once would let the queue through early.
            if !timers_available() {
                crate::observe::no_timers(&rules.name);
                let why = "the rate limiter cannot delay this request";
                let (policy, key) = (Some(&*rules.name), Some(cx.key));
                let refusals = &self.settings.refusals;
                return Verdict::Reject(refusals.unavailable((policy, key), cx.request, why));
            }
            // The fields go out after the wait: by then the key is that much closer to full.
            for d in decisions.iter_mut() {
                d.reset_after = d.reset_after.saturating_sub(wait);
            }
            weighed.decision.reset_after = weighed.decision.reset_after.saturating_sub(wait);
        }
        self.report(rules, tier, cx.key, decisions, &mut weighed);
        let decision = weighed.decision;
        let fields = self.fields(tier, decisions, &decision);
        if decision.allowed || !enforced {
            // What handlers see: each limit's decision, and the wait (reported by a dry run too).
            let exposed = rules.expose_decision.then(|| {
                let names = (&rules.name, tier.name.clone(), &tier.names[..]);
                PolicyDecision::of(names, (decision, &*decisions), (delay, enforced))
            });
            let near = rules.near.as_ref().and_then(|near| {
                let hook = self.settings.on_near_limit.as_deref();
                let (names, key) = (&tier.names[..], cx.key);
                let report = &rules.near_report;
                report.near(near, hook, (&rules.name, key), names, decisions, cx.request)
            });
            return Verdict::Admit(Admitted {
                headers: Some(fields),
                delay: wait,
                decision: exposed.map(Box::new),
                slot: (decision.allowed && tier.concurrency).then_some(slot),
                near,
            });
        }
        let refusals = &self.settings.refusals;
        let (policy, key) = ((&*rules.name, &rules.limited_body), (cx.key, &decision));
        Verdict::Reject(refusals.limited(policy, key, cx.request, fields))
    }

    /// The verdict on a client or key on a deny list (`policy`: the one that matched, if any).
    pub(crate) fn forbidden(
        &self,
        policy: Option<&CompiledPolicy>,
        key: Option<&Key>,
        request: RequestRef<'_>,
    ) -> Verdict {
        if !self.enforces(policy, RefusalKind::Denied, key) {
            return Verdict::Admit(Admitted::unlimited());
        }
        crate::observe::forbidden();
        let policy = policy.map(|p| &*p.name);
        Verdict::Reject(self.settings.refusals.forbidden((policy, key), request))
    }

    /// A request without a key, as `policy`'s [`MissingKey`] says (`what`: the expected source).
    pub(crate) fn missing_key(
        &self,
        policy: &CompiledPolicy,
        what: &str,
        request: RequestRef<'_>,
    ) -> Verdict {
        let status = match policy.missing_key {
            MissingKey::Reject(status)
                if self.enforces(Some(policy), RefusalKind::MissingKey, None) =>
            {
                status
            }
            _ => return Verdict::Admit(Admitted::unlimited()),
        };
        policy.reporter.missing_key(&policy.name, what);
        let refusals = &self.settings.refusals;
        Verdict::Reject(refusals.missing_key((&policy.name, status), what, request))
    }

    /// The judge's first steps on the decisions of `tier`'s limits, for a request and a stream
    /// message alike (`handle/message.rs`); `strike`: the decisions are the backend's, not a ban's;
    /// `pressed`: as the request read it ([`RequestContext::pressed`]).
    // Always inlined: a request's verdict is most of their callers' work, and out of line the
    // decisions and the weighing go through memory.
    #[inline(always)]
    pub(crate) fn weigh(
        &self,
        rules: &CompiledPolicy,
        tier: &CompiledTier,
        key: &Key,
        decisions: &mut [Decision],
        (strike, pressed): (bool, bool),
    ) -> Weighed {
        let enforced = self.enforces_limits(rules, key, pressed);
        // Most tiers have no limit in delay mode: nothing to wait for, nothing to correct.
        let mut delay = match tier.delays {
            true => tier.queue_delay(decisions),
            false => Duration::ZERO,
        };
        let mut decision = match &*decisions {
            [one] => *one,
            all => Decision::combine(all).expect("a tier has at least one limit"),
        };
        if !decision.allowed {
            delay = Duration::ZERO;
        }
        if strike
            && enforced
            && !decision.allowed
            && let Some(penalty) = &rules.penalty
            && let Some(ban) = penalty.strike(key)
        {
            // Every limit's fields show the ban too, as a backend that keeps penalties answers.
            let banned =
                |d: &Decision| Decision::banned(d.limit, ban, d.retry_after, d.reset_after);
            decision = banned(&decision);
            decisions.iter_mut().for_each(|d| *d = banned(d));
        }
        Weighed {
            decision,
            enforced,
            delay,
        }
    }

    /// The judge's last step before the answer, for a request and a stream message alike: the
    /// decision reported, and a refusal counted — as would-limit where the policy does not enforce
    /// it; where it does, with its retry jittered and the key counted as an offender.
    #[inline(always)] // as `weigh`
    pub(crate) fn report(
        &self,
        rules: &CompiledPolicy,
        tier: &CompiledTier,
        key: &Key,
        decisions: &[Decision],
        weighed: &mut Weighed,
    ) {
        let Weighed {
            decision,
            enforced,
            delay,
        } = weighed;
        let shown = self.shown(key);
        // A staged policy's refusal for a key outside its share, or one of a policy enforced only
        // under pressure while there is none, is only counted, as would-limit.
        let staged_off =
            !decision.allowed && !*enforced && (rules.staged.is_some() || rules.under_pressure);
        if staged_off {
            self.would_limit(rules, tier, decisions, shown);
        } else {
            rules
                .reporter
                .decision(&rules.name, shown, decision, *delay);
        }
        if decision.allowed || staged_off {
            return;
        }
        // Clients that share a key do not all come back in the same second. Only later.
        if let (true, Some(jitter), Some(retry)) =
            (*enforced, rules.retry_after_jitter, decision.retry_after)
        {
            decision.retry_after = Some(retry + jitter.mul_f64(crate::timer::unit_random()));
        }
        rules
            .reporter
            .limited(&rules.name, shown, decision, !*enforced);
        if let (true, Some(offenders)) = (*enforced, &self.settings.offenders) {
            offenders.record(&rules.name, key);
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::sync::Arc;

    use crate::key::Global;
    use crate::penalty::Penalty;
    use crate::policy::Policy;
    use crate::quota::Quota;
    use http::{Request, StatusCode};

    /// A judge, and the one policy it judges for (compiled as a table would).
    pub(crate) struct TestJudge {
        judge: Judge,
        pub(crate) p: Arc<CompiledPolicy>,
    }

    impl std::ops::Deref for TestJudge {
        type Target = Judge;

        fn deref(&self) -> &Judge {
            &self.judge
        }
    }

    pub(crate) fn judge(policy: Policy<Global>, settings: Settings) -> TestJudge {
        let exposed = settings.decision_extension;
        let policy = policy.compile(exposed, false, std::iter::empty());
        TestJudge {
            judge: Judge::new(settings),
            p: policy.compiled().clone(),
        }
    }

    pub(crate) fn policy() -> crate::policy::PolicyBuilder<Global> {
        Policy::builder("api")
            .quota(Quota::per_second(2))
            .key(Global)
    }

    /// The verdict of `judge` on `answer`, for a request of key "k" to policy 0, tier 0.
    pub(crate) fn verdict_on(
        judge: &TestJudge,
        answer: Result<Decisions, BackendError>,
    ) -> Verdict {
        let request = Request::get("/").body(()).unwrap();
        let key = Key::from("k");
        let cx = RequestContext::new(&judge.p, 0, &key, &request, false);
        judge.verdict(cx, cx.charges(), None, answer)
    }

    pub(crate) fn rejected(verdict: Verdict) -> Response<Bytes> {
        match verdict {
            Verdict::Reject(response) => response,
            Verdict::Admit(_) => panic!("admitted"),
        }
    }

    pub(crate) fn admitted(verdict: Verdict) -> Admitted {
        match verdict {
            Verdict::Admit(admitted) => admitted,
            Verdict::Reject(response) => panic!("rejected with {}", response.status()),
        }
    }

    pub(crate) const OVER: Decision = Decision::limited(
        2,
        0,
        Some(Duration::from_millis(1500)),
        Duration::from_secs(1),
    );

    #[test]
    fn an_admitted_decision_admits_with_its_fields_and_no_wait() {
        let judge = judge(policy().build().unwrap(), Settings::default());
        let decision = Decision::allowed(2, 1, Duration::from_millis(500));
        let admitted = admitted(verdict_on(&judge, Ok(Decisions::One(decision))));
        assert!(admitted.delay.is_zero());
        assert!(admitted.slot.is_none());
        assert!(admitted.decision.is_none(), "PolicyDecision is opt-in");
        let mut headers = http::HeaderMap::new();
        admitted.headers.expect("fields").apply(&mut headers);
        assert_eq!(headers["ratelimit"], r#""api";r=1;t=1"#);
    }

    #[test]
    fn a_rejected_decision_answers_429_with_retry_after_rounded_up() {
        let judge = judge(policy().build().unwrap(), Settings::default());
        let response = rejected(verdict_on(&judge, Ok(Decisions::One(OVER))));
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(response.headers()["retry-after"], "2");
        assert_eq!(response.headers()["ratelimit"], r#""api";r=0;t=1"#);
    }

    #[test]
    fn a_dry_run_admits_what_it_would_reject_and_says_so() {
        let judge = judge(policy().dry_run(true).build().unwrap(), Settings::default());
        let admitted = admitted(verdict_on(&judge, Ok(Decisions::One(OVER))));
        let exposed = admitted.decision.expect("dry runs expose their decision");
        assert!(!exposed.enforced);
        assert!(!exposed.decision.allowed);
    }

    #[test]
    fn the_rejection_that_earns_a_ban_answers_with_it_and_the_ban_answers_before_the_backend() {
        let penalty = Penalty::new(2, Duration::from_secs(60), Duration::from_secs(600)).unwrap();
        let judge = judge(
            policy().penalty(penalty).build().unwrap(),
            Settings::default(),
        );
        let request = Request::get("/").body(()).unwrap();
        let key = Key::from("k");
        let cx = RequestContext::new(&judge.p, 0, &key, &request, false);
        assert!(judge.banned(cx).is_none());
        let first = rejected(verdict_on(&judge, Ok(Decisions::One(OVER))));
        assert_eq!(first.headers()["retry-after"], "2");
        let second = rejected(verdict_on(&judge, Ok(Decisions::One(OVER))));
        assert_eq!(
            second.headers()["retry-after"],
            "600",
            "the second strike bans"
        );
        let banned = rejected(
            judge
                .banned(cx)
                .expect("banned before the backend is asked"),
        );
        assert_eq!(banned.status(), StatusCode::TOO_MANY_REQUESTS);
        let other = Key::from("other");
        assert!(judge.banned(RequestContext { key: &other, ..cx }).is_none());
    }

    #[test]
    fn a_missing_key_names_the_policy_and_a_deny_list_answers_403() {
        let judge = judge(policy().build().unwrap(), Settings::default());
        let request = Request::get("/").body(()).unwrap();
        let parts = RequestRef::of(&request);
        let response = rejected(judge.missing_key(&judge.p, "header x-api-key", parts));
        assert_eq!(response.status(), StatusCode::BAD_REQUEST);
        let body = String::from_utf8(response.into_body().to_vec()).unwrap();
        assert!(body.contains("policy 'api'"), "{body}");
        assert_eq!(
            rejected(judge.forbidden(None, None, parts)).status(),
            StatusCode::FORBIDDEN
        );
        // A dry run lets a request without a key through, but not past a deny list (the layer's).
        let dry = super::tests::judge(policy().dry_run(true).build().unwrap(), Settings::default());
        assert!(admitted(dry.missing_key(&dry.p, "header x-api-key", parts))
            .decision
            .is_none());
        assert_eq!(
            rejected(dry.forbidden(Some(&dry.p), None, parts)).status(),
            StatusCode::FORBIDDEN
        );
    }
}
