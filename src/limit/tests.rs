//! Unit tests of [`Limit`](super::Limit): its validation, its accessors and `same_rules`, one
//! assertion per rule (found missing by mutation testing, scripts/mutants.sh).

use std::time::Duration;

use super::*;

const ALL: [Algorithm; 5] = Algorithm::ALL;

fn with(algorithm: Algorithm, quota: Quota) -> Result<Limit, BuildError> {
    Limit::with_algorithm("limit-tests", algorithm, quota)
}

fn says(error: impl ToString, what: &str) {
    let error = error.to_string();
    assert!(error.contains(what), "{error}");
}

/// The quota error a limit was refused with.
fn refused(limit: Result<Limit, BuildError>) -> QuotaError {
    match limit {
        Err(BuildError::Quota { source, .. }) => source,
        other => panic!("{other:?}"),
    }
}

#[test]
fn algorithm_names_are_the_config_names_and_parse_back() {
    let names = [
        "gcra",
        "sliding-log",
        "fixed-window",
        "sliding-window",
        "concurrency",
    ];
    for (algorithm, name) in ALL.into_iter().zip(names) {
        assert_eq!(algorithm.as_str(), name);
        assert_eq!(algorithm.to_string(), name);
        assert_eq!(name.parse::<Algorithm>(), Ok(algorithm));
    }
    let error = "token-bucket".parse::<Algorithm>().unwrap_err();
    says(error, "unknown algorithm \"token-bucket\"");
}

#[test]
fn a_stack_holds_1_to_16_limits_and_no_concurrency_limit() {
    let gcra = Limit::new("stack-a", Quota::per_second(5)).unwrap();
    let log = with(Algorithm::SlidingLog, Quota::per_second(5)).unwrap();
    assert!(check_stack(&[]).unwrap_err().contains("not 0"));
    assert_eq!(check_stack(std::slice::from_ref(&gcra)), Ok(()));
    assert_eq!(check_stack(&[gcra.clone(), log]), Ok(()));
    assert_eq!(check_stack(&vec![gcra.clone(); MAX_STACKED_QUOTAS]), Ok(()));
    let error = check_stack(&vec![gcra.clone(); MAX_STACKED_QUOTAS + 1]).unwrap_err();
    says(error, "not 17");
    let conn = Limit::with_algorithm("stack-conn", Algorithm::Concurrency, Quota::per_second(5));
    let error = check_stack(&[gcra, conn.unwrap()]).unwrap_err();
    says(error, "\"stack-conn\": a concurrency limit");
}

#[test]
fn with_algorithm_makes_the_algorithm_asked_for() {
    for algorithm in ALL {
        let limit = with(algorithm, Quota::per_minute(30)).unwrap();
        assert_eq!(limit.algorithm(), algorithm);
        assert_eq!(limit.name(), "limit-tests");
        assert_eq!(limit.quota(), &Quota::per_minute(30));
        assert_eq!(limit.gcra().is_some(), algorithm == Algorithm::Gcra);
        assert_eq!(limit.tolerance().is_some(), algorithm == Algorithm::Gcra);
        assert_eq!(
            limit.concurrency(),
            (algorithm == Algorithm::Concurrency).then_some(30)
        );
        let window = matches!(
            algorithm,
            Algorithm::SlidingLog | Algorithm::FixedWindow | Algorithm::SlidingWindow
        );
        assert_eq!(limit.window().is_some(), window);
        if let Some(params) = limit.window() {
            assert_eq!(params.limit(), 30);
            assert_eq!(params.period(), 60_000_000_000);
        }
    }
    let gcra = Limit::new("limit-tests", Quota::per_minute(30).with_max_burst(4)).unwrap();
    assert_eq!(gcra.max_cost(), 5);
    let params = Quota::per_minute(30).with_max_burst(4).validate().unwrap();
    assert_eq!(gcra.gcra(), Some(&params));
    assert_eq!(gcra.tolerance(), Some(params.tolerance()));
    assert!(params.tolerance() > 0);
    for algorithm in [Algorithm::SlidingLog, Algorithm::Concurrency] {
        let limit = with(algorithm, Quota::per_minute(30).with_max_burst(4)).unwrap();
        let max_cost = limit.max_cost();
        assert_eq!(max_cost, 30, "{algorithm}: the count, not the burst");
    }
}

