//! The Prometheus text format (0.0.4) from prometheus_client's OpenMetrics
//! text, for scrapers that do not ask for OpenMetrics (`promtool check
//! metrics`, curl, older agents). The two differ, for the families tierd
//! has (gauges and counters), only in a counter's HELP and TYPE naming the
//! sample (`x_total`, not `x`), in `# UNIT` lines and in the `# EOF` end.

/// Content type of each format.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
pub const TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Whether a request's Accept header asks for OpenMetrics.
pub fn wants_openmetrics(accept: Option<&str>) -> bool {
    accept.is_some_and(|a| a.contains("application/openmetrics-text"))
}

/// Rewrites OpenMetrics text as the Prometheus text format.
pub fn from_openmetrics(om: &str) -> String {
    let counters: std::collections::HashSet<&str> = om
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(om.len());
    for line in om.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let meta = ["# HELP ", "# TYPE "]
            .into_iter()
            .find_map(|p| line.strip_prefix(p).map(|rest| (p, rest)));
        match meta {
            Some((p, rest)) => {
                let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
                out.push_str(p);
                out.push_str(name);
                if counters.contains(name) {
                    out.push_str("_total");
                }
                out.push(' ');
                out.push_str(tail);
            }
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_counter_is_named_by_its_sample_and_the_end_marker_goes() {
        let om = "# HELP tierd_updates Sampling intervals completed.\n# TYPE tierd_updates counter\ntierd_updates_total 3\n# HELP tierd_vms VMs tierd tracks.\n# TYPE tierd_vms gauge\ntierd_vms 1\n# EOF\n";
        assert_eq!(
            from_openmetrics(om),
            "# HELP tierd_updates_total Sampling intervals completed.\n# TYPE tierd_updates_total counter\ntierd_updates_total 3\n# HELP tierd_vms VMs tierd tracks.\n# TYPE tierd_vms gauge\ntierd_vms 1\n"
        );
    }

    #[test]
    fn openmetrics_only_when_asked() {
        assert!(wants_openmetrics(Some(
            "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
        )));
        assert!(!wants_openmetrics(Some("*/*")));
        assert!(!wants_openmetrics(None));
    }
}
