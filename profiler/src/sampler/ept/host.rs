//! Which KVM MMU this host runs, read from `/sys/module`: the vendor
//! module, whether it pages guests with EPT/NPT and the TDP MMU, and so
//! which SPTE masks the tracepoint program needs and which ageing
//! transition it will see.
//!
//! Parameters (checked in Linux 6.1 and 6.12):
//! - `kvm_intel/parameters/ept` (`enable_ept`) and `eptad`
//!   (`enable_ept_ad_bits`), arch/x86/kvm/vmx/vmx.c; hardware_setup() clears
//!   both when the CPU lacks the feature, so they read what KVM uses. EPT
//!   A/D bits are often off under nested virtualisation.
//! - `kvm_amd/parameters/npt` (`npt_enabled`), arch/x86/kvm/svm/svm.c,
//!   cleared by svm_hardware_setup() without X86_FEATURE_NPT. NPT always
//!   has an accessed bit (`shadow_accessed_mask = PT_ACCESSED_MASK`).
//! - `kvm/parameters/tdp_mmu`: 6.12 (arch/x86/kvm/mmu/mmu.c) sets it to
//!   `tdp_mmu_allowed && tdp_enabled` in kvm_configure_mmu(); 6.1
//!   (arch/x86/kvm/mmu/tdp_mmu.c) leaves it writable (0644), reads Y even
//!   with ept=N, and latches it per VM at creation (kvm_mmu_init_tdp_mmu),
//!   so both parameters are needed.

use std::path::{Path, PathBuf};

use super::SpteMasks;

/// The module that runs guests on this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Vendor {
    /// `kvm_intel`: EPT.
    Intel,
    /// `kvm_amd`: NPT.
    Amd,
    /// Neither (e.g. `kvm_pvm`): only the vendor-neutral shadow MMU.
    Other(String),
}

/// How KVM clears a young SPTE when it ages it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ageing {
    /// Clears the hardware accessed bit (EPT with A/D bits, NPT).
    AccessedBit,
    /// No A/D bits (`kvm_intel.eptad=N`): mark_spte_for_access_track()
    /// clears RWX, saving R and X in bits 54/56; the next access faults.
    AccessTrack,
}

/// The MMU facts that decide what the EPT programs can see.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostMode {
    pub vendor: Vendor,
    /// Two-dimensional paging (EPT or NPT) is on.
    pub tdp: bool,
    /// `kvm.tdp_mmu` reads Y.
    pub tdp_mmu: bool,
    /// Meaningful with `tdp`.
    pub ageing: Ageing,
}

/// Why [`HostMode`] could not be read, or why the tracepoint cannot count.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostModeError {
    #[error("no kvm module ({0} missing)")]
    NoKvm(PathBuf),
    #[error("both kvm_intel and kvm_amd are loaded")]
    TwoVendors,
    #[error("{path}: {message}")]
    Read { path: PathBuf, message: String },
    #[error("{path}: not a boolean parameter: {value:?}")]
    BadValue { path: PathBuf, value: String },
    #[error(
        "no kvm_intel or kvm_amd (vendor module: {0}): shadow paging only, kvm_tdp_mmu_spte_changed never fires"
    )]
    NoTdpVendor(String),
    #[error(
        "{0}=N: shadow paging, the TDP MMU is unused and kvm_tdp_mmu_spte_changed never fires (fexit/kvm_age_gfn still sees the rmap ageing)"
    )]
    ShadowPaging(&'static str),
    #[error(
        "kvm.tdp_mmu=N: the shadow MMU ages through its rmaps (kvm_age_rmap / kvm_rmap_age_gfn_range) and kvm_tdp_mmu_spte_changed never fires"
    )]
    TdpMmuOff,
}