#[test]
fn with_algorithm_refuses_what_cannot_be_enforced() {
    for algorithm in ALL {
        let (zero, zero_burst) = (Quota::per_second(0), Quota::per_second(5).bursts_of(0));
        assert_eq!(refused(with(algorithm, zero)), QuotaError::ZeroCount);
        assert_eq!(refused(with(algorithm, zero_burst)), QuotaError::ZeroBurst);
        assert!(with(algorithm, Quota::per_second(MAX_UNIT_COUNT)).is_ok());
        let large = with(algorithm, Quota::per_second(MAX_UNIT_COUNT + 1));
        match algorithm {
            Algorithm::SlidingLog | Algorithm::Concurrency => {
                says(large.unwrap_err(), "count is at most 10000, not 10001")
            }
            _ => assert!(large.is_ok(), "{algorithm}"),
        }
    }
    for algorithm in [
        Algorithm::SlidingLog,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
    ] {
        let period = |nanos| Quota::per_period(5, Duration::from_nanos(nanos));
        assert_eq!(refused(with(algorithm, period(0))), QuotaError::ZeroPeriod);
        assert!(with(algorithm, period(1 << 62)).is_ok());
        let too_long = refused(with(algorithm, period((1 << 62) + 1)));
        assert!(matches!(too_long, QuotaError::PeriodTooLong(_)));
    }
    // A concurrency limit has no window: its period is not read.
    assert!(with(Algorithm::Concurrency, Quota::per_period(5, Duration::ZERO)).is_ok());
    assert!(with(Algorithm::FixedWindow, Quota::per_second(5)).is_ok());
    assert!(matches!(
        Limit::with_algorithm("bad name", Algorithm::FixedWindow, Quota::per_second(5)),
        Err(BuildError::InvalidName { .. })
    ));
}

#[test]
fn a_delay_widens_the_admitting_tolerance_only() {
    let limit = Limit::new("limit-delay", Quota::per_second(10)).unwrap();
    let tolerance = limit.tolerance().unwrap();
    assert_eq!(limit.delay(), None);
    let delayed = limit
        .clone()
        .with_delay(Duration::from_millis(300))
        .unwrap();
    assert_eq!(delayed.delay(), Some(Duration::from_millis(300)));
    assert_eq!(delayed.tolerance(), Some(tolerance));
    let admit = delayed.gcra().unwrap();
    assert_eq!(admit.tolerance(), tolerance + 300_000_000);
    assert_eq!(admit.limit(), limit.gcra().unwrap().limit());
    assert_eq!(
        admit.emission_interval(),
        limit.gcra().unwrap().emission_interval()
    );
    assert!(limit.clone().with_delay(MAX_DELAY).is_ok());
    for bad in [Duration::ZERO, MAX_DELAY + Duration::from_nanos(1)] {
        let error = limit.clone().with_delay(bad).unwrap_err();
        says(error, "more than 0 and at most 1 hour");
    }
    let window = with(Algorithm::FixedWindow, Quota::per_second(10)).unwrap();
    assert_eq!(window.delay(), None);
    let error = window.with_delay(Duration::from_secs(1)).unwrap_err();
    says(error, "needs algorithm \"gcra\", not \"fixed-window\"");
}

#[test]
fn a_lease_is_for_concurrency_limits_up_to_a_day() {
    let conn = with(Algorithm::Concurrency, Quota::per_second(2)).unwrap();
    assert_eq!(conn.lease(), Some(DEFAULT_LEASE));
    let five = conn.clone().with_lease(Duration::from_secs(5)).unwrap();
    assert_eq!(five.lease(), Some(Duration::from_secs(5)));
    assert_eq!(five.concurrency(), Some(2));
    let day = Duration::from_secs(24 * 3600);
    assert_eq!(conn.clone().with_lease(day).unwrap().lease(), Some(day));
    let least = Duration::from_millis(30);
    assert_eq!(conn.clone().with_lease(least).unwrap().lease(), Some(least));
    for bad in [
        Duration::ZERO,
        least - Duration::from_nanos(1),
        day + Duration::from_nanos(1),
    ] {
        let error = conn.clone().with_lease(bad).unwrap_err();
        says(error, "lease must be at least 30 ms and at most 1 day");
    }
    let gcra = Limit::new("limit-lease", Quota::per_second(2)).unwrap();
    assert_eq!(gcra.lease(), None);
    let error = gcra.with_lease(Duration::from_secs(5)).unwrap_err();
    says(error, "only for algorithm \"concurrency\"");
}

