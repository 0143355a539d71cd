//! The verdicts of the QEMU loop, from the guests' exact counts and what
//! QEMU reports plugged; tierd's own estimate is printed, never judged.

use crate::run::{MIB, Outcome, Row};

#[derive(Debug)]
pub struct Verdict {
    pub name: &'static str,
    pub pass: bool,
    pub detail: String,
}

pub fn print_header() {
    println!(
        "{:>6}  {:>22} {:>16} {:>13}  {:>22} {:>16} {:>13}",
        "t s",
        "a dram (req/plugged)",
        "a truth touch",
        "a tierd ws 5 s",
        "b dram (req/plugged)",
        "b truth touch",
        "b tierd ws 5 s"
    );
}

fn device(d: Option<(u64, u64)>) -> String {
    d.map_or("-".into(), |(r, p)| format!("{}/{} MiB", r / MIB, p / MIB))
}

fn share(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{:.2}", v))
}

pub fn print_row(r: &Row) {
    let host =
        |h: Option<(f64, f64)>| h.map_or("n/m".into(), |(l, h)| format!("{:.2}-{:.2}", l, h));
    let [a, b] = &r.guests;
    println!(
        "{:>6.1}  {:>22} {:>16} {:>10} {:>15}  {:>22} {:>16} {:>10} {:>15}",
        r.t,
        device(a.dram_device),
        share(a.truth.touch),
        format!("{} MiB", a.truth.ws_bytes / MIB),
        host(a.hot),
        device(b.dram_device),
        share(b.truth.touch),
        format!("{} MiB", b.truth.ws_bytes / MIB),
        host(b.hot),
    );
}

/// Mean of a guest's DRAM share by touch over `rows` that have one.
fn mean_touch(rows: &[Row], g: usize) -> Option<f64> {
    let v: Vec<f64> = rows
        .iter()
        .filter_map(|r| r.guests[g].truth.touch)
        .collect();
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

fn plugged(r: Option<&Row>, g: usize) -> u64 {
    r.and_then(|r| r.guests[g].dram_device).map_or(0, |d| d.1)
}

/// The rows of the last `secs` seconds.
fn last(rows: &[Row], secs: f64) -> &[Row] {
    let end = rows.last().map_or(0.0, |r| r.t);
    let from = rows
        .iter()
        .position(|r| r.t >= end - secs)
        .unwrap_or(rows.len());
    &rows[from..]
}

pub fn all(o: &Outcome) -> Vec<Verdict> {
    let rows = &o.rows;
    let at_grow = rows.get(o.grew_at);
    let end = rows.last();
    let mut v = Vec::new();
    let (a0, a1) = (plugged(at_grow, 0), plugged(end, 0));
    let (b0, b1) = (plugged(rows.first(), 1), plugged(end, 1));
    v.push(Verdict {
        name: "dram_moves_to_the_guest_that_needs_it",
        pass: a1 > a0 && b1 < b0,
        detail: format!(
            "a's DRAM device {} -> {} MiB from its growth to the end; b's {} -> {} MiB over the run",
            a0 / MIB,
            a1 / MIB,
            b0 / MIB,
            b1 / MIB
        ),
    });
    let tail = last(rows, 20.0);
    let follows = (0..2).all(|g| {
        tail.last()
            .and_then(|r| r.guests[g].dram_device)
            .is_some_and(|(req, plug)| req.abs_diff(plug) <= 2 * MIB)
    });
    v.push(Verdict {
        name: "plugged_dram_follows",
        pass: follows,
        detail: format!(
            "at the end (requested/plugged): a {}, b {}",
            device(end.and_then(|r| r.guests[0].dram_device)),
            device(end.and_then(|r| r.guests[1].dram_device))
        ),
    });
    // a's worst 10 s after its growth (its new pages spill to node 1),
    // against its last 15 s: the DRAM moved must bring its accesses back.
    let after = &rows[o.grew_at.min(rows.len())..];
    let dip = (0..after.len())
        .filter_map(|k| {
            let w: Vec<Row> = after[k..]
                .iter()
                .take_while(|r| r.t < after[k].t + 10.0)
                .cloned()
                .collect();
            (w.last().is_some_and(|r| r.t >= after[k].t + 8.0))
                .then(|| mean_touch(&w, 0))
                .flatten()
        })
        .fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.min(x))));
    let a_end = mean_touch(last(rows, 15.0), 0);
    let b_end = mean_touch(last(rows, 15.0), 1);
    v.push(Verdict {
        name: "a_accesses_back_in_dram",
        pass: a_end.zip(dip).is_some_and(|(e, d)| e >= d + 0.1 && e >= 0.8),
        detail: format!(
            "a's DRAM share of accesses (exact): worst 10 s after its growth {}, last 15 s {} (needs +0.10 and >= 0.80)",
            share(dip),
            share(a_end)
        ),
    });
    v.push(Verdict {
        name: "b_keeps_its_hot_set_in_dram",
        pass: b_end.is_some_and(|e| e >= 0.9),
        detail: format!(
            "b's DRAM share of accesses (exact) in the last 15 s: {}",
            share(b_end)
        ),
    });
    let ooms: Vec<u64> = o
        .vmstat
        .iter()
        .map(|(_, e)| e.get("oom_kill").copied().unwrap_or(0))
        .collect();
    v.push(Verdict {
        name: "no_guest_ooms",
        pass: ooms.iter().all(|n| *n == 0) && o.alive.iter().all(|a| *a),
        detail: format!(
            "oom_kill a {} b {}; workloads running a {} b {}",
            ooms[0], ooms[1], o.alive[0], o.alive[1]
        ),
    });
    let settled = (0..2).all(|g| {
        let reqs: Vec<u64> = tail
            .iter()
            .filter_map(|r| r.guests[g].dram_device.map(|d| d.0))
            .collect();
        reqs.windows(2).all(|w| w[0] == w[1])
    });
    v.push(Verdict {
        name: "the_loop_settles",
        pass: settled,
        detail: "no DRAM device request changed in the last 20 s".into(),
    });
    v
}

