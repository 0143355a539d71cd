//! WatchStats fan-out. Each interval's update is encoded once, on first
//! demand, and the same bytes go to every watcher that takes the whole
//! update; only a stream's first message (it carries the VM list) and
//! filtered streams are built and encoded per watcher. tonic's generated
//! route encodes every message per stream, and even fed encoded bytes its
//! encoder copies each message into every stream's buffer (6.6 MB/s of
//! copies and fresh buffers at 1000 VMs and 10 watchers; `bench tierd-scale`). So
//! [`Routes`] serves WatchStats itself, in front of the generated service,
//! with the same wire format: each message is a 5-byte gRPC prefix and the
//! shared bytes, handed to h2 as they are (`WatchBody`).

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http_body::Frame as BodyFrame;
use prost::Message;
use prost::bytes::Bytes;
use tonic::Status;
use tonic::codec::{BufferSettings, DecodeBuf, Decoder, Streaming};
use tonic::codegen::{BoxFuture, Service, http};
use tonic::server::NamedService;

use tier_proto::v1::WatchStatsRequest;
use tier_proto::v1::tier_service_server::{SERVICE_NAME, TierServiceServer};

use crate::publish::Frame;
use crate::server::{BoxStream, Shared, TierServer};

/// The largest WatchStats request accepted (a list of VM ids).
const MAX_REQUEST: usize = 4 << 20;

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

/// A WatchStats response body: each encoded update as a gRPC message (its
/// 5-byte prefix, then the bytes themselves, not copied), then the status
/// as trailers when the stream ends or fails.
struct WatchBody {
    stream: BoxStream<Bytes>,
    /// The message whose prefix went out: its bytes go next.
    pending: Option<Bytes>,
    done: bool,
}

/// gRPC trailers of `status`.
fn trailers(status: &Status) -> http::HeaderMap {
    let mut h = http::HeaderMap::new();
    if status.add_header(&mut h).is_err() {
        // A message that cannot be a header value: the code alone.
        h.insert("grpc-status", http::HeaderValue::from(status.code() as i32));
    }
    h
}

impl http_body::Body for WatchBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<BodyFrame<Bytes>, Status>>> {
        let this = &mut *self;
        if let Some(b) = this.pending.take() {
            return Poll::Ready(Some(Ok(BodyFrame::data(b))));
        }
        if this.done {
            return Poll::Ready(None);
        }
        let end = match this.stream.as_mut().poll_next(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(Some(Ok(msg))) => match u32::try_from(msg.len()) {
                Ok(len) => {
                    // Uncompressed (flag 0), then the length, big-endian.
                    let mut prefix = [0u8; 5];
                    prefix[1..].copy_from_slice(&len.to_be_bytes());
                    this.pending = Some(msg);
                    return Poll::Ready(Some(Ok(BodyFrame::data(Bytes::copy_from_slice(&prefix)))));
                }
                Err(_) => Status::resource_exhausted("update larger than 4 GiB"),
            },
            Poll::Ready(Some(Err(status))) => status,
            Poll::Ready(None) => Status::ok(""),
        };
        this.done = true;
        Poll::Ready(Some(Ok(BodyFrame::trailers(trailers(&end)))))
    }

    fn is_end_stream(&self) -> bool {
        self.done && self.pending.is_none()
    }
}

/// One WatchStats call: its request decoded as tonic would, the updates
/// sent as [`WatchBody`]; errors as a trailers-only response.
async fn watch(
    shared: Arc<Shared>,
    req: http::Request<tonic::body::Body>,
) -> http::Response<tonic::body::Body> {
    if let Some(e) = req.headers().get("grpc-encoding")
        && e.as_bytes() != b"identity"
    {
        return Status::unimplemented(format!(
            "WatchStats: request compression {e:?} is not supported; send it uncompressed"
        ))
        .into_http();
    }
    let mut body = Streaming::new_request(RequestDecoder, req.into_body(), None, Some(MAX_REQUEST));
    let request = match body.message().await {
        Ok(Some(r)) => r,
        Ok(None) => return Status::invalid_argument("WatchStats: no request message").into_http(),
        Err(s) => return s.into_http(),
    };
    match shared.watch(request.vm_ids, Frame::into_bytes) {
        Err(s) => s.into_http(),
        Ok(stream) => {
            let mut r = http::Response::new(tonic::body::Body::new(WatchBody {
                stream,
                pending: None,
                done: false,
            }));
            r.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/grpc"),
            );
            r
        }
    }
}

const WATCH_STATS: &str = "/tier.v1.TierService/WatchStats";

/// tier.v1 as tierd serves it: the generated service, with WatchStats
/// taken over by `watch` (its own response body, `WatchBody`).
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
        Box::pin(async move { Ok(watch(shared, req).await) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body::Body as _;

    fn frames(items: Vec<Result<Bytes, Status>>) -> (Vec<BodyFrame<Bytes>>, bool) {
        let mut body = WatchBody {
            stream: Box::pin(tokio_stream::iter(items)),
            pending: None,
            done: false,
        };
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let mut out = Vec::new();
        while let Poll::Ready(Some(f)) = Pin::new(&mut body).poll_frame(&mut cx) {
            out.push(f.expect("frames are Ok"));
        }
        (out, body.is_end_stream())
    }

    /// Each message is its gRPC prefix and the very bytes it was given,
    /// then the OK status as trailers.
    #[test]
    fn messages_go_out_prefixed_and_uncopied_then_an_ok_status() {
        let msg = Bytes::from_static(b"abc");
        let (f, end) = frames(vec![Ok(msg.clone()), Ok(Bytes::new())]);
        assert!(end);
        assert_eq!(f.len(), 5);
        assert_eq!(
            f[0].data_ref().map(|d| &d[..]),
            Some(&[0u8, 0, 0, 0, 3][..])
        );
        let sent = f[1].data_ref().expect("payload");
        assert_eq!(sent.as_ptr(), msg.as_ptr(), "copied");
        assert_eq!(f[2].data_ref().map(|d| &d[..]), Some(&[0u8; 5][..]));
        let t = f[4].trailers_ref().expect("trailers");
        assert_eq!(t.get("grpc-status").map(|v| v.as_bytes()), Some(&b"0"[..]));
    }

    /// A stream that fails ends with its status, message included.
    #[test]
    fn a_failed_stream_ends_with_its_status() {
        let (f, end) = frames(vec![Err(Status::unavailable("tierd is stopping"))]);
        assert!(end);
        assert_eq!(f.len(), 1);
        let t = f[0].trailers_ref().expect("trailers");
        assert_eq!(t.get("grpc-status").map(|v| v.as_bytes()), Some(&b"14"[..]));
        assert!(t.get("grpc-message").is_some());
    }
}
