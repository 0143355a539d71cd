//! Fuzzes the parsers that read data from outside tierd's trust boundary
//! (docs/fuzz.md): cloud-hypervisor `vm.info` and `vm.counters` bodies,
//! the backend's control-socket lines, stats-queue buffers, the config
//! file. Seeded, structure-aware; every case under `catch_unwind`.
//!
//! `--seed N` (1), `--cases N` per parser (1000000), `--target a,b`
//! (all), `--batch N` (100000, the unit of the timing table), `--replay
//! FILE` (one saved input through `--target`).

use anyhow::{Context, bail};
use tier_benches::fuzz::{self, Report, targets};
use tier_benches::progress::Progress;
use tier_benches::{Row, Summary, print_table, result_line, sys};

struct Args {
    seed: u64,
    cases: u64,
    batch: u64,
    targets: Vec<String>,
    replay: Option<String>,
}

fn args() -> anyhow::Result<Args> {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut a = Args {
        seed: 1,
        cases: 1_000_000,
        batch: 100_000,
        targets: Vec::new(),
        replay: None,
    };
    let mut it = argv.iter();
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--seed" => a.seed = value()?.parse().context("--seed")?,
            "--cases" => a.cases = value()?.parse().context("--cases")?,
            "--batch" => a.batch = value()?.parse::<u64>().context("--batch")?.max(1),
            "--target" => a.targets.extend(value()?.split(',').map(str::to_string)),
            "--replay" => a.replay = Some(value()?.clone()),
            other => bail!(
                "unknown argument {other:?} (--seed N, --cases N, --target a,b, --batch N, --replay FILE)"
            ),
        }
    }
    let known = targets::names();
    if let Some(t) = a.targets.iter().find(|t| !known.contains(&t.as_str())) {
        bail!("no target {t:?}; targets: {}", known.join(", "));
    }
    Ok(a)
}

fn main() -> anyhow::Result<()> {
    let a = args()?;
    let chosen: Vec<Box<dyn fuzz::Target>> = targets::all()
        .into_iter()
        .filter(|t| a.targets.is_empty() || a.targets.iter().any(|n| n == t.name()))
        .collect();
    if let Some(file) = &a.replay {
        let input = std::fs::read(file).with_context(|| format!("reading {file}"))?;
        for mut t in chosen {
            match fuzz::run_case(t.as_mut(), &input) {
                Ok(v) => println!("{}: {v:?}", t.name()),
                Err(msg) => println!("{}: PANIC {msg}", t.name()),
            }
        }
        return Ok(());
    }
    let save = sys::out_dir("fuzz").context("bench output directory")?;
    let checks = fuzz::overflow_checks();
    println!(
        "fuzz: seed {}, {} cases per parser, batches of {}; 1 case in {} about 1 MiB; \
         overflow checks {} ({}); panicking inputs go to {}",
        a.seed,
        a.cases,
        a.batch,
        fuzz::BIG_EVERY,
        if checks { "on" } else { "off" },
        if checks {
            "integer overflow panics and is found"
        } else {
            "release: overflow wraps silently; run a debug build to find it"
        },
        save.display()
    );
    let batches = a.cases.div_ceil(a.batch) * chosen.len() as u64;
    let progress = Progress::bar("fuzz", batches);
    let mut reports: Vec<Report> = Vec::new();
    for mut t in chosen {
        progress.item(t.name());
        let r = fuzz::fuzz(
            t.as_mut(),
            a.seed,
            a.cases,
            a.batch,
            Some(&save),
            &mut || progress.inc(),
        );
        reports.push(r);
    }
    progress.finish();
    print_reports(&reports, a.batch);
    Ok(())
}

