//! Metered limits: a cost known only after the response (tokens an LLM generated, bytes sent, rows
//! scanned), reserved as an [`Estimate`] when the request is admitted and settled once its
//! response body has ended or was dropped ([`PolicyBuilder::metered`](crate::PolicyBuilder::metered)).
//!
//! The handler reports what the request really cost on its [`Meter`], a request extension; or the
//! middleware reads it from a response header or trailer
//! ([`usage_header`](crate::PolicyBuilder::usage_header)). The difference from the reservation is
//! settled with [`Adjustment::Settle`](crate::backend::Adjustment::Settle): a larger cost may
//! leave the key in debt (its next requests are refused until it is paid back), a smaller one is
//! given back. A handler that reports nothing keeps the reservation; a client that hangs up
//! mid-stream is charged what was reported until then.
//!
//! The whole feature lives here but for its TOML glue (`config/metered.rs`): the builder's options
//! (`builder.rs`); the reservation's charges, the meter and its settlement (here). The engine asks
//! the backend and says where the settlement goes (`engine/extended.rs`).

mod builder;

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use http::request::Parts;
use http::{HeaderMap, HeaderName};

use crate::backend::{AdjustLater, Charges, CLOCK_MARGIN};
use crate::error::BuildError;
use crate::key::{BodyField, Key};
use crate::limit::{Algorithm, Limit, MAX_STACKED_QUOTAS};

/// Whether this process has made a [`Meter`]: until it has, no request carries one.
static ANY_MADE: AtomicBool = AtomicBool::new(false);

/// What a metered request really cost, as its handler reports it: a request extension the
/// middleware inserts for every request a [metered](crate::PolicyBuilder::metered) policy lets
/// through (a handler behind routes of other policies too should take `Option<Extension<Meter>>`).
/// Clones share one count, so a streaming handler can move one into its stream and
/// [`add`](Self::add) as units go out. Behind several metered layers (an organisation's around a
/// user's), the handler's meter is the innermost layer's, and what it reports counts in each.
///
/// ```
/// use axum::{routing::post, Extension, Router};
/// use tower_throttle::Meter;
///
/// async fn complete(Extension(meter): Extension<Meter>) -> &'static str {
///     let answer = "four words of reply";
///     meter.add(4); // the tokens the model generated
///     answer
/// }
/// let app: Router = Router::new().route("/v1/complete", post(complete));
/// # let _ = app;
///
/// let meter = Meter::new(100);
/// assert_eq!((meter.estimate(), meter.used()), (100, None));
/// meter.add(30);
/// meter.clone().add(12);
/// assert_eq!(meter.used(), Some(42));
/// ```
#[derive(Clone)]
pub struct Meter {
    state: Arc<MeterState>,
}

struct MeterState {
    estimate: u64,
    used: AtomicU64,
    reported: AtomicBool,
    /// The response's usage header said the whole cost: what the handler reports after it (tokens
    /// it streams on) is left out, as the header is read instead of the meter.
    from_header: AtomicBool,
    /// The meter of a metered layer around this one: the handler's reports count there too.
    outer: Option<Meter>,
}

impl Meter {
    /// A meter for a request that reserved `estimate` units (the middleware makes them; this is
    /// for testing handlers).
    pub fn new(estimate: u64) -> Self {
        Self::within(estimate, None)
    }

    /// A meter for a request inside another metered layer, whose meter (`outer`) is told what
    /// the handler reports here.
    pub(crate) fn within(estimate: u64, outer: Option<Meter>) -> Self {
        ANY_MADE.store(true, Ordering::Relaxed);
        Meter {
            state: Arc::new(MeterState {
                estimate,
                used: AtomicU64::new(0),
                reported: AtomicBool::new(false),
                from_header: AtomicBool::new(false),
                outer,
            }),
        }
    }

    /// The handler's meter for a request of `parts` that reserved `estimate` units, put in its
    /// extensions; inside another metered layer, reporting to its meter too (which it replaces).
    pub(crate) fn for_request(parts: &mut Parts, estimate: u64) -> Self {
        let meter = Self::within(estimate, parts.extensions.get::<Meter>().cloned());
        parts.extensions.insert(meter.clone());
        meter
    }

