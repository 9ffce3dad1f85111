//! The crate's front: the names at its root, each with its line in the crate docs' Vocabulary; and
//! no layer constructor that panics on a policy that built.

use std::collections::BTreeSet;

use tower_throttle::key::{Composite, Global, Header, KeySpec, PeerIp};
use tower_throttle::policy::Budget;
use tower_throttle::{Algorithm, Estimate, Limit, Policy, PolicyBuilder, Quota, ThrottleLayer};

/// The most names the crate root may hold (modules aside).
const MAX_ROOT_NAMES: usize = 20;

/// The root's public names, from `src/lib.rs`: `(items, modules)`.
fn root_names() -> (BTreeSet<String>, BTreeSet<String>) {
    let lib = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/src/lib.rs")).unwrap();
    let (mut items, mut modules) = (BTreeSet::new(), BTreeSet::new());
    let mut statement = String::new();
    let mut depth = 0usize;
    for line in lib.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with("//") || trimmed.starts_with("#[") {
            continue;
        }
        // Only the root's own statements: not those inside `pub mod x { … }`. A `pub use`
        // statement's own braces do not count.
        if depth == 0 || !statement.is_empty() {
            if let Some(name) = trimmed.strip_prefix("pub mod ") {
                let name = name.trim_end_matches([';', '{', ' ']);
                modules.insert(name.to_owned());
            }
            if trimmed.starts_with("pub use ") || !statement.is_empty() {
                statement.push_str(trimmed);
                statement.push(' ');
                if trimmed.ends_with(';') {
                    let tree = statement
                        .trim_start_matches("pub use ")
                        .trim_end_matches([';', ' ']);
                    let leaves: Vec<&str> = match tree.split_once('{') {
                        Some((_, group)) => group.trim_end_matches('}').split(',').collect(),
                        None => vec![tree.rsplit("::").next().unwrap()],
                    };
                    for leaf in leaves.iter().map(|l| l.trim()).filter(|l| !l.is_empty()) {
                        let name = leaf
                            .rsplit(" as ")
                            .next()
                            .unwrap()
                            .rsplit("::")
                            .next()
                            .unwrap();
                        // `pub use middleware::body;` re-exports a module.
                        if name.chars().next().unwrap().is_lowercase() {
                            modules.insert(name.to_owned());
                        } else {
                            items.insert(name.to_owned());
                        }
                    }
                    statement.clear();
                }
                continue;
            }
        }
        depth += line.matches('{').count();
        depth -= line.matches('}').count();
    }
    (items, modules)
}

#[test]
fn every_root_name_has_its_vocabulary_line_and_there_are_few() {
    let (items, modules) = root_names();
    println!("{} names at the root: {items:?}", items.len());
    println!("{} public modules: {modules:?}", modules.len());
    let lib = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/src/lib.rs")).unwrap();
    let vocabulary: Vec<&str> = lib
        .split("# Vocabulary")
        .nth(1)
        .expect("the crate docs have a Vocabulary")
        .lines()
        .skip(1)
        .take_while(|l| l.starts_with("//!"))
        .filter(|l| l.starts_with("//! | "))
        .collect();
    for name in &items {
        let entry = format!("| [`{name}`] |");
        assert!(
            vocabulary
                .iter()
                .any(|l| l.starts_with(&format!("//! {entry}"))),
            "the root name {name} has no line `{entry} … |` in the crate docs' Vocabulary"
        );
    }
    let module_table: Vec<&str> = lib
        .split("//! # Modules")
        .nth(1)
        .expect("the crate docs have a module table")
        .lines()
        .skip_while(|l| !l.starts_with("//! |"))
        .take_while(|l| l.starts_with("//! |"))
        .collect();
    for module in &modules {
        let link = format!("[`{module}`]");
        assert!(
            module_table
                .iter()
                .any(|l| l.split('|').nth(1).is_some_and(|c| c.contains(&link))),
            "the module {module} has no line in the crate docs' module table"
        );
    }
    assert!(
        items.len() <= MAX_ROOT_NAMES,
        "{} names at the root, more than {MAX_ROOT_NAMES}: {items:?}",
        items.len()
    );
}

/// The constructor of the issue that found the panic: a stacked `1s` quota and a tier named `1s`
/// both make the limit `api.1s`. The policy does not build, so no layer can panic on it.
#[test]
fn a_tier_named_like_a_stacked_period_is_a_build_error() {
    let err = Policy::builder("api")
        .key(Global)
        .quotas([Quota::per_second(10), Quota::per_day(1000)])
        .tier("1s", [Quota::per_second(100)])
        .build()
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "policy \"api\": the limit name \"api.1s\" is made twice, by the policy's own quotas and \
         by tier \"1s\"; limits of one policy never share state: rename the tier"
    );
}

