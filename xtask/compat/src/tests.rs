//! Tests: BTF / .BTF.ext parsing and CO-RE matching on small objects compiled
//! here against this machine's kernel BTF, and the full check against the
//! real Debian packages when apt can reach them.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::btf::{Btf, KernelBtf, essential};
use crate::check::{self, RelocState};
use crate::core::Outcome;
use crate::kernel::{self, Kernel};
use crate::object;
use crate::types;

/// Local types flavoured with `___mine`, so CO-RE matches them to the
/// kernel's by essential name; `no_such_field` exists in no kernel.
const TINY: &str = r#"
typedef unsigned char __u8;
typedef unsigned short __u16;
typedef unsigned int __u32;
typedef unsigned long long __u64;
typedef signed char __s8;
typedef short __s16;
typedef int __s32;
typedef long long __s64;
typedef __u16 __be16;
typedef __u32 __be32;
typedef __u32 __wsum;
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>

char LICENSE[] SEC("license") = "GPL";

struct task_struct___mine {
	int pid;
	int no_such_field;
} __attribute__((preserve_access_index));

/* len lives inside anonymous unions/structs of the real sk_buff. */
struct sk_buff___mine {
	unsigned int len;
} __attribute__((preserve_access_index));

struct no_such_type___mine {
	int x;
} __attribute__((preserve_access_index));

extern void *bpf_cast_to_kern_ctx(void *) __ksym __weak;
extern void *bpf_no_such_kfunc_weak(void *) __ksym __weak;
extern void *bpf_no_such_kfunc(void *) __ksym;

__u64 out;

SEC("raw_tp/plain")
int plain(void *ctx)
{
	struct task_struct___mine *t = (void *)bpf_get_current_task();
	struct sk_buff___mine *s = ctx;

	out = BPF_CORE_READ(t, pid) + BPF_CORE_READ(s, len);
	if (bpf_core_field_exists(t->no_such_field))
		out += BPF_CORE_READ(t, no_such_field);
	out += bpf_core_type_exists(struct no_such_type___mine);
	if (bpf_ksym_exists(bpf_cast_to_kern_ctx))
		out += (__u64)bpf_cast_to_kern_ctx(ctx);
	if (bpf_ksym_exists(bpf_no_such_kfunc_weak))
		out += (__u64)bpf_no_such_kfunc_weak(ctx);
	return 0;
}

SEC("raw_tp/unguarded")
int unguarded(void *ctx)
{
	struct task_struct___mine *t = (void *)bpf_get_current_task();

	out = BPF_CORE_READ(t, no_such_field) + (__u64)bpf_no_such_kfunc(ctx);
	return 0;
}
"#;

/// The workspace root (this crate is `xtask/compat`).
fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub fn bpf_dir() -> PathBuf {
    workspace_root().join("bpf")
}

/// The directories `cargo xtask compat` uses: `<target>/compat`, where the
/// target dir is `CARGO_TARGET_DIR` or the workspace's `target/`.
pub fn dirs() -> crate::Dirs {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| workspace_root().join("target"), PathBuf::from);
    crate::Dirs {
        bpf: bpf_dir(),
        work: target.join("compat"),
    }
}

/// Compiles `source` (named NAME.bpf.c) the way the project's objects are.
pub fn compile(dir: &Path, name: &str, source: &str) -> object::Object {
    let src = dir.join(format!("{name}.bpf.c"));
    std::fs::write(&src, source).unwrap();
    let obj = dir.join(format!("{name}.bpf.o"));
    object::compile(&src, &obj, &bpf_dir(), &[bpf_dir()]).unwrap();
    object::read(name, &obj).unwrap()
}

/// This machine's kernel BTF (the tests that use it are ignored without).
fn host_kernel() -> Kernel {
    let raw = std::fs::read("/sys/kernel/btf/vmlinux").unwrap();
    let vmlinux = Arc::new(Btf::parse("vmlinux", &raw, None).unwrap());
    Kernel {
        package: "host".into(),
        btf: KernelBtf {
            vmlinux,
            modules: Vec::new(),
        },
        config: Default::default(),
    }
}