    /// Reports `units` more used (saturating).
    pub fn add(&self, units: u64) {
        if let Some(outer) = &self.state.outer {
            outer.add(units);
        }
        if self.state.from_header.load(Ordering::Acquire) {
            return;
        }
        let _ = self
            .state
            .used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |u| {
                Some(u.saturating_add(units))
            });
        self.state.reported.store(true, Ordering::Release);
    }

    /// Reports that the request used `units` in all (an upstream's total, read at once).
    pub fn set(&self, units: u64) {
        if let Some(outer) = &self.state.outer {
            outer.set(units);
        }
        if !self.state.from_header.load(Ordering::Acquire) {
            self.set_used(units);
        }
    }

    fn set_used(&self, units: u64) {
        self.state.used.store(units, Ordering::Relaxed);
        self.state.reported.store(true, Ordering::Release);
    }

    /// The whole cost, as a response's usage header says it: here and in the meters of the
    /// metered layers around this one, where it counts as the handler's reports do; what the
    /// handler reports after it is left out.
    fn set_from_header(&self, units: u64) {
        if let Some(outer) = &self.state.outer {
            outer.set_from_header(units);
        }
        self.state.from_header.store(true, Ordering::Release);
        self.set_used(units);
    }

    /// What was reported so far; `None` if nothing was (the reservation then stands).
    pub fn used(&self) -> Option<u64> {
        self.state
            .reported
            .load(Ordering::Acquire)
            .then(|| self.state.used.load(Ordering::Relaxed))
    }

    /// The units reserved when the request was admitted.
    pub fn estimate(&self) -> u64 {
        self.state.estimate
    }
}

impl fmt::Debug for Meter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Meter")
            .field("estimate", &self.estimate())
            .field("used", &self.used())
            .finish()
    }
}

type EstimateFn = dyn Fn(&Parts) -> u64 + Send + Sync;

/// What a metered request reserves when it is admitted, before its real cost is known. An
/// estimate that is an upper bound (a request's `max_tokens`) never lets parallel requests
/// over-admit; a lower one lets each request in flight go over by its difference, settled as debt
/// afterwards. An estimate above the limit's burst is reserved as the whole burst.
///
/// ```
/// use tower_throttle::Estimate;
///
/// let fixed = Estimate::fixed(500);
/// let from_header = Estimate::header("x-max-tokens", 500); // 500 when absent or not a number
/// let from_parts = Estimate::from_fn(|parts| if parts.uri.path().ends_with("/embed") { 50 } else { 500 });
/// # let _ = (fixed, from_header, from_parts);
/// ```
#[derive(Clone)]
pub struct Estimate(EstimateKind);

#[derive(Clone)]
enum EstimateKind {
    Fixed(u64),
    Header(String, u64),
    Body(BodyField, u64),
    Fn(Arc<EstimateFn>),
}

impl Estimate {
    /// Every request reserves `units`.
    pub fn fixed(units: u64) -> Self {
        Estimate(EstimateKind::Fixed(units))
    }

    /// Reserves the number in request header `name` (a client's `max_tokens`), or `default` when
    /// it is absent or not a whole number. The client chooses it: pair it with a usage report
    /// (the meter, a usage header) so that what it claims is settled to what it used.
    pub fn header(name: impl Into<String>, default: u64) -> Self {
        Estimate(EstimateKind::Header(name.into(), default))
    }

    /// Reserves the whole number in `field` of the request body (a JSON request's `max_tokens`:
    /// `BodyField::json("max_tokens")`), or `default` when the body has no such number (absent,
    /// not a whole number, a body over the policy's [`max_body`](crate::PolicyBuilder::max_body)).
    /// The policy reads the body for it, as for a [body key](crate::PolicyBuilder::body_key). The
    /// client chooses it, as with [`header`](Self::header).
    ///
    /// ```
    /// use tower_throttle::{key::BodyField, Estimate};
    ///
    /// let max_tokens = Estimate::body(BodyField::json("max_tokens").unwrap(), 1_000);
    /// # let _ = max_tokens;
    /// ```
    pub fn body(field: BodyField, default: u64) -> Self {
        Estimate(EstimateKind::Body(field, default))
    }

    /// Reserves what `f` computes from the request's parts (its headers, its URI, an extension an
    /// earlier layer inserted, such as a parsed body's `max_tokens`).
    pub fn from_fn<F>(f: F) -> Self
    where
        F: Fn(&Parts) -> u64 + Send + Sync + 'static,
    {
        Estimate(EstimateKind::Fn(Arc::new(f)))
    }