/// Prints the verdicts, the guests' own tiering and a RESULT line; true
/// if every verdict passed.
pub fn report(o: &Outcome) -> bool {
    let v = all(o);
    println!();
    for x in &v {
        println!(
            "{} {:<40} {}",
            if x.pass { "PASS" } else { "FAIL" },
            x.name,
            x.detail
        );
    }
    let delta = |g: usize, k: &str| {
        let (s, e) = &o.vmstat[g];
        e.get(k)
            .copied()
            .unwrap_or(0)
            .saturating_sub(s.get(k).copied().unwrap_or(0))
    };
    for (g, name) in ["a", "b"].iter().enumerate() {
        println!(
            "{name}: the guest's own tiering: {} pages promoted, {} demoted by kswapd, {} directly, {} NUMA hint faults",
            delta(g, "pgpromote_success"),
            delta(g, "pgdemote_kswapd"),
            delta(g, "pgdemote_direct"),
            delta(g, "numa_hint_faults")
        );
    }
    for (g, pid) in o.vm_ids.iter().enumerate() {
        let mut by: std::collections::BTreeMap<String, u32> = std::collections::BTreeMap::new();
        for d in o
            .decisions
            .iter()
            .filter(|d| Some(&d.vm_id) == pid.as_ref())
        {
            if d.outcome == tier_proto::v1::DecisionOutcome::Applied as i32 {
                let r = tier_proto::v1::DecisionReason::try_from(d.reason)
                    .map_or_else(|_| d.reason.to_string(), |r| r.as_str_name().to_string());
                *by.entry(r).or_default() += 1;
            }
        }
        println!("{}: decisions applied by reason {by:?}", ["a", "b"][g]);
    }
    let applied = o
        .decisions
        .iter()
        .filter(|d| d.outcome == tier_proto::v1::DecisionOutcome::Applied as i32)
        .count();
    let pass = v.iter().all(|x| x.pass);
    let end = o.rows.last();
    println!(
        "RESULT e2e={} vmm=qemu mode={} intervals={} applied={applied} a_dram_mib={} b_dram_mib={} a_promoted={} a_demoted={} failed={}",
        if pass { "pass" } else { "fail" },
        o.mode,
        o.rows.len(),
        plugged(end, 0) / MIB,
        plugged(end, 1) / MIB,
        delta(0, "pgpromote_success"),
        delta(0, "pgdemote_kswapd") + delta(0, "pgdemote_direct"),
        v.iter()
            .filter(|x| !x.pass)
            .map(|x| x.name)
            .collect::<Vec<_>>()
            .join(","),
    );
    pass
}
