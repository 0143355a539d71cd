//! Per-tier working-set ages (docs/working-set.md): how many bytes of each
//! tier were touched within each configured horizon, cold bytes beyond the
//! longest, and promotion pressure, each with a ~95 % interval.
//!
//! Accessed bits tell recency, not frequency, so this is what they measure
//! well. Two ways in: backends that know per sampled page whether it was
//! young in a pass keep a [`recency::Recency`] per tier; hostpte, which reads
//! whole-tier counts only, uses [`exposure`].

pub mod exposure;
pub mod interval;
pub mod profile;
pub mod recency;
#[cfg(test)]
mod sim_tests;

/// Default horizons, seconds: about the bins memtierd and far-memory
/// systems use (a second, ten, a minute, ten minutes).
pub const DEFAULT_HORIZONS_S: [f64; 4] = [1.0, 10.0, 60.0, 600.0];
/// At most this many horizons (each costs a scan of the sampled pages).
pub const MAX_HORIZONS: usize = 8;
/// hostpte: a long pass every this many intervals by default.
pub const DEFAULT_LONG_PASS_EVERY: u32 = 5;
/// hostpte: a sweep of this many seconds by default (reaches the 10 s and
/// 60 s horizons).
pub const DEFAULT_SWEEP_S: f64 = 60.0;
/// hostpte: a sweep every this many seconds by default: the ratio estimate
/// goes without passes 5 % of the time.
pub const DEFAULT_SWEEP_EVERY_S: f64 = 1200.0;

/// What the ages are computed over.
#[derive(Debug, Clone, PartialEq)]
pub struct AgesConfig {
    /// Horizons in seconds, ascending, positive.
    pub horizons: Vec<f64>,
    /// hostpte: one interval in this many is a long pass (no re-arm inside
    /// it) giving the working set within about one interval; 0: never.
    pub long_pass_every: u32,
    /// hostpte: a sweep is one pass this long, read at every interval's end
    /// without re-arming, which gives the horizons up to its length; 0: no
    /// sweep.
    pub sweep_s: f64,
    /// hostpte: a sweep starts this often (per process, staggered by VMM
    /// pid, the first after half of it); 0: no sweep.
    pub sweep_every_s: f64,
    /// tierd's interval, seconds: the sweep's unit.
    pub interval_s: f64,
}

impl Default for AgesConfig {
    fn default() -> AgesConfig {
        AgesConfig {
            horizons: DEFAULT_HORIZONS_S.to_vec(),
            long_pass_every: DEFAULT_LONG_PASS_EVERY,
            sweep_s: DEFAULT_SWEEP_S,
            sweep_every_s: DEFAULT_SWEEP_EVERY_S,
            interval_s: 1.0,
        }
    }
}

impl AgesConfig {
    /// The longest horizon (cold and promotion are measured against it).
    pub fn longest(&self) -> f64 {
        self.horizons.last().copied().unwrap_or(0.0)
    }

    /// hostpte's sweep as (intervals it lasts, intervals between starts);
    /// None when off.
    pub fn sweep(&self) -> Option<(u32, u32)> {
        if self.sweep_s <= 0.0 || self.sweep_every_s <= 0.0 || self.interval_s <= 0.0 {
            return None;
        }
        // Whole intervals: a sweep is read at interval ends.
        let len = (self.sweep_s / self.interval_s - 1e-9).ceil().max(1.0);
        let every = (self.sweep_every_s / self.interval_s)
            .round()
            .max(2.0 * len);
        Some((len as u32, every as u32))
    }
}

/// Why a horizon list is refused.
pub fn check_horizons(h: &[f64]) -> Result<(), String> {
    if h.is_empty() || h.len() > MAX_HORIZONS {
        return Err(format!("{} horizons; give 1 to {MAX_HORIZONS}", h.len()));
    }
    if let Some(x) = h.iter().find(|x| !x.is_finite() || **x <= 0.0) {
        return Err(format!("{x} is not a positive number of seconds"));
    }
    if h.windows(2).any(|w| w[0] >= w[1]) {
        return Err(format!("{h:?} is not strictly ascending"));
    }
    Ok(())
}

/// A horizon as a label: `1s`, `600s`, `0.5s`.
pub fn horizon_label(h: f64) -> String {
    format!("{h}s")
}

/// A value with its ~95 % interval.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Bounded {
    pub point: f64,
    pub low: f64,
    pub high: f64,
}

impl Bounded {
    /// Every field times `k`.
    pub fn scaled(self, k: f64) -> Bounded {
        Bounded {
            point: self.point * k,
            low: self.low * k,
            high: self.high * k,
        }
    }
}

/// Ages of one tier in the protocol's form, every horizon not measured for
/// `why`.
pub fn not_measured(horizons: &[f64], why: &str) -> tier_proto::v1::TierAges {
    tier_proto::v1::TierAges {
        working_set: horizons
            .iter()
            .map(|&h| tier_proto::v1::WorkingSet {
                horizon_seconds: h,
                not_measured: why.to_string(),
                ..Default::default()
            })
            .collect(),
        not_measured: why.to_string(),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn horizons_are_checked() {
        assert!(check_horizons(&DEFAULT_HORIZONS_S).is_ok());
        assert!(check_horizons(&[]).is_err());
        assert!(check_horizons(&[1.0; 9]).is_err());
        assert!(check_horizons(&[0.0, 1.0]).is_err());
        assert!(check_horizons(&[-1.0]).is_err());
        assert!(check_horizons(&[f64::NAN]).is_err());
        assert!(check_horizons(&[10.0, 1.0]).is_err());
        assert!(check_horizons(&[1.0, 1.0]).is_err());
        assert_eq!(horizon_label(0.5), "0.5s");
        assert_eq!(horizon_label(600.0), "600s");
    }
}
