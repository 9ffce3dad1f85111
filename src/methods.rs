//! The HTTP methods a policy may name: the standard ones (RFC 9110 and RFC 5789's `PATCH`), and
//! custom ones only where asked for, with a suggestion for a misspelt one.

use http::Method;

/// The methods HTTP defines (RFC 9110 and RFC 5789's `PATCH`): the only ones
/// [`PolicyBuilder::methods`](crate::PolicyBuilder::methods) accepts.
const STANDARD_METHODS: [Method; 9] = [
    Method::GET,
    Method::HEAD,
    Method::POST,
    Method::PUT,
    Method::DELETE,
    Method::PATCH,
    Method::OPTIONS,
    Method::CONNECT,
    Method::TRACE,
];

/// The methods a policy applies to (`None`: every method), from the standard `methods` and the
/// opted-in `custom` ones. A method that cannot be what the user meant is an error: a limit on a
/// misspelt method would silently leave the real one unlimited.
pub(crate) fn methods_of(
    methods: Option<Vec<Method>>,
    custom: Option<Vec<Method>>,
) -> Result<Option<Box<[Method]>>, String> {
    if methods.as_ref().is_some_and(Vec::is_empty) {
        return Err("methods is empty (leave it out to match every method)".into());
    }
    if custom.as_ref().is_some_and(Vec::is_empty) {
        return Err("custom_methods is empty (leave it out)".into());
    }
    for method in methods.iter().flatten() {
        if !STANDARD_METHODS.contains(method) {
            let hint = match closest_standard_method(method.as_str()) {
                Some(standard) => format!(" (did you mean {standard:?}?)"),
                None => String::new(),
            };
            return Err(format!(
                "method {:?} is not a standard HTTP method{hint}; list a non-standard method in \
                 custom_methods",
                method.as_str()
            ));
        }
    }
    for method in custom.iter().flatten() {
        let name = method.as_str();
        // Methods are case-sensitive: a standard one in another case is one no client sends.
        if let Some(standard) = STANDARD_METHODS
            .iter()
            .find(|m| m.as_str().eq_ignore_ascii_case(name))
        {
            let spelled = match standard.as_str() == name {
                true => String::new(),
                false => format!(" {:?} (methods are case-sensitive)", standard.as_str()),
            };
            return Err(format!(
                "{name:?} is a standard method{spelled}: list it in methods, not custom_methods"
            ));
        }
    }
    if methods.is_none() && custom.is_none() {
        return Ok(None);
    }
    let mut all: Vec<Method> = methods.into_iter().chain(custom).flatten().collect();
    // axum's `get` answers HEAD with the GET handler: a GET policy that let HEAD through would let
    // anyone run the handler unlimited.
    if all.contains(&Method::GET) && !all.contains(&Method::HEAD) {
        all.push(Method::HEAD);
    }
    Ok(Some(all.into_boxed_slice()))
}

/// The standard method `name` is most likely a misspelling of (case aside, at most two letters
/// inserted, deleted, replaced or swapped), if any.
fn closest_standard_method(name: &str) -> Option<&'static str> {
    let name = name.to_ascii_uppercase();
    STANDARD_METHODS
        .iter()
        .map(|m| (edit_distance(&name, m.as_str()), m.as_str()))
        .filter(|(distance, _)| *distance <= 2)
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, standard)| standard)
}

/// The optimal string alignment distance between `a` and `b`: single-byte insertions, deletions,
/// substitutions and swaps of adjacent bytes.
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    // rows[i][j]: the distance between a[..i] and b[..j].
    let mut rows = vec![vec![0; b.len() + 1]; a.len() + 1];
    for (i, row) in rows.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in rows[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let substitution = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (rows[i - 1][j] + 1)
                .min(rows[i][j - 1] + 1)
                .min(rows[i - 1][j - 1] + substitution);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(rows[i - 2][j - 2] + 1);
            }
            rows[i][j] = best;
        }
    }
    rows[a.len()][b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn misspellings_suggest_the_standard_method() {
        assert_eq!(closest_standard_method("PSOT"), Some("POST"));
        assert_eq!(closest_standard_method("DELTE"), Some("DELETE"));
        assert_eq!(closest_standard_method("patch"), Some("PATCH"));
        assert_eq!(closest_standard_method("OPTION"), Some("OPTIONS"));
        assert_eq!(closest_standard_method("PROPFIND"), None);
        assert_eq!(closest_standard_method("MKCOL"), None);
    }
}