#[test]
fn a_policy_without_a_key_is_a_build_error_that_lists_the_key_types() {
    let err = Policy::builder("api")
        .quota(Quota::per_second(10))
        .build()
        .unwrap_err()
        .to_string();
    for name in [
        "no key",
        ".key(",
        "key::PeerIp",
        "key::ClientIp",
        "key::Header",
        "key::Global",
    ] {
        assert!(err.contains(name), "{err}");
    }
}

/// A small deterministic generator (xorshift), so that a failure names its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn pick<'a, T>(&mut self, from: &'a [T]) -> &'a T {
        &from[self.below(from.len() as u64) as usize]
    }
}

/// Names chosen to collide with the ones the builder makes: periods (`1s`), `shadow`, the
/// metered limit's, dotted ones.
const NAMES: &[&str] = &[
    "api",
    "api.1s",
    "1s",
    "1m",
    "shadow",
    "api.shadow",
    "tokens",
    "paid",
    "x",
];

fn quota(rng: &mut Rng) -> Quota {
    let count = 1 + rng.below(100);
    let quota = match rng.below(4) {
        0 => Quota::per_second(count),
        1 => Quota::per_minute(count),
        2 => Quota::per_hour(count),
        _ => Quota::per_day(count),
    };
    if rng.below(2) == 0 {
        quota.bursts_of(1 + rng.below(50))
    } else {
        quota
    }
}

fn quotas(rng: &mut Rng) -> Vec<Quota> {
    (0..1 + rng.below(3)).map(|_| quota(rng)).collect()
}

/// A policy from the seed, through every option that names limits (a metered limit's name
/// starts with `metered`); `None` when the builder refuses it (which is what it may do).
fn policy(rng: &mut Rng, name: &str, route: &str, metered: &str) -> Option<Policy<KeySpec>> {
    let algorithms = [
        Algorithm::Gcra,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::SlidingLog,
        Algorithm::Concurrency,
    ];
    let key = rng
        .pick(&[
            KeySpec::Global,
            KeySpec::PeerIp(PeerIp::new()),
            KeySpec::Header(Header::new("x-user-id")),
            KeySpec::Composite(
                Composite::new([KeySpec::Header(Header::new("x-user-id")), KeySpec::Global])
                    .unwrap(),
            ),
        ])
        .clone();
    let mut builder: PolicyBuilder<KeySpec> = Policy::builder(name).key(key).route(route);
    builder = match rng.below(3) {
        0 => builder.quota(quota(rng)),
        1 => builder.quotas(quotas(rng)),
        _ => builder,
    };
    if rng.below(3) == 0 {
        builder = builder.algorithm(*rng.pick(&algorithms));
    }
    for _ in 0..rng.below(3) {
        let tier = *rng.pick(NAMES);
        builder = builder.tier(tier, quotas(rng));
    }
    for _ in 0..rng.below(3) {
        builder = builder.shadow(quota(rng));
    }
    if rng.below(3) == 0 {
        let limit = Limit::new(format!("{metered}{}", rng.pick(NAMES)), quota(rng)).ok()?;
        builder = builder.metered(limit, Estimate::fixed(1 + rng.below(5)));
    }
    if rng.below(4) == 0 {
        builder = builder.dry_run(true);
    }
    if rng.below(4) == 0 {
        builder = builder.enforce_fraction(0.5);
    }
    if rng.below(5) == 0 {
        builder = builder.budget(Budget::new());
    }
    if rng.below(4) == 0 {
        builder = builder.cost(1 + rng.below(3));
    }
    builder.build().ok()
}

/// Any policy the builder accepts makes a layer: alone, through the constructor that cannot
/// return an error, and beside another policy on another route in one table.
#[test]
fn every_policy_that_builds_makes_a_layer_alone_and_beside_others() {
    let (mut built, mut tried) = (0, 0);
    for seed in 1..=3_000u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        tried += 1;
        let name = *rng.pick(NAMES);
        let Some(first) = policy(&mut rng, name, "/first", "") else {
            continue;
        };
        built += 1;
        let alone = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            ThrottleLayer::new(first.clone())
        }));
        assert!(
            alone.is_ok(),
            "seed {seed}: ThrottleLayer::new panicked on {first:?}"
        );
        // Another policy under another name on another route: nothing they share.
        if let Some(second) = policy(&mut rng, "other", "/second", "other-") {
            let table = ThrottleLayer::builder()
                .policy(first.clone())
                .policy(second.clone())
                .build();
            assert!(
                table.is_ok(),
                "seed {seed}: two policies that share nothing make no table: {:?}\n{first:?}\n{second:?}",
                table.err()
            );
        }
    }
    // The generator reaches the builder's accepted policies, not only its refusals.
    println!("{built} of {tried} generated policies built");
    assert!(
        built * 10 > tried,
        "only {built} of {tried} generated policies built"
    );
}
