use super::*;

fn ept(key: &str, pages: u64) -> UnitSpec {
    UnitSpec {
        key: key.into(),
        vms: vec![key.into()],
        pages,
        scalable: true,
    }
}

fn hostpte(pid: u32, vms: &[&str], pages: u64) -> UnitSpec {
    UnitSpec {
        key: format!("pid {pid}"),
        vms: vms.iter().map(|v| v.to_string()).collect(),
        pages,
        scalable: false,
    }
}

/// Runs `intervals` intervals of `slots` passes where a grid page costs
/// `per_page` s (scalable) and a hostpte pass `per_pass(pages)`;
/// returns the reports and total CPU "spent".
fn run(
    b: &mut Budget,
    units: &[UnitSpec],
    intervals: usize,
    cost: impl Fn(&UnitSpec, u64) -> f64,
) -> (Vec<Report>, f64) {
    let mut reports = Vec::new();
    let mut total = 0.0;
    for _ in 0..intervals {
        for _ in 0..b.slots {
            let d = b.begin_pass(units);
            for (s, d) in units.iter().zip(d) {
                if d.run {
                    let g = if s.scalable {
                        grid(s.pages, d.stride)
                    } else {
                        1
                    };
                    let c = cost(s, d.stride);
                    total += c;
                    b.spent(&s.key, Duration::from_secs_f64(c), g);
                }
            }
        }
        reports.push(b.take_report());
    }
    (reports, total)
}

const GIB_PAGES: u64 = 1 << 18;

#[test]
fn scalable_units_stay_inside_the_budget_whatever_their_size() {
    // 1 % of a core, 1 s intervals, 5 passes: 10 ms per interval.
    let mut b = Budget::new(1.0, Duration::from_secs(1), 5, 1);
    let units: Vec<UnitSpec> = [1u64, 8, 64]
        .iter()
        .map(|g| ept(&format!("vm{g}"), g * GIB_PAGES))
        .collect();
    // 200 ns per grid page: a 64 GiB VM at stride 1 is 3.4 s a pass.
    let per_page = 200e-9;
    let (reports, total) = run(&mut b, &units, 40, |s, st| {
        per_page * grid(s.pages, st) as f64
    });
    // After the probe interval, every interval is inside the budget.
    for r in &reports[2..] {
        assert!(r.spent_pct <= 1.0 + 1e-9, "{r:?}");
        assert!(r.spent_pct > 0.5, "budget mostly used: {r:?}");
    }
    assert!(total <= 40.0 * 0.010 * 1.05, "total {total}");
    // Bigger VMs get larger strides, not more CPU: same allowance.
    let last = reports.last().unwrap();
    let stride: Vec<u64> = ["vm1", "vm8", "vm64"]
        .iter()
        .map(|id| last.vms.iter().find(|v| v.vm == *id).unwrap().stride)
        .collect();
    assert!(stride[0] < stride[1] && stride[1] < stride[2], "{last:?}");
    for v in &last.vms {
        assert_eq!(v.passes, 5, "{v:?}");
        assert!(!v.limited.is_empty(), "{v:?}");
        assert!((v.budget_pct - 1.0 / 3.0).abs() < 1e-6, "{v:?}");
    }
}

#[test]
fn the_budget_leans_to_wide_intervals_over_a_floor() {
    let mut b = Budget::new(1.0, Duration::from_secs(1), 5, 1);
    b.set_needs(HashMap::from([
        ("wide".into(), 0.4),
        ("tight".into(), 0.02),
    ]));
    let units = [ept("wide", 16 * GIB_PAGES), ept("tight", 16 * GIB_PAGES)];
    let (reports, _) = run(&mut b, &units, 6, |s, st| 200e-9 * grid(s.pages, st) as f64);
    let last = reports.last().unwrap();
    let get = |id: &str| last.vms.iter().find(|v| v.vm == id).unwrap().clone();
    let (wide, tight) = (get("wide"), get("tight"));
    assert!(
        wide.budget_pct > 3.0 * tight.budget_pct,
        "{wide:?} {tight:?}"
    );
    // The floor: at least FLOOR_SHARE / n of the budget.
    assert!(tight.budget_pct >= 100.0 * 0.01 * FLOOR_SHARE / 2.0 - 1e-9);
    assert!((wide.budget_pct + tight.budget_pct - 1.0).abs() < 1e-6);
    assert!(wide.coverage > tight.coverage, "{wide:?} {tight:?}");
}

