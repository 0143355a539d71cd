//! The one way tests, the e2e run and the benches start tierd: a builder
//! for `tierd run` (config, flags, a directory of its own), and a running
//! [`Tierd`] that gives its socket, its log and its metrics address and is
//! stopped by PID (SIGTERM, or SIGKILL for a crash; on drop too).
//!
//! By default a tierd is isolated from the host and from tests running in
//! parallel: no config file (`/dev/null`), no discovery of other VMs, no
//! metrics endpoint; its socket `tierd.sock` and its log `tierd.log` (stdout
//! and stderr, appended so a restart keeps the earlier lines) in a temporary
//! directory that lives as long as the [`Tierd`].
//!
//! ```no_run
//! # use std::time::Duration;
//! # use tier_test_support::Tierd;
//! let tierd = Tierd::builder()
//!     .config("interval_ms = 250\n")
//!     .metrics("127.0.0.1:0")
//!     .args(["--demo-vm"])
//!     .start();
//! let metrics = tierd.metrics_addr();
//! tierd.wait_until("the demo VM in the log", Duration::from_secs(10), || {
//!     tierd.log().contains("demo").then_some(())
//! });
//! ```
//!
//! [`TierdBuilder::start`] and the methods of [`Tierd`] panic with tierd's
//! log; the `try_` ones return errors, for the e2e run and the benches.

use std::ffi::{OsStr, OsString};
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Output, Stdio};
use std::time::Duration;

use crate::child::{ChildGuard, GRACE};
use crate::daemon::{log_stdio, tierd_bin, wait_bound};
use crate::wait::{Check, try_wait_until, try_wait_until_async, try_within};

/// How long [`TierdBuilder::start`] waits for the socket by default.
pub const LISTEN_TIMEOUT: Duration = Duration::from_secs(30);

/// Where `tierd run` reads its config.
#[derive(Debug, Clone)]
enum ConfigSource {
    /// `/dev/null`: every key at its default.
    None,
    /// Written to `DIR/tierd.toml`.
    Text(String),
    Path(PathBuf),
}

/// How `tierd run` is started; see the module docs for the defaults.
#[derive(Debug, Clone)]
pub struct TierdBuilder {
    bin: Option<PathBuf>,
    dir: Option<PathBuf>,
    config: ConfigSource,
    socket: Option<PathBuf>,
    /// `--metrics-listen`; `None` leaves it to the config.
    metrics: Option<String>,
    discover: bool,
    args: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    grace: Duration,
}

impl Default for TierdBuilder {
    fn default() -> Self {
        TierdBuilder {
            bin: None,
            dir: None,
            config: ConfigSource::None,
            socket: None,
            metrics: Some(String::new()),
            discover: false,
            args: Vec::new(),
            env: Vec::new(),
            grace: GRACE,
        }
    }
}

impl TierdBuilder {
    /// The tierd binary (default: [`tierd_bin`]; tier-profiler's own tests
    /// pass `CARGO_BIN_EXE_tierd`).
    pub fn bin(mut self, bin: impl AsRef<Path>) -> Self {
        self.bin = Some(bin.as_ref().to_path_buf());
        self
    }

    /// Its directory (config, socket and log) in place of a temporary one.
    /// The directory must exist.
    pub fn dir(mut self, dir: impl AsRef<Path>) -> Self {
        self.dir = Some(dir.as_ref().to_path_buf());
        self
    }

    /// `text` as its config file, written to `DIR/tierd.toml`.
    pub fn config(mut self, text: impl Into<String>) -> Self {
        self.config = ConfigSource::Text(text.into());
        self
    }

    /// An existing config file.
    pub fn config_file(mut self, path: impl AsRef<Path>) -> Self {
        self.config = ConfigSource::Path(path.as_ref().to_path_buf());
        self
    }

    /// Its socket in place of `DIR/tierd.sock`; a relative path is taken
    /// in DIR (e.g. `run/tierd.sock`, a directory tierd creates).
    pub fn socket(mut self, socket: impl AsRef<Path>) -> Self {
        self.socket = Some(socket.as_ref().to_path_buf());
        self
    }

