//! Tests of the real-Redis test harness itself (tests/support/redis.rs): every kind of server starts,
//! answers, stops and restarts. Needs redis-server, redis-cli, openssl and the redis-cell module:
//! `bash scripts/test.sh` installs and builds them.

use crate::support::redis as redis_support;

use std::net::{Ipv4Addr, TcpStream};

use redis_support::{RedisCluster, RedisServer, TLS_PASSWORD, TLS_USER};

/// What `CL.THROTTLE k 15 30 60 1` answers for a fresh key: allowed, limit 16, 15 left, no retry,
/// reset in 2 s.
const FRESH_THROTTLE: &str = "0\n16\n15\n-1\n2";

#[test]
fn plain_server_answers_ping() {
    let server = RedisServer::start();
    assert_eq!(server.cli(&["PING"]), "PONG");
    assert_eq!(
        server.url(),
        format!("redis://127.0.0.1:{}/", server.port())
    );
    assert_eq!(server.ca_cert_path(), None);
    // No persistence, and no redis-cell module.
    assert_eq!(server.cli(&["CONFIG", "GET", "save"]), "save");
    assert_eq!(
        server.cli(&["CONFIG", "GET", "appendonly"]),
        "appendonly\nno"
    );
    assert!(server
        .cli_result(&["CL.THROTTLE", "k", "15", "30", "60", "1"])
        .is_err());
}

#[test]
fn cell_server_answers_cl_throttle() {
    let server = RedisServer::start_with_cell();
    assert_eq!(
        server.cli(&["CL.THROTTLE", "k", "15", "30", "60", "1"]),
        FRESH_THROTTLE
    );
    // One fewer left (the reset time depends on the time between the two calls).
    let second = server.cli(&["CL.THROTTLE", "k", "15", "30", "60", "1"]);
    assert_eq!(
        second.lines().take(4).collect::<Vec<_>>(),
        ["0", "16", "14", "-1"]
    );
}

#[test]
fn stop_then_restart_on_the_same_port() {
    let mut server = RedisServer::start_with_cell();
    let port = server.port();
    server.cli(&["SET", "kept", "no"]);
    server.cli(&["CL.THROTTLE", "k", "15", "30", "60", "1"]);

    server.stop();
    assert!(!server.is_running());
    assert!(TcpStream::connect((Ipv4Addr::LOCALHOST, port)).is_err());
    server.stop(); // a second stop does nothing

    server.restart();
    assert_eq!(server.port(), port);
    assert_eq!(server.cli(&["PING"]), "PONG");
    // Nothing persisted, and the module is loaded again.
    assert_eq!(server.cli(&["EXISTS", "kept"]), "0");
    assert_eq!(
        server.cli(&["CL.THROTTLE", "k", "15", "30", "60", "1"]),
        FRESH_THROTTLE
    );

    // Restarting a running server stops it first.
    server.restart();
    assert_eq!(server.port(), port);
    assert_eq!(server.cli(&["PING"]), "PONG");
}

#[test]
fn cluster_covers_every_slot_on_every_node() {
    let cluster = RedisCluster::start();
    assert_eq!(cluster.nodes().len(), 3);
    let urls = cluster.urls();
    assert_eq!(urls.len(), 3);
    for (node, url) in cluster.nodes().iter().zip(&urls) {
        assert_eq!(url, &format!("redis://127.0.0.1:{}/", node.port()));
        let info = node.cli(&["CLUSTER", "INFO"]);
        assert!(info.contains("cluster_state:ok"), "{info}");
        assert!(info.contains("cluster_slots_assigned:16384"), "{info}");
        assert!(info.contains("cluster_size:3"), "{info}");
        // Every node loads redis-cell.
        assert_eq!(
            node.cli(&["CL.THROTTLE", "k", "15", "30", "60", "1"]),
            FRESH_THROTTLE
        );
    }
    // A keyed command sent to a node that does not own the slot is redirected.
    let moved = cluster
        .nodes()
        .iter()
        .filter_map(|node| node.cli_result(&["GET", "some-key"]).err())
        .filter(|err| err.starts_with("MOVED "))
        .count();
    assert_eq!(moved, 2);
}

#[test]
fn cluster_node_restarts_and_rejoins() {
    let mut cluster = RedisCluster::start();
    let port = cluster.nodes()[1].port();
    cluster.nodes_mut()[1].restart();
    assert_eq!(cluster.nodes()[1].port(), port);
    cluster.wait_until_ok();
}

#[test]
fn tls_server_answers_ping_over_tls() {
    let server = RedisServer::start_tls();
    assert_eq!(server.cli(&["PING"]), "PONG");
    assert_eq!(server.cli(&["ACL", "WHOAMI"]), TLS_USER);
    assert_eq!(
        server.url(),
        format!(
            "rediss://{TLS_USER}:{TLS_PASSWORD}@127.0.0.1:{}/",
            server.port()
        )
    );
    let ca = server.ca_cert_path().expect("a TLS server has a CA");
    assert!(ca.is_file());
    assert!(std::fs::read_to_string(&ca)
        .unwrap()
        .starts_with("-----BEGIN CERTIFICATE-----"));
    // TLS only: the plain port is off.
    assert_eq!(server.cli(&["CONFIG", "GET", "port"]), "port\n0");
    // The ACL user checks its password; the default user still works.
    let wrong = server.cli_result(&["AUTH", TLS_USER, "wrong"]).unwrap_err();
    assert!(wrong.contains("WRONGPASS"), "{wrong}");
    assert_eq!(server.cli(&["AUTH", "default", "anything"]), "OK");
}

#[test]
fn tls_server_restarts_on_the_same_port() {
    let mut server = RedisServer::start_tls();
    let port = server.port();
    server.restart();
    assert_eq!(server.port(), port);
    assert_eq!(server.cli(&["PING"]), "PONG");
}

/// The Valkey pass of scripts/test.sh sets `TEST_REDIS_SERVER` to a `valkey-server`: the servers the
/// tests start must then be Valkey by their own account, and Redis otherwise.
#[test]
fn the_server_is_the_one_the_run_asked_for() {
    let server = RedisServer::start();
    let info = server.cli(&["INFO", "server"]);
    let name = info
        .lines()
        .find_map(|line| line.trim().strip_prefix("server_name:"))
        .unwrap_or("redis");
    assert_eq!(
        name,
        redis_support::expected_server_name(),
        "INFO server of {}:\n{info}",
        redis_support::server_binary().display()
    );
    if name == "valkey" {
        assert!(info.contains("valkey_version:"), "{info}");
    }
}