#[test]
fn a_small_vm_takes_full_coverage_and_leaves_the_rest() {
    let mut b = Budget::new(1.0, Duration::from_secs(1), 5, 1);
    let units = [ept("small", 1024), ept("big", 64 * GIB_PAGES)];
    let (reports, _) = run(&mut b, &units, 6, |s, st| 200e-9 * grid(s.pages, st) as f64);
    let last = reports.last().unwrap();
    let small = last.vms.iter().find(|v| v.vm == "small").unwrap();
    let big = last.vms.iter().find(|v| v.vm == "big").unwrap();
    assert_eq!(small.stride, 1, "{small:?}");
    assert!(small.limited.is_empty(), "{small:?}");
    // 1024 pages x 200 ns x 5 passes = 1 ms (1.28 with headroom): the
    // big VM gets the 8.72 ms left.
    assert!((big.budget_pct - 0.872).abs() < 0.01, "{big:?}");
}

#[test]
fn hostpte_lowers_its_passes_and_says_so() {
    let mut b = Budget::new(1.0, Duration::from_secs(1), 5, 1);
    // 4 GiB resident at 30.8 ms/GiB: 123 ms a pass, 12 x the budget.
    let units = [hostpte(42, &["a", "b"], 4 * GIB_PAGES)];
    let (reports, total) = run(&mut b, &units, 200, |_, _| 0.1232);
    // Whole intervals: 5 passes or none.
    assert!(
        reports.iter().all(|r| r.vms[0].passes % 5 == 0),
        "{reports:?}"
    );
    let sampled = reports.iter().filter(|r| r.vms[0].passes == 5).count();
    // 200 intervals x 10 ms = 2 s buys 3 intervals of 5 x 123 ms (the
    // first on credit, the debt then paid back).
    assert!((3..=4).contains(&sampled), "sampled intervals {sampled}");
    assert!(total <= 2.0 + 5.0 * 0.1232, "total {total}");
    let skipped = reports.iter().find(|r| r.vms[0].passes == 0).unwrap();
    assert!(
        skipped.vms[0].limited.contains("1 interval in 62"),
        "{skipped:?}"
    );
    let r = reports.last().unwrap();
    assert_eq!(r.vms.len(), 2, "both VMs of the process reported");
    for v in &r.vms {
        assert!(v.passes_allowed < 0.1, "{v:?}");
        assert!(v.limited.contains("passes per interval"), "{v:?}");
        assert_eq!(v.coverage, 1.0);
    }
    // Within budget over the run (plus one interval's passes), not per
    // interval.
    let spent: f64 = reports.iter().map(|r| r.spent_pct).sum::<f64>() / 200.0;
    assert!(
        spent <= 1.0 + 100.0 * 5.0 * 0.1232 / 200.0,
        "mean spent {spent} %"
    );
}

#[test]
fn hostpte_under_budget_runs_every_pass() {
    let mut b = Budget::new(1.0, Duration::from_secs(1), 5, 1);
    let units = [hostpte(7, &["a"], 1024)];
    let (reports, _) = run(&mut b, &units, 4, |_, _| 0.0005);
    for r in &reports {
        assert_eq!(r.vms[0].passes, 5);
        assert!(r.vms[0].limited.is_empty(), "{r:?}");
    }
}

#[test]
fn without_a_budget_every_page_every_pass() {
    let mut b = Budget::unlimited(4);
    let units = [ept("a", 64 * GIB_PAGES), hostpte(1, &["b"], GIB_PAGES)];
    for _ in 0..3 {
        let d = b.begin_pass(&units);
        assert_eq!(
            d,
            vec![
                Decision {
                    run: true,
                    stride: 4
                },
                Decision {
                    run: true,
                    stride: 1
                }
            ]
        );
        b.spent("a", Duration::from_millis(100), grid(64 * GIB_PAGES, 4));
    }
    let r = b.take_report();
    assert_eq!(r.budget_pct, 0.0);
    assert!(r.vms.iter().all(|v| v.limited.is_empty()), "{r:?}");
}

#[test]
fn units_that_left_are_forgotten() {
    let mut b = Budget::new(1.0, Duration::from_secs(1), 1, 1);
    b.begin_pass(&[ept("a", 10), ept("b", 10)]);
    b.take_report();
    b.begin_pass(&[ept("a", 10)]);
    let r = b.take_report();
    assert_eq!(r.vms.len(), 1);
    assert_eq!(b.take_report().vms.len(), 0);
}

#[test]
fn thread_cpu_advances_with_work() {
    let a = thread_cpu();
    let mut x = 0u64;
    for i in 0..5_000_000u64 {
        x = x.wrapping_mul(31).wrapping_add(i);
    }
    std::hint::black_box(x);
    assert!(thread_cpu() > a);
}
