//! [`Route`]: a policy's route pattern in axum 0.8 syntax, validated when the policy is built and
//! matched exactly as axum's router matches it (with `matchit`, the router's own matcher).

use http::Request;

#[derive(Clone, Debug)]
pub(crate) struct Route {
    pattern: String,
    /// A router holding only this route: axum's own matcher, so the policy matches a request path
    /// exactly when axum would route it here.
    router: matchit::Router<()>,
}

impl Route {
    pub(crate) fn pattern(&self) -> &str {
        &self.pattern
    }

    pub(crate) fn parse(pattern: &str) -> Result<Route, String> {
        if !pattern.starts_with('/') {
            return Err(format!("route {pattern:?} must start with '/'"));
        }
        if let Some(c) = pattern
            .chars()
            .find(|c| c.is_whitespace() || c.is_control() || matches!(c, '?' | '#'))
        {
            let why = match c {
                '?' => "the query string is not part of the path a route matches",
                '#' => "a fragment is never sent to the server",
                _ => "a request path never contains one (percent-encode it as clients send it)",
            };
            return Err(format!("route {pattern:?} contains {c:?}: {why}"));
        }
        // axum 0.8 refuses these at `Router::route` (unless `without_v07_checks`); as a literal a
        // policy's `/users/:id` would match only the path `/users/:id`, never `/users/7`.
        for segment in pattern.split('/') {
            let (what, written) = match segment.split_at_checked(1) {
                Some((":", name)) => ("parameter", format!("{{{name}}}")),
                Some(("*", name)) => ("wildcard", format!("{{*{name}}}")),
                _ => continue,
            };
            return Err(format!(
                "route {pattern:?}: {segment:?} is axum 0.7 syntax; axum 0.8 writes a {what} as \
                 {written}"
            ));
        }
        let mut router = matchit::Router::new();
        router.insert(pattern, ()).map_err(|e| {
            let why = match e {
                matchit::InsertError::InvalidParamSegment => {
                    "only one parameter is allowed per segment, after any literal text \
                     (`/v{version}` is a route, `/{name}.json` is not)"
                        .to_owned()
                }
                matchit::InsertError::InvalidParam => {
                    "a parameter needs a name and matching braces (`{id}`; `{{` and `}}` are \
                     literal braces)"
                        .to_owned()
                }
                matchit::InsertError::InvalidCatchAll => {
                    "a wildcard {*name} must be the end of the route".to_owned()
                }
                other => other.to_string(),
            };
            format!("route {pattern:?}: {why}")
        })?;
        Ok(Route {
            pattern: pattern.to_owned(),
            router,
        })
    }

    /// Whether `other` is the same route, spelt perhaps with other parameter names.
    pub(crate) fn same_route(&self, other: &Route) -> bool {
        same_shape(&self.pattern, &other.pattern)
    }

    /// The route with its parameters' names erased (`/users/{}`, `/files/{*}`): equal for exactly
    /// the patterns [`same_route`](Self::same_route) calls the same, so it can key a map.
    pub(crate) fn shape(&self) -> String {
        let mut shape = String::with_capacity(self.pattern.len());
        for piece in pieces(&self.pattern) {
            match piece {
                Piece::Char('{') => shape.push_str("{{"),
                Piece::Char('}') => shape.push_str("}}"),
                Piece::Char(c) => shape.push(c),
                Piece::Param => shape.push_str("{}"),
                Piece::CatchAll => shape.push_str("{*}"),
            }
        }
        shape
    }

    pub(crate) fn has_param(&self, name: &str) -> bool {
        let (plain, wildcard) = (format!("{{{name}}}"), format!("{{*{name}}}"));
        [plain, wildcard].iter().any(|p| {
            self.pattern
                .match_indices(p.as_str())
                // `{{name}}` is the literal text `{name}`, not a parameter.
                .any(|(at, _)| !self.pattern[..at].ends_with('{'))
        })
    }

    /// The raw (still percent-encoded) value of the parameter `name` in the request's path, if the
    /// path is this route. Inside axum's `Router::nest`, a path that still carries the nest's
    /// prefix is matched without it, and a route written whole (`/api/orders/{id}`) is matched
    /// with it.
    pub(crate) fn param<'r, B>(&self, request: &'r Request<B>, name: &str) -> Option<&'r str> {
        let path = request.uri().path();
        if let Ok(found) = self.router.at(path) {
            return found.params.get(name);
        }
        #[cfg(feature = "axum")]
        if let Some(nested) = request.extensions().get::<axum::extract::NestedPath>() {
            let prefix = nested.as_str().trim_end_matches('/');
            // The prefix's whole segments (`/api` is not the start of `/apikeys`).
            let rest = path
                .strip_prefix(prefix)
                .filter(|r| r.is_empty() || r.starts_with('/'));
            if let Some(Ok(found)) = rest.map(|rest| self.router.at(rest)) {
                return found.params.get(name);
            }
            // axum strips the prefix before the nested router's layers: the path is put back
            // under it, unless the prefix has parameters, whose values are gone with it.
            if !prefix.contains('{') {
                let whole = format!("{prefix}{path}");
                let found = self.router.at(&whole).ok()?;
                let value = found.params.get(name)?;
                // The value is in the prefix or in the request's path (borrowed from the
                // request, not from `whole`); one across both is none.
                let at = (value.as_ptr() as usize).checked_sub(whole.as_ptr() as usize)?;
                return match at.checked_sub(prefix.len()) {
                    Some(at) => path.get(at..at + value.len()),
                    None => prefix.get(at..at + value.len()),
                };
            }
        }
        None
    }

    pub(crate) fn matches<B>(&self, request: &Request<B>) -> bool {
        #[cfg(feature = "axum")]
        if let Some(matched) = request.extensions().get::<axum::extract::MatchedPath>() {
            let matched = matched.as_str();
            if same_shape(matched, &self.pattern) {
                return true;
            }
            // Inside `Router::nest("/api", ..)` axum's MatchedPath is the full "/api/users/{id}"; the
            // nested router's own "/users/{id}" names the same route (nested at "/api/" too).
            let nested = request.extensions().get::<axum::extract::NestedPath>();
            let rest = nested.and_then(|n| matched.strip_prefix(n.as_str().trim_end_matches('/')));
            return match rest {
                Some("") => self.pattern == "/",
                Some(rest) => same_shape(rest, &self.pattern),
                None => false,
            };
        }
        self.matches_path(request.uri().path())
    }

    fn matches_path(&self, path: &str) -> bool {
        self.router.at(path).is_ok()
    }
}

