//! gRPC over real TCP: a tonic server with the layer (`ThrottleLayerBuilder::grpc`), called by a real
//! tonic client, as in examples/grpc.

use std::future::{ready, Ready};
use std::net::SocketAddr;
use tower_throttle::backend::{Charges, Decisions};

use http::StatusCode;
use tonic::metadata::MetadataMap;
use tonic::transport::server::TcpIncoming;
use tonic::transport::Server;
use tonic::{Code, Status};
use tower_throttle::key::{Header, KeyExtractor};
use tower_throttle::ops::AccessList;
use tower_throttle::{
    backend::BackendError, policy::MissingKey, Backend, OnBackendError, Policy, Quota,
    ThrottleLayer, ThrottleLayerBuilder,
};

#[path = "../../examples/grpc/greeter.rs"]
mod greeter;

use greeter::{GreeterClient, GreeterServer, HelloRequest, SAY_HELLO};

/// Serves the greeter behind `layer` on a free loopback port.
async fn serve<K, B>(layer: ThrottleLayer<K, B>) -> SocketAddr
where
    K: KeyExtractor<tonic::body::Body> + Send + Sync + 'static,
    B: Backend + Send + Sync + 'static,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(
        Server::builder()
            .layer(layer)
            .add_service(GreeterServer)
            .serve_with_incoming(TcpIncoming::from(listener)),
    );
    addr
}

async fn client(addr: SocketAddr) -> GreeterClient {
    GreeterClient::connect(format!("http://{addr}"))
        .await
        .unwrap()
}

fn request(key: Option<&str>) -> tonic::Request<HelloRequest> {
    let mut request = tonic::Request::new(HelloRequest {
        name: "tonic".into(),
    });
    if let Some(key) = key {
        request
            .metadata_mut()
            .insert("x-api-key", key.parse().unwrap());
    }
    request
}

fn meta<'a>(map: &'a MetadataMap, name: &str) -> &'a str {
    map.get(name)
        .unwrap_or_else(|| panic!("no {name} in {map:?}"))
        .to_str()
        .unwrap()
}

/// Per API key: bursts of 3, then one every 20 seconds.
fn greeter_policy() -> Policy<Header> {
    Policy::builder("greeter")
        .quota(Quota::per_minute(3).with_max_burst(2))
        .key(Header::new("x-api-key"))
        .build()
        .unwrap()
}

fn grpc_layer(policy: Policy<Header>) -> ThrottleLayer<Header, tower_throttle::MemoryBackend> {
    ThrottleLayer::builder()
        .policy(policy)
        .grpc()
        .build()
        .unwrap()
}

