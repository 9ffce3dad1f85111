//! tonic: a gRPC greeter behind tower-throttle, and a client that calls it.
//!
//! ```text
//! cargo run --example grpc                                  # server on 127.0.0.1:50051
//! cargo run --example grpc -- --client                      # 5 calls with x-api-key: demo
//! cargo run --example grpc -- --client --calls 8 --key other
//! cargo run --example grpc -- --listen 127.0.0.1:50052      # another address (for both modes)
//! ```
//!
//! Each API key (metadata `x-api-key`) gets bursts of 3 calls, then one every 10 seconds. A call over
//! the limit fails with `RESOURCE_EXHAUSTED`, and its metadata says when to retry (`retry-after` in
//! seconds, `grpc-retry-pushback-ms`); a call without a key fails with `INVALID_ARGUMENT`.
//!
//! ```text
//! $ cargo run --example grpc -- --client
//! 1: OK "Hello, demo!" ratelimit: "greeter";r=2;t=10
//! 2: OK "Hello, demo!" ratelimit: "greeter";r=1;t=20
//! 3: OK "Hello, demo!" ratelimit: "greeter";r=0;t=30
//! 4: ResourceExhausted "rate limit of policy 'greeter' exceeded; retry after 9996 ms" retry-after: 10, grpc-retry-pushback-ms: 9996
//! 5: ResourceExhausted "rate limit of policy 'greeter' exceeded; retry after 9995 ms" retry-after: 10, grpc-retry-pushback-ms: 9995
//! $ cargo run --example grpc -- --client --no-key --calls 1
//! 1: InvalidArgument "no rate-limit key for policy 'greeter': expected header x-api-key (once)" retry-after: -, grpc-retry-pushback-ms: -
//! ```

use std::net::SocketAddr;
use std::process::ExitCode;

use tonic::transport::server::TcpIncoming;
use tonic::transport::Server;
use tower_throttle::key::Header;
use tower_throttle::{Policy, Quota, ThrottleLayer};

mod greeter;

use greeter::{GreeterClient, GreeterServer, HelloRequest};

struct Args {
    listen: SocketAddr,
    client: bool,
    calls: u32,
    key: Option<String>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        listen: "127.0.0.1:50051".parse().unwrap(),
        client: false,
        calls: 5,
        key: Some("demo".into()),
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || it.next().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "--listen" => args.listen = value()?.parse().map_err(|e| format!("--listen: {e}"))?,
            "--client" => args.client = true,
            "--calls" => args.calls = value()?.parse().map_err(|e| format!("--calls: {e}"))?,
            "--key" => args.key = Some(value()?),
            "--no-key" => args.key = None,
            "--help" | "-h" => {
                return Err(
                    "usage: grpc [--listen ADDR] [--client [--calls N] [--key KEY | --no-key]]"
                        .into(),
                )
            }
            other => return Err(format!("unknown argument {other:?} (try --help)")),
        }
    }
    Ok(args)
}

/// The layer: per API key, bursts of 3 calls, then one every 10 seconds; gRPC answers.
fn throttle() -> ThrottleLayer<Header, tower_throttle::MemoryBackend> {
    ThrottleLayer::builder()
        .policy(
            Policy::builder("greeter")
                .quota(Quota::per_minute(6).with_max_burst(2))
                .key(Header::new("x-api-key"))
                .build()
                .expect("a valid policy"),
        )
        .grpc()
        .build()
        .expect("a valid layer")
}

async fn serve(addr: SocketAddr) -> Result<(), Box<dyn std::error::Error>> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    println!(
        "gRPC greeter listening on http://{}",
        listener.local_addr()?
    );
    // ThrottleLayer wraps every service of the server; its response body needs no adapter.
    Server::builder()
        .layer(throttle())
        .add_service(GreeterServer)
        .serve_with_incoming(TcpIncoming::from(listener))
        .await?;
    Ok(())
}

async fn call(
    addr: SocketAddr,
    calls: u32,
    key: Option<&str>,
) -> Result<(), Box<dyn std::error::Error>> {
    let mut client = GreeterClient::connect(format!("http://{addr}")).await?;
    let name = key.unwrap_or("anonymous");
    for i in 1..=calls {
        let mut request = tonic::Request::new(HelloRequest { name: name.into() });
        if let Some(key) = key {
            request.metadata_mut().insert("x-api-key", key.parse()?);
        }
        match client.say_hello(request).await {
            Ok(response) => {
                let ratelimit = response
                    .metadata()
                    .get("ratelimit")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("-");
                println!(
                    "{i}: OK {:?} ratelimit: {ratelimit}",
                    response.get_ref().message
                );
            }
            Err(status) => {
                let meta = |name: &str| {
                    status
                        .metadata()
                        .get(name)
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("-")
                        .to_owned()
                };
                println!(
                    "{i}: {:?} {:?} retry-after: {}, grpc-retry-pushback-ms: {}",
                    status.code(),
                    status.message(),
                    meta("retry-after"),
                    meta("grpc-retry-pushback-ms"),
                );
            }
        }
    }
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(args) => args,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::from(2);
        }
    };
    let result = if args.client {
        call(args.listen, args.calls, args.key.as_deref()).await
    } else {
        serve(args.listen).await
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
