//! The example server on a Redis Cluster (`[backend] urls = [...]`, so `cluster = true`) that is
//! down when it starts: it starts (lazily, the default), answers by the failure policy, and
//! decides on the Cluster once it has formed.

use std::time::{Duration, Instant};

use crate::example_server::{send, start};
use crate::support::redis::RedisCluster;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_server_starts_with_its_cluster_down_and_uses_it_once_formed() {
    let mut cluster = RedisCluster::unformed_and_down(3);
    let urls = cluster.urls();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("cluster.toml");
    let urls_toml = urls
        .iter()
        .map(|u| format!("{u:?}"))
        .collect::<Vec<_>>()
        .join(", ");
    std::fs::write(
        &file,
        format!(
            "[backend]\nkind = \"redis\"\nurls = [{urls_toml}]\n\n\
             [[route]]\nname = \"items\"\npath = \"/items/{{id}}\"\nkey = \"global\"\ncount = 2\nperiod = \"1h\"\n"
        ),
    )
    .unwrap();
    let server = start(&["--config", file.to_str().unwrap()]);
    assert!(
        server.line.contains("backend: redis") && server.line.contains("Redis not reachable yet"),
        "{}",
        server.line
    );
    // The default failure policy, allow: every request passes while the Cluster is down.
    for i in 0..5 {
        let r = send(server.addr, "GET", &format!("/items/{i}"), &[]).await;
        assert_eq!(r.status, 200, "{}", r.body);
    }

    let cluster = tokio::task::spawn_blocking(move || {
        for node in cluster.nodes_mut() {
            node.restart();
        }
        cluster.form(0);
        cluster
    })
    .await
    .unwrap();
    // Decided on the Cluster: two pass, then 429 (the failure policy never refuses).
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut statuses = Vec::new();
    loop {
        let status = send(server.addr, "GET", "/items/x", &[]).await.status;
        statuses.push(status);
        if status == 429 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no 429 from the Cluster within 2 s of it forming: {statuses:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let keys: Vec<String> = cluster
        .nodes()
        .iter()
        .map(|n| n.cli(&["KEYS", "*"]))
        .collect();
    assert!(
        keys.iter().any(|k| k.contains("throttle:items:")),
        "the route's key is not on the Cluster: {keys:?}"
    );
}
