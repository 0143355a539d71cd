//! The sampler CPU budget as series (docs/hostpte.md, "Sampler CPU budget"): per VM what the budget
//! chose (coverage, passes, allowance) and what sampling it cost; per
//! backend the configured budget and the CPU spent. Shares of one core
//! are ratios (0.01 = 1 % of a core); CPU is a seconds counter, so
//! `rate(tierd_sampler_cpu_seconds_total[5m])` is the share used.

use std::sync::atomic::AtomicU64;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tier_proto::v1::{SamplerHealth, VmStats};

use super::{BackendLabels, FGauge, VmLabels};

#[derive(Debug, Default)]
pub(super) struct Budget {
    coverage: FGauge<VmLabels>,
    passes: Family<VmLabels, Gauge>,
    passes_allowed: FGauge<VmLabels>,
    allowance: FGauge<VmLabels>,
    vm_cpu: Family<VmLabels, Counter<f64, AtomicU64>>,
    limited: Family<VmLabels, Gauge>,
    budget: FGauge<BackendLabels>,
    cpu: Family<BackendLabels, Counter<f64, AtomicU64>>,
}

impl Budget {
    pub(super) fn register(&self, r: &mut Registry) {
        r.register(
            "vm_sampler_coverage_ratio",
            "Share of the VM's pages the sampler's sample covers (1/stride; 1 for hostpte), as the sampler CPU budget chose it",
            self.coverage.clone(),
        );
        r.register(
            "vm_sampler_passes",
            "Sampler passes that ran over the VM in the last interval",
            self.passes.clone(),
        );
        r.register(
            "vm_sampler_passes_allowed",
            "Passes per interval the VM's share of the sampler CPU budget pays for at the measured cost (at most passes_per_interval)",
            self.passes_allowed.clone(),
        );
        r.register(
            "vm_sampler_cpu_budget_ratio",
            "The VM's share of the sampler CPU budget, in cores (0 when no budget is set)",
            self.allowance.clone(),
        );
        r.register(
            "vm_sampler_cpu_seconds",
            "CPU time tierd spent sampling the VM (thread CPU time of its passes)",
            self.vm_cpu.clone(),
        );
        r.register(
            "vm_sampler_limited",
            "1 if the budget gives the VM less than every page every pass (a larger stride or skipped passes; the reason is the stream's SamplerBudget.limited)",
            self.limited.clone(),
        );
        r.register(
            "sampler_cpu_budget_ratio",
            "The sampler CPU budget in cores ([sampler] cpu_budget_pct / 100; 0 = none)",
            self.budget.clone(),
        );
        r.register(
            "sampler_cpu_seconds",
            "CPU time tierd's sampler passes took (thread CPU time, user and system)",
            self.cpu.clone(),
        );
    }

    /// One VM's interval; a VM without a budget report has no series.
    pub(super) fn vm(&self, vl: &VmLabels, stats: &VmStats, secs: f64) {
        let Some(b) = &stats.sampler_budget else {
            self.forget_vm(vl);
            return;
        };
        self.coverage.get_or_create(vl).set(b.coverage);
        self.passes.get_or_create(vl).set(i64::from(b.passes));
        self.passes_allowed.get_or_create(vl).set(b.passes_allowed);
        self.allowance.get_or_create(vl).set(b.budget_pct / 100.0);
        self.vm_cpu
            .get_or_create(vl)
            .inc_by((b.spent_pct / 100.0 * secs).max(0.0));
        self.limited
            .get_or_create(vl)
            .set(i64::from(!b.limited.is_empty()));
    }

    pub(super) fn health(&self, b: &BackendLabels, h: &SamplerHealth, secs: f64) {
        self.budget.get_or_create(b).set(h.cpu_budget_pct / 100.0);
        self.cpu
            .get_or_create(b)
            .inc_by((h.cpu_spent_pct / 100.0 * secs).max(0.0));
    }

    pub(super) fn forget_vm(&self, vl: &VmLabels) {
        self.coverage.remove(vl);
        self.passes.remove(vl);
        self.passes_allowed.remove(vl);
        self.allowance.remove(vl);
        self.vm_cpu.remove(vl);
        self.limited.remove(vl);
    }
}
