//! Boots Debian's 6.12 cloud kernel under QEMU TCG with tier_truth and
//! checks the counts are real: a guest that writes 32 MiB into a tmpfs
//! bound to node 1 must show at least that many node-1 pages touched
//! between its START and DONE markers. Ignored, with the reason, without
//! qemu-system-x86_64, busybox, the plugin (TIERD_TRUTH_PLUGIN, from
//! `cargo xtask linux-bed-plugin`) or the kernel .deb (TIERD_BED_KERNEL_DEB,
//! default: the newest 6.12 cloud-amd64 one `cargo xtask compat` cached).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tier_linux_bed::truth::{PAGE, Truth};

const MIB: u64 = 1 << 20;
const WRITE_MIB: u64 = 32;
const INIT: &str = "#!/bin/sh
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
mount -t tmpfs -o size=64m,mpol=bind:1 tmpfs /mnt
echo TRUTH-START; sleep 1
dd if=/dev/zero of=/mnt/f bs=1M count=32 && echo TRUTH-WROTE
echo TRUTH-DONE; sleep 1
poweroff -f
";

fn main() {
    let args = libtest_mimic::Arguments::from_args();
    let ready = needs();
    let trial =
        libtest_mimic::Trial::ignorable_test("boot_counts_node1_writes", move || match &ready {
            Err(why) => Ok(libtest_mimic::Completion::ignored_with(why.clone())),
            Ok(n) => {
                boot_counts_node1_writes(n);
                Ok(libtest_mimic::Completion::Completed)
            }
        });
    libtest_mimic::run(&args, vec![trial]).exit();
}

#[derive(Debug)]
struct Needs {
    plugin: PathBuf,
    deb: PathBuf,
    busybox: PathBuf,
}

fn needs() -> Result<Needs, String> {
    let on_path = |n: &str| {
        std::env::var_os("PATH")
            .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(n).is_file()))
    };
    if !on_path("qemu-system-x86_64") || !on_path("cpio") {
        return Err(
            "needs qemu-system-x86_64 and cpio (apt-get install qemu-system-x86 cpio)".into(),
        );
    }
    let busybox = PathBuf::from("/bin/busybox");
    if !busybox.is_file() {
        return Err("needs /bin/busybox (apt-get install busybox-static)".into());
    }
    let plugin = std::env::var_os("TIERD_TRUTH_PLUGIN")
        .map(PathBuf::from)
        .filter(|p| p.is_file())
        .ok_or("TIERD_TRUTH_PLUGIN is not a file (`cargo xtask linux-bed-plugin` prints it)")?;
    let deb = match std::env::var_os("TIERD_BED_KERNEL_DEB") {
        Some(d) => PathBuf::from(d),
        None => cached_deb().ok_or("no linux-image-6.12*-cloud-amd64 .deb: run `cargo xtask compat` or set TIERD_BED_KERNEL_DEB")?,
    };
    Ok(Needs {
        plugin,
        deb,
        busybox,
    })
}

fn cached_deb() -> Option<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or(root.join("target"), PathBuf::from);
    let mut debs: Vec<PathBuf> = std::fs::read_dir(target.join("compat/debs"))
        .ok()?
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("linux-image-6.12") && n.contains("-cloud-amd64_"))
        })
        .collect();
    debs.sort();
    debs.pop()
}

fn run(cmd: &mut Command) {
    let st = cmd.status().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(st.success(), "{cmd:?}: {st}");
}

