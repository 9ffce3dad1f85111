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
//!
//! `estimate = "json:max_tokens"` reserves the number in the JSON body's field instead (the route
//! reads the body, as for a body key: `max_body`, `body_timeout`).

use super::schema::{set, EstimateConfig, MeteredConfig};
use crate::limit::Limit;
use crate::meter::Estimate;
use crate::policy::PolicyBuilder;
use crate::quota::Quota;

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
        let Some(estimate) = &self.estimate else {
            return Err(
                "metered: estimate is required (the units a request reserves, or the default of \
                 estimate_header)"
                    .into(),
            );
        };
        let unit = self.unit.as_deref().unwrap_or("units");
        let quota = Quota::per_period(self.count, self.period);
        let quota = set(quota, self.max_burst, Quota::with_max_burst);
        let limit =
            Limit::new(format!("{route}.{unit}"), quota).map_err(|e| format!("metered: {e}"))?;
        let limit = set(limit, self.max_debt, Limit::with_max_debt);
        let estimate = match (estimate, &self.estimate_header) {
            (EstimateConfig::Units(units), Some(header)) => {
                Estimate::header(header.clone(), *units)
            }
            (EstimateConfig::Units(units), None) => Estimate::fixed(*units),
            // Without the field, the most one request may reserve (an estimate is capped there).
            (EstimateConfig::Body(field), None) => Estimate::body(field.clone(), u64::MAX),
            (EstimateConfig::Body(_), Some(_)) => {
                return Err(
                    "metered: estimate_header and an estimate from the body both say what \
                     a request reserves; use one"
                        .into(),
                )
            }
        };
        let builder = builder.metered(limit, estimate);
        Ok(set(
            builder,
            self.usage_header.clone(),
            PolicyBuilder::usage_header,
        ))
    }
}