#[tokio::test]
async fn limited_calls_fail_with_resource_exhausted_and_retry_metadata() {
    let addr = serve(grpc_layer(greeter_policy())).await;
    let mut client = client(addr).await;

    for remaining in [2, 1, 0] {
        let response = client.say_hello(request(Some("k1"))).await.unwrap();
        assert_eq!(response.get_ref().message, "Hello, tonic!");
        // The rate-limit fields arrive as initial metadata.
        let metadata = response.metadata();
        assert_eq!(meta(metadata, "ratelimit-policy"), r#""greeter";q=3;w=60"#);
        let ratelimit = meta(metadata, "ratelimit");
        assert!(
            ratelimit.starts_with(&format!(r#""greeter";r={remaining};t="#)),
            "{ratelimit}"
        );
    }

    let status: Status = client.say_hello(request(Some("k1"))).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(
        status
            .message()
            .starts_with("rate limit of policy 'greeter' exceeded; retry after "),
        "{}",
        status.message()
    );
    let metadata = status.metadata();
    let retry_after: u64 = meta(metadata, "retry-after").parse().unwrap();
    let pushback: u64 = meta(metadata, "grpc-retry-pushback-ms").parse().unwrap();
    // The next call is admitted 20 s after the first (one emission interval).
    assert_eq!(retry_after, 20);
    assert!(
        (retry_after - 1) * 1000 < pushback && pushback <= retry_after * 1000,
        "retry-after {retry_after} s, pushback {pushback} ms"
    );
    assert!(pushback > 19_000, "{pushback}");
    assert_eq!(meta(metadata, "ratelimit-policy"), r#""greeter";q=3;w=60"#);
    assert!(meta(metadata, "ratelimit").starts_with(r#""greeter";r=0;t="#));
    // The grpc-* fields are the status itself, not metadata.
    assert!(metadata.get("grpc-status").is_none());

    // Another key has its own limit; the channel still works after the refusal.
    let response = client.say_hello(request(Some("k2"))).await.unwrap();
    assert_eq!(response.get_ref().message, "Hello, tonic!");
    let status = client.say_hello(request(Some("k1"))).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
}

#[tokio::test]
async fn calls_without_a_key_fail_with_invalid_argument_or_unauthenticated() {
    let addr = serve(grpc_layer(greeter_policy())).await;
    let status = client(addr)
        .await
        .say_hello(request(None))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert_eq!(
        status.message(),
        "no rate-limit key for policy 'greeter': expected header x-api-key (once)"
    );

    let policy = Policy::builder("greeter")
        .quota(Quota::per_minute(3))
        .key(Header::new("x-api-key"))
        .on_missing_key(MissingKey::Reject(StatusCode::UNAUTHORIZED))
        .build()
        .unwrap();
    let addr = serve(grpc_layer(policy)).await;
    let status = client(addr)
        .await
        .say_hello(request(None))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
}

#[tokio::test]
async fn denied_keys_fail_with_permission_denied() {
    let lists = AccessList::new();
    lists.deny_key("abuser");
    let layer = ThrottleLayer::builder()
        .policy(greeter_policy())
        .access_list(lists)
        .grpc()
        .build()
        .unwrap();
    let mut client = client(serve(layer).await).await;
    let status = client.say_hello(request(Some("abuser"))).await.unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    client.say_hello(request(Some("k1"))).await.unwrap();
}

#[tokio::test]
async fn backend_failure_with_deny_fails_with_unavailable() {
    #[derive(Clone)]
    struct Broken;
    impl Backend for Broken {
        type Future = Ready<Result<Decisions, BackendError>>;
        fn check(&self, _: Charges<'_>) -> Self::Future {
            ready(Err(BackendError::new("connection refused")))
        }
    }
    let layer = ThrottleLayerBuilder::with_backend(Broken)
        .policy(greeter_policy())
        .on_backend_error(OnBackendError::Deny)
        .grpc()
        .build()
        .unwrap();
    let status = client(serve(layer).await)
        .await
        .say_hello(request(Some("k1")))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert_eq!(
        status.message(),
        "the rate limiter is unavailable; retry shortly"
    );
    assert_eq!(meta(status.metadata(), "retry-after"), "1");
    assert_eq!(meta(status.metadata(), "grpc-retry-pushback-ms"), "1000");
}

#[tokio::test]
async fn a_policy_can_limit_one_method() {
    let policy = Policy::builder("say-hello")
        .quota(Quota::per_minute(1))
        .key(Header::new("x-api-key"))
        .route(SAY_HELLO)
        .build()
        .unwrap();
    let addr = serve(grpc_layer(policy)).await;
    let mut client = client(addr).await;
    client.say_hello(request(Some("k1"))).await.unwrap();
    let status = client.say_hello(request(Some("k1"))).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert_eq!(meta(status.metadata(), "retry-after"), "60");

    // Another method of the same service, by the same key, is not limited: it reaches the
    // server (which does not implement it) every time, and carries no rate-limit fields.
    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut raw = tonic::client::Grpc::new(channel);
    for _ in 0..3 {
        raw.ready().await.unwrap();
        let status = raw
            .unary::<_, greeter::HelloReply, _>(
                request(Some("k1")),
                http::uri::PathAndQuery::from_static("/helloworld.Greeter/SayGoodbye"),
                tonic_prost::ProstCodec::default(),
            )
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::Unimplemented, "{status:?}");
        assert!(status.metadata().get("ratelimit").is_none());
    }
    // And the limited method is still limited for that key.
    let status = client.say_hello(request(Some("k1"))).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
}

/// Why `.grpc()` exists: the HTTP 429 means nothing to a gRPC client. tonic 0.14 reads the problem
/// JSON as gRPC frames and fails with INTERNAL (a protocol error); gRPC's HTTP status mapping would
/// say UNAVAILABLE. Either way the client cannot tell that it was limited.
#[tokio::test]
async fn without_grpc_a_429_is_not_resource_exhausted() {
    let layer = ThrottleLayer::new(
        Policy::builder("greeter")
            .quota(Quota::per_minute(1))
            .key(Header::new("x-api-key"))
            .build()
            .unwrap(),
    );
    let mut client = client(serve(layer).await).await;
    client.say_hello(request(Some("k1"))).await.unwrap();
    let status = client.say_hello(request(Some("k1"))).await.unwrap_err();
    assert!(
        matches!(status.code(), Code::Internal | Code::Unavailable),
        "{status:?}"
    );
}

/// Counting by outcome reads a gRPC call's `grpc-status`, not the HTTP `200` every call has: a
/// login counted only when it fails (`401`) counts a call answered `UNAUTHENTICATED`.
#[tokio::test]
async fn counting_by_outcome_reads_the_grpc_status() {
    use tower::ServiceExt;
    let policy = Policy::builder("login")
        .quota(Quota::per_minute(2).with_max_burst(1))
        .key(Header::new("x-api-key"))
        .count_only(|status| status == StatusCode::UNAUTHORIZED)
        .build()
        .unwrap();
    let answer = |code: &'static str| {
        move || async move {
            let mut response = http::Response::new(axum::body::Body::empty());
            let headers = response.headers_mut();
            headers.insert("content-type", "application/grpc".parse().unwrap());
            headers.insert("grpc-status", code.parse().unwrap());
            response
        }
    };
    let app = axum::Router::new()
        .route("/ok", axum::routing::post(answer("0")))
        .route("/denied", axum::routing::post(answer("16")))
        .layer(grpc_layer(policy));
    let call = |path: &'static str| {
        let request = http::Request::post(path)
            .header("x-api-key", "mallory")
            .body(axum::body::Body::empty())
            .unwrap();
        let app = app.clone();
        async move {
            let response = app.oneshot(request).await.unwrap();
            response.headers()["grpc-status"]
                .to_str()
                .unwrap()
                .to_owned()
        }
    };
    for _ in 0..3 {
        assert_eq!(
            call("/ok").await,
            "0",
            "a call that succeeds does not count"
        );
    }
    // A refund gives back its units less a clock margin (10 ms each): let it pass.
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert_eq!(call("/denied").await, "16");
    assert_eq!(call("/denied").await, "16");
    assert_eq!(call("/ok").await, "8", "two failed logins used the quota");
}