    /// `--metrics-listen ADDR` (default: `""`, no endpoint).
    pub fn metrics(mut self, addr: &str) -> Self {
        self.metrics = Some(addr.to_string());
        self
    }

    /// No `--metrics-listen`: the config's `[metrics] listen` decides.
    pub fn metrics_from_config(mut self) -> Self {
        self.metrics = None;
        self
    }

    /// Discovery as the config says, in place of `--no-discover`.
    pub fn discover(mut self) -> Self {
        self.discover = true;
        self
    }

    /// Flags appended to `tierd run`'s.
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.args
            .extend(args.into_iter().map(|a| a.as_ref().to_os_string()));
        self
    }

    /// One flag appended to `tierd run`'s.
    pub fn arg(mut self, arg: impl AsRef<OsStr>) -> Self {
        self.args.push(arg.as_ref().to_os_string());
        self
    }

    /// An environment variable of its own (e.g. `TIERD_LOG`).
    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Self {
        self.env
            .push((key.as_ref().to_os_string(), value.as_ref().to_os_string()));
        self
    }

    /// Time between SIGTERM and SIGKILL when stopped (default [`GRACE`]).
    pub fn grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// Spawns tierd and waits up to [`LISTEN_TIMEOUT`] until its socket
    /// accepts a connection; panics with its log if it exits first.
    pub fn start(self) -> Tierd {
        self.start_within(LISTEN_TIMEOUT)
    }

    /// [`start`](Self::start) with its own timeout.
    pub fn start_within(self, timeout: Duration) -> Tierd {
        let mut t = self
            .try_spawn()
            .unwrap_or_else(|e| panic!("starting tierd: {e}"));
        t.try_wait_listening(timeout)
            .unwrap_or_else(|e| panic!("{e}"));
        t
    }

    /// Spawns tierd without waiting for its socket (see
    /// [`Tierd::try_wait_listening`] and [`Tierd::try_client`]).
    pub fn try_spawn(mut self) -> std::io::Result<Tierd> {
        let tempdir = match &self.dir {
            Some(_) => None,
            None => Some(tempfile::tempdir()?),
        };
        let dir = match &tempdir {
            Some(t) => t.path().to_path_buf(),
            None => self.dir.clone().unwrap_or_default(),
        };
        self.dir = Some(dir.clone());
        let (child, socket, log) = self.spawn_in(&dir)?;
        Ok(Tierd {
            child,
            socket,
            log,
            dir,
            builder: self,
            _tempdir: tempdir,
        })
    }

    /// Spawns `tierd run` in `dir`, logging to `dir/tierd.log`: (child,
    /// socket, log).
    fn spawn_in(&self, dir: &Path) -> std::io::Result<(ChildGuard, PathBuf, PathBuf)> {
        let (mut cmd, socket) = self.command_in(dir)?;
        let log = dir.join("tierd.log");
        let (out, err) = log_stdio(&log)?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| std::io::Error::new(e.kind(), format!("spawning {cmd:?}: {e}")))?;
        Ok((ChildGuard::with_grace(child, self.grace), socket, log))
    }

    /// Runs tierd to its end and returns its output: for a start that is
    /// expected to fail (a bad config, a refused socket).
    pub fn output(self) -> Output {
        let tempdir = tempfile::tempdir().unwrap();
        let dir = self
            .dir
            .clone()
            .unwrap_or_else(|| tempdir.path().to_path_buf());
        let (mut cmd, _) = self.command_in(&dir).unwrap();
        cmd.stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"))
    }

    /// The `tierd run` command in `dir`, with its config written; and its
    /// socket path.
    fn command_in(&self, dir: &Path) -> std::io::Result<(Command, PathBuf)> {
        let bin = match &self.bin {
            Some(b) => b.clone(),
            None => tierd_bin().to_path_buf(),
        };
        let config = match &self.config {
            ConfigSource::None => PathBuf::from("/dev/null"),
            ConfigSource::Path(p) => p.clone(),
            ConfigSource::Text(text) => {
                let p = dir.join("tierd.toml");
                std::fs::write(&p, text)?;
                p
            }
        };
        let socket = dir.join(self.socket.as_deref().unwrap_or(Path::new("tierd.sock")));
        let mut cmd = Command::new(bin);
        cmd.arg("run")
            .arg("--config")
            .arg(config)
            .arg("--socket")
            .arg(&socket);
        if let Some(addr) = &self.metrics {
            cmd.arg("--metrics-listen").arg(addr);
        }
        if !self.discover {
            cmd.arg("--no-discover");
        }
        cmd.args(&self.args);
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        Ok((cmd, socket))
    }
}

