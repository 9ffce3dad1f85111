//! A unary gRPC greeter written by hand, as tonic-build would generate it from
//!
//! ```proto
//! package helloworld;
//! service Greeter { rpc SayHello (HelloRequest) returns (HelloReply); }
//! message HelloRequest { string name = 1; }
//! message HelloReply { string message = 1; }
//! ```
//!
//! so that the example and its test need no `protoc`. Shared by examples/grpc and tests/middleware/grpc.rs.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::uri::PathAndQuery;
use tonic::body::Body;
use tonic::server::NamedService;
use tonic::transport::Channel;
use tonic::{IntoRequest, Request, Response, Status};
use tonic_prost::ProstCodec;

/// The greeter's one method, as a path: the route a policy limited to this method would name.
pub const SAY_HELLO: &str = "/helloworld.Greeter/SayHello";

/// `message HelloRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct HelloRequest {
    #[prost(string, tag = "1")]
    pub name: String,
}

/// `message HelloReply`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct HelloReply {
    #[prost(string, tag = "1")]
    pub message: String,
}

/// The server: answers `SayHello` with "Hello, {name}!", every other method with `UNIMPLEMENTED`.
#[derive(Clone, Copy, Debug, Default)]
pub struct GreeterServer;

impl NamedService for GreeterServer {
    const NAME: &'static str = "helloworld.Greeter";
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl tower::Service<http::Request<Body>> for GreeterServer {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        if request.uri().path() != SAY_HELLO {
            let status = Status::unimplemented(format!("no method {}", request.uri().path()));
            return Box::pin(async move { Ok(status.into_http()) });
        }
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(ProstCodec::default());
            Ok(grpc.unary(SayHello, request).await)
        })
    }
}

/// The `SayHello` handler.
struct SayHello;

impl tonic::server::UnaryService<HelloRequest> for SayHello {
    type Response = HelloReply;
    type Future = std::future::Ready<Result<Response<HelloReply>, Status>>;

    fn call(&mut self, request: Request<HelloRequest>) -> Self::Future {
        let name = request.into_inner().name;
        std::future::ready(Ok(Response::new(HelloReply {
            message: format!("Hello, {name}!"),
        })))
    }
}

/// The client.
#[derive(Clone, Debug)]
pub struct GreeterClient {
    inner: tonic::client::Grpc<Channel>,
}

impl GreeterClient {
    /// Connects to `uri` (`http://127.0.0.1:50051`).
    pub async fn connect(uri: String) -> Result<Self, tonic::transport::Error> {
        let channel = Channel::from_shared(uri)
            .expect("a valid URI")
            .connect()
            .await?;
        Ok(GreeterClient {
            inner: tonic::client::Grpc::new(channel),
        })
    }

    /// Calls `SayHello`.
    pub async fn say_hello(
        &mut self,
        request: impl IntoRequest<HelloRequest>,
    ) -> Result<Response<HelloReply>, Status> {
        self.inner
            .ready()
            .await
            .map_err(|e| Status::unknown(format!("service not ready: {e}")))?;
        let codec = ProstCodec::<HelloRequest, HelloReply>::default();
        self.inner
            .unary(
                request.into_request(),
                PathAndQuery::from_static(SAY_HELLO),
                codec,
            )
            .await
    }
}