/// One piece of a route pattern, parameter names erased.
#[derive(Debug, PartialEq, Eq)]
enum Piece {
    Char(char),
    Param,
    CatchAll,
}

/// Whether two axum route patterns are the same route: equal but for the names of their parameters
/// (`/users/{id}` and `/users/{user_id}`), which axum's router could not hold side by side either.
fn same_shape(a: &str, b: &str) -> bool {
    a == b || pieces(a).eq(pieces(b))
}

/// A pattern's pieces: its characters, `{{`/`}}` as literal braces, each parameter as one piece.
fn pieces(pattern: &str) -> impl Iterator<Item = Piece> + '_ {
    let mut chars = pattern.chars().peekable();
    std::iter::from_fn(move || {
        let c = chars.next()?;
        Some(match c {
            '{' if chars.next_if_eq(&'{').is_some() => Piece::Char('{'),
            '}' if chars.next_if_eq(&'}').is_some() => Piece::Char('}'),
            '{' => {
                let catch_all = chars.next_if_eq(&'*').is_some();
                for c in chars.by_ref() {
                    if c == '}' {
                        break;
                    }
                }
                if catch_all {
                    Piece::CatchAll
                } else {
                    Piece::Param
                }
            }
            c => Piece::Char(c),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_match_like_axum() {
        let r = Route::parse("/users/{id}/posts").unwrap();
        assert!(r.matches_path("/users/7/posts"));
        // As in axum 0.8 (matchit 0.8.4): a parameter before another segment may be empty.
        assert!(r.matches_path("/users//posts"));
        assert!(!r.matches_path("/users/7/posts/1"));
        assert!(!r.matches_path("/users/7"));
        let r = Route::parse("/files/{*path}").unwrap();
        assert!(r.matches_path("/files/a/b/c"));
        assert!(!r.matches_path("/files"));
        assert!(!r.matches_path("/files/"));
        assert!(!r.matches_path("/other/a"));
        let r = Route::parse("/v{version}/status").unwrap();
        assert!(r.matches_path("/v2/status"));
        assert!(!r.matches_path("/x2/status"));
        let r = Route::parse("/").unwrap();
        assert!(r.matches_path("/"));
        assert!(!r.matches_path("/x"));
    }

    #[test]
    fn routes_no_path_can_match_are_errors() {
        let err = |pattern: &str| Route::parse(pattern).unwrap_err();
        assert!(err("users").contains("must start with '/'"));
        assert!(err("").contains("must start with '/'"));
        assert!(err("/a/{*rest}/b").contains("must be the end of the route"));
        assert!(err("/a/{}").contains("needs a name"));
        assert!(err("/a/{id").contains("needs a name"));
        assert!(err("/a/{id}.json").contains("one parameter is allowed per segment"));
        assert!(err("/users/:id").contains("axum 0.8 writes a parameter as {id}"));
        assert!(err("/files/*path").contains("axum 0.8 writes a wildcard as {*path}"));
        assert!(err("/search?q=1").contains("query string"));
        assert!(err("/page#top").contains("fragment"));
        assert!(err("/users ").contains("' '"));
    }

    #[test]
    fn parameter_names_do_not_make_another_route() {
        assert!(same_shape("/users/{id}", "/users/{user_id}"));
        assert!(same_shape("/files/{*path}", "/files/{*rest}"));
        assert!(!same_shape("/files/{*path}", "/files/{path}"));
        assert!(!same_shape("/users/{id}", "/users/id"));
        // `{{` is a literal brace, not a parameter.
        assert!(!same_shape("/a/{{x}}", "/a/{y}"));
        assert!(same_shape("/a/{{x}}/{id}", "/a/{{x}}/{n}"));
        // The shape keys exactly the same routes.
        let shape = |p: &str| Route::parse(p).unwrap().shape();
        for (a, b) in [
            ("/users/{id}", "/users/{user_id}"),
            ("/files/{*path}", "/files/{*rest}"),
            ("/files/{*path}", "/files/{path}"),
            ("/users/{id}", "/users/id"),
            ("/a/{{x}}", "/a/{y}"),
            ("/a/{{x}}/{id}", "/a/{{x}}/{n}"),
        ] {
            assert_eq!(shape(a) == shape(b), same_shape(a, b), "{a} {b}");
        }
    }
}
