//! Several keys in one atomic decision: a route with 10 requests an hour per user
//! (`header:x-user-id`) and 50 an hour per organisation (`header:x-org-id`), from TOML. 200
//! concurrent requests admit exactly what the tightest key allows, and a refusal charges no
//! limit: the users' counts add up to exactly what was admitted, and a user refused by the
//! organisation's limit keeps the whole of its own (peek). Shared by
//! `tests/middleware/multikey.rs` (memory) and `tests/redis/multikey.rs` (Lua alone and
//! coalesced, `Cell` mode).

use std::collections::BTreeMap;
use std::convert::Infallible;

use http::{Request, Response, StatusCode};
use tokio::task::JoinSet;
use tower::{Service, ServiceExt};
use tower_throttle::config::Config;
use tower_throttle::ops::ThrottleHandle;
use tower_throttle::{Backend, Key, ThrottleLayer};

const USER_LIMIT: u64 = 10;
const ORG_LIMIT: u64 = 50;
const USER: &str = "api.1h.x-user-id";
const ORG: &str = "api.1h.x-org-id";

/// The route, as the issue writes it.
pub const TOML: &str = r#"
[[route]]
name = "api"
key = "header:x-user-id"
quotas = [
  { count = 10, period = "1h", key = "header:x-user-id" },
  { count = 50, period = "1h", key = "header:x-org-id" },
]
"#;

fn request(user: &str, org: Option<&str>) -> Request<String> {
    let mut request = Request::get("/items").header("x-user-id", user);
    if let Some(org) = org {
        request = request.header("x-org-id", org);
    }
    request.body(String::new()).unwrap()
}

type App = tower::util::BoxCloneService<
    Request<String>,
    Response<tower_throttle::body::ThrottleBody<String>>,
    Infallible,
>;

fn app<B: Backend>(backend: B) -> (App, ThrottleHandle<tower_throttle::key::KeySpec, B>) {
    let layer = ThrottleLayer::builder()
        .backend(backend)
        .policies(Config::from_toml(TOML).unwrap().policies().unwrap())
        .build()
        .unwrap();
    let handle = layer.handle();
    let inner = tower::service_fn(|_: Request<String>| async {
        Ok::<_, Infallible>(Response::new("ok".to_owned()))
    });
    let service = tower::ServiceBuilder::new().layer(layer).service(inner);
    (tower::util::BoxCloneService::new(service), handle)
}

/// Sends every `(user, org)` request at once; the statuses, in order.
async fn concurrently(app: &App, requests: &[(String, String)]) -> Vec<StatusCode> {
    let mut set = JoinSet::new();
    for (i, (user, org)) in requests.iter().enumerate() {
        let mut app = app.clone();
        let request = request(user, Some(org));
        set.spawn(async move {
            let response = app.ready().await.unwrap().call(request).await.unwrap();
            (i, response.status())
        });
    }
    let mut statuses = vec![StatusCode::OK; requests.len()];
    while let Some(done) = set.join_next().await {
        let (i, status) = done.unwrap();
        statuses[i] = status;
    }
    statuses
}

/// The remaining units of limit `name` under `key`, by the handle's peek.
async fn remaining<B: Backend>(
    handle: &ThrottleHandle<tower_throttle::key::KeySpec, B>,
    key: &str,
    name: &str,
) -> u64 {
    let state = handle.peek_key("api", &Key::from(key)).await.unwrap();
    let limits: BTreeMap<_, _> = state.tiers[0].limits.iter().cloned().collect();
    limits[name].remaining
}

/// 200 concurrent requests from 10 users of one organisation (20 each): the organisation admits
/// exactly 50, no user more than 10, and the users' counts add up to exactly 50 (the 150
/// refusals charged no user). Then a new user of that organisation is refused by the
/// organisation's limit and keeps all 10 of its own.
pub async fn several_users_in_one_org<B: Backend>(backend: B) {
    let (app, handle) = app(backend);
    let requests: Vec<(String, String)> = (0..200)
        .map(|i| (format!("user-{}", i % 10), "acme".to_owned()))
        .collect();
    let statuses = concurrently(&app, &requests).await;
    let mut admitted: BTreeMap<&str, u64> = BTreeMap::new();
    for ((user, _), status) in requests.iter().zip(&statuses) {
        match *status {
            StatusCode::OK => *admitted.entry(user.as_str()).or_default() += 1,
            StatusCode::TOO_MANY_REQUESTS => {}
            other => panic!("unexpected status {other}"),
        }
    }
    let total: u64 = admitted.values().sum();
    assert_eq!(
        total, ORG_LIMIT,
        "the organisation admits exactly its limit"
    );
    assert!(admitted.values().all(|n| *n <= USER_LIMIT), "{admitted:?}");
    let mut charged = 0;
    for u in 0..10 {
        let user = format!("user-{u}");
        let left = remaining(&handle, &user, USER).await;
        let own = admitted.get(user.as_str()).copied().unwrap_or(0);
        assert_eq!(
            USER_LIMIT - left,
            own,
            "{user} was charged for its admissions only"
        );
        charged += USER_LIMIT - left;
    }
    assert_eq!(charged, ORG_LIMIT);
    assert_eq!(remaining(&handle, "acme", ORG).await, 0);
    // A refusal by the organisation's limit leaves the user's untouched.
    let mut app = app;
    for _ in 0..3 {
        let response = app
            .ready()
            .await
            .unwrap()
            .call(request("newcomer", Some("acme")))
            .await;
        let response = response.unwrap();
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        let fields = response.headers()["ratelimit"].to_str().unwrap().to_owned();
        assert!(fields.contains(USER) && fields.contains(ORG), "{fields}");
    }
    assert_eq!(remaining(&handle, "newcomer", USER).await, USER_LIMIT);
    // Another organisation is not touched either.
    let response = app
        .ready()
        .await
        .unwrap()
        .call(request("newcomer", Some("globex")))
        .await;
    assert_eq!(response.unwrap().status(), StatusCode::OK);
    assert_eq!(remaining(&handle, "newcomer", USER).await, USER_LIMIT - 1);
    assert_eq!(remaining(&handle, "globex", ORG).await, ORG_LIMIT - 1);
}

/// 200 concurrent requests from one user of one organisation: exactly 10 pass (the user's
/// limit), and the organisation is charged for those 10 only. A request without the
/// organisation's header gets the missing-key answer (400) and charges nothing.
pub async fn one_user_in_one_org<B: Backend>(backend: B) {
    let (app, handle) = app(backend);
    let requests = vec![("solo".to_owned(), "initech".to_owned()); 200];
    let statuses = concurrently(&app, &requests).await;
    let passed = statuses.iter().filter(|s| **s == StatusCode::OK).count() as u64;
    let refused = statuses
        .iter()
        .filter(|s| **s == StatusCode::TOO_MANY_REQUESTS)
        .count() as u64;
    assert_eq!((passed, refused), (USER_LIMIT, 200 - USER_LIMIT));
    assert_eq!(remaining(&handle, "solo", USER).await, 0);
    assert_eq!(
        remaining(&handle, "initech", ORG).await,
        ORG_LIMIT - USER_LIMIT
    );
    let mut app = app;
    let response = app
        .ready()
        .await
        .unwrap()
        .call(request("other", None))
        .await;
    assert_eq!(response.unwrap().status(), StatusCode::BAD_REQUEST);
    assert_eq!(remaining(&handle, "other", USER).await, USER_LIMIT);
}
