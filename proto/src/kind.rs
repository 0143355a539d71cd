//! Human names of the protocol's enums, shared by tierd's logs and tierctl.

use crate::v1::{Backend, TierKind};

impl TierKind {
    /// Short lowercase name: "dram", "pmem", "cxl", "remote", "unknown".
    pub fn short_name(self) -> &'static str {
        match self {
            TierKind::Unknown => "unknown",
            TierKind::Dram => "dram",
            TierKind::Pmem => "pmem",
            TierKind::Cxl => "cxl",
            TierKind::Remote => "remote",
        }
    }

    /// Parses a short name as printed by [`TierKind::short_name`].
    pub fn from_short_name(s: &str) -> Option<TierKind> {
        [
            TierKind::Unknown,
            TierKind::Dram,
            TierKind::Pmem,
            TierKind::Cxl,
            TierKind::Remote,
        ]
        .into_iter()
        .find(|k| k.short_name() == s)
    }

    /// Whether accesses to this kind count as DRAM hits.
    pub fn is_fast(self) -> bool {
        self == TierKind::Dram
    }
}

impl Backend {
    /// Name used by `tierd probe`, configs and tierctl.
    pub fn short_name(self) -> &'static str {
        match self {
            Backend::Unspecified => "-",
            Backend::EptFexit => "ept-fexit",
            Backend::EptTracepoint => "ept-tracepoint",
            Backend::Hostpte => "hostpte",
            Backend::Pmu => "pmu",
            Backend::Guest => "guest",
        }
    }
}
