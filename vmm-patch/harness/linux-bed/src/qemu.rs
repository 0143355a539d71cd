//! QEMU's command line for the bed: q35 under TCG, two NUMA nodes whose
//! HMAT latencies and bandwidths put them in two memory tiers (6.12 reads
//! HMAT into memory tiers; 6.1 shows the figures but keeps one tier), a
//! virtio-mem device per node, a virtio-balloon, QMP on a unix socket, the
//! console on stdio. Backends are shared files under [`Machine::backends`]
//! (a tmpfs), so each shows by path in QEMU's maps and the truth plugin
//! can tell them apart (`plugin/tier_truth.c`); virtio-mem devices sit at
//! fixed guest-physical addresses from 4 GiB up, so their pages are known
//! before the guest boots.

use std::path::{Path, PathBuf};

/// One NUMA node of the guest.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Node {
    /// Boot memory (its memory backend), MiB.
    pub mib: u64,
    /// HMAT access latency, ns.
    pub latency_ns: u32,
    /// HMAT access bandwidth, GB/s.
    pub bandwidth_gbs: u32,
    /// The node's virtio-mem device: most it can plug, MiB (0: none).
    pub vmem_max_mib: u64,
    /// What it plugs at boot, MiB.
    pub vmem_mib: u64,
}

/// What to boot.
#[derive(Debug, Clone)]
pub struct Machine {
    pub qemu: PathBuf,
    pub vmlinuz: PathBuf,
    pub initramfs: PathBuf,
    pub qmp: PathBuf,
    /// Directory of the backend files (`m0`, `m1`, `vm0`, `vm1`).
    pub backends: PathBuf,
    pub cpus: u32,
    /// Node 0 (DRAM, with the CPUs) and node 1 (the slow tier).
    pub nodes: [Node; 2],
    pub balloon: bool,
    /// `-plugin` value (the TCG plugin and its arguments).
    pub plugin: Option<String>,
    /// Kernel command line beyond the console and panic settings.
    pub append: String,
    /// More QEMU arguments (e.g. a second `-qmp` for tierd: the bed keeps
    /// its own QMP connection, and QEMU serves one client per socket).
    pub extra_args: Vec<String>,
    /// Run under KVM (`-accel kvm -cpu qemu64`) instead of TCG; the truth
    /// plugin is TCG's, so it cannot be loaded then.
    pub kvm: bool,
    /// `memory-backend-memfd` instead of files on /dev/shm, as libvirt's
    /// `<source type='memfd'/>` gives; the truth plugin needs files.
    pub memfd: bool,
    /// Room under `maxmem` for memory devices added at run time.
    pub spare_mib: u64,
}

impl Machine {
    /// Defaults: 2 vCPUs, 256 MiB per node at 80 / 250 ns and 100 / 30
    /// GB/s (DRAM and a CXL-like tier), a virtio-mem device of up to 512 MiB
    /// per node plugging 0 and 128 MiB, the balloon.
    pub fn new(vmlinuz: &Path, initramfs: &Path, qmp: &Path, backends: &Path) -> Machine {
        Machine {
            qemu: PathBuf::from("qemu-system-x86_64"),
            vmlinuz: vmlinuz.into(),
            initramfs: initramfs.into(),
            qmp: qmp.into(),
            backends: backends.into(),
            cpus: 2,
            nodes: [
                Node {
                    mib: 256,
                    latency_ns: 80,
                    bandwidth_gbs: 100,
                    vmem_max_mib: 512,
                    vmem_mib: 0,
                },
                Node {
                    mib: 256,
                    latency_ns: 250,
                    bandwidth_gbs: 30,
                    vmem_max_mib: 512,
                    vmem_mib: 128,
                },
            ],
            balloon: true,
            plugin: None,
            extra_args: Vec::new(),
            append: String::new(),
            kvm: false,
            memfd: false,
            spare_mib: 0,
        }
    }

