//! Real-KVM tests (no mocks). Without a usable /dev/kvm at build time they
//! are compiled as ignored, with the reason shown by the test runner.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

use super::*;
use std::time::{Duration, Instant};

fn start(cfg: DemoVmConfig) -> DemoVm {
    DemoVm::start(cfg).expect("start demo VM")
}

/// Polls until `cond` holds; panics with the VM state after 10 s.
fn wait_for(vm: &DemoVm, what: &str, cond: impl Fn(&GuestCounters) -> bool) -> GuestCounters {
    let t = Instant::now();
    loop {
        let c = vm.counters();
        if cond(&c) {
            return c;
        }
        assert!(vm.is_running(), "vCPU died: {:?}", vm.last_error());
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "timeout waiting for {what}: {c:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn expected(rounds: u64, p: Phase) -> [u64; 2] {
    [
        rounds * u64::from(p.dram_pages) * u64::from(p.dram_repeat),
        rounds * u64::from(p.slow_pages) * u64::from(p.slow_repeat),
    ]
}

/// Work page `i` of region `r` (0 = dram, 1 = slow).
fn work_gpa(r: usize, i: u32) -> u64 {
    [DRAM_WORK_GPA, SLOW_GPA][r] + u64::from(i) * PAGE_SIZE
}

#[test]
#[cfg_attr(not(has_kvm), ignore = "needs a usable /dev/kvm")]
fn starts_and_runs_guest_code() {
    let vm = start(DemoVmConfig::default());
    let c = wait_for(&vm, "3 rounds", |c| c.rounds >= 3);
    assert_eq!(c.accesses, expected(c.rounds, Phase::default()));
    assert!(c.exits >= c.rounds);
    assert_eq!(vm.touched_pages(), [2 + 48, 96]);
    let r = vm.regions();
    assert_eq!((r[0].name, r[0].gpa, r[0].slot), ("dram", 0, 0));
    assert_eq!((r[1].name, r[1].gpa, r[1].slot), ("slow", SLOW_GPA, 1));
    let end = vm.stop().expect("stop");
    assert!(end.rounds >= c.rounds);
    assert_eq!(end.accesses, expected(end.rounds, Phase::default()));
}

#[test]
#[cfg_attr(not(has_kvm), ignore = "needs a usable /dev/kvm")]
fn guest_writes_its_work_pages_only() {
    let p = Phase {
        dram_pages: 5,
        dram_repeat: 3,
        slow_pages: 7,
        slow_repeat: 2,
    };
    let vm = start(DemoVmConfig {
        phase: p,
        ..DemoVmConfig::default()
    });
    wait_for(&vm, "3 rounds", |c| c.rounds >= 3);
    for (r, pages) in [(0, p.dram_pages), (1, p.slow_pages)] {
        for i in 0..pages {
            assert!(
                vm.read_u32(work_gpa(r, i)).unwrap() > 0,
                "region {r} page {i}"
            );
        }
        assert_eq!(
            vm.read_u32(work_gpa(r, pages)),
            Some(0),
            "region {r} beyond"
        );
    }
    // Each finished round adds `repeat` to every work dword.
    let before = vm.counters().rounds;
    let (d, s) = (
        vm.read_u32(work_gpa(0, 4)).unwrap(),
        vm.read_u32(work_gpa(1, 6)).unwrap(),
    );
    let after = vm.counters().rounds;
    assert!(
        (before * 3..=(after + 1) * 3).contains(&u64::from(d)),
        "{before} {d} {after}"
    );
    assert!(
        (before * 2..=(after + 1) * 2).contains(&u64::from(s)),
        "{before} {s} {after}"
    );
    vm.stop().expect("stop");
}

/// An unexpected exit (here HLT patched over `jmp top`) stops vcpu0 and is
/// reported with its exit reason and RIP.
#[test]
#[cfg_attr(not(has_kvm), ignore = "needs a usable /dev/kvm")]
fn unexpected_exit_is_reported() {
    let vm = start(DemoVmConfig::default());
    wait_for(&vm, "1 round", |c| c.rounds >= 1);
    vm.mem[0]
        .write_bytes(CODE_GPA + 0x30, &[0xf4, 0xf4])
        .unwrap();
    let t = Instant::now();
    while vm.is_running() {
        assert!(t.elapsed() < Duration::from_secs(10), "vCPU did not stop");
        std::thread::sleep(Duration::from_millis(1));
    }
    let err = vm.last_error().expect("error recorded");
    assert!(
        err.contains("KVM_EXIT_HLT") && err.contains("RIP=0x1031"),
        "{err}"
    );
    assert!(matches!(
        vm.set_phase(Phase::default()),
        Err(DemoVmError::NotRunning(_))
    ));
    match vm.stop() {
        Err(DemoVmError::Vcpu(msg)) => assert_eq!(msg, err),
        other => panic!("expected Vcpu error, got {other:?}"),
    }
}

#[test]
#[cfg_attr(not(has_kvm), ignore = "needs a usable /dev/kvm")]
fn set_phase_takes_effect_at_round_boundary() {
    let vm = start(DemoVmConfig::default());
    wait_for(&vm, "1 round", |c| c.rounds >= 1);
    let next = Phase {
        dram_pages: 60,
        dram_repeat: 1,
        slow_pages: 10,
        slow_repeat: 2,
    };
    vm.set_phase(next).expect("set_phase");
    let t = Instant::now();
    while vm.phase() != next {
        assert!(t.elapsed() < Duration::from_secs(10), "phase never applied");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(vm.touched_pages(), [62, 10]);
    let before = vm.counters().rounds;
    let c = wait_for(&vm, "3 more rounds", |c| c.rounds >= before + 3);
    // Every round ran wholly in one phase: find the split and check it
    // explains both regions' counts exactly.
    let (old, new) = (expected(1, Phase::default()), expected(1, next));
    let old_rounds = (c.rounds * new[0]).abs_diff(c.accesses[0]) / old[0].abs_diff(new[0]);
    assert!(old_rounds >= 1 && old_rounds <= before, "{c:?}");
    let new_rounds = c.rounds - old_rounds;
    for r in 0..2 {
        assert_eq!(
            c.accesses[r],
            old_rounds * old[r] + new_rounds * new[r],
            "{c:?}"
        );
    }
    // Pages 48..60 of dram were never touched before the switch.
    for i in 48..60 {
        assert!(vm.read_u32(work_gpa(0, i)).unwrap() > 0, "dram page {i}");
    }
    assert_eq!(vm.read_u32(work_gpa(0, 60)), Some(0));
    vm.stop().expect("stop");
}

#[test]
#[cfg_attr(not(has_kvm), ignore = "needs a usable /dev/kvm")]
fn vcpu_thread_is_named_vcpu0() {
    let vm = start(DemoVmConfig::default());
    let tid = vm.vcpu_tid().expect("tid");
    let comm = std::fs::read_to_string(format!("/proc/self/task/{tid}/comm")).unwrap();
    assert_eq!(comm.trim_end(), "vcpu0");
    vm.stop().expect("stop");
}

#[test]
#[cfg_attr(not(has_kvm), ignore = "needs a usable /dev/kvm")]
fn config_and_phase_validation() {
    let cases = [
        DemoVmConfig {
            dram_bytes: (16 << 20) + 1,
            ..Default::default()
        },
        DemoVmConfig {
            slow_bytes: 0,
            ..Default::default()
        },
        DemoVmConfig {
            dram_bytes: 1 << 20,
            ..Default::default()
        },
        DemoVmConfig {
            dram_bytes: 512 << 20,
            ..Default::default()
        },
        DemoVmConfig {
            slow_bytes: 4 << 30,
            ..Default::default()
        },
        DemoVmConfig {
            dram_bytes: 2 << 20,
            phase: Phase {
                dram_pages: 257,
                ..Phase::default()
            },
            ..Default::default()
        },
        DemoVmConfig {
            slow_bytes: 64 << 10,
            phase: Phase {
                slow_pages: 17,
                ..Phase::default()
            },
            ..Default::default()
        },
    ];
    for cfg in cases {
        match DemoVm::start(cfg) {
            Err(DemoVmError::Config(msg)) => println!("{cfg:?}: {msg}"),
            other => panic!("{cfg:?}: expected Config error, got {other:?}"),
        }
    }
    // Exactly full work areas are fine; one more page is not.
    let cfg = DemoVmConfig {
        dram_bytes: 2 << 20,
        slow_bytes: 64 << 10,
        phase: Phase {
            dram_pages: 256,
            dram_repeat: 1,
            slow_pages: 16,
            slow_repeat: 1,
        },
    };
    let vm = start(cfg);
    let e = vm
        .set_phase(Phase {
            slow_pages: 17,
            ..cfg.phase
        })
        .unwrap_err();
    assert!(matches!(e, DemoVmError::Phase(_)), "{e}");
    assert!(e.to_string().contains("slow_pages = 17"), "{e}");
    vm.set_phase(Phase {
        dram_pages: 0,
        dram_repeat: 0,
        slow_pages: 0,
        slow_repeat: 9,
    })
    .expect("idle phase is allowed");
    vm.stop().expect("stop");
}

#[test]
#[cfg_attr(not(has_kvm), ignore = "needs a usable /dev/kvm")]
fn idle_phase_touches_only_code_and_params() {
    let idle = Phase {
        dram_pages: 0,
        dram_repeat: 5,
        slow_pages: 3,
        slow_repeat: 0,
    };
    let vm = start(DemoVmConfig {
        phase: idle,
        ..Default::default()
    });
    assert_eq!(vm.touched_pages(), [2, 0]);
    let c = wait_for(&vm, "100 rounds", |c| c.rounds >= 100);
    assert_eq!(c.accesses, [0, 0]);
    assert_eq!(vm.read_u32(work_gpa(1, 0)), Some(0));
    vm.stop().expect("stop");
}

/// Host-side view: the dram and slow VMAs hold exactly the pages the guest
/// (plus the loader, for code/params) touched.
#[test]
#[cfg_attr(not(has_kvm), ignore = "needs a usable /dev/kvm")]
fn smaps_rss_matches_touched_pages() {
    let vm = start(DemoVmConfig::default());
    wait_for(&vm, "3 rounds", |c| c.rounds >= 3);
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    for (r, want) in vm.regions().iter().zip(vm.touched_pages()) {
        let (size_kb, rss_kb) = vma_size_rss_kb(&smaps, r.hva).expect("VMA in smaps");
        assert_eq!(size_kb * 1024, r.size, "{} is its own VMA", r.name);
        assert_eq!(rss_kb / 4, want, "{} resident pages", r.name);
    }
    vm.stop().expect("stop");
}

fn vma_size_rss_kb(smaps: &str, start: u64) -> Option<(u64, u64)> {
    let header = format!("{start:x}-");
    let mut lines = smaps
        .lines()
        .skip_while(|l| !l.starts_with(&header))
        .skip(1);
    let field = |l: &str, k: &str| -> Option<u64> {
        l.strip_prefix(k)?
            .trim()
            .strip_suffix("kB")?
            .trim()
            .parse()
            .ok()
    };
    let size = lines.next().and_then(|l| field(l, "Size:"))?;
    let rss = lines.find_map(|l| field(l, "Rss:"))?;
    Some((size, rss))
}

#[test]
#[cfg_attr(not(has_kvm), ignore = "needs a usable /dev/kvm")]
fn stop_interrupts_a_long_round() {
    // ~40 M RMWs per round: many seconds at emulated speed.
    let long = Phase {
        dram_pages: 3000,
        dram_repeat: 10_000,
        slow_pages: 0,
        slow_repeat: 0,
    };
    let vm = start(DemoVmConfig {
        phase: long,
        ..Default::default()
    });
    std::thread::sleep(Duration::from_millis(50));
    let t = Instant::now();
    let c = vm.stop().expect("stop");
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "stop took {:?}",
        t.elapsed()
    );
    assert_eq!(c.rounds, 0);
}

#[test]
fn guest_code_matches_assembler() {
    const SRC: &str = "
.code32
.intel_syntax noprefix
top:      mov esi, 0x2000
          mov edi, 2
seg:      mov edx, [esi+8]
          test edx, edx
          jz seg_next
rep_loop: mov ebx, [esi]
          mov ecx, [esi+4]
          test ecx, ecx
          jz seg_next
page_loop: inc dword ptr [ebx]
          add ebx, 0x1000
          dec ecx
          jnz page_loop
          dec edx
          jnz rep_loop
seg_next: add esi, 12
          dec edi
          jnz seg
          out 0x80, al
          jmp top
";
    let dir = std::env::temp_dir().join(format!("demovm-asm-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (s, o, b) = (dir.join("g.s"), dir.join("g.o"), dir.join("g.bin"));
    std::fs::write(&s, SRC).unwrap();
    let run = |cmd: &str, args: &[&std::path::Path], extra: &[&str]| {
        std::process::Command::new(cmd)
            .args(extra)
            .args(args)
            .status()
    };
    match run("as", &[&s], &["--32", "-o", o.to_str().unwrap()]) {
        Ok(st) if st.success() => {}
        other => panic!("GNU as (binutils, installed by `cargo xtask deps`) failed: {other:?}"),
    }
    let st = run("objcopy", &[&o, &b], &["-O", "binary", "-j", ".text"]).unwrap();
    assert!(st.success());
    assert_eq!(std::fs::read(&b).unwrap(), guest::GUEST_CODE);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn demo_vm_can_be_shared_across_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<DemoVm>();
}
