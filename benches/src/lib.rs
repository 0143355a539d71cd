//! Shared reporting for benches: min/median/max tables, ratios against a
//! baseline measured in the same run, and the final `RESULT` line.

pub mod fidelity;
pub mod fuzz;
pub mod plot;
pub mod progress;
pub mod sys;
pub mod twin;
pub mod value;
pub mod verdict;
pub mod workload;

/// min, median, max of a non-empty sample.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    pub min: f64,
    pub median: f64,
    pub max: f64,
}

impl Summary {
    /// `None` for an empty sample or one with NaN.
    pub fn of(values: &[f64]) -> Option<Summary> {
        if values.is_empty() || values.iter().any(|v| v.is_nan()) {
            return None;
        }
        let mut v = values.to_vec();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        Some(Summary {
            min: v[0],
            median,
            max: v[n - 1],
        })
    }
}

/// One row of a bench table.
#[derive(Debug, Clone)]
pub struct Row {
    pub name: String,
    pub unit: &'static str,
    pub summary: Summary,
    /// median / baseline median, when the row has a baseline.
    pub ratio: Option<f64>,
}

/// Prints rows as an aligned table.
pub fn print_table(title: &str, rows: &[Row]) {
    println!("{title}");
    println!(
        "{:<34} {:>12} {:>12} {:>12} {:>8}  unit",
        "case", "min", "median", "max", "ratio"
    );
    for r in rows {
        let ratio = r.ratio.map_or("-".to_string(), |x| format!("{x:.2}"));
        println!(
            "{:<34} {:>12.3} {:>12.3} {:>12.3} {:>8}  {}",
            r.name, r.summary.min, r.summary.median, r.summary.max, ratio, r.unit
        );
    }
}

/// The last line of every bench: `RESULT k=v ...`.
pub fn result_line(pairs: &[(&str, String)]) -> String {
    let kv: Vec<String> = pairs.iter().map(|(k, v)| format!("{k}={v}")).collect();
    format!("RESULT {}", kv.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_odd_even_and_empty() {
        assert_eq!(
            Summary::of(&[3.0, 1.0, 2.0]),
            Some(Summary {
                min: 1.0,
                median: 2.0,
                max: 3.0
            })
        );
        assert_eq!(
            Summary::of(&[4.0, 1.0, 2.0, 3.0]).map(|s| s.median),
            Some(2.5)
        );
        assert_eq!(Summary::of(&[]), None);
        assert_eq!(Summary::of(&[1.0, f64::NAN]), None);
    }

    #[test]
    fn result_line_format() {
        assert_eq!(
            result_line(&[("a", "1".into()), ("b_c", "2.5".into())]),
            "RESULT a=1 b_c=2.5"
        );
    }
}
