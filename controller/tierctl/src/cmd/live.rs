//! The full-screen loop of `tierctl top`: a thread reads the terminal, a
//! task follows tierd (WatchStats and WatchDecisions, reconnecting with
//! backoff), and the loop applies both to the state and redraws.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use ratatui::crossterm::event::{self, Event};
use tier_proto::Endpoint;
use tier_proto::v1::{
    DaemonInfo, Decision, GetPolicyRequest, Policy, StatsUpdate, WatchDecisionsRequest,
    WatchStatsRequest,
};
use tierctl::conn::{self, Client, RpcError};
use tierctl::top::app::Conn;
use tierctl::top::{App, input, render};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};
use tokio_stream::StreamExt;

enum Msg {
    Term(Event),
    TermError(String),
    Connected(DaemonInfo, Option<Policy>),
    Policy(Policy),
    Stats(Box<StatsUpdate>, bool),
    Decision(Box<Decision>),
    Disconnected {
        error: String,
        attempt: u32,
        retry_at_ns: u64,
    },
}

/// The policy is re-read this often (targets and epsilon shown); stats
/// and decisions are streamed, never polled.
const POLICY_REFRESH: Duration = Duration::from_secs(10);

pub async fn run(endpoint: Endpoint, client: Client, info: DaemonInfo) -> anyhow::Result<()> {
    let (tx, mut rx) = unbounded_channel();
    let net = tokio::spawn(follow(endpoint, Some((client, info)), tx.clone()));
    let mut terminal = ratatui::try_init().context("setting up the terminal")?;
    let input = tx.clone();
    // crossterm's read blocks: a thread of its own; it ends with the process.
    std::thread::spawn(move || {
        loop {
            let m = match event::read() {
                Ok(ev) => Msg::Term(ev),
                Err(e) => Msg::TermError(e.to_string()),
            };
            let stop = matches!(m, Msg::TermError(_));
            if input.send(m).is_err() || stop {
                return;
            }
        }
    });
    let result = ui(&mut terminal, &mut rx).await;
    net.abort();
    ratatui::try_restore().context("restoring the terminal")?;
    result
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

async fn ui(
    terminal: &mut ratatui::DefaultTerminal,
    rx: &mut UnboundedReceiver<Msg>,
) -> anyhow::Result<()> {
    let mut app = App::new();
    let size = terminal.size().context("terminal size")?;
    app.resize(size.width, size.height);
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("SIGTERM handler")?;
    loop {
        app.now_ns = now_ns();
        terminal
            .draw(|f| render(&app, f))
            .context("drawing the screen")?;
        tokio::select! {
            m = rx.recv() => match m {
                Some(m) => apply(&mut app, m)?,
                None => return Ok(()),
            },
            // Only the retry countdown moves without a message.
            _ = tick.tick(), if matches!(app.conn, Conn::Disconnected { .. }) => {}
            _ = term.recv() => app.quit = true,
        }
        // Apply what else is queued before drawing again.
        while let Ok(m) = rx.try_recv() {
            apply(&mut app, m)?;
        }
        if app.quit {
            return Ok(());
        }
    }
}

fn apply(app: &mut App, m: Msg) -> anyhow::Result<()> {
    match m {
        Msg::Term(Event::Key(k)) => input::handle_key(app, k),
        Msg::Term(Event::Resize(w, h)) => app.resize(w, h),
        Msg::Term(_) => {}
        Msg::TermError(e) => anyhow::bail!("reading the terminal: {e}"),
        Msg::Connected(info, policy) => app.on_connected(info, policy),
        Msg::Policy(p) => {
            app.policy = Some(p);
            if !app.paused() {
                app.refresh();
            }
        }
        Msg::Stats(u, first) => app.on_update(*u, first),
        Msg::Decision(d) => app.on_decision(*d),
        Msg::Disconnected {
            error,
            attempt,
            retry_at_ns,
        } => app.on_disconnected(error, attempt, retry_at_ns),
    }
    Ok(())
}

/// Delay before reconnect attempt `n` (1-based): 250 ms doubling to 5 s.
fn backoff(n: u32) -> Duration {
    Duration::from_millis((250u64 << n.saturating_sub(1).min(5)).min(5000))
}

/// Follows tierd for as long as the UI runs: on any failure, reports it
/// and reconnects with backoff; the UI keeps its last picture meanwhile.
async fn follow(
    endpoint: Endpoint,
    mut first: Option<(Client, DaemonInfo)>,
    tx: UnboundedSender<Msg>,
) {
    let mut attempt = 0;
    loop {
        let connected = match first.take() {
            Some(c) => Ok(c),
            None => conn::connect(&endpoint).await,
        };
        let error = match connected {
            Ok((client, info)) => {
                attempt = 0;
                let policy = client
                    .clone()
                    .get_policy(GetPolicyRequest {})
                    .await
                    .ok()
                    .map(|r| r.into_inner());
                if tx.send(Msg::Connected(info, policy)).is_err() {
                    return;
                }
                stream(client, &tx).await
            }
            Err(e) => e.to_string(),
        };
        if tx.is_closed() {
            return;
        }
        attempt += 1;
        let wait = backoff(attempt);
        let retry_at_ns = now_ns() + wait.as_nanos() as u64;
        let _ = tx.send(Msg::Disconnected {
            error,
            attempt,
            retry_at_ns,
        });
        tokio::time::sleep(wait).await;
    }
}

/// Forwards stats and decisions until the connection fails; returns why.
async fn stream(mut client: Client, tx: &UnboundedSender<Msg>) -> String {
    let mut stats = match client
        .watch_stats(WatchStatsRequest { vm_ids: Vec::new() })
        .await
    {
        Ok(s) => s.into_inner(),
        Err(s) => return RpcError::new("WatchStats", s).to_string(),
    };
    // Without decisions (an older tierd) the column just stays "-".
    let mut decisions = client
        .clone()
        .watch_decisions(WatchDecisionsRequest { vm_ids: Vec::new() })
        .await
        .ok()
        .map(|r| r.into_inner());
    let mut policy = tokio::time::interval(POLICY_REFRESH);
    policy.tick().await;
    let mut first = true;
    loop {
        let next_decision = async {
            match decisions.as_mut() {
                Some(d) => d.next().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            u = stats.next() => match u {
                Some(Ok(u)) => {
                    if tx.send(Msg::Stats(Box::new(u), first)).is_err() {
                        return String::new();
                    }
                    first = false;
                }
                Some(Err(s)) => return RpcError::new("WatchStats", s).to_string(),
                None => return "tierd closed the stats stream".into(),
            },
            d = next_decision => match d {
                Some(Ok(d)) => {
                    let _ = tx.send(Msg::Decision(Box::new(d)));
                }
                _ => decisions = None,
            },
            _ = policy.tick() => {
                if let Ok(p) = client.get_policy(GetPolicyRequest {}).await {
                    let _ = tx.send(Msg::Policy(p.into_inner()));
                }
            }
        }
    }
}
