//! WatchStats fan-out. Each interval's update is encoded once, on first
//! demand, and the same bytes go to every watcher that takes the whole
//! update; only a stream's first message (it carries the VM list) and
//! filtered streams are built and encoded per watcher. tonic's generated
//! route encodes every message per stream (and the stream's items had to
//! be deep copies of the update), so [`Routes`] serves WatchStats itself,
//! in front of the generated service, with the same wire format.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use prost::Message;
use prost::bytes::{BufMut, Bytes};
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::{BoxFuture, Service, http};
use tonic::server::{NamedService, ServerStreamingService};
use tonic::{Request, Response, Status};

use tier_proto::v1::WatchStatsRequest;
use tier_proto::v1::tier_service_server::{SERVICE_NAME, TierServiceServer};

use crate::publish::Frame;
use crate::server::{BoxStream, Shared, TierServer};

/// Encodes pre-encoded messages: copies their bytes into the frame.
#[derive(Debug, Default)]
struct BytesEncoder;

impl Encoder for BytesEncoder {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        // Room for the whole update at once: the stream's buffer (8 KiB at
        // first) would otherwise double its way up to it, a new allocation
        // and copy each time, for every watcher and interval. Reserved
        // whole, the buffer of the last update, sent by now, is reused.
        dst.reserve(item.len());
        dst.put_slice(&item);
        Ok(())
    }
}

/// Requests as tonic decodes them; responses already encoded.
#[derive(Debug, Default)]
struct EncodedCodec;

/// Decodes WatchStatsRequest as the generated route does.
#[derive(Debug, Default)]
struct RequestDecoder;

impl Decoder for RequestDecoder {
    type Item = WatchStatsRequest;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Self::Item>, Status> {
        WatchStatsRequest::decode(src)
            .map(Some)
            .map_err(|e| Status::internal(e.to_string()))
    }

    fn buffer_settings(&self) -> BufferSettings {
        BufferSettings::default()
    }
}

impl Codec for EncodedCodec {
    type Encode = Bytes;
    type Decode = WatchStatsRequest;
    type Encoder = BytesEncoder;
    type Decoder = RequestDecoder;

    fn encoder(&mut self) -> BytesEncoder {
        BytesEncoder
    }

    fn decoder(&mut self) -> RequestDecoder {
        RequestDecoder
    }
}

/// WatchStats answered with encoded updates.
struct WatchEncoded(Arc<Shared>);

impl ServerStreamingService<WatchStatsRequest> for WatchEncoded {
    type Response = Bytes;
    type ResponseStream = BoxStream<Bytes>;
    type Future = BoxFuture<Response<BoxStream<Bytes>>, Status>;

    fn call(&mut self, req: Request<WatchStatsRequest>) -> Self::Future {
        let shared = self.0.clone();
        Box::pin(async move {
            let ids = req.into_inner().vm_ids;
            shared.watch(ids, Frame::into_bytes).map(Response::new)
        })
    }
}

const WATCH_STATS: &str = "/tier.v1.TierService/WatchStats";

/// tier.v1 as tierd serves it: the generated service, with WatchStats
/// taken over by [`WatchEncoded`].
#[derive(Debug, Clone)]
pub struct Routes {
    inner: TierServiceServer<TierServer>,
    shared: Arc<Shared>,
}

impl Routes {
    pub fn new(shared: Arc<Shared>) -> Routes {
        Routes {
            inner: TierServiceServer::new(TierServer::new(shared.clone())),
            shared,
        }
    }
}

impl NamedService for Routes {
    const NAME: &'static str = SERVICE_NAME;
}

impl Service<http::Request<tonic::body::Body>> for Routes {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Infallible>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        if req.uri().path() != WATCH_STATS {
            return self.inner.call(req);
        }
        let shared = self.shared.clone();
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(EncodedCodec);
            Ok(grpc.server_streaming(WatchEncoded(shared), req).await)
        })
    }
}