    pub(crate) fn body_field(&self) -> Option<&BodyField> {
        match &self.0 {
            EstimateKind::Body(field, _) => Some(field),
            _ => None,
        }
    }

    pub(crate) fn header_name(&self) -> Option<&str> {
        match &self.0 {
            EstimateKind::Header(name, _) => Some(name),
            _ => None,
        }
    }
}

impl fmt::Debug for Estimate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            EstimateKind::Fixed(n) => f.debug_tuple("Estimate::fixed").field(n).finish(),
            EstimateKind::Header(name, default) => f
                .debug_tuple("Estimate::header")
                .field(name)
                .field(default)
                .finish(),
            EstimateKind::Body(field, default) => f
                .debug_tuple("Estimate::body")
                .field(&field.to_string())
                .field(default)
                .finish(),
            EstimateKind::Fn(_) => f.write_str("Estimate::from_fn(..)"),
        }
    }
}

/// A policy's metered limit, as the middleware uses it.
#[derive(Debug)]
pub(crate) struct MeterRule {
    /// The metered limit's place in the policy's stack.
    pub(crate) position: usize,
    pub(crate) estimate: Estimate,
    /// The metered limit's burst: the most one request may reserve.
    pub(crate) most: u64,
    pub(crate) usage_header: Option<HeaderName>,
}

impl MeterRule {
    /// What a request reserves; `body`: the whole request body, when the policy read it and it
    /// came whole.
    pub(crate) fn estimate(&self, parts: &Parts, body: Option<&[u8]>) -> u64 {
        let units = match &self.estimate.0 {
            EstimateKind::Fixed(n) => *n,
            EstimateKind::Header(name, default) => number(&parts.headers, name).unwrap_or(*default),
            EstimateKind::Body(field, default) => body
                .and_then(|body| field.units(&parts.headers, body))
                .unwrap_or(*default),
            EstimateKind::Fn(f) => f(parts),
        };
        units.min(self.most)
    }

    /// What a request of a stack of `limits` is charged: its `estimate` under the metered limit,
    /// `cost` under the others (`quantities`: room for one per limit).
    pub(crate) fn charges<'a>(
        &self,
        (limits, key): (&'a [Limit], &'a Key),
        (cost, estimate): (u64, u64),
        quantities: &'a mut [u64; MAX_STACKED_QUOTAS],
    ) -> Charges<'a> {
        *quantities = [cost; MAX_STACKED_QUOTAS];
        quantities[self.position] = estimate;
        Charges::stack(limits, key, 0).with_quantities(&quantities[..limits.len()])
    }
}

fn number(headers: &HeaderMap, name: &str) -> Option<u64> {
    crate::key::body::units_of(headers.get(name)?.to_str().ok()?)
}

#[derive(Debug, Default)]
pub(crate) struct MeteredBuilder {
    pub(crate) limit: Option<(Limit, Estimate)>,
    pub(crate) usage_header: Option<String>,
}

impl MeteredBuilder {
    /// Checks the metered limit and makes its rule, the limit placed at `position` in the stack and
    /// marked metered, so that its decisions read debt as debt.
    pub(crate) fn build(
        self,
        policy: &str,
        position: usize,
    ) -> Result<Option<(Limit, MeterRule)>, BuildError> {
        let invalid = |why: String| BuildError::Invalid(format!("policy {policy:?}: {why}"));
        let Some((limit, estimate)) = self.limit else {
            return match self.usage_header {
                Some(_) => Err(invalid(
                    "usage_header is set but no limit is metered".into(),
                )),
                None => Ok(None),
            };
        };
        if limit.algorithm() != Algorithm::Gcra {
            return Err(invalid(format!(
                "metered limit {:?} uses algorithm {:?}; a cost settled after the response needs \
                 \"gcra\" (its debt is a theoretical arrival time beyond the burst)",
                limit.name(),
                limit.algorithm().as_str()
            )));
        }
        if limit.delay().is_some() || limit.budget().is_some() {
            return Err(invalid(format!(
                "metered limit {:?} cannot delay nor lease a budget",
                limit.name()
            )));
        }
        let header = |name: &str, what: &str| {
            HeaderName::try_from(name)
                .map_err(|_| invalid(format!("{what} {name:?} is not a valid header name")))
        };
        if let Some(name) = estimate.header_name() {
            header(name, "estimate header")?;
        }
        let usage_header = self
            .usage_header
            .map(|name| header(&name, "usage_header"))
            .transpose()?;
        let limit = if limit.is_metered() {
            limit
        } else {
            let debt = limit.max_debt();
            limit.with_max_debt(debt)
        };
        let rule = MeterRule {
            position,
            estimate,
            most: limit.max_cost(),
            usage_header,
        };
        Ok(Some((limit, rule)))
    }
}