/// Byte offset of `member` in the kernel's `strukt`, searched through
/// anonymous members by a plain walk (independent of the CO-RE code).
fn offset_in(btf: &Btf, id: u32, member: &str) -> Option<u64> {
    let (_, t) = btf.skip_mods(id);
    for m in t.members()? {
        if m.name == member {
            return Some(u64::from(m.bit_offset) / 8);
        }
        if m.name.is_empty()
            && let Some(o) = offset_in(btf, m.ty, member)
        {
            return Some(u64::from(m.bit_offset) / 8 + o);
        }
    }
    None
}

#[test]
fn essential_names_strip_the_last_flavour() {
    assert_eq!(essential("task_struct___mine"), "task_struct");
    assert_eq!(essential("a___b___c"), "a___b");
    assert_eq!(essential("task_struct"), "task_struct");
    assert_eq!(essential("__u64"), "__u64");
    // "___" must sit between two non-underscores.
    assert_eq!(essential("x____y"), "x____y");
}

#[test]
fn newest_picks_one_package_per_series_and_flavour() {
    let names = "linux-image-6.1.0-9-amd64\nlinux-image-6.1.0-56-amd64\nlinux-image-6.1.0-56-amd64-dbg\n\
                 linux-image-6.1.0-55-cloud-amd64\nlinux-image-6.1.0-56-rt-amd64\n\
                 linux-image-6.12.117+deb12-amd64\nlinux-image-6.12.99+deb12-cloud-amd64\n\
                 linux-image-6.12.117+deb12-amd64-unsigned\nlinux-image-6.12-amd64\n";
    assert_eq!(
        kernel::newest(names),
        vec![
            "linux-image-6.1.0-56-amd64",
            "linux-image-6.1.0-55-cloud-amd64",
            "linux-image-6.12.117+deb12-amd64",
            "linux-image-6.12.99+deb12-cloud-amd64",
        ]
    );
}

#[test]
fn config_lines_and_not_set_comments() {
    let c = kernel::parse_config("CONFIG_A=y\n# CONFIG_B is not set\nCONFIG_C=m\nCONFIG_D=\"x\"\n");
    assert_eq!(c.get("CONFIG_A").map(String::as_str), Some("y"));
    assert_eq!(c.get("CONFIG_B"), None);
    assert_eq!(c.get("CONFIG_C").map(String::as_str), Some("m"));
    assert_eq!(c.get("CONFIG_D").map(String::as_str), Some("x"));
}

#[test]
fn vmlinux_is_found_after_a_false_magic() {
    let dir = tempfile::tempdir().unwrap();
    let elf: Vec<u8> = b"\x7fELF"
        .iter()
        .copied()
        .chain((0..4096u32).map(|i| (i % 251) as u8))
        .collect();
    let raw = dir.path().join("payload");
    std::fs::write(&raw, &elf).unwrap();
    let st = std::process::Command::new("zstd")
        .arg("-q")
        .arg(&raw)
        .status()
        .unwrap();
    assert!(st.success());
    let packed = std::fs::read(dir.path().join("payload.zst")).unwrap();
    // A setup stub with a stray lz4 magic, the payload, then trailing bytes.
    let mut image = b"MZ setup \x02\x21\x4c\x18 garbage".to_vec();
    image.extend_from_slice(&packed);
    image.extend_from_slice(b"trailer");
    assert_eq!(kernel::vmlinux_of(&image).unwrap(), elf);
    assert!(kernel::vmlinux_of(b"no payload here").is_err());
}

