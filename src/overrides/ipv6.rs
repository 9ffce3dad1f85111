//! IPv6 address patterns of overrides and bans: written and matched in whole groups
//! (`2001:db8:0:*`), as an address's shown form drops zero groups (`2001:db8::`) and a pattern of
//! its text would match no network.

use crate::key::Key;

/// The start of an IPv6 address as whole groups (`2001:0DB8:0:`), written as the overrides'
/// matching reads IPv6 keys: each group in lower case without leading zeros (`2001:db8:0:`).
/// `None` for a partial group, `::` or more than seven groups.
pub(crate) fn ipv6_groups(digits: &str) -> Option<String> {
    let groups = digits.strip_suffix(':')?.split(':');
    let mut written = String::new();
    for (i, group) in groups.enumerate() {
        let value = (i < 7 && (1..=4).contains(&group.len()))
            .then(|| u16::from_str_radix(group, 16).ok())??;
        written.push_str(&format!("{value:x}:"));
    }
    Some(written)
}

/// A pattern of text as keys are matched against it: an IPv6 one in whole groups (as written by
/// this version); one written as such keys show (`!2001:db8::`, by an earlier one) matches none,
/// and says so.
pub(crate) fn address_text(prefix: &str) -> String {
    let Some(digits) = prefix.strip_prefix('!').filter(|d| d.contains(':')) else {
        return prefix.to_owned();
    };
    match ipv6_groups(digits) {
        Some(groups) => format!("!{groups}"),
        None => {
            tracing::warn!(
                prefix,
                "an IPv6 pattern not in whole groups matches no key: write them (2001:db8:0:*)"
            );
            prefix.to_owned()
        }
    }
}

/// `key` as patterns of text match it: as logs show it, but an IPv6 address in whole groups
/// (`!2001:db8:0:0:0:0:0:1`), whose shown form drops zero groups (`!2001:db8::1`): a pattern of
/// its first groups then matches every address in their network.
pub(crate) fn pattern_text(key: &Key) -> String {
    use std::fmt::Write;
    match key.ip() {
        Some(std::net::IpAddr::V6(ip)) => {
            let mut text = String::with_capacity(40);
            for group in ip.segments() {
                let _ = write!(text, "{}{group:x}", if text.is_empty() { '!' } else { ':' });
            }
            text
        }
        _ => key.to_string(),
    }
}
