//! `policy get` and `policy set`: tierd validates, tierctl only parses.

use anyhow::Context;
use tier_proto::v1::{GetPolicyRequest, Policy, SetPolicyRequest};
use tierctl::cli::PolicySetArgs;
use tierctl::conn::{Client, RpcError};
use tierctl::policy_json;

async fn current(client: &mut Client) -> anyhow::Result<Policy> {
    Ok(client
        .get_policy(GetPolicyRequest {})
        .await
        .map_err(|s| RpcError::new("GetPolicy", s))?
        .into_inner())
}

fn print(p: &Policy) -> anyhow::Result<()> {
    println!(
        "{}",
        serde_json::to_string_pretty(&policy_json::to_json(p)).context("encoding JSON")?
    );
    Ok(())
}

pub async fn get(client: &mut Client) -> anyhow::Result<()> {
    print(&current(client).await?)
}

/// Reads the policy in force, applies the file then the flags, and sends
/// the whole policy (SetPolicy replaces, it does not patch).
pub async fn set(client: &mut Client, args: &PolicySetArgs) -> anyhow::Result<()> {
    let mut p = current(client).await?;
    if let Some(path) = &args.file {
        let text = if path.as_os_str() == "-" {
            std::io::read_to_string(std::io::stdin()).context("reading the policy from stdin")?
        } else {
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?
        };
        policy_json::apply_file(&mut p, &text)
            .with_context(|| format!("parsing {}", path.display()))?;
    }
    policy_json::apply_flags(&mut p, args);
    let now = match client
        .set_policy(SetPolicyRequest { policy: Some(p) })
        .await
    {
        Ok(r) => r.into_inner(),
        Err(s) if s.code() == tonic::Code::InvalidArgument => {
            anyhow::bail!(
                "{}; the policy in force is unchanged",
                RpcError::new("SetPolicy", s)
            )
        }
        Err(s) => return Err(RpcError::new("SetPolicy", s).into()),
    };
    print(&now)
}
