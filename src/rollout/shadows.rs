//! Rolling a limit out, in the engine: a policy's shadow limits are asked beside its own
//! limits (concurrently, so they add no round trip) and their refusals only reported; a staged
//! policy's refusals for keys outside its share are reported the same way. Which refusals are
//! enforced is decided in one place, `Judge::enforces` (verdict.rs); this file only asks and
//! reports. Only the extended path and a stream message's check come here for shadow limits: a
//! policy without them never does.

use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::task::Poll;

use crate::backend::{Backend, Charges};
use crate::decision::Decision;
use crate::engine::verdict::Judge;
use crate::error::BackendError;
use crate::key::Key;
use crate::limit::Limit;
use crate::observe::ShownKey;
use crate::policy::{CompiledPolicy, CompiledTier};
use crate::rollout::Unenforced;

/// The answer of `check` (the policy's own limits) and of each shadow limit for `key`, asked
/// together: every future is polled until all are done.
pub(crate) async fn with_shadows<B, F>(
    check: F,
    backend: &B,
    shadows: &[Limit],
    key: &Key,
    cost: u64,
) -> (F::Output, Vec<Result<Decision, BackendError>>)
where
    B: Backend,
    F: Future + Unpin,
{
    let mut check = Some(check);
    let mut own = None;
    let mut pending: Vec<Option<B::Future>> = shadows
        .iter()
        .map(|limit| Some(backend.check(Charges::one(limit, key, cost))))
        .collect();
    let mut answers: Vec<Option<Result<Decision, BackendError>>> =
        shadows.iter().map(|_| None).collect();
    poll_fn(|cx| {
        if let Some(future) = check.as_mut()
            && let Poll::Ready(answer) = Pin::new(future).poll(cx)
        {
            own = Some(answer);
            check = None;
        }
        for (slot, answer) in pending.iter_mut().zip(answers.iter_mut()) {
            if let Some(future) = slot.as_mut()
                && let Poll::Ready(decided) = Pin::new(future).poll(cx)
            {
                let decided = decided.and_then(|all| {
                    let no_answer = || BackendError::new("the backend returned no decision");
                    all.combined().ok_or_else(no_answer)
                });
                *answer = Some(decided);
                *slot = None;
            }
        }
        if check.is_none() && pending.iter().all(Option::is_none) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
    let own = own.expect("the policy's check is done");
    let answers = answers
        .into_iter()
        .map(|a| a.expect("every shadow check is done"))
        .collect();
    (own, answers)
}

impl Judge {
    /// Reports what the shadow limits of the request `cx`'s policy decided: each refusal is
    /// counted as would-limit. A shadow limit the backend could not decide is logged (the layer's
    /// error log, at warn at most once a second) and changes nothing.
    pub(crate) fn shadowed(
        &self,
        (rules, key): (&CompiledPolicy, &Key),
        shadows: &[Limit],
        answers: Vec<Result<Decision, BackendError>>,
    ) {
        for (limit, answer) in shadows.iter().zip(answers) {
            match answer {
                Ok(decision) if decision.allowed => {}
                Ok(_) => rules.would_limit.record(
                    &rules.name,
                    limit.name(),
                    self.shown(key),
                    Unenforced::Shadow,
                ),
                Err(error) => self
                    .errors
                    .aside(&rules.name, &error, "ignored (shadow limit)"),
            }
        }
    }

    /// A staged policy's refusal of a key outside its share, counted for each limit that refused.
    pub(crate) fn would_limit(
        &self,
        rules: &CompiledPolicy,
        tier: &CompiledTier,
        decisions: &[Decision],
        shown: ShownKey<'_>,
    ) {
        for (name, decision) in tier.names.iter().zip(decisions) {
            if !decision.allowed {
                rules
                    .would_limit
                    .record(&rules.name, name, shown, Unenforced::Staged);
            }
        }
    }
}