impl HostMode {
    /// Reads the mode from a `/sys/module`-like tree at `root`.
    pub fn detect(root: &Path) -> Result<HostMode, HostModeError> {
        let kvm = root.join("kvm");
        if !kvm.is_dir() {
            return Err(HostModeError::NoKvm(kvm));
        }
        let tdp_mmu = read_bool(&root.join("kvm/parameters/tdp_mmu"))?;
        let intel = root.join("kvm_intel").is_dir();
        let amd = root.join("kvm_amd").is_dir();
        let (vendor, tdp, ageing) = match (intel, amd) {
            (true, true) => return Err(HostModeError::TwoVendors),
            (true, false) => {
                let ept = read_bool(&root.join("kvm_intel/parameters/ept"))?;
                let ad = read_bool(&root.join("kvm_intel/parameters/eptad"))?;
                let ageing = if ad {
                    Ageing::AccessedBit
                } else {
                    Ageing::AccessTrack
                };
                (Vendor::Intel, ept, ageing)
            }
            (false, true) => {
                let npt = read_bool(&root.join("kvm_amd/parameters/npt"))?;
                (Vendor::Amd, npt, Ageing::AccessedBit)
            }
            (false, false) => (
                Vendor::Other(other_kvm_modules(root)),
                false,
                Ageing::AccessedBit,
            ),
        };
        Ok(HostMode {
            vendor,
            tdp,
            tdp_mmu,
            ageing,
        })
    }

    /// [`HostMode::detect`] on this host's `/sys/module`.
    pub fn detect_host() -> Result<HostMode, HostModeError> {
        HostMode::detect(Path::new("/sys/module"))
    }

    /// The masks the tracepoint program needs, or why the tracepoint never
    /// fires on this host.
    pub fn tracepoint_masks(&self) -> Result<SpteMasks, HostModeError> {
        let masks = match (&self.vendor, self.ageing) {
            (Vendor::Other(name), _) => return Err(HostModeError::NoTdpVendor(name.clone())),
            (Vendor::Intel, _) if !self.tdp => {
                return Err(HostModeError::ShadowPaging("kvm_intel.ept"));
            }
            (Vendor::Amd, _) if !self.tdp => {
                return Err(HostModeError::ShadowPaging("kvm_amd.npt"));
            }
            (Vendor::Intel, Ageing::AccessedBit) => SpteMasks::EPT_AD,
            (Vendor::Intel, Ageing::AccessTrack) => SpteMasks::EPT_ACCESS_TRACK,
            (Vendor::Amd, _) => SpteMasks::NPT,
        };
        if !self.tdp_mmu {
            return Err(HostModeError::TdpMmuOff);
        }
        Ok(masks)
    }

    /// One line for `tierd probe`.
    pub fn describe(&self) -> String {
        let vendor = match &self.vendor {
            Vendor::Intel => "kvm_intel",
            Vendor::Amd => "kvm_amd",
            Vendor::Other(name) => name.as_str(),
        };
        match self.tracepoint_masks() {
            Ok(_) => format!(
                "{vendor}, TDP MMU, ageing {}",
                match self.ageing {
                    Ageing::AccessedBit => "clears the accessed bit",
                    Ageing::AccessTrack => "by access tracking (no A/D bits)",
                }
            ),
            Err(e) => format!("{vendor}: {e}"),
        }
    }
}

/// A bool module parameter: `Y`/`N` (bool), `1`/`0` (older int params).
fn read_bool(path: &Path) -> Result<bool, HostModeError> {
    let raw = std::fs::read_to_string(path).map_err(|e| HostModeError::Read {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    match raw.trim() {
        "Y" | "y" | "1" => Ok(true),
        "N" | "n" | "0" => Ok(false),
        other => Err(HostModeError::BadValue {
            path: path.to_path_buf(),
            value: other.to_string(),
        }),
    }
}

/// Names of loaded `kvm_*` modules, for the message ("none" if none).
fn other_kvm_modules(root: &Path) -> String {
    let mut names: Vec<String> = std::fs::read_dir(root)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.starts_with("kvm_"))
        .collect();
    names.sort();
    if names.is_empty() {
        "none".into()
    } else {
        names.join(", ")
    }
}
