#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose
//! `top --output json` against controller/tierctl/schema/top.schema.json with the
//! jsonschema crate, on synthetic updates (no daemon, no KVM): the schema
//! accepts what tierctl prints, including nulls, and rejects drift. The
//! same check runs on a real tierd's output in tests/gated/cli.rs.

use tierctl::top::synthetic;
use tierctl::view;

fn validator() -> jsonschema::Validator {
    let schema: serde_json::Value =
        serde_json::from_str(include_str!("../../schema/top.schema.json")).unwrap();
    jsonschema::validator_for(&schema).unwrap()
}

fn errors(v: &serde_json::Value) -> Vec<String> {
    validator().iter_errors(v).map(|e| e.to_string()).collect()
}

#[test]
fn tierctl_json_is_valid() {
    let mut first = synthetic::update(20, 1);
    first.departed_vm_ids = vec!["kvm-fd:1".into()];
    // A VM without stats yet: rows with nulls and "-" sources.
    first.stats.truncate(10);
    let v = view::update_json(&first);
    assert_eq!(errors(&v), Vec::<String>::new(), "{v}");
    assert_eq!(v["vm_count"], 20);
    let rows = v["rows"].as_array().unwrap();
    assert!(rows.iter().any(|r| r["dram_hit_ratio"].is_null()));
    assert!(rows.iter().any(|r| r["source"] == "-"));
    assert!(rows.iter().any(|r| r["dram_hit_target"] == 0.8));
}

#[test]
fn the_schema_rejects_drift() {
    let good = view::update_json(&synthetic::update(2, 1));
    let mut missing = good.clone();
    missing["rows"][0]
        .as_object_mut()
        .unwrap()
        .remove("accesses_per_s");
    assert!(!errors(&missing).is_empty(), "a missing field");
    let mut extra = good.clone();
    extra["rows"][0]["surprise"] = 1.into();
    assert!(!errors(&extra).is_empty(), "an undocumented field");
    let mut ratio = good.clone();
    ratio["rows"][0]["dram_hit_ratio"] = 1.5.into();
    assert!(!errors(&ratio).is_empty(), "a ratio above 1");
    let mut kind = good;
    kind["rows"][0]["kind"] = "hbm".into();
    assert!(!errors(&kind).is_empty(), "an unknown tier kind");
}

#[test]
fn csv_has_one_header_and_a_row_per_tier() {
    let u = synthetic::update(3, 1);
    let csv = view::csv(&view::rows(&u));
    let lines: Vec<&str> = csv.lines().collect();
    assert!(lines[0].starts_with("vm_id,vm_name,vcpus,tier,kind,size_bytes"));
    // 2 + 3 + 4 tiers.
    assert_eq!(lines.len(), 1 + 9);
    let cols = lines[0].split(',').count();
    assert!(lines.iter().all(|l| l.split(',').count() == cols));
}
