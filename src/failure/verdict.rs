//! The failure policy in the engine: the verdict on a request whose backend could not decide, or
//! whose async key came too late, as [`OnBackendError`] says.

use super::{Fallen, OnBackendError};
use crate::backend::Charges;
use crate::engine::verdict::{Admitted, Judge, RequestContext, Verdict};
use crate::error::BackendError;
use crate::observe::RequestRef;
use crate::policy::CompiledPolicy;
use crate::refusal::RefusalKind;

impl Judge {
    /// A policy's async key did not come within its timeout: the application's key service is
    /// slow, not the client at fault, so the failure policy answers as for a backend that cannot
    /// decide (`Local` cannot count a request without a key: it is let through, as by `Allow`).
    pub(crate) fn key_unavailable(
        &self,
        policy: &CompiledPolicy,
        request: RequestRef<'_>,
    ) -> Verdict {
        let rules = policy;
        match self.settings.on_error {
            OnBackendError::Deny if self.enforces(Some(rules), RefusalKind::Unavailable, None) => {
                Verdict::Reject(self.settings.refusals.unavailable(
                    (Some(&rules.name), None),
                    request,
                    "the rate limiter could not identify this client in time; retry shortly",
                ))
            }
            _ => Verdict::Admit(Admitted::unlimited()),
        }
    }

    /// The backend could not decide: reported, then what [`OnBackendError`] says.
    pub(crate) fn failed(
        &self,
        cx: RequestContext<'_>,
        charges: Charges<'_>,
        error: BackendError,
    ) -> Verdict {
        self.failed_taking(cx, charges, error).0
    }

    /// [`failed`](Self::failed), and whether the local limiter took the request's units (it
    /// decided, every limit admitting): only then has it anything to give back or settle.
    pub(crate) fn failed_taking(
        &self,
        cx: RequestContext<'_>,
        charges: Charges<'_>,
        error: BackendError,
    ) -> (Verdict, bool) {
        let rules = cx.policy;
        let on_error = self.settings.on_error;
        rules.reporter.failure(&rules.name);
        self.errors.record(&rules.name, &error, on_error.as_str());
        let fallen = self.fallback.decide(charges);
        #[cfg(feature = "memory")]
        let took = matches!(&fallen, Fallen::Decided(all) if all.iter().all(|d| d.allowed));
        #[cfg(not(feature = "memory"))]
        let took = false;
        let verdict = match fallen {
            Fallen::Deny if self.enforces(Some(rules), RefusalKind::Unavailable, Some(cx.key)) => {
                Verdict::Reject(self.settings.refusals.unavailable(
                    (Some(&rules.name), Some(cx.key)),
                    cx.request,
                    "the rate limiter is unavailable; retry shortly",
                ))
            }
            Fallen::Allow | Fallen::Deny => Verdict::Admit(Admitted::unlimited()),
            // A dry run decides locally too, and reports what it would refuse (`decided`).
            #[cfg(feature = "memory")]
            Fallen::Decided(mut decisions) => {
                let lease = decisions.first().and_then(|d| d.lease).unwrap_or(0);
                let local = crate::engine::slot::SlotOwner::Local { lease };
                self.decided(cx, &mut decisions, true, local)
            }
        };
        let admitted = matches!(verdict, Verdict::Admit(_));
        rules
            .reporter
            .fallback(&rules.name, on_error.as_str(), admitted);
        (verdict, took)
    }
}

#[cfg(test)]
mod tests {
    use http::{Request, StatusCode};

    use super::*;
    use crate::backend::Decisions;
    use crate::engine::settings::Settings;
    use crate::engine::verdict::tests::{admitted, judge, policy, rejected, verdict_on, OVER};
    use crate::key::{Global, Key};
    use crate::policy::Policy;
    use crate::quota::Quota;

    fn on_error(on_error: OnBackendError) -> Settings {
        Settings {
            on_error,
            ..Settings::default()
        }
    }

    /// A backend's failure.
    fn down() -> Result<Decisions, BackendError> {
        Err(BackendError::new("down"))
    }

