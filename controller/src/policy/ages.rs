//! A tier's recency profile (`TierAges` in the stream) as the working_set
//! mode reads it: every number with its ~95 % interval, a horizon that is
//! not measured as `None` with the sender's reason kept.

use tier_proto::v1 as pb;

/// A byte count (or rate) and its ~95 % interval, low <= point <= high.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Est {
    pub point: f64,
    pub low: f64,
    pub high: f64,
}

impl Est {
    /// An exact value (interval of width 0).
    pub fn exact(v: f64) -> Est {
        Est {
            point: v,
            low: v,
            high: v,
        }
    }

    /// `None` unless all three are finite and >= 0; an interval that
    /// misses its own point is widened to include it.
    pub fn new(point: f64, low: f64, high: f64) -> Option<Est> {
        let ok = |v: f64| v.is_finite() && v >= 0.0;
        (ok(point) && ok(low) && ok(high)).then(|| Est {
            point,
            low: low.min(point),
            high: high.max(point),
        })
    }

    /// Sum of two estimates: the ends add (each is a ~95 % end; the sum's
    /// interval is wider than 95 %, which errs on the side of not moving).
    pub fn plus(self, o: Est) -> Est {
        Est {
            point: self.point + o.point,
            low: self.low + o.low,
            high: self.high + o.high,
        }
    }

    pub fn scale(self, k: f64) -> Est {
        Est {
            point: self.point * k,
            low: self.low * k,
            high: self.high * k,
        }
    }
}

/// Bytes touched within one horizon.
#[derive(Debug, Clone, PartialEq)]
pub struct Horizon {
    pub seconds: f64,
    /// `None`: not measured (`why` says why).
    pub bytes: Option<Est>,
    pub why: String,
}

/// One tier's ages over one interval.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TierAges {
    /// Shortest first, as sent.
    pub horizons: Vec<Horizon>,
    /// Resident bytes not touched within the longest horizon.
    pub cold: Option<Est>,
    /// Bytes per second found touched within the shortest horizon after
    /// being cold.
    pub promoted_per_s: Option<Est>,
    pub history_seconds: f64,
    /// Non-empty: nothing is measured, and why.
    pub not_measured: String,
}

fn est(point: Option<f64>, low: Option<f64>, high: Option<f64>) -> Option<Est> {
    let p = point?;
    Est::new(p, low.unwrap_or(p), high.unwrap_or(p))
}

/// Horizons are equal when within a millisecond (they come from a config
/// file as floats).
pub fn same_horizon(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-3
}

impl TierAges {
    pub fn from_proto(a: &pb::TierAges) -> TierAges {
        let horizons = a
            .working_set
            .iter()
            .map(|w| {
                let bytes = if w.not_measured.is_empty() {
                    Est::new(w.bytes, w.bytes_low, w.bytes_high)
                } else {
                    None
                };
                let why = match (&bytes, w.not_measured.is_empty()) {
                    (None, true) => "bytes not finite".to_string(),
                    _ => w.not_measured.clone(),
                };
                Horizon {
                    seconds: w.horizon_seconds,
                    bytes,
                    why,
                }
            })
            .collect();
        TierAges {
            horizons,
            cold: est(a.cold_bytes, a.cold_bytes_low, a.cold_bytes_high),
            promoted_per_s: est(
                a.promoted_bytes_per_s,
                a.promoted_bytes_per_s_low,
                a.promoted_bytes_per_s_high,
            ),
            history_seconds: a.history_seconds,
            not_measured: a.not_measured.clone(),
        }
    }

    /// The horizon of `seconds`, if the tier reports it.
    pub fn at(&self, seconds: f64) -> Option<&Horizon> {
        self.horizons
            .iter()
            .find(|h| same_horizon(h.seconds, seconds))
    }

    /// The longest horizon reported (measured or not).
    pub fn longest(&self) -> Option<&Horizon> {
        self.horizons
            .iter()
            .max_by(|a, b| a.seconds.total_cmp(&b.seconds))
    }

    /// The shortest horizon reported.
    pub fn shortest(&self) -> Option<&Horizon> {
        self.horizons
            .iter()
            .min_by(|a, b| a.seconds.total_cmp(&b.seconds))
    }

    /// "1 s, 10 s, 60 s" for detail texts.
    pub fn horizon_list(&self) -> String {
        let v: Vec<String> = self
            .horizons
            .iter()
            .map(|h| format!("{} s", h.seconds))
            .collect();
        v.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_intervals_and_unmeasured_horizons() {
        let a = pb::TierAges {
            working_set: vec![
                pb::WorkingSet {
                    horizon_seconds: 1.0,
                    bytes: 100.0,
                    bytes_low: 90.0,
                    bytes_high: 120.0,
                    not_measured: String::new(),
                },
                pb::WorkingSet {
                    horizon_seconds: 60.0,
                    not_measured: "watched for 8 s of 60".into(),
                    ..Default::default()
                },
            ],
            cold_bytes: None,
            promoted_bytes_per_s: Some(5.0),
            promoted_bytes_per_s_low: Some(6.0),
            promoted_bytes_per_s_high: Some(9.0),
            history_seconds: 8.0,
            ..Default::default()
        };
        let t = TierAges::from_proto(&a);
        assert_eq!(
            t.at(1.0).unwrap().bytes,
            Some(Est {
                point: 100.0,
                low: 90.0,
                high: 120.0
            })
        );
        let long = t.longest().unwrap();
        assert_eq!((long.seconds, long.bytes), (60.0, None));
        assert_eq!(long.why, "watched for 8 s of 60");
        assert!(t.cold.is_none());
        // A low end above the point is widened to it.
        assert_eq!(t.promoted_per_s.unwrap().low, 5.0);
        assert_eq!(t.horizon_list(), "1 s, 60 s");
        assert!(t.at(10.0).is_none());
    }
}
