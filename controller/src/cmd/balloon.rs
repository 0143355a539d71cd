//! `balloon set`: arguments are parsed and checked against the VM's tier
//! map, then refused: tier.v1 has no balloon RPC yet, and tierctl does not
//! pretend otherwise.

use std::collections::HashSet;

use anyhow::bail;
use tier_controller::cli::TierSize;
use tier_controller::conn::Client;
use tier_controller::view::human_bytes;
use tier_proto::v1::DaemonInfo;

pub async fn set(
    client: &mut Client,
    info: &DaemonInfo,
    key: &str,
    tiers: &[TierSize],
) -> anyhow::Result<()> {
    let vm = super::resolve_vm(client, key).await?;
    let mut seen = HashSet::new();
    for t in tiers {
        if !seen.insert(t.tier.as_str()) {
            bail!("tier {:?} is given twice", t.tier);
        }
        let Some(tier) = vm.tiers.iter().find(|x| x.name == t.tier) else {
            let names: Vec<&str> = vm.tiers.iter().map(|x| x.name.as_str()).collect();
            bail!(
                "VM {} has no tier {:?}; its tiers: {}",
                vm.name,
                t.tier,
                names.join(", ")
            );
        };
        if t.bytes > tier.size_bytes {
            bail!(
                "balloon {}={} is larger than the tier ({})",
                t.tier,
                human_bytes(t.bytes),
                human_bytes(tier.size_bytes)
            );
        }
    }
    let asked: Vec<String> = tiers
        .iter()
        .map(|t| format!("{}={}", t.tier, human_bytes(t.bytes)))
        .collect();
    bail!(
        "tierd does not support per-tier balloons yet: tier.v1 (protocol version {}, tierd {}) has no balloon RPC, so nothing was changed (checked and not applied: {} {})",
        info.protocol_version,
        info.daemon_version,
        vm.id,
        asked.join(" ")
    )
}
