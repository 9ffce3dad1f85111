//! A route's metered limit, `metered = { .. }` (or a `[route.metered]` table): a second limit whose
//! cost is settled after the response ([`PolicyBuilder::metered`]), such as tokens next to the
//! route's requests.
//!
//! ```toml
//! [[route]]
//! name = "chat"
//! path = "/v1/chat"
//! key = "header:x-api-key"
//! count = 60                      # requests a minute (leave count/period out: tokens only)
//! period = "1m"
//! metered = { charge = "after-response", unit = "tokens", count = 100000, period = "1m", estimate = 1000, estimate_header = "x-max-tokens", usage_header = "x-usage-tokens", max_debt = 100000 }
//! ```

use std::time::Duration;

use serde::Deserialize;

use super::schema::duration;
use crate::limit::Limit;
use crate::meter::Estimate;
use crate::policy::PolicyBuilder;
use crate::quota::Quota;

/// A route's `metered` table: the limit whose cost is settled after the response.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct MeteredConfig {
    /// `"after-response"`, the only charge of a metered limit (optional; it says the intent).
    #[serde(default)]
    pub charge: Option<String>,
    /// What the limit counts, such as `"tokens"`: the limit is named `{route}.{unit}` (default
    /// `"units"`).
    #[serde(default)]
    pub unit: Option<String>,
    /// Units per period.
    pub count: u64,
    /// The period, such as `"1m"`.
    #[serde(deserialize_with = "duration")]
    pub period: Duration,
    /// `CL.THROTTLE`'s max_burst (the most one request may reserve is max_burst + 1); default
    /// count - 1.
    #[serde(default)]
    pub max_burst: Option<u64>,
    /// The units a request reserves when it is admitted (with `estimate_header`: when the header
    /// is absent or not a number). Required.
    #[serde(default)]
    pub estimate: Option<u64>,
    /// A request header holding the units to reserve, such as a client's `"x-max-tokens"`.
    #[serde(default)]
    pub estimate_header: Option<String>,
    /// A response header (or trailer) holding the units the request used, such as
    /// `"x-usage-tokens"`; without it (or when a response lacks it) the handler's `Meter` says.
    #[serde(default)]
    pub usage_header: Option<String>,
    /// How many units past its burst a settled cost may push a key (default `count`).
    #[serde(default)]
    pub max_debt: Option<u64>,
}

impl MeteredConfig {
    /// Adds this metered limit to the policy `route` is building.
    pub(super) fn apply<K>(
        &self,
        route: &str,
        builder: PolicyBuilder<K>,
    ) -> Result<PolicyBuilder<K>, String> {
        if let Some(charge) = self.charge.as_deref().filter(|c| *c != "after-response") {
            return Err(format!(
                "metered: charge {charge:?} is not \"after-response\" (a metered limit's cost is \
                 settled after the response; leave metered out to charge at admission)"
            ));
        }
        let Some(estimate) = self.estimate else {
            return Err(
                "metered: estimate is required (the units a request reserves, or the default of \
                 estimate_header)"
                    .into(),
            );
        };
        let unit = self.unit.as_deref().unwrap_or("units");
        let mut quota = Quota::per_period(self.count, self.period);
        if let Some(max_burst) = self.max_burst {
            quota = quota.with_max_burst(max_burst);
        }
        let mut limit =
            Limit::new(format!("{route}.{unit}"), quota).map_err(|e| format!("metered: {e}"))?;
        if let Some(max_debt) = self.max_debt {
            limit = limit.with_max_debt(max_debt);
        }
        let estimate = match &self.estimate_header {
            Some(header) => Estimate::header(header.clone(), estimate),
            None => Estimate::fixed(estimate),
        };
        let mut builder = builder.metered(limit, estimate);
        if let Some(header) = &self.usage_header {
            builder = builder.usage_header(header.clone());
        }
        Ok(builder)
    }
}
