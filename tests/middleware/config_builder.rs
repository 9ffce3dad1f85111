//! Every public builder option has a TOML key, and every `[[route]]` key sets a builder option.
//!
//! Three sources, none of them copied here: the route table's keys come from serde (the
//! unknown-field probe of `config_reference.rs`); the builder options from the source text of
//! `src/policy.rs`, `src/meter/builder.rs`, `src/rollout/builder.rs`, `src/policy/body_key.rs` and `src/policy/keyed.rs` (`PolicyBuilder`'s `pub fn`s) and `src/limit.rs` (`Limit`'s `pub fn with_*`);
//! the mapping from the rows of `src/config/options.rs` (`row(&[keys], &[options], how)`). A
//! builder option that TOML cannot express goes on [`NOT_IN_TOML`] with its reason.

use std::collections::{BTreeMap, BTreeSet};

use tower_throttle::config::Config;

const POLICY_RS: &str = include_str!("../../src/policy.rs");
/// `PolicyBuilder`'s metered-limit options, in a file of their own.
const POLICY_METERED_RS: &str = include_str!("../../src/meter/builder.rs");
const POLICY_ROLLOUT_RS: &str = include_str!("../../src/rollout/builder.rs");
/// `PolicyBuilder`'s keys from the body.
const POLICY_BODY_RS: &str = include_str!("../../src/policy/body_key.rs");
/// `PolicyBuilder`'s quotas with keys of their own.
const POLICY_KEYED_RS: &str = include_str!("../../src/policy/keyed.rs");
const LIMIT_RS: &str = include_str!("../../src/limit.rs");
const OPTIONS_RS: &str = include_str!("../../src/config/options.rs");

/// Builder options with no TOML key, each with why.
const NOT_IN_TOML: &[(&str, &str)] = &[
    // Not an option: it ends the builder.
    ("build", "finishes the policy; not an option"),
    // Same field as `quotas`, which the count/period/max_burst/quotas row sets.
    ("quota", "the one-quota spelling of `quotas`"),
    // Code, not data.
    ("quota_from", "a closure choosing a quota per request"),
    (
        "quota_resolver",
        "user code (a QuotaResolver) fetching quotas per key",
    ),
    // Without a resolver, which TOML cannot name, the timeout has nothing to time.
    ("resolver_timeout", "only used with quota_resolver"),
    ("async_key", "an async closure finding the key"),
];

/// The `pub fn`s of each `impl` block of `source`, by the implemented type's name.
fn pub_fns_by_type(source: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut by_type: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in source.lines() {
        if let Some(rest) = line.strip_prefix("impl") {
            // `impl<K> PolicyBuilder<K> {`, `impl Limit {`; trait impls (`for`) have no options.
            let rest = rest.trim_start_matches(|c| c != ' ').trim();
            current = (!rest.contains(" for ")).then(|| {
                rest.split(|c: char| !c.is_alphanumeric() && c != '_')
                    .next()
                    .unwrap()
                    .to_owned()
            });
        } else if line.starts_with('}') {
            current = None;
        } else if let (Some(ty), Some(rest)) = (&current, line.strip_prefix("    pub fn ")) {
            let name = rest
                .split(|c: char| !c.is_alphanumeric() && c != '_')
                .next()
                .unwrap();
            by_type
                .entry(ty.clone())
                .or_default()
                .insert(name.to_owned());
        }
    }
    by_type
}

/// The public builder options: `PolicyBuilder`'s methods, and `Limit::with_*`.
fn builder_options() -> BTreeSet<String> {
    let policy = pub_fns_by_type(POLICY_RS);
    let limit = pub_fns_by_type(LIMIT_RS);
    let mut options = policy["PolicyBuilder"].clone();
    options.extend(pub_fns_by_type(POLICY_METERED_RS)["PolicyBuilder"].clone());
    options.extend(pub_fns_by_type(POLICY_ROLLOUT_RS)["PolicyBuilder"].clone());
    options.extend(pub_fns_by_type(POLICY_BODY_RS)["PolicyBuilder"].clone());
    options.extend(pub_fns_by_type(POLICY_KEYED_RS)["PolicyBuilder"].clone());
    options.extend(
        limit["Limit"]
            .iter()
            .filter(|f| f.starts_with("with_"))
            .map(|f| format!("Limit::{f}")),
    );
    options
}