#[test]
fn a_budget_goes_only_with_a_plain_gcra_limit() {
    // with_budget's errors are checked in tests/memory/limits.rs; these are the accessors'.
    let budget = Budget::new().max_slice(7);
    let gcra = Limit::new("limit-budget", Quota::per_second(100)).unwrap();
    assert!(gcra.budget().is_none() && gcra.budget_error().is_none() && gcra.penalty().is_none());
    assert_eq!(gcra.with_budget(budget).unwrap().budget(), Some(&budget));
    let window = with(Algorithm::SlidingWindow, Quota::per_second(100)).unwrap();
    assert_eq!(
        window.budget_error().unwrap(),
        "policy \"limit-tests\": a leased budget is only for algorithm \"gcra\""
    );
}

#[test]
fn max_debt_meters_the_limit_and_caps_its_tat() {
    let limit = Limit::new("limit-debt", Quota::per_second(10)).unwrap();
    assert!(!limit.is_metered());
    assert_eq!(limit.max_debt(), 10);
    let params = *limit.gcra().unwrap();
    assert_eq!(params.ceiling(), params.tolerance());
    let metered = limit.with_max_debt(4);
    assert!(metered.is_metered());
    assert_eq!(metered.max_debt(), 4);
    let ceiling = params.tolerance() + 4 * params.emission_interval();
    assert_eq!(metered.gcra().unwrap().ceiling(), ceiling);
}

#[test]
fn names_are_validated_and_interned() {
    let a = Limit::new("limit-intern-a", Quota::per_second(1)).unwrap();
    let b = Limit::new("limit-intern-b", Quota::per_second(1)).unwrap();
    let c = Limit::new("limit-intern-c", Quota::per_second(1)).unwrap();
    let a2 = with(Algorithm::FixedWindow, Quota::per_second(1))
        .map(|_| ())
        .and(Limit::with_algorithm(
            "limit-intern-a",
            Algorithm::FixedWindow,
            Quota::per_second(1),
        ));
    assert_eq!(a2.unwrap().id(), a.id());
    assert!(a.id() != b.id() && b.id() != c.id() && a.id() != c.id());
    assert!(Limit::new("A_z.0-9", Quota::per_second(1)).is_ok());
    assert!(Limit::new("x".repeat(64), Quota::per_second(1)).is_ok());
    for (bad, why) in [
        ("", "is empty"),
        (&*"x".repeat(65), "is longer than 64 characters"),
        ("log in", "may only contain"),
        ("log:in", "may only contain"),
    ] {
        match Limit::new(bad, Quota::per_second(1)) {
            Err(BuildError::InvalidName { name, reason }) => {
                assert_eq!(name, bad);
                assert!(reason.starts_with(why), "{bad:?}: {reason}");
            }
            other => panic!("{bad:?}: {other:?}"),
        }
    }
}

#[test]
fn same_rules_compares_every_rule_but_the_name() {
    let base = Limit::new("limit-same-a", Quota::per_second(10)).unwrap();
    let renamed = Limit::new("limit-same-b", Quota::per_second(10)).unwrap();
    assert!(base.same_rules(&renamed));
    assert!(base.same_rules(&base.clone()));
    let penalty = Penalty::new(3, Duration::from_secs(10), Duration::from_secs(60)).unwrap();
    let conn = with(Algorithm::Concurrency, Quota::per_second(10)).unwrap();
    let different = [
        Limit::new("limit-same-a", Quota::per_second(11)).unwrap(),
        with(Algorithm::FixedWindow, Quota::per_second(10)).unwrap(),
        base.clone().with_delay(Duration::from_secs(1)).unwrap(),
        base.clone().with_penalty(penalty),
        base.clone().with_max_debt(3),
        // Metered with the default debt (its count): still a debt a plain limit would forgive.
        base.clone().with_max_debt(10),
    ];
    for other in &different {
        assert!(!base.same_rules(other), "{other:?}");
        assert!(!other.same_rules(&base), "{other:?}");
    }
    let leased = conn.clone().with_lease(Duration::from_secs(5)).unwrap();
    assert!(conn.same_rules(&conn.clone()));
    assert!(!conn.same_rules(&leased));
}

#[test]
fn override_state_is_apart_from_the_policys_own_however_long_its_name() {
    assert_eq!(crate::limit::override_state_name("api"), "api.override");
    let long = "p".repeat(60);
    let other = format!("{}q", "p".repeat(59));
    let (a, b) = (
        crate::limit::override_state_name(&long),
        crate::limit::override_state_name(&other),
    );
    assert!(
        a.len() <= 64 && a.ends_with(".override") && a != long,
        "{a}"
    );
    assert!(crate::limit::validate_name(&a).is_ok(), "{a}");
    assert_ne!(a, b, "two long names that start alike");
}
