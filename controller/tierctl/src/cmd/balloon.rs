//! `balloon set`: tierd validates the targets against the VM's tiers and
//! applies them where it can drive a per-tier balloon; its refusal is
//! printed as it is, never turned into success.

use anyhow::bail;
use tier_proto::human_bytes;
use tier_proto::v1::{BalloonTarget, SetBalloonTargetsRequest};
use tierctl::cli::TierSize;
use tierctl::conn::Client;

pub async fn set(client: &mut Client, key: &str, tiers: &[TierSize]) -> anyhow::Result<()> {
    let vm = super::resolve_vm(client, key).await?;
    let asked: Vec<String> = tiers
        .iter()
        .map(|t| format!("{}={}", t.tier, human_bytes(t.bytes)))
        .collect();
    let req = SetBalloonTargetsRequest {
        vm_id: vm.id.clone(),
        targets: tiers
            .iter()
            .map(|t| BalloonTarget {
                tier: t.tier.clone(),
                target_bytes: t.bytes,
            })
            .collect(),
    };
    match client.set_balloon_targets(req).await {
        Ok(r) => {
            let r = r.into_inner();
            for t in r.targets {
                println!(
                    "{} {} balloon target {}",
                    r.vm_id,
                    t.tier,
                    human_bytes(t.target_bytes)
                );
            }
            Ok(())
        }
        Err(s) => bail!(
            "tierd refused SetBalloonTargets: {} (asked: {} {})",
            s.message(),
            vm.id,
            asked.join(" ")
        ),
    }
}
