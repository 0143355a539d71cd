//! The command line: every task and flag parses as documented; and
//! docs/architecture.md's "Where a change goes" matches the tree.

use std::path::{Path, PathBuf};

use clap::Parser;

use crate::{Cli, Task, bench, compat, demo, deps, docs, e2e, linux_bed, package, soak, vmm_patch};

fn parse(args: &[&str]) -> Result<Task, clap::Error> {
    let mut all = vec!["cargo-xtask"];
    all.extend_from_slice(args);
    Cli::try_parse_from(all).map(|c| c.task)
}

#[test]
fn parses_every_task() {
    assert_eq!(
        parse(&["deps"]).unwrap(),
        Task::Deps(deps::Args { check: false })
    );
    assert_eq!(
        parse(&["deps", "--check"]).unwrap(),
        Task::Deps(deps::Args { check: true })
    );
    assert_eq!(parse(&["test"]).unwrap(), Task::Test);
    assert_eq!(
        parse(&["linux-bed", "--offline"]).unwrap(),
        Task::LinuxBed(linux_bed::Args { offline: true })
    );
    assert_eq!(parse(&["linux-bed-plugin"]).unwrap(), Task::LinuxBedPlugin);
    // ch_bin may also come from TIERD_CH_BIN in the environment.
    assert!(matches!(
        parse(&["demo"]).unwrap(),
        Task::Demo(demo::Args { updates: None, .. })
    ));
    assert!(matches!(
        parse(&["demo", "--updates", "3"]).unwrap(),
        Task::Demo(demo::Args {
            updates: Some(3),
            ..
        })
    ));
    assert_eq!(
        parse(&["demo", "--ch-bin", "/opt/ch/cloud-hypervisor"]).unwrap(),
        Task::Demo(demo::Args {
            updates: None,
            ch_bin: Some("/opt/ch/cloud-hypervisor".into())
        })
    );
    assert_eq!(
        parse(&["bench", "balloon"]).unwrap(),
        Task::Bench(bench::Args {
            name: "balloon".into(),
            args: Vec::new(),
        })
    );
    assert_eq!(
        parse(&["bench", "fidelity", "--source", "linux"]).unwrap(),
        Task::Bench(bench::Args {
            name: "fidelity".into(),
            args: vec!["--source".into(), "linux".into()],
        })
    );
    assert_eq!(
        parse(&["bench", "fidelity", "--", "--ch-bin", "/opt/ch"]).unwrap(),
        Task::Bench(bench::Args {
            name: "fidelity".into(),
            args: vec!["--ch-bin".into(), "/opt/ch".into()],
        })
    );
    assert_eq!(
        parse(&["e2e", "--ch-src", "/src/ch"]).unwrap(),
        Task::E2e(e2e::Args {
            ch_src: Some("/src/ch".into()),
            micro_http: None,
            ch_target_dir: None,
            work_dir: None,
            actuator: "balloon".into(),
            ch_bin: None,
            upstream: false,
            mode: None,
            guests: None,
            vmm: "cloud-hypervisor".into(),
        })
    );
    assert_eq!(
        parse(&["e2e", "--ch-src", "/src/ch", "--mode", "working-set"]).unwrap(),
        Task::E2e(e2e::Args {
            ch_src: Some("/src/ch".into()),
            micro_http: None,
            ch_target_dir: None,
            work_dir: None,
            actuator: "balloon".into(),
            ch_bin: None,
            upstream: false,
            mode: Some("working-set".into()),
            guests: None,
            vmm: "cloud-hypervisor".into(),
        })
    );
    assert!(matches!(
        parse(&["e2e", "--vmm", "qemu", "--mode", "ratio"]).unwrap(),
        Task::E2e(e2e::Args { vmm, mode: Some(m), .. }) if vmm == "qemu" && m == "ratio"
    ));
    assert!(parse(&["e2e", "--vmm", "xen"]).is_err());
    assert_eq!(parse(&["vmlinux"]).unwrap(), Task::Vmlinux);
    assert_eq!(
        parse(&["package", "--debug", "--out", "/tmp/p"]).unwrap(),
        Task::Package(package::Args {
            debug: true,
            out: Some("/tmp/p".into()),
        })
    );
    assert_eq!(
        parse(&["compat"]).unwrap(),
        Task::Compat(compat::Args {
            kernels: Vec::new(),
            cache: None,
            offline: false,
            report_only: false,
        })
    );
    assert_eq!(
        parse(&[
            "compat",
            "--kernel",
            "linux-image-6.1.0-56-amd64",
            "--kernel",
            "linux-image-6.12.117+deb12-amd64",
            "--cache",
            "/var/cache/debs",
            "--offline",
            "--report-only"
        ])
        .unwrap(),
        Task::Compat(compat::Args {
            kernels: vec![
                "linux-image-6.1.0-56-amd64".into(),
                "linux-image-6.12.117+deb12-amd64".into()
            ],
            cache: Some("/var/cache/debs".into()),
            offline: true,
            report_only: true,
        })
    );
    assert_eq!(
        parse(&["vmm-patch", "apply", "--ch-src", "/src/ch"]).unwrap(),
        Task::VmmPatch(vmm_patch::Args {
            action: vmm_patch::Action::Apply,
            ch_src: Some("/src/ch".into()),
            micro_http: None,
        })
    );
    assert_eq!(
        parse(&[
            "vmm-patch",
            "build",
            "--ch-src",
            "/src/ch",
            "--micro-http",
            "/src/mh"
        ])
        .unwrap(),
        Task::VmmPatch(vmm_patch::Args {
            action: vmm_patch::Action::Build,
            ch_src: Some("/src/ch".into()),
            micro_http: Some("/src/mh".into()),
        })
    );
    assert_eq!(
        parse(&["vmm-patch", "build-vendored"]).unwrap(),
        Task::VmmPatch(vmm_patch::Args {
            action: vmm_patch::Action::BuildVendored,
            ch_src: None,
            micro_http: None,
        })
    );
    assert_eq!(
        parse(&["vmm-patch", "build"]).unwrap(),
        Task::VmmPatch(vmm_patch::Args {
            action: vmm_patch::Action::Build,
            ch_src: None,
            micro_http: None,
        })
    );
}