/// Why tierd did not come up: the message carries its log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TierdError(pub String);

impl std::fmt::Display for TierdError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TierdError {}

/// A running `tierd run`; stopped by PID when dropped (SIGTERM, SIGKILL
/// after its grace).
#[derive(Debug)]
pub struct Tierd {
    child: ChildGuard,
    socket: PathBuf,
    log: PathBuf,
    dir: PathBuf,
    /// How it was started, in `dir`: for [`Tierd::restart`].
    builder: TierdBuilder,
    _tempdir: Option<tempfile::TempDir>,
}

impl Tierd {
    pub fn builder() -> TierdBuilder {
        TierdBuilder::default()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Its socket as an endpoint (`unix:PATH`), as tierctl takes it.
    pub fn endpoint(&self) -> String {
        format!("unix:{}", self.socket.display())
    }

    /// Its directory: the config, socket and log unless set elsewhere.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// What it has logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Its exit status if it has exited, without waiting.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Waits until its socket accepts a connection; an error with its log
    /// if it exits first or `timeout` passes.
    pub fn try_wait_listening(&mut self, timeout: Duration) -> Result<(), TierdError> {
        let mut exited = None;
        let r = try_wait_until("tierd to listen", timeout, || {
            if std::os::unix::net::UnixStream::connect(&self.socket).is_ok() {
                return Some(());
            }
            exited = self.child.try_wait().ok().flatten();
            exited.map(|_| ())
        });
        match (r, exited) {
            (_, Some(st)) => Err(TierdError(format!(
                "tierd exited early ({st}); its log ({}):\n{}",
                self.log.display(),
                self.log()
            ))),
            (Ok(()), None) => Ok(()),
            (Err(e), None) => Err(TierdError(format!(
                "{e} on {}; its log:\n{}",
                self.socket.display(),
                self.log()
            ))),
        }
    }

    /// A tier.v1 client once the socket answers, within `timeout`.
    pub async fn try_client(
        &mut self,
        timeout: Duration,
    ) -> Result<crate::stream::Client, TierdError> {
        let endpoint = tier_proto::Endpoint::Unix(self.socket.clone());
        let mut exited = None;
        let child = &mut self.child;
        let socket = &self.socket;
        // Some(Some(client)) once connected; Some(None) ends the wait when
        // tierd has exited; None waits on.
        let r = try_wait_until_async("tierd's socket to answer", timeout, || {
            exited = child.try_wait().ok().flatten();
            let (gone, up) = (exited.is_some(), socket.exists());
            let endpoint = &endpoint;
            async move {
                match (gone, up) {
                    (true, _) => Some(None),
                    (false, true) => tier_proto::connect(endpoint).await.ok().map(Some),
                    (false, false) => None,
                }
            }
        })
        .await;
        match r {
            Ok(Some(client)) => Ok(client),
            Ok(None) => Err(TierdError(format!(
                "tierd exited ({}); its log ({}):\n{}",
                exited.map_or_else(|| "?".to_string(), |st| st.to_string()),
                self.log.display(),
                self.log()
            ))),
            Err(e) => Err(TierdError(format!("{e} on {}", self.socket.display()))),
        }
    }

    /// [`wait_until`](crate::wait_until) with tierd's log in the panic
    /// message.
    pub fn wait_until<T, C: Check<T>>(
        &self,
        what: &str,
        timeout: Duration,
        f: impl FnMut() -> C,
    ) -> T {
        try_wait_until(what, timeout, f)
            .unwrap_or_else(|e| panic!("{e}\ntierd's log:\n{}", self.log()))
    }

    /// [`within`](crate::within) with tierd's log in the panic message:
    /// for a loop over its stream.
    pub async fn within<T>(
        &self,
        what: &str,
        timeout: Duration,
        fut: impl Future<Output = T>,
    ) -> T {
        try_within(what, timeout, fut)
            .await
            .unwrap_or_else(|e| panic!("{e}\ntierd's log:\n{}", self.log()))
    }

    /// The address of the first log line containing `phrase` (e.g.
    /// "metrics on") with a `bound=ADDR`, waited for up to 20 s.
    pub fn bound(&self, phrase: &str) -> SocketAddr {
        wait_bound(&self.log, phrase)
    }

    /// The metrics endpoint's address, as tierd announced it.
    pub fn metrics_addr(&self) -> SocketAddr {
        self.bound("metrics on")
    }

    /// SIGTERM by PID and waits for it to exit; panics with its log if it
    /// ignored SIGTERM (then SIGKILLed after its grace).
    pub fn terminate(&mut self) -> ExitStatus {
        match self.child.terminate() {
            Some(st) => st,
            None => panic!("tierd ignored SIGTERM; its log:\n{}", self.log()),
        }
    }

    /// SIGTERM by PID, SIGKILL after its grace; never panics. `None` if it
    /// had to be killed.
    pub fn stop(&mut self) -> Option<ExitStatus> {
        self.child.terminate()
    }

    /// Starts it again, as it was started, in the same directory (the log
    /// appended), once the running one is stopped; waits for its socket.
    pub fn restart(&mut self) {
        self.stop();
        let (child, _, _) = self
            .builder
            .spawn_in(&self.dir)
            .unwrap_or_else(|e| panic!("restarting tierd: {e}"));
        self.child = child;
        self.try_wait_listening(LISTEN_TIMEOUT)
            .unwrap_or_else(|e| panic!("{e}"));
    }

    /// SIGKILL by PID, and reaped: a crash.
    pub fn kill9(&mut self) {
        let c = self.child.child_mut();
        let _ = c.kill();
        let _ = c.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_is_isolated_by_default() {
        let dir = tempfile::tempdir().unwrap();
        let (cmd, socket) = Tierd::builder()
            .bin("/bin/tierd")
            .args(["--interval-ms", "250"])
            .command_in(dir.path())
            .unwrap();
        assert_eq!(socket, dir.path().join("tierd.sock"));
        let args: Vec<_> = cmd.get_args().map(|a| a.to_string_lossy()).collect();
        let want = [
            "run",
            "--config",
            "/dev/null",
            "--socket",
            &socket.display().to_string(),
            "--metrics-listen",
            "",
            "--no-discover",
            "--interval-ms",
            "250",
        ];
        assert_eq!(args, want);
    }

    #[test]
    fn a_config_text_is_written_beside_the_socket() {
        let dir = tempfile::tempdir().unwrap();
        let (cmd, _) = Tierd::builder()
            .bin("/bin/tierd")
            .config("interval_ms = 250\n")
            .metrics_from_config()
            .discover()
            .command_in(dir.path())
            .unwrap();
        let cfg = dir.path().join("tierd.toml");
        assert_eq!(
            std::fs::read_to_string(&cfg).unwrap(),
            "interval_ms = 250\n"
        );
        let args: Vec<_> = cmd.get_args().map(|a| a.to_string_lossy()).collect();
        assert!(args.contains(&cfg.display().to_string().into()), "{args:?}");
        assert!(
            !args
                .iter()
                .any(|a| a == "--no-discover" || a == "--metrics-listen")
        );
    }

    #[test]
    fn a_tierd_that_exits_ends_the_waits_at_once_with_its_log() {
        // sh stands in for a tierd that refuses to start: it exits at once,
        // saying it cannot open the script `run` (its first argument).
        let started = std::time::Instant::now();
        let mut t = Tierd::builder().bin("/bin/sh").try_spawn().unwrap();
        let e = t.try_wait_listening(Duration::from_secs(30)).unwrap_err();
        assert!(
            e.0.contains("exited early") && e.0.contains("cannot open run"),
            "{e}"
        );
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let e = rt
            .block_on(t.try_client(Duration::from_secs(30)))
            .unwrap_err();
        assert!(
            e.0.contains("tierd exited") && e.0.contains("cannot open run"),
            "{e}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{:?}",
            started.elapsed()
        );
    }
}
