//! The configuration reference (`src/guide/configuration.md`) names every key of the TOML schema,
//! and only those.
//!
//! Where the schema's keys come from: serde itself. Every table of the file is a
//! `#[serde(deny_unknown_fields)]` struct, and serde answers an unknown key in such a struct with
//! its complete field list as the derive generated it (`unknown field `zz`, expected one of `a`,
//! `b``), renames applied. So each probe below parses a file with one unknown key in one table and
//! reads the list from the error. This follows the code wherever the structs live and whatever
//! attributes they carry, where parsing `schema.rs`'s source would break on a moved file, a
//! `rename` or a `flatten`; and it needs no `Serialize` impl that the crate does not otherwise want.
//!
//! What it cannot see: a table reached through an untagged enum (serde then reports only that no
//! variant matched). `budget = { .. }` is probed on its struct ([`BudgetTuning`]) directly, and
//! `redact_keys = { secret_env }` is pinned by a destructuring pattern that stops compiling when the
//! variant gains or loses a field. A new nested table needs a probe here; the new key itself is caught
//! anyway, since its parent's list names it and the page must then list it.

use std::collections::BTreeMap;
use std::collections::BTreeSet;

use crate::server_settings::{AdminConfig, ServerConfig};
use tower_throttle::config::{BudgetTuning, Config, RedactKeys};

const PAGE: &str = include_str!("../../src/guide/configuration.md");
const UNKNOWN: &str = "zz_not_a_key";

