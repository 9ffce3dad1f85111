//! Allow and deny lists through the layer: static, changed at run time, behind proxies, and shared
//! through Redis sets; and the configuration keys for them.

use crate::shared::access::{app, req, statuses};
use crate::support::{from_peer, request, status_of};
use axum::{routing::get, Router};
use http::StatusCode;
use tower_throttle::config::Config;
use tower_throttle::key::{ClientIp, TrustedProxies};
use tower_throttle::ops::AccessList;

#[tokio::test]
async fn allowed_bypass_denied_get_403_others_are_limited() {
    let lists = AccessList::new();
    lists.allow_network("10.0.0.0/8").unwrap();
    lists.deny_network("203.0.113.0/24").unwrap();
    lists.allow_key("internal");
    lists.deny_key("stolen");
    let app = app(&lists, None);
    assert_eq!(statuses(&app, "10.1.1.1:1", "k1", 5).await, [200; 5]);
    assert_eq!(statuses(&app, "203.0.113.5:1", "k2", 2).await, [403; 2]);
    assert_eq!(statuses(&app, "192.0.2.1:1", "internal", 5).await, [200; 5]);
    assert_eq!(statuses(&app, "192.0.2.1:1", "stolen", 2).await, [403; 2]);
    assert_eq!(
        statuses(&app, "192.0.2.1:1", "k3", 3).await,
        [200, 200, 429]
    );
    // Allow wins over deny; IPv4-mapped peers are matched as IPv4.
    assert_eq!(statuses(&app, "203.0.113.5:1", "internal", 1).await, [200]);
    assert_eq!(
        statuses(&app, "[::ffff:203.0.113.5]:1", "k4", 1).await,
        [403]
    );

    // Changed at run time, through a clone: the running layer follows.
    lists.deny_key("k3");
    assert_eq!(statuses(&app, "192.0.2.1:1", "k3", 1).await, [403]);
    lists.remove_key("k3");
    lists.allow_key("k3");
    assert_eq!(statuses(&app, "192.0.2.1:1", "k3", 3).await, [200; 3]);
}

#[tokio::test]
async fn networks_match_the_client_behind_trusted_proxies_only() {
    let lists = AccessList::new();
    lists.deny_network("198.51.100.0/24").unwrap();
    let client_ip = ClientIp::new(TrustedProxies::new(["10.0.0.0/8"]).unwrap());
    let proxied = app(&lists, Some(client_ip));
    let via = |peer: &str, xff: &str| {
        let mut r = req(peer, "k");
        r.headers_mut()
            .insert("x-forwarded-for", xff.parse().unwrap());
        r
    };
    assert_eq!(
        status_of(&proxied, via("10.0.0.1:1", "198.51.100.7")).await,
        StatusCode::FORBIDDEN
    );
    // An untrusted peer cannot get itself denied or allowed by naming another address.
    let lists2 = AccessList::new();
    lists2.allow_network("192.0.2.0/24").unwrap();
    let client_ip = ClientIp::new(TrustedProxies::new(["10.0.0.0/8"]).unwrap());
    let app2 = app(&lists2, Some(client_ip));
    let mut statuses = Vec::new();
    for _ in 0..3 {
        statuses.push(
            status_of(&app2, via("198.51.100.9:1", "192.0.2.1"))
                .await
                .as_u16(),
        );
    }
    assert_eq!(statuses, [200, 200, 429]);
}

#[tokio::test]
async fn the_config_builds_lists_and_client_ip_keys() {
    let toml = r#"
        trusted_proxies = ["10.0.0.0/8", "::1/128"]
        client_ip_header = "x-forwarded-for"
        [access]
        allow_networks = ["192.0.2.0/24"]
        deny_networks = ["198.51.100.0/24"]
        deny_keys = ["stolen"]
        [[route]]
        name = "api"
        key = "client-ip"
        ipv6_prefix = 56
        count = 2
        period = "1m"
    "#;
    let layer = Config::from_toml(toml).unwrap().memory_layer().unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    let via = |xff: &str| {
        let mut r = from_peer(request("/"), "10.0.0.1:1");
        r.headers_mut()
            .insert("x-forwarded-for", xff.parse().unwrap());
        r
    };
    assert_eq!(
        status_of(&app, via("198.51.100.1")).await,
        StatusCode::FORBIDDEN
    );
    for _ in 0..4 {
        assert_eq!(status_of(&app, via("192.0.2.1")).await, StatusCode::OK);
    }
    // Clients in one /56 share a key.
    let mut statuses = Vec::new();
    for ip in ["2001:db8:0:1::1", "2001:db8:0:2::1", "2001:db8:0:3::1"] {
        statuses.push(status_of(&app, via(ip)).await.as_u16());
    }
    assert_eq!(statuses, [200, 200, 429]);

    for (bad, says) in [
        ("trusted_proxies = [\"10.0.0.0/99\"]\n[[route]]\nname = \"a\"\nkey = \"client-ip\"\ncount = 1\nperiod = \"1s\"", "trusted_proxies"),
        ("client_ip_header = \"x-client\"\n[[route]]\nname = \"a\"\nkey = \"client-ip\"\ncount = 1\nperiod = \"1s\"", "client_ip_header"),
        ("[access]\ndeny_networks = [\"nope\"]\n[[route]]\nname = \"a\"\nkey = \"ip\"\ncount = 1\nperiod = \"1s\"", "[access]"),
        ("[access]\nredis_refresh = \"2s\"\n[[route]]\nname = \"a\"\nkey = \"ip\"\ncount = 1\nperiod = \"1s\"", "set redis_sets too"),
        ("[access]\nredis_sets = \"acl\"\n[[route]]\nname = \"a\"\nkey = \"ip\"\ncount = 1\nperiod = \"1s\"", "redis_sets needs"),
    ] {
        let err = Config::from_toml(bad).unwrap().memory_layer().unwrap_err();
        assert!(err.to_string().contains(says), "{err}");
    }
}

/// An address in `deny_keys` refuses the client an `ip` route keys by it: an IPv6 address by its
/// /64, as the key groups it.
#[tokio::test]
async fn an_ipv6_address_in_deny_keys_refuses_its_client() {
    let toml = r#"
        [access]
        deny_keys = ["2001:db8::1", "192.0.2.7"]
        [[route]]
        name = "api"
        key = "ip"
        count = 100
        period = "1m"
    "#;
    let layer = Config::from_toml(toml).unwrap().memory_layer().unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    for (peer, status) in [
        ("[2001:db8::1]:1", StatusCode::FORBIDDEN),
        ("192.0.2.7:1", StatusCode::FORBIDDEN),
        ("[2001:db8:0:1::1]:1", StatusCode::OK),
        ("192.0.2.8:1", StatusCode::OK),
    ] {
        assert_eq!(
            status_of(&app, from_peer(request("/"), peer)).await,
            status,
            "{peer}"
        );
    }
}
