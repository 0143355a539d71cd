//! tierd's `WatchStats` stream as a test opens it: a client on tierd's
//! unix socket, then the stream of every VM's updates.

use std::path::Path;

use tier_proto::v1::tier_service_client::TierServiceClient;
use tier_proto::v1::{StatsUpdate, WatchStatsRequest};
use tier_proto::{Endpoint, connect};
use tonic::Streaming;
use tonic::transport::Channel;

/// A tier.v1 client of tierd.
pub type Client = TierServiceClient<Channel>;

/// A client on tierd's unix `socket` (which must already listen).
pub async fn client(socket: &Path) -> Client {
    connect(&Endpoint::Unix(socket.to_path_buf()))
        .await
        .unwrap_or_else(|e| panic!("connecting to {}: {e}", socket.display()))
}

/// `WatchStats` for every VM on `client`: the updates as tierd sends them.
pub async fn watch_stats(client: &mut Client) -> Streaming<StatsUpdate> {
    client
        .watch_stats(WatchStatsRequest::default())
        .await
        .unwrap_or_else(|e| panic!("WatchStats: {e}"))
        .into_inner()
}

/// [`client`] on `socket`, then [`watch_stats`] on it; the client is
/// returned for the test's other calls.
pub async fn open_watch_stats(socket: &Path) -> (Client, Streaming<StatsUpdate>) {
    let mut c = client(socket).await;
    let stream = watch_stats(&mut c).await;
    (c, stream)
}
