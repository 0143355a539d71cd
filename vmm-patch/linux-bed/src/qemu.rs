//! QEMU's command line for the bed: q35 under TCG, two NUMA nodes whose
//! HMAT latencies and bandwidths put them in two memory tiers (6.12 reads
//! HMAT into memory tiers; 6.1 shows the figures but keeps one tier), a
//! virtio-mem device per node, a virtio-balloon, QMP on a unix socket, the
//! console on stdio. Backends are memfds, so each shows by name
//! (`/memfd:ID`) in QEMU's maps.

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
    pub cpus: u32,
    /// Node 0 (DRAM, with the CPUs) and node 1 (the slow tier).
    pub nodes: [Node; 2],
    pub balloon: bool,
    /// `-plugin` value (the TCG plugin and its arguments).
    pub plugin: Option<String>,
    /// Kernel command line beyond the console and panic settings.
    pub append: String,
}

impl Machine {
    /// Defaults: 2 vCPUs, 256 MiB per node at 80 / 250 ns and 100 / 30
    /// GB/s (DRAM and a CXL-like tier), a virtio-mem device of up to 512 MiB
    /// per node plugging 0 and 128 MiB, the balloon.
    pub fn new(vmlinuz: &Path, initramfs: &Path, qmp: &Path) -> Machine {
        Machine {
            qemu: PathBuf::from("qemu-system-x86_64"),
            vmlinuz: vmlinuz.into(),
            initramfs: initramfs.into(),
            qmp: qmp.into(),
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
            append: String::new(),
        }
    }

    /// QEMU's arguments.
    pub fn args(&self) -> Vec<String> {
        let boot: u64 = self.nodes.iter().map(|n| n.mib).sum();
        let hot: u64 = self.nodes.iter().map(|n| n.vmem_max_mib).sum();
        let mut a: Vec<String> = [
            "-accel",
            "tcg",
            "-cpu",
            "max",
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
            format!("{boot}M,slots=2,maxmem={}M", boot + hot.max(1)),
        );
        push("-smp", self.cpus.to_string());
        for (i, n) in self.nodes.iter().enumerate() {
            push(
                "-object",
                format!("memory-backend-memfd,id=m{i},size={}M", n.mib),
            );
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
        for (i, n) in self
            .nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| n.vmem_max_mib > 0)
        {
            push(
                "-object",
                format!("memory-backend-memfd,id=vm{i},size={}M", n.vmem_max_mib),
            );
            push(
                "-device",
                format!(
                    "virtio-mem-pci,id=vmem{i},memdev=vm{i},node={i},requested-size={}M",
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
        a
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_nodes_with_hmat_a_vmem_each_and_room_for_them() {
        let m = Machine::new(Path::new("/k"), Path::new("/i"), Path::new("/q.sock"));
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
            a.contains("virtio-mem-pci,id=vmem1,memdev=vm1,node=1,requested-size=128M"),
            "{a}"
        );
        assert!(
            a.contains("virtio-mem-pci,id=vmem0,memdev=vm0,node=0,requested-size=0M"),
            "{a}"
        );
        assert!(a.contains("-qmp unix:/q.sock,server=on,wait=off"), "{a}");
        assert!(!a.contains("-plugin"));
    }

    #[test]
    fn a_node_without_vmem_gets_no_device() {
        let mut m = Machine::new(Path::new("/k"), Path::new("/i"), Path::new("/q"));
        m.nodes[0].vmem_max_mib = 0;
        m.plugin = Some("/p.so,out=/dev/shm/x".into());
        let a = m.args().join(" ");
        assert!(!a.contains("id=vmem0"), "{a}");
        assert!(a.contains("-plugin /p.so,out=/dev/shm/x"), "{a}");
        assert!(a.contains("maxmem=1024M"), "{a}");
    }
}