/// The field list serde gives in `error`, the message of an unknown key `UNKNOWN`.
fn listed_fields(error: &str) -> BTreeSet<String> {
    let at = error
        .find(&format!("unknown field `{UNKNOWN}`"))
        .unwrap_or_else(|| panic!("not an unknown-field error: {error}"));
    let rest = &error[at + UNKNOWN.len() + "unknown field ``".len()..];
    if rest
        .trim_start_matches(", ")
        .starts_with("there are no fields")
    {
        return BTreeSet::new();
    }
    // ", expected `a`" or ", expected one of `a`, `b`": every backquoted name up to the line's end.
    let line = rest.lines().next().unwrap();
    line.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// The fields of the table that `toml` puts `UNKNOWN` into, through `Config::from_toml`.
fn probe(toml: &str) -> BTreeSet<String> {
    let toml = toml.replace("UNKNOWN", UNKNOWN);
    match Config::from_toml(&toml) {
        Ok(_) => panic!("an unknown key was accepted:\n{toml}"),
        Err(e) => listed_fields(&e.to_string()),
    }
}

/// The variants of `[backend]`'s `kind` tag, from the error of an unknown one.
fn backend_kinds() -> Vec<String> {
    let error = Config::from_toml("[backend]\nkind = \"zz_kind\"")
        .unwrap_err()
        .to_string();
    let rest = &error[error
        .find("unknown variant `zz_kind`")
        .unwrap_or_else(|| panic!("{error}"))..];
    let line = rest.lines().next().unwrap();
    line.split('`')
        .skip(1)
        .step_by(2)
        .skip(1)
        .map(str::to_owned)
        .collect()
}

/// Each table of the schema, by the heading of its section on the page, with its keys.
fn schema() -> BTreeMap<String, BTreeSet<String>> {
    let mut tables = BTreeMap::new();
    tables.insert("Top level".to_owned(), probe("UNKNOWN = 0"));
    let kinds = backend_kinds();
    assert!(kinds.len() >= 2, "{kinds:?}");
    for kind in kinds {
        let mut keys = probe(&format!("[backend]\nkind = \"{kind}\"\nUNKNOWN = 0"));
        // The tag (`#[serde(tag = "kind")]`) is a key of the table, but not a field of a variant.
        keys.insert("kind".to_owned());
        tables.insert(format!("`[backend]` with `kind = \"{kind}\"`"), keys);
    }
    tables.insert("`[access]`".to_owned(), probe("[access]\nUNKNOWN = 0"));
    tables.insert("`[logging]`".to_owned(), probe("[logging]\nUNKNOWN = 0"));
    tables.insert("`[overload]`".to_owned(), probe("[overload]\nUNKNOWN = 0"));
    tables.insert(
        "`partitions = [{ .. }]`".to_owned(),
        probe("[overload]\npartitions = [{ UNKNOWN = 0 }]"),
    );
    // The library keeps these two tables for the server that runs it: the example server's types
    // read them.
    let unknown = format!("{UNKNOWN} = 0");
    let admin = toml::from_str::<AdminConfig>(&unknown).unwrap_err();
    tables.insert("`[admin]`".to_owned(), listed_fields(&admin.to_string()));
    let server = toml::from_str::<ServerConfig>(&unknown).unwrap_err();
    tables.insert("`[server]`".to_owned(), listed_fields(&server.to_string()));
    tables.insert("`[[route]]`".to_owned(), probe("[[route]]\nUNKNOWN = 0"));
    let route = "[[route]]\nname = \"a\"\nkey = \"ip\"\n";
    tables.insert(
        "`[route.tiers.<name>]`".to_owned(),
        probe(&format!("{route}[route.tiers.paid]\nUNKNOWN = 0")),
    );
    tables.insert(
        "`quotas = [{ .. }]`".to_owned(),
        probe(&format!("{route}quotas = [{{ UNKNOWN = 0 }}]")),
    );
    tables.insert(
        "`when = { .. }`".to_owned(),
        probe(&format!("{route}when = {{ UNKNOWN = 0 }}")),
    );
    tables.insert(
        "`penalty = { .. }`".to_owned(),
        probe(&format!("{route}penalty = {{ UNKNOWN = 0 }}")),
    );
    tables.insert(
        "`metered = { .. }`".to_owned(),
        probe(&format!("{route}metered = {{ UNKNOWN = 0 }}")),
    );
    // Untagged (`true` or a table): probed on the table's own struct.
    let budget = toml::from_str::<BudgetTuning>(&format!("{UNKNOWN} = 0")).unwrap_err();
    tables.insert(
        "`budget = { .. }`".to_owned(),
        listed_fields(&budget.to_string()),
    );
    // Untagged: the pattern names every field of the variant (no `..`), so a field added
    // or renamed fails to compile here; the parse shows that the TOML key is the field's name.
    let redact: BTreeMap<String, RedactKeys> =
        toml::from_str("r = { secret_env = \"VAR\" }").unwrap();
    let RedactKeys::Secret { secret_env } = &redact["r"] else {
        panic!("{{ secret_env = .. }} did not parse as RedactKeys::Secret")
    };
    assert_eq!(secret_env, "VAR");
    // A misspelt key beside it is an error, not ignored.
    let typo =
        toml::from_str::<BTreeMap<String, RedactKeys>>("r = { secret_env = \"V\", typo = 1 }");
    assert!(typo.is_err(), "{typo:?}");
    tables.insert(
        "`redact_keys = { .. }`".to_owned(),
        BTreeSet::from(["secret_env".to_owned()]),
    );
    tables
}

/// The sections (`## heading`) of the page `text` with the keys of their table rows (the first
/// column's backquoted name). Code blocks are skipped.
fn page(text: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut sections: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut current: Option<String> = None;
    let mut in_code = false;
    for line in text.lines() {
        if line.starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if in_code {
            continue;
        }
        if let Some(heading) = line.strip_prefix("## ") {
            let heading = heading.trim().to_owned();
            assert!(
                sections.insert(heading.clone(), BTreeSet::new()).is_none(),
                "the page has two sections {heading:?}"
            );
            current = Some(heading);
        } else if let Some(row) = line.strip_prefix("| `") {
            let key = &row[..row.find('`').unwrap()];
            let section = current
                .as_ref()
                .unwrap_or_else(|| panic!("a key row before any section: {line}"));
            let keys = sections.get_mut(section).unwrap();
            assert!(keys.insert(key.to_owned()), "{section}: `{key}` twice");
        }
    }
    sections
}

/// Where the page and the schema disagree, one line each.
fn disagreements(
    schema: &BTreeMap<String, BTreeSet<String>>,
    page: &BTreeMap<String, BTreeSet<String>>,
) -> Vec<String> {
    let mut problems = Vec::new();
    for (table, keys) in schema {
        let Some(listed) = page.get(table) else {
            problems.push(format!("no section `## {table}` (keys {keys:?})"));
            continue;
        };
        for key in keys.difference(listed) {
            problems.push(format!(
                "{table}: the schema has `{key}`, the page does not"
            ));
        }
        for key in listed.difference(keys) {
            problems.push(format!(
                "{table}: the page names `{key}`, the schema has no such key"
            ));
        }
    }
    for (section, keys) in page {
        if !schema.contains_key(section) && !keys.is_empty() {
            problems.push(format!(
                "section `## {section}` lists keys {keys:?} of no table of the schema"
            ));
        }
    }
    problems
}

#[test]
fn the_configuration_reference_names_every_schema_key_and_no_other() {
    let schema = schema();
    // The probes found the schema (a broken probe would find empty sets).
    assert!(schema["`[[route]]`"].contains("count"), "{schema:?}");
    assert!(schema["Top level"].contains("route"), "{schema:?}");
    let problems = disagreements(&schema, &page(PAGE));
    assert!(
        problems.is_empty(),
        "src/guide/configuration.md and the schema disagree:\n{}",
        problems.join("\n")
    );
}

/// The check reports what it is for: a key missing from the page, a key the schema lacks, and a
/// table without its section.
#[test]
fn the_reference_check_reports_a_missing_an_unknown_key_and_a_missing_table() {
    let schema = schema();
    let edited = PAGE
        .replace("| `cost` |", "| `costs` |")
        .replace("## `penalty = { .. }`", "## `penalties = { .. }`");
    let problems = disagreements(&schema, &page(&edited));
    let expect = [
        "`[[route]]`: the schema has `cost`, the page does not",
        "`[[route]]`: the page names `costs`, the schema has no such key",
        "no section `## `penalty = { .. }`` (keys {\"after\", \"ban\", \"within\"})",
        "section `## `penalties = { .. }`` lists keys {\"after\", \"ban\", \"within\"} of no table of the schema",
    ];
    for line in expect {
        assert!(
            problems.iter().any(|p| p == line),
            "{line:?} not in {problems:#?}"
        );
    }
    assert_eq!(problems.len(), expect.len(), "{problems:#?}");
}