    /// Each backend: id, guest-physical start, bytes. Boot memory is
    /// contiguous from 0 (under q35's 2.75 GiB hole); virtio-mem regions
    /// follow from 4 GiB.
    pub fn layout(&self) -> Vec<(String, u64, u64)> {
        let mut out = Vec::new();
        let mut gpa = 0;
        for (i, n) in self.nodes.iter().enumerate() {
            out.push((format!("m{i}"), gpa, n.mib * MIB));
            gpa += n.mib * MIB;
        }
        let mut gpa = DEVICE_MEMORY;
        for (i, n) in self
            .nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| n.vmem_max_mib > 0)
        {
            out.push((format!("vm{i}"), gpa, n.vmem_max_mib * MIB));
            gpa += n.vmem_max_mib * MIB;
        }
        out
    }

    /// The backend file of `id`.
    pub fn backend(&self, id: &str) -> PathBuf {
        self.backends.join(id)
    }

    /// Creates the backend files at their sizes (the truth plugin reads
    /// their sizes when QEMU loads it, before QEMU maps them).
    pub fn create_backends(&self) -> std::io::Result<()> {
        std::fs::create_dir_all(&self.backends)?;
        if self.memfd {
            return Ok(());
        }
        for (id, _, len) in self.layout() {
            std::fs::File::create(self.backend(&id))?.set_len(len)?;
        }
        Ok(())
    }

    /// The `-plugin` value that loads tier_truth (`so`) writing to `out`,
    /// with every backend's guest-physical range.
    pub fn truth_plugin(&self, so: &Path, out: &Path) -> String {
        let mut v = format!("{},out={}", so.display(), out.display());
        for (id, gpa, _) in self.layout() {
            v += &format!(",ram={gpa:#x}:{}", self.backend(&id).display());
        }
        v
    }

    /// QEMU's arguments.
    pub fn args(&self) -> Vec<String> {
        let boot: u64 = self.nodes.iter().map(|n| n.mib).sum();
        let hot: u64 = self.nodes.iter().map(|n| n.vmem_max_mib).sum();
        let (accel, cpu) = if self.kvm {
            ("kvm", "qemu64")
        } else {
            ("tcg", "max")
        };
        let mut a: Vec<String> = [
            "-accel",
            accel,
            "-cpu",
            cpu,
            "-machine",
            "q35,hmat=on",
            "-nodefaults",
            "-display",
            "none",
            "-serial",
            "stdio",
            "-no-reboot",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let mut push = |k: &str, v: String| {
            a.push(k.into());
            a.push(v);
        };
        push(
            "-m",
            format!(
                "{boot}M,slots=2,maxmem={}M",
                boot + (hot + self.spare_mib).max(1)
            ),
        );
        push("-smp", self.cpus.to_string());
        for (i, n) in self.nodes.iter().enumerate() {
            push("-object", self.backend_object(&format!("m{i}"), n.mib));
            let cpus = if i == 0 {
                format!(",cpus=0-{}", self.cpus.saturating_sub(1))
            } else {
                String::new()
            };
            push(
                "-numa",
                format!("node,nodeid={i},memdev=m{i}{cpus},initiator=0"),
            );
        }
        for (i, n) in self.nodes.iter().enumerate() {
            push(
                "-numa",
                format!(
                    "hmat-lb,initiator=0,target={i},hierarchy=memory,data-type=access-latency,latency={}",
                    n.latency_ns
                ),
            );
            push(
                "-numa",
                format!(
                    "hmat-lb,initiator=0,target={i},hierarchy=memory,data-type=access-bandwidth,bandwidth={}G",
                    n.bandwidth_gbs
                ),
            );
        }
        for (id, gpa, len) in self.layout().into_iter().filter(|l| l.0.starts_with("vm")) {
            let i = &id[2..];
            let n = self.nodes[usize::from(i == "1")];
            push("-object", self.backend_object(&id, len / MIB));
            push(
                "-device",
                format!(
                    "virtio-mem-pci,id=vmem{i},memdev={id},node={i},memaddr={gpa:#x},requested-size={}M",
                    n.vmem_mib
                ),
            );
        }
        if self.balloon {
            push("-device", "virtio-balloon-pci,id=balloon0".into());
        }
        push(
            "-qmp",
            format!("unix:{},server=on,wait=off", self.qmp.display()),
        );
        if let Some(p) = &self.plugin {
            push("-plugin", p.clone());
        }
        push("-kernel", self.vmlinuz.display().to_string());
        push("-initrd", self.initramfs.display().to_string());
        // Plugged memory online as movable, so it can be unplugged again.
        push(
            "-append",
            format!(
                "console=ttyS0 panic=-1 quiet memhp_default_state=online_movable {}",
                self.append
            )
            .trim()
            .to_string(),
        );
        a.extend(self.extra_args.iter().cloned());
        a
    }

    fn backend_object(&self, id: &str, mib: u64) -> String {
        if self.memfd {
            return format!("memory-backend-memfd,id={id},size={mib}M,share=on");
        }
        format!(
            "memory-backend-file,id={id},size={mib}M,share=on,mem-path={}",
            self.backend(id).display()
        )
    }
}

