//! tierctl's commands. Each connects only if it needs tierd, so
//! `completions` and argument errors work without a daemon.

mod balloon;
mod info;
mod live;
mod policy;
mod top;

use anyhow::bail;
use clap::CommandFactory;
use tier_proto::Endpoint;
use tier_proto::v1::{GetVmRequest, ListVmsRequest, Vm};
use tierctl::cli::{BalloonCmd, Cli, Cmd, PolicyCmd};
use tierctl::conn::{self, Client, RpcError};

pub async fn run(cli: Cli) -> anyhow::Result<()> {
    if let Cmd::Completions { shell } = cli.cmd {
        let mut cmd = Cli::command();
        clap_complete::generate(shell, &mut cmd, "tierctl", &mut std::io::stdout());
        return Ok(());
    }
    if let Cmd::Man = cli.cmd {
        clap_mangen::Man::new(Cli::command()).render(&mut std::io::stdout())?;
        return Ok(());
    }
    let endpoint = Endpoint::parse(&cli.endpoint)?;
    let (mut client, info) = conn::connect(&endpoint).await?;
    match cli.cmd {
        Cmd::Info => info::info(&info),
        Cmd::Vms { output } => info::vms(&mut client, output).await?,
        Cmd::Vm { vm } => info::vm(&mut client, &vm).await?,
        Cmd::Top(args) => top::top(endpoint, client, info, args).await?,
        Cmd::Policy {
            cmd: PolicyCmd::Get,
        } => policy::get(&mut client).await?,
        Cmd::Policy {
            cmd: PolicyCmd::Set(args),
        } => policy::set(&mut client, &args).await?,
        Cmd::Balloon {
            cmd: BalloonCmd::Set { vm, tiers },
        } => balloon::set(&mut client, &vm, &tiers).await?,
        Cmd::Completions { .. } | Cmd::Man => {}
    }
    Ok(())
}

/// A VM by id, or else by name (which must be unique).
pub async fn resolve_vm(client: &mut Client, key: &str) -> anyhow::Result<Vm> {
    match client.get_vm(GetVmRequest { id: key.into() }).await {
        Ok(r) => return Ok(r.into_inner()),
        Err(s) if s.code() == tonic::Code::NotFound => {}
        Err(s) => return Err(RpcError::new("GetVm", s).into()),
    }
    let vms = client
        .list_vms(ListVmsRequest {})
        .await
        .map_err(|s| RpcError::new("ListVms", s))?
        .into_inner()
        .vms;
    let mut named: Vec<Vm> = vms.into_iter().filter(|v| v.name == key).collect();
    match named.len() {
        1 => Ok(named.remove(0)),
        0 => bail!("tierd knows no VM with id or name {key:?} (`tierctl vms` lists them)"),
        _ => bail!(
            "{} VMs are named {key:?}; use an id: {}",
            named.len(),
            named
                .iter()
                .map(|v| v.id.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}
