//! Keys from the configuration, through the layer in axum: query parameters, cookies, route path
//! parameters, composites, a key header sent twice, and CDN client-IP headers behind trusted
//! proxies. Hostile values never panic and never make unbounded keys.

use crate::support::{from_peer, request, status_of};
use axum::{routing::get, Router};
use http::{Request, StatusCode};
use tower_throttle::config::Config;

/// A layer on `/orgs/{org}/repos` and `/items` from `routes` (TOML `[[route]]` tables, each
/// allowing 2 requests a minute).
fn app(top: &str, routes: &str) -> Router {
    let config = Config::from_toml(&format!("{top}\n{routes}")).unwrap();
    let layer = config.memory_layer().unwrap();
    Router::new()
        .route("/orgs/{org}/repos", get(|| async { "repos" }))
        .route("/items", get(|| async { "items" }))
        .layer(layer)
}

fn route(name: &str, path: Option<&str>, key: &str, extra: &str) -> String {
    let path = path.map_or(String::new(), |p| format!("path = \"{p}\"\n"));
    format!(
        "[[route]]\nname = \"{name}\"\n{path}key = {key}\ncount = 2\nperiod = \"1m\"\n{extra}\n"
    )
}

/// The statuses of `requests`, in order.
async fn statuses(app: &Router, requests: Vec<Request<axum::body::Body>>) -> Vec<u16> {
    let mut out = Vec::new();
    for r in requests {
        out.push(status_of(app, r).await.as_u16());
    }
    out
}

fn with_header(uri: &str, lines: &[(&str, &str)]) -> Request<axum::body::Body> {
    let mut r = request(uri);
    for (name, value) in lines {
        r.headers_mut().append(
            http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            http::HeaderValue::from_str(value).unwrap(),
        );
    }
    r
}

