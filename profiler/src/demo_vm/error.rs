//! Error type of the demo VM harness.

/// Everything that can go wrong while creating, driving or stopping the demo VM.
#[derive(Debug, thiserror::Error)]
pub enum DemoVmError {
    /// Opening /dev/kvm failed (missing module, no permission, ...).
    #[error("/dev/kvm: {0}")]
    DevKvm(String),
    /// A KVM ioctl failed; `op` names it, e.g. "KVM_CREATE_VM".
    #[error("{op} failed: {source}")]
    Kvm {
        op: &'static str,
        source: kvm_ioctls::Error,
    },
    #[error("mmap of the {region} region ({size} bytes) failed: {source}")]
    Mmap {
        region: &'static str,
        size: u64,
        source: std::io::Error,
    },
    #[error("invalid config: {0}")]
    Config(String),
    #[error("invalid phase: {0}")]
    Phase(String),
    #[error("spawning the vcpu0 thread failed: {0}")]
    Spawn(String),
    /// `set_phase` on a VM whose vCPU thread has ended.
    #[error("vCPU thread is not running: {0}")]
    NotRunning(String),
    /// The vCPU thread ended with an error (unexpected exit, KVM_RUN failure, panic).
    #[error("vCPU thread failed: {0}")]
    Vcpu(String),
}

impl DemoVmError {
    pub(crate) fn kvm(op: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> Self {
        move |source| DemoVmError::Kvm { op, source }
    }

    /// Maps the errno of opening /dev/kvm to a short human message.
    pub(crate) fn dev_kvm(e: kvm_ioctls::Error) -> Self {
        let msg = match e.errno() {
            libc::ENOENT => "no such device (is the kvm module loaded?)".to_string(),
            libc::EACCES | libc::EPERM => "permission denied".to_string(),
            _ => e.to_string(),
        };
        DemoVmError::DevKvm(msg)
    }
}
