//! Connecting to tierd: `unix:/path`, a bare path, or `http://host:port`.

use std::path::PathBuf;

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Uri};

use crate::v1::tier_service_client::TierServiceClient;

/// Where tierd listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// A unix socket path.
    Unix(PathBuf),
    /// An `http://` or `https://` URI.
    Tcp(String),
}

impl Endpoint {
    /// Parses `unix:/path`, `/path` or `http(s)://host:port`.
    pub fn parse(s: &str) -> Result<Endpoint, ConnectError> {
        if let Some(p) = s.strip_prefix("unix:") {
            return Ok(Endpoint::Unix(PathBuf::from(p)));
        }
        if s.starts_with("http://") || s.starts_with("https://") {
            return Ok(Endpoint::Tcp(s.to_string()));
        }
        if s.starts_with('/') || s.starts_with('.') {
            return Ok(Endpoint::Unix(PathBuf::from(s)));
        }
        Err(ConnectError::BadEndpoint(s.to_string()))
    }
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoint::Unix(p) => write!(f, "unix:{}", p.display()),
            Endpoint::Tcp(u) => f.write_str(u),
        }
    }
}

/// Why a connection to tierd failed, phrased for the person at the terminal.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("bad endpoint {0:?}: expected unix:/path, /path or http://host:port")]
    BadEndpoint(String),
    #[error("tierd is not running: no socket at {0} (start it with `tierd` or `cargo xtask demo`)")]
    NotRunning(PathBuf),
    #[error(
        "permission denied on {0}: join the group that owns the socket (see `ls -l {0}`) or run as root"
    )]
    PermissionDenied(PathBuf),
    #[error("cannot connect to {endpoint}: {source}")]
    Transport {
        endpoint: String,
        #[source]
        source: tonic::transport::Error,
    },
}

/// Connects to tierd. The unix socket is probed first so that the common
/// failures (no daemon, wrong group) get a precise message.
pub async fn connect(endpoint: &Endpoint) -> Result<TierServiceClient<Channel>, ConnectError> {
    let channel = match endpoint {
        Endpoint::Unix(path) => {
            if let Err(e) = UnixStream::connect(path).await {
                return Err(match e.kind() {
                    std::io::ErrorKind::PermissionDenied => {
                        ConnectError::PermissionDenied(path.clone())
                    }
                    _ => ConnectError::NotRunning(path.clone()),
                });
            }
            let path = path.clone();
            // The URI is a placeholder: the connector below ignores it.
            tonic::transport::Endpoint::from_static("http://tierd.sock")
                .connect_with_connector(tower::service_fn(move |_: Uri| {
                    let path = path.clone();
                    async move {
                        Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?))
                    }
                }))
                .await
                .map_err(|source| ConnectError::Transport {
                    endpoint: endpoint.to_string(),
                    source,
                })?
        }
        Endpoint::Tcp(uri) => tonic::transport::Endpoint::from_shared(uri.clone())
            .map_err(|source| ConnectError::Transport {
                endpoint: uri.clone(),
                source,
            })?
            .connect()
            .await
            .map_err(|source| ConnectError::Transport {
                endpoint: uri.clone(),
                source,
            })?,
    };
    Ok(TierServiceClient::new(channel))
}
