//! tierd's own cost at fleet scale: 1000 synthetic VM sources x 4 tiers at
//! 1 Hz, streamed to 10 watchers, against the same tierd with no watcher
//! (the baseline: sampling and aggregation alone) in the same run. CPU is
//! tierd's utime+stime from /proc/PID/stat over the measured window.
//! `--against PATH`: another tierd binary (say, one built from an earlier
//! commit) runs the same 10-watcher load in every run, alternated with
//! this one, and the table gives this tierd's CPU as a ratio of it.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tier_benches::progress::Progress;
use tier_benches::{Row, Summary, print_table, result_line};
use tier_proto::Endpoint;
use tier_proto::v1::WatchStatsRequest;
use tier_test_support::Tierd;
use tokio_stream::StreamExt;

const VMS: u32 = 1000;
const TIERS: u32 = 4;
const WATCHERS: usize = 10;
const RUNS: usize = 3;
const WARMUP: Duration = Duration::from_secs(3);
const WINDOW: Duration = Duration::from_secs(10);

/// CPU seconds (user + system) of a process so far.
fn cpu_seconds(pid: u32) -> anyhow::Result<f64> {
    let stat =
        std::fs::read_to_string(format!("/proc/{pid}/stat")).context("reading /proc/PID/stat")?;
    // Fields after the ")" that ends the command name: utime is field 14.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .context("malformed stat")?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 =
        f.get(11).context("utime")?.parse::<f64>()? + f.get(12).context("stime")?.parse::<f64>()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Ok(ticks / hz)
}

struct Outcome {
    cpu_pct: f64,
    updates: u64,
    gaps: u64,
    bytes_per_update: f64,
}

async fn one_run(tierd: &PathBuf, watchers: usize) -> anyhow::Result<Outcome> {
    let mut d = Tierd::builder()
        .bin(tierd)
        .args(["--backend", "none", "--interval-ms", "1000"])
        .args(["--synthetic-vms", &VMS.to_string()])
        .args(["--synthetic-tiers", &TIERS.to_string()])
        .try_spawn()
        .context("starting tierd")?;
    d.try_wait_listening(Duration::from_secs(20))?;
    let socket = d.socket().to_path_buf();
    let ep = Endpoint::Unix(socket.clone());
    let mut tasks = Vec::new();
    for _ in 0..watchers {
        let mut client = tier_proto::connect(&ep).await?;
        let mut stream = client
            .watch_stats(WatchStatsRequest::default())
            .await?
            .into_inner();
        tasks.push(tokio::spawn(async move {
            let (mut n, mut gaps, mut bytes, mut last) = (0u64, 0u64, 0u64, 0u64);
            while let Some(Ok(u)) = stream.next().await {
                if last != 0 && u.sequence > last + 1 {
                    gaps += u.sequence - last - 1;
                }
                last = u.sequence;
                n += 1;
                bytes += prost::Message::encoded_len(&u) as u64;
            }
            (n, gaps, bytes)
        }));
    }
    tokio::time::sleep(WARMUP).await;
    let pid = d.pid();
    let c0 = cpu_seconds(pid)?;
    let t0 = Instant::now();
    tokio::time::sleep(WINDOW).await;
    let cpu = cpu_seconds(pid)? - c0;
    let wall = t0.elapsed().as_secs_f64();
    drop(d);
    let (mut updates, mut gaps, mut bytes) = (0, 0, 0);
    for t in tasks {
        let (n, g, b) = t.await.context("watcher task")?;
        updates += n;
        gaps += g;
        bytes += b;
    }
    Ok(Outcome {
        cpu_pct: 100.0 * cpu / wall,
        updates,
        gaps,
        bytes_per_update: if updates > 0 {
            bytes as f64 / updates as f64
        } else {
            0.0
        },
    })
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let tierd = std::env::current_exe()
        .context("current_exe")?
        .parent()
        .context("bench dir")?
        .join("tierd");
    if !tierd.exists() {
        bail!(
            "{} not built: run through `cargo xtask bench tierd-scale`",
            tierd.display()
        );
    }
    let args: Vec<String> = std::env::args().collect();
    let against = match args.iter().position(|a| a == "--against") {
        Some(i) => {
            let p = PathBuf::from(args.get(i + 1).context("--against needs a tierd path")?);
            if !p.is_file() {
                bail!("--against {}: no such file", p.display());
            }
            Some(p)
        }
        None => None,
    };
    let (mut base, mut fan, mut other) = (Vec::new(), Vec::new(), Vec::new());
    let (mut gaps, mut updates, mut size) = (0, 0, 0.0);
    let per_run = if against.is_some() { 3 } else { 2 };
    let progress = Progress::bar("tierd-scale", (RUNS * per_run) as u64);
    for run in 1..=RUNS {
        // Alternate so drift on a noisy machine hits all alike.
        progress.item(format!("run {run}/{RUNS}: no watcher"));
        base.push(one_run(&tierd, 0).await?.cpu_pct);
        progress.inc();
        progress.item(format!("run {run}/{RUNS}: {WATCHERS} watchers"));
        let o = one_run(&tierd, WATCHERS).await?;
        progress.inc();
        fan.push(o.cpu_pct);
        gaps += o.gaps;
        updates += o.updates;
        size = o.bytes_per_update;
        if let Some(a) = &against {
            progress.item(format!("run {run}/{RUNS}: {WATCHERS} watchers, --against"));
            other.push(one_run(a, WATCHERS).await?.cpu_pct);
            progress.inc();
        }
    }
    progress.finish();
    let (b, f) = (
        Summary::of(&base).context("no runs")?,
        Summary::of(&fan).context("no runs")?,
    );
    let o = Summary::of(&other);
    let mut rows = vec![
        Row {
            name: "no watcher (baseline)".into(),
            unit: "% of one core",
            summary: b,
            ratio: Some(1.0),
        },
        Row {
            name: format!("{WATCHERS} watchers"),
            unit: "% of one core",
            summary: f,
            ratio: (b.median > 0.0).then(|| f.median / b.median),
        },
    ];
    if let (Some(o), Some(a)) = (o, &against) {
        rows.push(Row {
            name: format!("{WATCHERS} watchers, --against {}", a.display()),
            unit: "% of one core",
            summary: o,
            ratio: (b.median > 0.0).then(|| o.median / b.median),
        });
    }
    print_table(
        &format!(
            "tierd CPU, {VMS} synthetic VMs x {TIERS} tiers at 1 Hz, {RUNS} runs of {WINDOW:?} (update {:.0} KiB encoded)",
            size / 1024.0
        ),
        &rows,
    );
    if let Some(o) = o.filter(|o| o.median > 0.0) {
        println!(
            "this tierd / the --against tierd, 10 watchers, medians: {:.2}",
            f.median / o.median
        );
    }
    println!("watchers received {updates} updates, {gaps} lost (sequence gaps)");
    println!(
        "{}",
        result_line(&[
            ("cpu_pct", format!("{:.2}", f.median)),
            ("baseline_cpu_pct", format!("{:.2}", b.median)),
            ("gaps", gaps.to_string()),
            (
                "against_cpu_pct",
                o.map_or("na".into(), |o| format!("{:.2}", o.median)),
            ),
        ])
    );
    Ok(())
}