/// vmlinuz of the .deb and a busybox initramfs running INIT.
fn guest(n: &Needs, dir: &Path) -> (PathBuf, PathBuf) {
    let x = dir.join("deb");
    run(Command::new("dpkg-deb").arg("-x").arg(&n.deb).arg(&x));
    let boot = std::fs::read_dir(x.join("boot")).unwrap();
    let kernel = boot
        .filter_map(|e| Some(e.ok()?.path()))
        .find(|p| {
            p.file_name()
                .is_some_and(|f| f.to_string_lossy().starts_with("vmlinuz"))
        })
        .expect("no vmlinuz in the .deb");
    let root = dir.join("root");
    for d in ["bin", "proc", "sys", "dev", "mnt"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    std::fs::copy(&n.busybox, root.join("bin/busybox")).unwrap();
    for a in ["sh", "mount", "echo", "sleep", "dd", "poweroff"] {
        std::os::unix::fs::symlink("busybox", root.join("bin").join(a)).unwrap();
    }
    let init = root.join("init");
    std::fs::write(&init, INIT).unwrap();
    run(Command::new("chmod").arg("755").arg(&init));
    let initrd = dir.join("initrd.cpio");
    run(Command::new("sh")
        .arg("-c")
        .arg(format!(
            "find . | cpio -o -H newc --quiet > {}",
            initrd.display()
        ))
        .current_dir(&root));
    (kernel, initrd)
}

fn boot_counts_node1_writes(n: &Needs) {
    let dir = tempfile::tempdir().unwrap();
    let (kernel, initrd) = guest(n, dir.path());
    // Backends are files so the plugin can tell them apart (tier_truth.c).
    let shm = tempfile::tempdir_in("/dev/shm").unwrap();
    let (m0, m1) = (shm.path().join("m0"), shm.path().join("m1"));
    for f in [&m0, &m1] {
        std::fs::File::create(f)
            .unwrap()
            .set_len(256 * MIB)
            .unwrap();
    }
    let out = shm.path().join("truth");
    let plugin = format!(
        "{},out={},ram=0x0:{},ram=0x10000000:{}",
        n.plugin.display(),
        out.display(),
        m0.display(),
        m1.display()
    );
    let mut qemu = Command::new("qemu-system-x86_64")
        .args([
            "-accel", "tcg", "-cpu", "max", "-machine", "q35", "-m", "512M", "-smp", "2",
        ])
        .arg("-object")
        .arg(format!(
            "memory-backend-file,id=m0,size=256M,share=on,mem-path={}",
            m0.display()
        ))
        .arg("-object")
        .arg(format!(
            "memory-backend-file,id=m1,size=256M,share=on,mem-path={}",
            m1.display()
        ))
        .args([
            "-numa",
            "node,nodeid=0,memdev=m0,cpus=0-1",
            "-numa",
            "node,nodeid=1,memdev=m1",
        ])
        .args(["-plugin", &plugin, "-kernel"])
        .arg(&kernel)
        .arg("-initrd")
        .arg(&initrd)
        .args([
            "-append",
            "console=ttyS0 panic=-1 quiet",
            "-display",
            "none",
            "-serial",
            "stdio",
        ])
        .args(["-no-reboot", "-nodefaults"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("starting qemu-system-x86_64");
    let started = Instant::now();
    let stdout = qemu.stdout.take().expect("piped stdout");
    let mut truth = None;
    let (mut at_start, mut at_done) = (None, None);
    let mut console = String::new();
    for line in BufReader::new(stdout).lines() {
        let line = line.unwrap_or_default();
        console.push_str(&line);
        console.push('\n');
        if line.contains("TRUTH-") {
            let t = truth.get_or_insert_with(|| Truth::open(&out).expect("opening the truth file"));
            let snap = Some((t.snapshot(), started.elapsed()));
            if line.contains("TRUTH-START") {
                at_start = snap;
            } else if line.contains("TRUTH-DONE") {
                at_done = snap;
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(900),
            "guest ran over 15 min"
        );
    }
    let st = qemu.wait().unwrap();
    assert!(st.success(), "qemu: {st}");
    assert!(
        console.contains("TRUTH-WROTE"),
        "the guest's dd failed:\n{console}"
    );
    let t = truth.expect("the guest printed no TRUTH- marker");
    let ((a, ta), (b, tb)) = (at_start.expect("no START"), at_done.expect("no DONE"));
    let end = t.snapshot();
    let d = b.since(&a).unwrap();
    let node0 = d.sum_in(0, 256 * MIB);
    let node1 = d.sum_in(256 * MIB, 256 * MIB);
    eprintln!("guest console:\n{console}");
    eprintln!(
        "boot to START {:.1} s wall, START..DONE {:.1} s; interval: {} insns, node0 {node0:?}, node1 {node1:?}; whole run {:?}, {:?}",
        ta.as_secs_f64(),
        (tb - ta).as_secs_f64(),
        d.counters.instructions,
        end.total(),
        end.counters
    );
    assert!(end.counters.exited, "the plugin did not see QEMU exit");
    assert!(end.counters.instructions > 0 && d.counters.instructions > 0);
    assert!(end.counters.check_samples > 0);
    assert_eq!(
        end.counters.check_mismatches, 0,
        "phys_addr - host varied within a backend"
    );
    assert!(
        node1.pages_touched >= WRITE_MIB * MIB / PAGE,
        "node 1 touched {} pages, the guest wrote {WRITE_MIB} MiB there",
        node1.pages_touched
    );
    assert!(node1.misses > 0 && node1.misses <= node1.touches);
    let total = end.total();
    assert!(total.misses <= total.touches);
    // QEMU 7.2's phys_addr is ram_addr + the region's offset in its
    // container: GPA for node 0, GPA + 256 MiB for node 1.
    let r = t.ranges();
    assert_eq!(r[0].phys_minus_gpa, Some(0));
    assert_eq!(r[1].phys_minus_gpa, Some((256 * MIB) as i64));
}
