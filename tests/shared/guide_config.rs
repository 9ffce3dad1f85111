//! What tests/middleware/guide_config.rs and tests/http/guide_config_on_redis.rs share.

/// The first TOML block of `page` after `marker`.
pub(crate) fn toml_block<'a>(page: &'a str, marker: &str) -> &'a str {
    let section = &page[page
        .find(marker)
        .unwrap_or_else(|| panic!("no {marker:?} on the page"))..];
    let start = section.find("```toml\n").expect("a toml block") + "```toml\n".len();
    &section[start..start + section[start..].find("```").unwrap()]
}