/// A request a layer answers itself (a refusal), never served: an outer layer that metered it used
/// nothing, and gives its reservation back (its [`Meter`] is in the request's extensions), unless
/// usage was reported already (a retry's earlier attempt, served, shares the meter).
#[inline]
pub(crate) fn unserved(extensions: &http::Extensions) {
    // Every refusal comes here, and most processes meter nothing: no lookup in the extensions.
    if !ANY_MADE.load(Ordering::Relaxed) {
        return;
    }
    if let Some(meter) = extensions.get::<Meter>().filter(|m| m.used().is_none()) {
        meter.set(0);
    }
}

/// A metered request on its way out: settled once, when its response body ends or is dropped
/// (or its response never comes), with what its [`Meter`] or usage header says it cost.
pub(crate) struct MeterGuard {
    meter: Meter,
    usage_header: Option<HeaderName>,
    /// The metered limit's place in its stack, and what settles each limit's delta there.
    position: usize,
    settle: Option<AdjustLater>,
    /// When the backend was asked: the reservation came after.
    asked: Instant,
}

impl MeterGuard {
    pub(crate) fn new(meter: Meter, rule: &MeterRule, settle: AdjustLater, asked: Instant) -> Self {
        MeterGuard {
            meter,
            usage_header: rule.usage_header.clone(),
            position: rule.position,
            settle: Some(settle),
            asked,
        }
    }

    /// Reads the usage header from a response's headers or trailers, if it is there: it is the
    /// request's whole cost.
    pub(crate) fn read_usage(&self, headers: &HeaderMap) {
        let Some(name) = &self.usage_header else {
            return;
        };
        if let Some(used) = number(headers, name.as_str()) {
            self.meter.set_from_header(used);
        }
    }
}

impl Drop for MeterGuard {
    fn drop(&mut self) {
        let Some(settle) = self.settle.take() else {
            return;
        };
        let estimate = self.meter.estimate();
        let used = self.meter.used().unwrap_or(estimate);
        let delta = (i128::from(used) - i128::from(estimate))
            .clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64;
        if delta != 0 {
            let mut deltas = [0; MAX_STACKED_QUOTAS];
            deltas[self.position] = delta;
            settle(Some(&deltas), self.asked.elapsed() + CLOCK_MARGIN);
        }
    }
}