/// The quoted strings of a `&[...]` list.
fn quoted(list: &str) -> Vec<String> {
    list.split('"')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// The rows of `ROUTE_OPTIONS`: (TOML keys, builder options).
fn rows() -> Vec<(Vec<String>, Vec<String>)> {
    OPTIONS_RS
        .lines()
        .filter_map(|line| line.trim().strip_prefix("row(&["))
        .map(|row| {
            let (keys, rest) = row
                .split_once("], &[")
                .expect("row(&[keys], &[options], how)");
            let (options, _) = rest.split_once(']').expect("row(&[keys], &[options], how)");
            (quoted(keys), quoted(options))
        })
        .collect()
}

/// The keys of `[[route]]`, from serde's answer to an unknown one.
fn route_keys() -> BTreeSet<String> {
    let error = Config::from_toml("[[route]]\nzz_not_a_key = 0")
        .unwrap_err()
        .to_string();
    let at = error
        .find("expected one of")
        .unwrap_or_else(|| panic!("{error}"));
    let line = error[at..].lines().next().unwrap();
    line.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// Where the builder options, the table's rows and the route's keys disagree, one line each.
fn mismatches(
    options: &BTreeSet<String>,
    rows: &[(Vec<String>, Vec<String>)],
    keys: &BTreeSet<String>,
) -> Vec<String> {
    let mut problems = Vec::new();
    let mut row_of_key: BTreeMap<&str, usize> = BTreeMap::new();
    let mut set_by_rows = BTreeSet::new();
    for (i, (row_keys, row_options)) in rows.iter().enumerate() {
        if row_options.is_empty() {
            problems.push(format!("row {row_keys:?} sets no builder option"));
        }
        for key in row_keys {
            if let Some(other) = row_of_key.insert(key, i) {
                problems.push(format!("`{key}` is in two rows ({other} and {i})"));
            }
            if !keys.contains(key) {
                problems.push(format!("row {row_keys:?}: `{key}` is not a [[route]] key"));
            }
        }
        for option in row_options {
            // The row for `name`: the builder starts from it.
            if option != "Policy::builder" && !options.contains(option) {
                problems.push(format!("row {row_keys:?}: `{option}` is no builder option"));
            }
            set_by_rows.insert(option.clone());
        }
    }
    for key in keys {
        if !row_of_key.contains_key(key.as_str()) {
            problems.push(format!(
                "[[route]] key `{key}` maps to no builder option: add a row to src/config/options.rs"
            ));
        }
    }
    let allowed: BTreeMap<&str, &str> = NOT_IN_TOML.iter().copied().collect();
    for option in options {
        match (
            set_by_rows.contains(option),
            allowed.contains_key(option.as_str()),
        ) {
            (false, false) => problems.push(format!(
                "builder option `{option}` has no TOML key: add a row to src/config/options.rs, or \
                 put it on NOT_IN_TOML with the reason"
            )),
            (true, true) => problems.push(format!(
                "`{option}` has a TOML key and is on NOT_IN_TOML: take it off"
            )),
            _ => {}
        }
    }
    for option in allowed.keys() {
        if !options.contains(*option) {
            problems.push(format!("NOT_IN_TOML names `{option}`, no builder option"));
        }
    }
    problems
}

#[test]
fn every_builder_option_has_a_toml_key_and_every_key_an_option() {
    let options = builder_options();
    let rows = rows();
    let keys = route_keys();
    // The readers found what they read (a broken reader would find nothing and pass).
    assert!(options.contains("tier_header") && options.contains("Limit::with_delay"));
    assert!(keys.contains("count") && keys.contains("tiers"), "{keys:?}");
    assert!(rows.len() > 10, "{rows:?}");
    assert!(pub_fns_by_type(POLICY_RS)["Policy"].contains("builder"));
    let problems = mismatches(&options, &rows, &keys);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_check_reports_an_option_without_a_key_and_a_key_without_an_option() {
    let mut options = builder_options();
    options.insert("with_colour".to_owned());
    let mut keys = route_keys();
    keys.insert("colour".to_owned());
    let mut rows = rows();
    rows.push((vec!["shade".to_owned()], vec!["with_shade".to_owned()]));
    let problems = mismatches(&options, &rows, &keys).join("\n");
    assert!(
        problems.contains("builder option `with_colour` has no TOML key"),
        "{problems}"
    );
    assert!(
        problems.contains("[[route]] key `colour` maps to no builder option"),
        "{problems}"
    );
    assert!(
        problems.contains("`shade` is not a [[route]] key"),
        "{problems}"
    );
    assert!(
        problems.contains("`with_shade` is no builder option"),
        "{problems}"
    );
}