#[tokio::test]
async fn a_query_parameter_is_a_key_decoded_as_the_app_decodes_it() {
    let app = app("", &route("q", None, r#""query:api_key""#, ""));
    let got = statuses(
        &app,
        vec![
            request("/items?api_key=acme"),
            // The same key, percent-encoded and among other parameters: not a way around the limit.
            request("/items?page=2&api_key=ac%6De"),
            request("/items?api_key=acme&page=3"),
            request("/items?api_key=other"),
            request("/items"),
            request("/items?api_key="),
            // Twice: ambiguous, the missing-key answer.
            request("/items?api_key=new&api_key=acme"),
        ],
    )
    .await;
    assert_eq!(got, [200, 200, 429, 200, 400, 400, 400]);
}

#[tokio::test]
async fn a_cookie_is_a_key() {
    let app = app("", &route("c", None, r#""cookie:session""#, ""));
    let got = statuses(
        &app,
        vec![
            with_header("/items", &[("cookie", "theme=dark; session=s1")]),
            // HTTP/2 sends cookies on several lines: one list.
            with_header(
                "/items",
                &[("cookie", "theme=dark"), ("cookie", "session=s1")],
            ),
            with_header("/items", &[("cookie", "session=\"s1\"")]),
            with_header("/items", &[("cookie", "session=s2")]),
            with_header("/items", &[("cookie", "theme=dark")]),
            with_header("/items", &[("cookie", "session=s3; session=s1")]),
        ],
    )
    .await;
    assert_eq!(got, [200, 200, 429, 200, 400, 400]);
}

#[tokio::test]
async fn a_path_parameter_and_a_composite_with_it_are_keys() {
    let per_org = app(
        "",
        &route("org", Some("/orgs/{org}/repos"), r#""path:org""#, ""),
    );
    let got = statuses(
        &per_org,
        vec![
            request("/orgs/acme/repos"),
            request("/orgs/ac%6De/repos"),
            request("/orgs/acme/repos"),
            request("/orgs/other/repos"),
            request("/items"), // not the route: no policy applies
        ],
    )
    .await;
    assert_eq!(got, [200, 200, 429, 200, 200]);

    // Per API key within an organization: each pair has its own limit.
    let per_key_and_org = app(
        "",
        &route(
            "key-org",
            Some("/orgs/{org}/repos"),
            r#"["header:x-api-key", "path:org"]"#,
            "",
        ),
    );
    let call =
        |key: &str, org: &str| with_header(&format!("/orgs/{org}/repos"), &[("x-api-key", key)]);
    let got = statuses(
        &per_key_and_org,
        vec![
            call("k1", "acme"),
            call("k1", "acme"),
            call("k1", "acme"),
            call("k1", "other"),
            call("k2", "acme"),
            request("/orgs/acme/repos"), // a part is missing: no key
        ],
    )
    .await;
    assert_eq!(got, [200, 200, 429, 200, 200, 400]);
}

#[tokio::test]
async fn a_key_header_sent_twice_is_refused_unless_configured() {
    let twice = || {
        with_header(
            "/items",
            &[("x-user-id", "victim"), ("x-user-id", "gateway-set")],
        )
    };
    let refuse = app("", &route("u", None, r#""header:x-user-id""#, ""));
    let response = {
        use tower::ServiceExt;
        refuse.clone().oneshot(twice()).await.unwrap()
    };
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let body = crate::support::body_string(response).await;
    assert!(body.contains("expected header x-user-id (once)"), "{body}");

    // `last`: the line the gateway appended counts.
    let last = app(
        "",
        &route(
            "u",
            None,
            r#""header:x-user-id""#,
            r#"on_duplicate = "last""#,
        ),
    );
    let gateway = || with_header("/items", &[("x-user-id", "gateway-set")]);
    let got = statuses(&last, vec![twice(), gateway(), gateway()]).await;
    assert_eq!(got, [200, 200, 429]);

    let first = app(
        "",
        &route(
            "u",
            None,
            r#""header:x-user-id""#,
            r#"on_duplicate = "first""#,
        ),
    );
    let victim = || with_header("/items", &[("x-user-id", "victim")]);
    let got = statuses(&first, vec![twice(), victim(), victim()]).await;
    assert_eq!(got, [200, 200, 429]);
}

#[tokio::test]
async fn cdn_client_ip_headers_count_behind_trusted_proxies_only() {
    for header in ["cf-connecting-ip", "true-client-ip", "fly-client-ip"] {
        let top = format!("trusted_proxies = [\"10.0.0.0/8\"]\nclient_ip_header = \"{header}\"\n");
        let app = app(&top, &route("cdn", None, r#""client-ip""#, ""));
        let via = |peer: &str, client: &str| {
            let mut r = from_peer(request("/items"), peer);
            r.headers_mut().insert(header, client.parse().unwrap());
            r
        };
        let got = statuses(
            &app,
            vec![
                via("10.0.0.1:1", "203.0.113.7"),
                via("10.0.0.2:1", "203.0.113.7"), // another edge node, the same client
                via("10.0.0.1:1", "203.0.113.7"),
                via("10.0.0.1:1", "203.0.113.8"),
                // From an untrusted peer the header is the client's own: the peer is the key.
                via("198.51.100.1:1", "203.0.113.9"),
                via("198.51.100.1:1", "203.0.113.10"),
                via("198.51.100.1:1", "203.0.113.11"),
            ],
        )
        .await;
        assert_eq!(got, [200, 200, 429, 200, 200, 200, 429], "{header}");
    }
}

#[tokio::test]
async fn hostile_values_never_panic_and_keys_stay_bounded() {
    let app = app(
        "",
        &format!(
            "{}{}",
            route("q", Some("/items"), r#"["query:k", "cookie:c"]"#, ""),
            route("org", Some("/orgs/{org}/repos"), r#""path:org""#, "")
        ),
    );
    let huge = "%FF".repeat(20_000);
    let odd = [
        format!("/items?k={huge}"),
        "/items?k=%".into(),
        "/items?k=%%%%&&&==".into(),
        "/items?k=%00%0A%0D".into(),
        "/items?%6B=%E2%82".into(),
        "/items?k=+%2B+".into(),
        format!("/orgs/{}/repos", "%F0%9F%92%A9".repeat(2_000)),
        "/orgs/%/repos".into(),
        "/orgs/%2F%2E%2E/repos".into(),
    ];
    for uri in odd {
        let mut r = request(&uri);
        r.headers_mut().insert(
            "cookie",
            http::HeaderValue::from_bytes(b"c=\"\xff\xfe\"; =; ;c; c=\x80").unwrap(),
        );
        let status = status_of(&app, r).await;
        assert!(
            [200, 400, 429].contains(&status.as_u16()),
            "{uri}: {status}"
        );
    }
}

#[test]
fn bad_key_configurations_are_errors_that_say_why() {
    let err = |route_text: &str| {
        Config::from_toml(route_text)
            .map_err(|e| e.to_string())
            .and_then(|c| c.memory_layer().map(|_| ()).map_err(|e| e.to_string()))
            .unwrap_err()
    };
    let cases = [
        (
            route("a", None, r#""path:org""#, ""),
            "needs the route's path",
        ),
        (
            route("a", Some("/users/{id}"), r#""path:org""#, ""),
            "has no parameter {org}",
        ),
        (route("a", None, r#""query:""#, ""), "not a valid name"),
        (route("a", None, r#""cookie:a b""#, ""), "not a valid name"),
        (route("a", None, r#"["ip"]"#, ""), "at least two parts"),
        (route("a", None, r#"["ip", "nope"]"#, ""), "is not one of"),
        (route("a", None, "5", ""), "an array of keys"),
        (
            route("a", None, r#""header:x""#, r#"on_duplicate = "any""#),
            "on_duplicate \"any\"",
        ),
    ];
    for (text, says) in cases {
        let e = err(&text);
        assert!(e.contains(says), "{text}\n=> {e}");
    }
}

/// `ipv4_prefix = 24` counts a /24 subnet as one client, through the TOML and the layer, and peek
/// takes any address of the subnet (or the subnet as `/top` shows it).
#[tokio::test]
async fn an_ipv4_prefix_counts_a_subnet_as_one_client() {
    use crate::support::{from_peer, request, status_of};

    let config = tower_throttle::config::Config::from_toml(
        "[[route]]\nname = \"ip\"\nkey = \"ip\"\nipv4_prefix = 24\ncount = 1\nperiod = \"1m\"\n",
    )
    .unwrap();
    let layer = config.memory_layer().unwrap();
    let handle = layer.handle();
    let app = axum::Router::new()
        .route("/", axum::routing::get(|| async { "ok" }))
        .layer(layer);
    let from = |peer: &str| from_peer(request("/"), peer);
    assert_eq!(status_of(&app, from("10.1.2.3:1")).await, 200);
    assert_eq!(status_of(&app, from("10.1.2.200:1")).await, 429);
    assert_eq!(status_of(&app, from("10.1.3.1:1")).await, 200);
    for text in ["10.1.2.77", "!10.1.2.0"] {
        let state = handle.peek("ip", text).await.unwrap();
        assert_eq!(state.summary().remaining, 0, "{text}");
    }
}