impl fmt::Debug for MeterGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MeterGuard")
            .field("meter", &self.meter)
            .field("settled", &self.settle.is_none())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use std::time::Duration;

    fn guarded(estimate: u64, usage: Option<&str>) -> (Meter, MeterGuard, Arc<Mutex<Vec<i64>>>) {
        let settled = Arc::new(Mutex::new(Vec::new()));
        let seen = settled.clone();
        let rule = MeterRule {
            position: 1,
            estimate: Estimate::fixed(estimate),
            most: 1000,
            usage_header: usage.map(|h| HeaderName::try_from(h).unwrap()),
        };
        let meter = Meter::new(estimate);
        // Settled on the metered limit's place in the stack (second), nothing on the others.
        let settle: AdjustLater = Box::new(move |deltas, _| {
            let deltas = deltas.expect("a settlement, not a refund");
            assert!(deltas.iter().enumerate().all(|(i, d)| i == 1 || *d == 0));
            seen.lock().unwrap().push(deltas[1]);
        });
        let guard = MeterGuard::new(meter.clone(), &rule, settle, Instant::now());
        (meter, guard, settled)
    }

    #[test]
    fn a_guard_settles_once_what_the_meter_says_less_the_reservation() {
        let (meter, guard, settled) = guarded(100, None);
        meter.add(130);
        drop(guard);
        assert_eq!(*settled.lock().unwrap(), [30]);

        let (meter, guard, settled) = guarded(100, None);
        meter.add(20);
        drop(guard);
        assert_eq!(*settled.lock().unwrap(), [-80]);

        // Nothing reported: the reservation stands, nothing to settle.
        let (_meter, guard, settled) = guarded(100, None);
        drop(guard);
        assert!(settled.lock().unwrap().is_empty());
    }

    #[test]
    fn the_usage_header_is_the_whole_cost() {
        let (meter, guard, settled) = guarded(10, Some("x-usage-tokens"));
        meter.add(3);
        let mut headers = HeaderMap::new();
        headers.insert("x-usage-tokens", "25".parse().unwrap());
        guard.read_usage(&headers);
        // Not a number: ignored.
        headers.insert("x-usage-tokens", "lots".parse().unwrap());
        guard.read_usage(&headers);
        // Tokens the handler streams after the header are the header's already.
        meter.add(5);
        meter.set(40);
        drop(guard);
        assert_eq!(*settled.lock().unwrap(), [15]);
    }

    #[test]
    fn debug_output_names_what_each_holds() {
        let meter = Meter::new(40);
        meter.add(7);
        assert_eq!(
            format!("{meter:?}"),
            "Meter { estimate: 40, used: Some(7) }"
        );
        assert_eq!(format!("{:?}", Estimate::fixed(3)), "Estimate::fixed(3)");
        assert_eq!(
            format!("{:?}", Estimate::header("x-max-tokens", 9)),
            r#"Estimate::header("x-max-tokens", 9)"#
        );
        assert_eq!(
            format!("{:?}", Estimate::from_fn(|_| 1)),
            "Estimate::from_fn(..)"
        );
        let (_meter, guard, _) = guarded(5, None);
        assert_eq!(
            format!("{guard:?}"),
            "MeterGuard { meter: Meter { estimate: 5, used: None }, settled: false }"
        );
    }

    /// A metered limit settles a cost after the response: it can neither delay (nothing is known
    /// to wait for) nor lease a budget (a slice is charged when granted). Each alone is refused.
    #[test]
    fn a_metered_limit_with_a_delay_or_a_budget_alone_is_refused() {
        use crate::budget::Budget;
        use crate::quota::Quota;
        let limit = || Limit::new("chat.tokens", Quota::per_minute(1000)).unwrap();
        let delayed = limit().with_delay(Duration::from_secs(1)).unwrap();
        let leased = limit().with_budget(Budget::new()).unwrap();
        for (what, limit) in [("a delay", delayed), ("a budget", leased)] {
            let err = crate::Policy::builder("chat")
                .key(crate::key::Global)
                .metered(limit, Estimate::fixed(1))
                .build()
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("cannot delay nor lease a budget"),
                "{what}: {err}"
            );
        }
    }

    #[test]
    fn estimates_are_capped_at_the_burst() {
        let rule = |estimate| MeterRule {
            position: 0,
            estimate,
            most: 1000,
            usage_header: None,
        };
        let parts = |max: &str| {
            http::Request::builder()
                .header("x-max-tokens", max)
                .body(())
                .unwrap()
                .into_parts()
                .0
        };
        let header = rule(Estimate::header("x-max-tokens", 7));
        assert_eq!(header.estimate(&parts("12"), None), 12);
        assert_eq!(header.estimate(&parts("-3"), None), 7);
        assert_eq!(header.estimate(&parts("99999"), None), 1000);
        // Past u64, or written with an exponent: the cap, not the default.
        assert_eq!(header.estimate(&parts("99999999999999999999"), None), 1000);
        assert_eq!(header.estimate(&parts("1e20"), None), 1000);
        assert_eq!(header.estimate(&parts("12.7"), None), 7);
        assert_eq!(header.estimate(&parts("NaN"), None), 7);
        let f = rule(Estimate::from_fn(|p| p.headers.len() as u64));
        assert_eq!(f.estimate(&parts("1"), None), 1);
        assert_eq!(
            rule(Estimate::fixed(5000)).estimate(&parts("1"), None),
            1000
        );
        let body = rule(Estimate::body(BodyField::json("max_tokens").unwrap(), 9));
        let mut json = parts("1");
        json.headers
            .insert("content-type", "application/json".parse().unwrap());
        assert_eq!(body.estimate(&json, Some(br#"{"max_tokens":40}"#)), 40);
        assert_eq!(body.estimate(&json, Some(br#"{"max_tokens":4e4}"#)), 1000);
        assert_eq!(body.estimate(&json, Some(br#"{"tokens":40}"#)), 9);
        assert_eq!(body.estimate(&json, None), 9);
        assert_eq!(body.estimate(&parts("1"), Some(br#"{"max_tokens":40}"#)), 9);
    }
}
