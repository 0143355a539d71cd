//! SetBalloonTargets on a QEMU VM: a tier's target is the bytes of its
//! virtio-mem region not requested (as the controller drives it), sent as
//! the device's `requested-size`, rounded to whole blocks toward the size
//! requested now (docs/grpc.md).

use tier_proto::v1::{BalloonTarget, SetBalloonTargetsResponse, Vm};
use tonic::{Response, Status};

use super::handle::QemuHandle;

/// Checks every target against the VM's devices first, then resizes them
/// in order; answers with the targets in force after a read-back.
pub async fn set_targets(
    vm: &Vm,
    h: &QemuHandle,
    targets: &[BalloonTarget],
) -> Result<Response<SetBalloonTargetsResponse>, Status> {
    let snap = h.snapshot();
    let mut plan = Vec::with_capacity(targets.len());
    for t in targets {
        let z = h.resizable(&snap, &t.tier).ok_or_else(|| {
            Status::failed_precondition(format!(
                "VM {}: tier {:?} has no virtio-mem device tierd can resize (QEMU has no per-tier balloon); nothing was changed",
                vm.name, t.tier
            ))
        })?;
        if t.target_bytes > z.reach() {
            return Err(Status::out_of_range(format!(
                "VM {}: {}={} bytes is more than its virtio-mem device can take ({} bytes); nothing was changed",
                vm.name,
                t.tier,
                t.target_bytes,
                z.reach()
            )));
        }
        plan.push((t.tier.clone(), z.desired_ram(t.target_bytes)));
    }
    let mut done = Vec::new();
    for (tier, desired) in &plan {
        if let Err(e) = h.resize_zone(tier, *desired).await {
            tracing::warn!(vm = %vm.id, tier = %tier, error = %e, "manual virtio-mem resize failed");
            let after = if done.is_empty() {
                "nothing was changed".to_string()
            } else {
                format!("{} resized before it", done.join(", "))
            };
            return Err(Status::unavailable(format!("VM {}: {e}; {after}", vm.name)));
        }
        done.push(tier.clone());
    }
    let after = h.snapshot();
    let in_force = targets
        .iter()
        .map(|t| BalloonTarget {
            tier: t.tier.clone(),
            target_bytes: h
                .resizable(&after, &t.tier)
                .map_or(t.target_bytes, |z| z.target()),
        })
        .collect();
    tracing::info!(vm = %vm.id, targets = ?plan, "manual virtio-mem sizes set");
    Ok(Response::new(SetBalloonTargetsResponse {
        vm_id: vm.id.clone(),
        targets: in_force,
    }))
}