#[test]
fn soak_takes_a_binary_or_a_checkout() {
    assert_eq!(
        parse(&[
            "soak",
            "--ch-bin",
            "/ch",
            "--minutes",
            "1.5",
            "--faults",
            "kill-tierd"
        ])
        .unwrap(),
        Task::Soak(soak::Args {
            ch_bin: Some(PathBuf::from("/ch")),
            ch_src: None,
            micro_http: None,
            minutes: 1.5,
            seed: 1,
            faults: Some("kill-tierd".into()),
            work_dir: None,
        })
    );
    assert!(parse(&["soak", "--ch-bin", "/a", "--ch-src", "/b"]).is_err());
}

#[test]
fn rejects_bad_arguments() {
    assert!(parse(&[]).is_err());
    assert!(parse(&["bench"]).is_err(), "bench needs a name");
    assert!(parse(&["demo", "--updates", "x"]).is_err());
    assert!(parse(&["frobnicate"]).is_err());
    assert!(parse(&["vmm-patch"]).is_err(), "vmm-patch needs an action");
    assert!(parse(&["vmm-patch", "frob", "--ch-src", "/x"]).is_err());
}

/// The workspace's members as the root Cargo.toml lists them.
fn workspace_members(cargo_toml: &str) -> Vec<String> {
    let Some(start) = cargo_toml.find("members = [") else {
        return Vec::new();
    };
    let list = &cargo_toml[start + "members = [".len()..];
    let list = &list[..list.find(']').unwrap_or(list.len())];
    list.split('"')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

/// docs/architecture.md's "Where a change goes" matches the tree: every
/// path it names exists, it has a row for each kind of change, and every
/// crate of the workspace has a row (its folder) in the doc's table of
/// crates.
#[test]
fn where_a_change_goes_names_the_tree() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let doc = std::fs::read_to_string(root.join("docs/architecture.md")).unwrap();
    let section = doc
        .split("\n## Where a change goes\n")
        .nth(1)
        .expect("docs/architecture.md has a section \"Where a change goes\"");
    let section = section.split("\n## ").next().unwrap();
    let named = docs::paths(section);
    assert!(named.len() >= 30, "{named:?}");
    assert_eq!(docs::missing(section, root), Vec::<String>::new());
    for change in [
        "a config key",
        "a sampler backend",
        "a metric",
        "a field of the stats stream",
        "a controller rule",
        "a test",
        "a doc",
    ] {
        assert!(
            section.contains(&format!("\n| {change}")),
            "no row for {change}"
        );
    }
    let cargo = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    let members = workspace_members(&cargo);
    assert!(members.len() >= 14, "{members:?}");
    let crates = doc
        .split("\n## Crates, one job each\n")
        .nth(1)
        .expect("docs/architecture.md has a table of crates");
    let crates = crates.split("\n## ").next().unwrap();
    let absent: Vec<&String> = members
        .iter()
        .filter(|m| !crates.contains(&format!("| `{m}/` |")))
        .collect();
    assert_eq!(
        absent,
        Vec::<&String>::new(),
        "crates without a row in docs/architecture.md's table of crates"
    );
    let unbuilt: Vec<&String> = members
        .iter()
        .filter(|m| !root.join(m).join("Cargo.toml").is_file())
        .collect();
    assert_eq!(
        unbuilt,
        Vec::<&String>::new(),
        "members without a Cargo.toml"
    );
}

#[test]
fn members_are_read_from_the_workspace() {
    let toml =
        "[workspace]\nresolver = \"3\"\nmembers = [\"proto\", \"a/b\"]\n\n[x]\ny = [\"z\"]\n";
    assert_eq!(workspace_members(toml), vec!["proto", "a/b"]);
    assert_eq!(workspace_members("[package]\n"), Vec::<String>::new());
}