    #[test]
    fn a_dry_run_never_refuses_for_a_failed_backend_and_under_local_reports_what_it_would() {
        let deny = on_error(OnBackendError::Deny);
        let dry = judge(policy().dry_run(true).build().unwrap(), deny);
        assert!(admitted(verdict_on(&dry, down())).headers.is_none());

        #[cfg(feature = "memory")]
        {
            let local = on_error(OnBackendError::Local);
            let dry = judge(policy().dry_run(true).build().unwrap(), local);
            // The local limiter decides (2 a second): the third is what it would refuse.
            for _ in 0..2 {
                let exposed = admitted(verdict_on(&dry, down())).decision.unwrap();
                assert!(exposed.decision.allowed && !exposed.enforced);
            }
            let exposed = admitted(verdict_on(&dry, down())).decision.unwrap();
            assert!(!exposed.decision.allowed && !exposed.enforced);
        }
    }

    /// An async key that comes too late is answered as a failed backend: refused (503) under
    /// `Deny` where the policy enforces its refusals, let through by a dry run and under `Allow`.
    #[test]
    fn a_late_key_is_refused_under_deny_only_where_refusals_are_enforced() {
        let deny = || on_error(OnBackendError::Deny);
        let request = Request::get("/").body(()).unwrap();
        let parts = RequestRef::of(&request);
        let enforced = judge(policy().build().unwrap(), deny());
        let response = rejected(enforced.key_unavailable(&enforced.p, parts));
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        let dry = judge(policy().dry_run(true).build().unwrap(), deny());
        assert!(admitted(dry.key_unavailable(&dry.p, parts))
            .headers
            .is_none());
        let allow = judge(policy().build().unwrap(), Settings::default());
        assert!(admitted(allow.key_unavailable(&allow.p, parts))
            .headers
            .is_none());
    }

    /// Under `Local`, the in-memory limiter decides every limit of a stack, not only the first.
    #[cfg(feature = "memory")]
    #[test]
    fn under_local_every_limit_of_a_stack_decides() {
        let local = on_error(OnBackendError::Local);
        let stack = Policy::builder("api")
            .key(Global)
            .quotas([Quota::per_second(10), Quota::per_minute(2)])
            .build()
            .unwrap();
        let judge = judge(stack, local);
        for _ in 0..2 {
            admitted(verdict_on(&judge, down()));
        }
        // The second limit, 2 a minute, refuses the third request; the first would admit it.
        let response = rejected(verdict_on(&judge, down()));
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(response.headers()["retry-after"], "30");
    }

    /// Under `Local`, a concurrency slot the local limiter gave is given back to it.
    #[cfg(feature = "memory")]
    #[test]
    fn under_local_a_concurrency_slot_is_given_back() {
        let local = on_error(OnBackendError::Local);
        let one = Policy::builder("api")
            .key(Global)
            .quota(Quota::per_second(1))
            .algorithm(crate::limit::Algorithm::Concurrency)
            .build()
            .unwrap();
        let judge = judge(one, local);
        let slot = admitted(verdict_on(&judge, down())).slot;
        let Some(crate::engine::slot::SlotOwner::Local { lease }) = slot else {
            panic!("the local limiter's slot: {slot:?}");
        };
        assert_ne!(lease, 0, "taken under the local limiter's lease");
        rejected(verdict_on(&judge, down()));
        let limit = &judge.p.tiers[0].limits[0];
        judge
            .fallback
            .release(limit, &Key::from("k"), judge.p.cost, lease);
        assert!(admitted(verdict_on(&judge, down())).slot.is_some());
    }

    #[test]
    fn a_failed_backend_follows_on_backend_down() {
        let allow = judge(policy().build().unwrap(), Settings::default());
        let through = admitted(verdict_on(&allow, down()));
        assert!(through.headers.is_none(), "no limit applied, no fields");

        let settings = on_error(OnBackendError::Deny);
        let deny = judge(policy().build().unwrap(), settings);
        let response = rejected(verdict_on(&deny, down()));
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(response.headers()["retry-after"], "1");

        // A stack answered with the wrong number of decisions is a backend failure too.
        let wrong = Ok(Decisions::Many(vec![OVER, OVER]));
        let response = rejected(verdict_on(&deny, wrong));
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    }
}
