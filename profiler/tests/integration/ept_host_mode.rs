//! HostMode from stand-in `/sys/module` trees (this machine has neither
//! kvm_intel nor kvm_amd), one per vendor, mode and reason the tracepoint
//! cannot count; and the real host's tree read the same way.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

use crate::ept_common::stand_in;

use std::path::Path;

use tier_profiler::sampler::ept::{Ageing, HostMode, HostModeError, SpteMasks, Vendor};

fn detect(params: &[(&str, &str)]) -> Result<HostMode, HostModeError> {
    HostMode::detect(stand_in(params).path())
}

const TDP_MMU: (&str, &str) = ("kvm/parameters/tdp_mmu", "Y");
const EPT: (&str, &str) = ("kvm_intel/parameters/ept", "Y");
const EPT_AD: (&str, &str) = ("kvm_intel/parameters/eptad", "Y");

#[test]
fn stand_in_sysfs_intel_ept_with_ad_bits() {
    let m = detect(&[TDP_MMU, EPT, EPT_AD]).unwrap();
    assert_eq!(m.vendor, Vendor::Intel);
    assert_eq!(m.ageing, Ageing::AccessedBit);
    assert_eq!(m.tracepoint_masks(), Ok(SpteMasks::EPT_AD));
    assert!(m.describe().contains("accessed bit"), "{}", m.describe());
}

#[test]
fn stand_in_sysfs_intel_ept_without_ad_bits_is_access_tracking() {
    let m = detect(&[TDP_MMU, EPT, ("kvm_intel/parameters/eptad", "N")]).unwrap();
    assert_eq!(m.ageing, Ageing::AccessTrack);
    assert_eq!(m.tracepoint_masks(), Ok(SpteMasks::EPT_ACCESS_TRACK));
    assert!(m.describe().contains("access tracking"), "{}", m.describe());
}

#[test]
fn stand_in_sysfs_amd_npt() {
    let m = detect(&[TDP_MMU, ("kvm_amd/parameters/npt", "Y")]).unwrap();
    assert_eq!(m.vendor, Vendor::Amd);
    assert_eq!(m.tracepoint_masks(), Ok(SpteMasks::NPT));
    // Older int-valued parameters read 1/0.
    let m = detect(&[TDP_MMU, ("kvm_amd/parameters/npt", "1")]).unwrap();
    assert_eq!(m.tracepoint_masks(), Ok(SpteMasks::NPT));
}

#[test]
fn stand_in_sysfs_shadow_paging_is_unavailable() {
    // 6.1 leaves kvm.tdp_mmu=Y even with ept=N: ept decides.
    let m = detect(&[TDP_MMU, ("kvm_intel/parameters/ept", "N"), EPT_AD]).unwrap();
    assert_eq!(
        m.tracepoint_masks(),
        Err(HostModeError::ShadowPaging("kvm_intel.ept"))
    );
    let m = detect(&[TDP_MMU, ("kvm_amd/parameters/npt", "0")]).unwrap();
    let e = m.tracepoint_masks().unwrap_err();
    assert_eq!(e, HostModeError::ShadowPaging("kvm_amd.npt"));
    assert!(e.to_string().contains("never fires"), "{e}");
    assert!(
        m.describe().starts_with("kvm_amd: kvm_amd.npt=N"),
        "{}",
        m.describe()
    );
}

#[test]
fn stand_in_sysfs_tdp_mmu_off_is_unavailable() {
    let m = detect(&[("kvm/parameters/tdp_mmu", "N"), EPT, EPT_AD]).unwrap();
    assert!(!m.tdp_mmu);
    assert_eq!(m.tracepoint_masks(), Err(HostModeError::TdpMmuOff));
}

#[test]
fn stand_in_sysfs_no_tdp_vendor_names_the_module() {
    let tree = stand_in(&[
        ("kvm/parameters/tdp_mmu", "N"),
        ("kvm_pvm/parameters/force", "N"),
    ]);
    let m = HostMode::detect(tree.path()).unwrap();
    assert_eq!(m.vendor, Vendor::Other("kvm_pvm".into()));
    assert_eq!(
        m.tracepoint_masks(),
        Err(HostModeError::NoTdpVendor("kvm_pvm".into()))
    );
}

#[test]
fn stand_in_sysfs_bad_trees_are_errors() {
    let empty = stand_in(&[]);
    assert!(matches!(
        HostMode::detect(empty.path()),
        Err(HostModeError::NoKvm(_))
    ));
    // Vendor module without its parameter.
    let e = detect(&[TDP_MMU, ("kvm_intel/parameters/eptad", "Y")]).unwrap_err();
    match e {
        HostModeError::Read { path, .. } => assert!(path.ends_with("kvm_intel/parameters/ept")),
        other => panic!("{other:?}"),
    }
    let e = detect(&[TDP_MMU, ("kvm_intel/parameters/ept", "maybe"), EPT_AD]).unwrap_err();
    assert!(
        matches!(&e, HostModeError::BadValue { value, .. } if value == "maybe"),
        "{e:?}"
    );
    let e = detect(&[TDP_MMU, EPT, EPT_AD, ("kvm_amd/parameters/npt", "Y")]).unwrap_err();
    assert_eq!(e, HostModeError::TwoVendors);
}

/// This host, read through the same function; checked against the
/// parameters read here independently.
#[test]
fn host_mode_of_this_machine() {
    let root = Path::new("/sys/module");
    let got = HostMode::detect_host();
    if !root.join("kvm").is_dir() {
        assert!(matches!(got, Err(HostModeError::NoKvm(_))), "{got:?}");
        return;
    }
    let m = got.unwrap();
    let read = |p: &str| std::fs::read_to_string(root.join(p)).unwrap().trim() == "Y";
    assert_eq!(m.tdp_mmu, read("kvm/parameters/tdp_mmu"));
    let vendor = if root.join("kvm_intel").is_dir() {
        assert_eq!(m.tdp, read("kvm_intel/parameters/ept"));
        Vendor::Intel
    } else if root.join("kvm_amd").is_dir() {
        assert_eq!(m.tdp, read("kvm_amd/parameters/npt"));
        Vendor::Amd
    } else {
        assert!(m.tracepoint_masks().is_err());
        m.vendor.clone()
    };
    assert_eq!(m.vendor, vendor);
    if !m.tdp_mmu || !m.tdp {
        assert!(m.tracepoint_masks().is_err());
    }
    eprintln!("this host: {}", m.describe());
}
