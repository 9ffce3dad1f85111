//! The builder's metered limit ([`PolicyBuilder::metered`]): a cost settled after the response.

use crate::error::BuildError;
use crate::limit::{Algorithm, Limit, MAX_STACKED_QUOTAS};
use crate::meter::Estimate;
use crate::policy::PolicyBuilder;

/// Metered limits (`meter/`): a cost settled after the response.
impl<K> PolicyBuilder<K> {
    /// Adds a metered `limit` to the policy's stack: a request reserves `estimate` units of it when
    /// it is admitted (its [`cost`](Self::cost) is taken from the other limits, as usual), and
    /// what it really cost is settled once its response body has ended or was dropped — "60
    /// requests a minute *and* 100,000 tokens a minute". The handler reports the cost on the
    /// [`Meter`](crate::Meter) request extension (`Extension(meter): Extension<Meter>`, then
    /// `meter.add(n)` as tokens stream out), or the middleware reads it from the
    /// [`usage_header`](Self::usage_header); a handler that reports nothing keeps the
    /// reservation, and a client that hangs up mid-stream is charged what was reported until then.
    ///
    /// A cost beyond what the key had left puts it in debt: its next requests get `429` with a
    /// `Retry-After` of exactly the time until the debt is paid back, and `remaining` shows 0.
    /// The debt is capped at the limit's [`max_debt`](Limit::max_debt) (default: one period's
    /// quota). The quota's burst bounds what one request may reserve.
    ///
    /// The limit must be a GCRA limit, named apart from the policy's own (its name names it in the
    /// `RateLimit` fields: `"api";q=60;w=60, "api.tokens";q=100000;w=60`). One metered limit per
    /// policy; not with tiers, per-customer quotas, counting by outcome, delay nor budgets (the
    /// build says which). The policy's [`quota`](Self::quota) may be left out: then it limits
    /// tokens only. The backend must settle ([`Backend::validate`](crate::Backend::validate) with
    /// [`Uses::settles`](crate::backend::Uses): memory and Redis do).
    ///
    /// ```
    /// use tower_throttle::{key::Header, Estimate, Limit, Policy, Quota};
    ///
    /// let chat = Policy::builder("chat")
    ///     .key(Header::new("x-api-key"))
    ///     .quota(Quota::per_minute(60))
    ///     .metered(
    ///         Limit::new("chat.tokens", Quota::per_minute(100_000)).unwrap(),
    ///         Estimate::header("x-max-tokens", 1_000),
    ///     )
    ///     .build()
    ///     .unwrap();
    /// let names: Vec<&str> = chat.limits().iter().map(|l| l.name()).collect();
    /// assert_eq!(names, ["chat", "chat.tokens"]);
    /// assert_eq!(chat.limits()[1].max_debt(), 100_000);
    /// ```
    pub fn metered(mut self, limit: Limit, estimate: Estimate) -> Self {
        self.opts.extras.metered.limit = Some((limit, estimate));
        self
    }

    /// Reads a [metered](Self::metered) request's whole cost from this response header (or
    /// trailer, for a streamed body) when the response has it, instead of the
    /// [`Meter`](crate::Meter): an upstream that reports `x-usage-tokens: 1234`.
    pub fn usage_header(mut self, name: impl Into<String>) -> Self {
        self.opts.extras.metered.usage_header = Some(name.into());
        self
    }

    /// What a metered limit cannot be used with, in a policy whose other limits are `limits`.
    pub(crate) fn check_metered(
        &self,
        limits: &[Limit],
        metered: &Limit,
    ) -> Result<(), BuildError> {
        let invalid =
            |why: &str| BuildError::Invalid(format!("policy {:?}: {why}", self.opts.name));
        if limits.iter().any(|l| l.name() == metered.name()) {
            return Err(invalid(
                "the metered limit needs a name of its own (not the policy's)",
            ));
        }
        if limits.len() + 1 > MAX_STACKED_QUOTAS {
            return Err(invalid(&format!(
                "at most {MAX_STACKED_QUOTAS} limits may be stacked, the metered one included"
            )));
        }
        if self.opts.algorithm == Algorithm::Concurrency && !limits.is_empty() {
            return Err(invalid(
                "a metered limit cannot be stacked with a concurrency limit",
            ));
        }
        Ok(())
    }
}