fn print_reports(reports: &[Report], batch: u64) {
    println!();
    println!(
        "{:<13} {:>9} {:>9} {:>9} {:>6} {:>9} {:>9} {:>6} {:>9} {:>4} {:>9} {:>9} {:>9}",
        "parser",
        "cases",
        "accepted",
        "rejected",
        "panics",
        "cases/s",
        "gen/s",
        "x gen",
        "max in",
        "big",
        "rss0 KiB",
        "rss1 KiB",
        "peak+KiB"
    );
    let mut rows = Vec::new();
    for r in reports {
        let gen_secs: f64 = r.gen_batch_secs.iter().sum();
        let per_s = |secs: f64| {
            if secs > 0.0 {
                r.cases as f64 / secs
            } else {
                0.0
            }
        };
        let fuzz_med = Summary::of(&r.batch_secs);
        let gen_med = Summary::of(&r.gen_batch_secs);
        let ratio = match (fuzz_med, gen_med) {
            (Some(f), Some(g)) if g.median > 0.0 => Some(f.median / g.median),
            _ => None,
        };
        println!(
            "{:<13} {:>9} {:>9} {:>9} {:>6} {:>9.0} {:>9.0} {:>6} {:>9} {:>4} {:>9} {:>9} {:>9}{}",
            r.name,
            r.cases,
            r.accepted,
            r.rejected,
            r.panic_count,
            per_s(r.secs),
            per_s(gen_secs),
            ratio.map_or("-".into(), |x| format!("{x:.1}")),
            r.max_input,
            r.big_inputs,
            r.rss_before_kib,
            r.rss_after_kib,
            r.peak_growth_kib,
            if r.hwm_reset { "" } else { " (HWM not reset)" }
        );
        let ms = |v: &[f64]| v.iter().map(|s| s * 1e3).collect::<Vec<_>>();
        if let (Some(f), Some(g)) = (
            Summary::of(&ms(&r.batch_secs)),
            Summary::of(&ms(&r.gen_batch_secs)),
        ) {
            rows.push(Row {
                name: format!("{} generate+parse", r.name),
                unit: "ms/batch",
                summary: f,
                ratio,
            });
            rows.push(Row {
                name: format!("{} generate only", r.name),
                unit: "ms/batch",
                summary: g,
                ratio: None,
            });
        }
    }
    for r in reports.iter().filter(|r| !r.notes.is_empty()) {
        println!("{}: {}", r.name, r.notes);
    }
    println!();
    print_table(
        &format!(
            "time per batch of {batch} cases (ratio: generate+parse / generate only, medians)"
        ),
        &rows,
    );
    for r in reports {
        for p in &r.panics {
            println!();
            println!(
                "PANIC {} case {} (seed {}): {}",
                r.name, p.case, r.seed, p.message
            );
            println!("  input: {}", fuzz::escaped(&p.input, 400));
            if let Some(f) = &p.saved {
                println!(
                    "  saved: {} (replay: --target {} --replay FILE)",
                    f.display(),
                    r.name
                );
            }
        }
    }
    let cases: u64 = reports.iter().map(|r| r.cases).sum();
    let panics: u64 = reports.iter().map(|r| r.panic_count).sum();
    let peak = reports.iter().map(|r| r.peak_growth_kib).max().unwrap_or(0);
    let retained = reports
        .iter()
        .map(|r| r.rss_after_kib.saturating_sub(r.rss_before_kib))
        .max()
        .unwrap_or(0);
    let max_input = reports.iter().map(|r| r.max_input).max().unwrap_or(0);
    let secs: f64 = reports
        .iter()
        .map(|r| r.secs + r.gen_batch_secs.iter().sum::<f64>())
        .sum();
    println!();
    println!(
        "{}",
        result_line(&[
            ("parsers", reports.len().to_string()),
            ("cases", cases.to_string()),
            ("panics", panics.to_string()),
            ("rss_growth_kib", peak.to_string()),
            ("rss_retained_kib", retained.to_string()),
            ("max_input_bytes", max_input.to_string()),
            ("secs", format!("{secs:.0}")),
        ])
    );
}