#[test]
#[cfg_attr(
    not(host_btf),
    ignore = "needs this kernel's BTF: /sys/kernel/btf/vmlinux"
)]
fn core_relocations_resolve_against_this_kernel() {
    let k = host_kernel();
    let dir = tempfile::tempdir().unwrap();
    let obj = compile(dir.path(), "tiny", TINY);
    let names: Vec<&str> = obj.programs.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["plain", "unguarded"]);
    let kinds: Vec<&str> = obj.relos.iter().map(|r| r.kind_name()).collect();
    assert!(kinds.contains(&"field_byte_offset"), "{kinds:?}");
    assert!(kinds.contains(&"field_exists"), "{kinds:?}");
    assert!(kinds.contains(&"type_exists"), "{kinds:?}");

    let vm = &k.btf.vmlinux;
    let task = vm.own_named("task_struct").next().unwrap();
    let skb = vm.own_named("sk_buff").next().unwrap();
    let report = check::check_object(&obj, &k).unwrap();
    let find = |prog: &str, what: &str, kind: &str| {
        report
            .relocs
            .iter()
            .find(|r| r.programs == [prog] && r.what.ends_with(what) && r.kind == kind)
            .unwrap_or_else(|| panic!("{prog} {what} {kind} in {:#?}", report.relocs))
    };
    let pid = find("plain", "task_struct___mine.pid", "field_byte_offset");
    assert_eq!(
        pid.outcome,
        Outcome::Resolved {
            value: offset_in(vm, task, "pid").unwrap(),
            btf: "vmlinux".into()
        }
    );
    // Through the anonymous unions of struct sk_buff.
    let len = find("plain", "sk_buff___mine.len", "field_byte_offset");
    let want = offset_in(vm, skb, "len").unwrap();
    assert!(want > 0);
    assert_eq!(
        len.outcome,
        Outcome::Resolved {
            value: want,
            btf: "vmlinux".into()
        }
    );
    assert_eq!(
        find("plain", ".no_such_field", "field_exists").state,
        RelocState::ExistsZero
    );
    assert_eq!(
        find("plain", ".no_such_field", "field_byte_offset").state,
        RelocState::GuardedAbsent
    );
    assert_eq!(
        find("plain", "no_such_type___mine", "type_exists").outcome,
        Outcome::Absent
    );
    assert_eq!(
        find("unguarded", ".no_such_field", "field_byte_offset").state,
        RelocState::Failed
    );

    let ext = |name: &str| report.externs.iter().find(|e| e.name == name).unwrap();
    assert!(!ext("bpf_no_such_kfunc_weak").failure);
    assert_eq!(ext("bpf_no_such_kfunc_weak").detail, "weak, absent");
    assert!(ext("bpf_no_such_kfunc").failure && !ext("bpf_no_such_kfunc").weak);
    // bpf_cast_to_kern_ctx came in 6.2: found where this kernel has it
    // (asked of its BTF independently of the checker), weak-absent before.
    let raw = std::fs::read("/sys/kernel/btf/vmlinux").unwrap();
    let needle = b"\0bpf_cast_to_kern_ctx\0";
    let has = raw.windows(needle.len()).any(|w| w == needle);
    assert_eq!(
        ext("bpf_cast_to_kern_ctx").found_in.as_deref(),
        has.then_some("vmlinux")
    );
    assert_eq!(report.failures.len(), 2, "{:#?}", report.failures);
    assert!(
        report
            .failures
            .iter()
            .any(|f| f.contains("bpf_no_such_kfunc:"))
    );
    assert!(
        report
            .failures
            .iter()
            .any(|f| f.contains("no_such_field in unguarded"))
    );
}

#[test]
#[cfg_attr(
    not(host_btf),
    ignore = "needs this kernel's BTF: /sys/kernel/btf/vmlinux"
)]
fn fields_and_types_compat_follow_libbpf() {
    let k = host_kernel();
    let vm = &k.btf.vmlinux;
    let task = vm.own_named("task_struct").next().unwrap();
    let mm = vm.own_named("mm_struct").next().unwrap();
    // Any two composites are field-compatible; a struct and an int are not.
    assert!(types::fields_are_compat(vm, task, vm, mm));
    let int = vm.own_named("int").next().unwrap();
    assert!(!types::fields_are_compat(vm, task, vm, int));
    assert!(types::types_are_compat(vm, task, vm, task, 32));
    assert!(!types::types_are_compat(vm, task, vm, int, 32));
    assert_eq!(types::type_size(vm, int), 4);
}