const MIB: u64 = 1 << 20;
/// Where q35 puts hot-pluggable memory when boot memory is under 4 GiB.
pub const DEVICE_MEMORY: u64 = 1 << 32;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_nodes_with_hmat_a_vmem_each_and_room_for_them() {
        let m = Machine::new(
            Path::new("/k"),
            Path::new("/i"),
            Path::new("/q.sock"),
            Path::new("/b"),
        );
        let a = m.args().join(" ");
        assert!(a.contains("-m 512M,slots=2,maxmem=1536M"), "{a}");
        assert!(
            a.contains("node,nodeid=0,memdev=m0,cpus=0-1,initiator=0"),
            "{a}"
        );
        assert!(a.contains("node,nodeid=1,memdev=m1,initiator=0"), "{a}");
        assert!(
            a.contains("target=1,hierarchy=memory,data-type=access-latency,latency=250"),
            "{a}"
        );
        assert!(
            a.contains("id=vmem1,memdev=vm1,node=1,memaddr=0x120000000,requested-size=128M"),
            "{a}"
        );
        assert!(
            a.contains("id=vmem0,memdev=vm0,node=0,memaddr=0x100000000,requested-size=0M"),
            "{a}"
        );
        assert!(
            a.contains("memory-backend-file,id=m1,size=256M,share=on,mem-path=/b/m1"),
            "{a}"
        );
        let p = m.truth_plugin(Path::new("/t.so"), Path::new("/o"));
        assert_eq!(
            p,
            "/t.so,out=/o,ram=0x0:/b/m0,ram=0x10000000:/b/m1,ram=0x100000000:/b/vm0,ram=0x120000000:/b/vm1"
        );
        assert!(a.contains("-qmp unix:/q.sock,server=on,wait=off"), "{a}");
        assert!(!a.contains("-plugin"));
    }

    #[test]
    fn a_node_without_vmem_gets_no_device() {
        let mut m = Machine::new(
            Path::new("/k"),
            Path::new("/i"),
            Path::new("/q"),
            Path::new("/b"),
        );
        m.nodes[0].vmem_max_mib = 0;
        m.plugin = Some("/p.so,out=/dev/shm/x".into());
        let a = m.args().join(" ");
        assert!(!a.contains("id=vmem0"), "{a}");
        assert!(a.contains("-plugin /p.so,out=/dev/shm/x"), "{a}");
        assert!(a.contains("maxmem=1024M"), "{a}");
    }

    #[test]
    fn kvm_memfd_and_spare_room() {
        let mut m = Machine::new(
            Path::new("/k"),
            Path::new("/i"),
            Path::new("/q"),
            Path::new("/b"),
        );
        (m.kvm, m.memfd, m.spare_mib) = (true, true, 256);
        let a = m.args().join(" ");
        assert!(a.contains("-accel kvm -cpu qemu64"), "{a}");
        assert!(!a.contains("tcg"), "{a}");
        assert!(
            a.contains("memory-backend-memfd,id=m0,size=256M,share=on"),
            "{a}"
        );
        assert!(!a.contains("memory-backend-file"), "{a}");
        assert!(a.contains("maxmem=1792M"), "{a}");
    }
}
