//! WatchStats fan-out. Each interval's update is encoded once, on first
//! demand, and the same bytes go to every watcher that takes the whole
//! update; only a stream's first message (it carries the VM list) and
//! filtered streams are built and encoded per watcher. tonic's generated
//! route encodes every message per stream (and the stream's items had to
//! be deep copies of the update), so [`Routes`] serves WatchStats itself,
//! in front of the generated service, with the same wire format.

use std::convert::Infallible;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use prost::Message;
use prost::bytes::{BufMut, Bytes};
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::{BoxFuture, Service, http};
use tonic::server::{NamedService, ServerStreamingService};
use tonic::{Request, Response, Status};

use tier_proto::v1::tier_service_server::{SERVICE_NAME, TierServiceServer};
use tier_proto::v1::{StatsUpdate, WatchStatsRequest};

use crate::server::{BoxStream, Shared, TierServer};

/// One interval's update as published, with its encoding once a watcher
/// asked for it.
#[derive(Debug)]
pub struct Published {
    pub update: Arc<StatsUpdate>,
    encoded: OnceLock<Bytes>,
}

impl Published {
    pub fn new(update: Arc<StatsUpdate>) -> Published {
        Published {
            update,
            encoded: OnceLock::new(),
        }
    }

    /// The update's protobuf encoding, made by the first watcher that
    /// needs it and shared by the rest.
    pub fn encoded(&self) -> Bytes {
        self.encoded
            .get_or_init(|| Bytes::from(self.update.encode_to_vec()))
            .clone()
    }
}

/// One message of a watcher's stream.
#[derive(Debug)]
pub enum Frame {
    /// The interval's whole update, as every unfiltered watcher gets it.
    Whole(Arc<Published>),
    /// An update made for this watcher (filtered, or its first).
    Own(StatsUpdate),
}

impl Frame {
    pub fn into_update(self) -> StatsUpdate {
        match self {
            Frame::Whole(p) => (*p.update).clone(),
            Frame::Own(u) => u,
        }
    }

    pub fn into_bytes(self) -> Bytes {
        match self {
            Frame::Whole(p) => p.encoded(),
            Frame::Own(u) => Bytes::from(u.encode_to_vec()),
        }
    }
}

/// The part of an update a watcher asked for.
fn filter(update: &StatsUpdate, ids: &[String]) -> StatsUpdate {
    if ids.is_empty() {
        return update.clone();
    }
    let wanted = |id: &String| ids.contains(id);
    StatsUpdate {
        vms: update
            .vms
            .iter()
            .filter(|v| wanted(&v.id))
            .cloned()
            .collect(),
        stats: update
            .stats
            .iter()
            .filter(|s| wanted(&s.vm_id))
            .cloned()
            .collect(),
        departed_vm_ids: update
            .departed_vm_ids
            .iter()
            .filter(|i| wanted(i))
            .cloned()
            .collect(),
        ..update.clone()
    }
}

/// What a watcher of `ids` (empty: all VMs) gets of `p`. A stream's first
/// message always carries the VM list: `sent_vms` says whether this
/// stream's did.
pub fn frame(shared: &Shared, p: &Arc<Published>, ids: &[String], sent_vms: &mut bool) -> Frame {
    let first = !std::mem::replace(sent_vms, true);
    let u = &p.update;
    if ids.is_empty() && !(first && u.vms_unchanged) {
        return Frame::Whole(p.clone());
    }
    let mut out = filter(u, ids);
    if first && out.vms_unchanged {
        let all = StatsUpdate {
            vms: shared.vms().to_vec(),
            ..Default::default()
        };
        out.vms = filter(&all, ids).vms;
        out.vms_unchanged = false;
    }
    Frame::Own(out)
}

/// Encodes pre-encoded messages: copies their bytes into the frame.
#[derive(Debug, Default)]
struct BytesEncoder;

impl Encoder for BytesEncoder {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use tier_proto::v1::{DaemonInfo, Vm, VmStats};

    fn update(seq: u64, vms_unchanged: bool) -> StatsUpdate {
        StatsUpdate {
            sequence: seq,
            vms: if vms_unchanged {
                Vec::new()
            } else {
                vec![Vm {
                    id: "a".into(),
                    ..Default::default()
                }]
            },
            stats: ["a", "b"]
                .map(|id| VmStats {
                    vm_id: id.into(),
                    dram_hit_ratio: 0.25,
                    ..Default::default()
                })
                .to_vec(),
            vms_unchanged,
            ..Default::default()
        }
    }

    #[test]
    fn watchers_of_every_vm_share_one_encoding_of_the_update() {
        let shared = Shared::new(DaemonInfo::default());
        shared.set_vms(
            ["a", "b"]
                .map(|id| Vm {
                    id: id.into(),
                    ..Default::default()
                })
                .to_vec(),
        );
        let p = Arc::new(Published::new(Arc::new(update(7, true))));
        // After its first message a whole-update watcher gets the shared
        // bytes: the same for every watcher, and the update once decoded.
        let mut sent = true;
        let Frame::Whole(w) = frame(&shared, &p, &[], &mut sent) else {
            panic!("not shared")
        };
        let (a, b) = (w.encoded(), p.encoded());
        assert_eq!(a.as_ptr(), b.as_ptr(), "encoded twice");
        assert_eq!(StatsUpdate::decode(a).ok().as_ref(), Some(&*p.update));
        // A stream's first message carries the VM list; a filtered one
        // only its VMs: both made for that watcher, as before.
        let mut first = false;
        let own = frame(&shared, &p, &[], &mut first).into_bytes();
        let own = StatsUpdate::decode(own).unwrap();
        assert!(first && !own.vms_unchanged);
        assert_eq!(own.vms.len(), 2);
        assert_eq!(own.stats, p.update.stats);
        let ids = vec!["b".to_string()];
        let mut sent = true;
        let only_b = frame(&shared, &p, &ids, &mut sent).into_update();
        assert_eq!(only_b.stats.len(), 1);
        assert_eq!(only_b.stats[0].vm_id, "b");
        assert!(only_b.vms_unchanged && only_b.vms.is_empty());
        // An update that carries the VM list anyway is shared from the
        // first message on.
        let listed = Arc::new(Published::new(Arc::new(update(8, false))));
        let mut first = false;
        assert!(matches!(
            frame(&shared, &listed, &[], &mut first),
            Frame::Whole(_)
        ));
    }
}
