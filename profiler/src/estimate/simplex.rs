//! A dense two-phase simplex for the small linear programs of
//! [`super::bounds`] (a few dozen columns, a dozen rows): maximise `c x`
//! subject to `A x <= b`, `x >= 0`. Dantzig's rule (steepest reduced cost)
//! for the first pivots, then Bland's, so it cannot cycle; a pivot cap
//! guards against numerical stalls. On the estimate's programs Dantzig's
//! rule takes about a sixth of the pivots Bland's alone took (52 to 9 per
//! tier and interval on tierd-scale's passes), and the tableau is one flat
//! array, not a vector per row: tierd solves these for every tier every
//! interval.

const EPS: f64 = 1e-9;
/// Pivots before giving up (far above what these problems need).
const MAX_PIVOTS: usize = 5_000;
/// Pivots by Dantzig's rule before Bland's takes over.
const DANTZIG_PIVOTS: usize = 50;

/// How a program ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The optimum and the `x` that reaches it.
    Optimal(f64, Vec<f64>),
    Infeasible,
    Unbounded,
    /// Pivot cap reached (treated as "no answer" by callers).
    Stalled,
}

#[derive(Clone, Debug)]
struct Tableau {
    /// `m` constraint rows then the objective row, `width` values each;
    /// the last column is the right-hand side (objective row: the current
    /// value).
    t: Vec<f64>,
    width: usize,
    basis: Vec<usize>,
    /// Columns that may enter (the phase-one column is barred afterwards).
    allowed: Vec<bool>,
}

impl Tableau {
    fn rhs(&self) -> usize {
        self.width - 1
    }

    fn at(&self, i: usize, j: usize) -> f64 {
        self.t[i * self.width + j]
    }

    fn row(&self, i: usize) -> &[f64] {
        &self.t[i * self.width..(i + 1) * self.width]
    }

    fn pivot(&mut self, r: usize, c: usize) {
        let w = self.width;
        let p = self.t[r * w + c];
        for v in &mut self.t[r * w..(r + 1) * w] {
            *v /= p;
        }
        // Every other row, the objective row included, less its multiple
        // of the pivot row.
        let (before, rest) = self.t.split_at_mut(r * w);
        let (row, after) = rest.split_at_mut(w);
        for other in before.chunks_exact_mut(w).chain(after.chunks_exact_mut(w)) {
            let f = other[c];
            if f != 0.0 {
                for (o, v) in other.iter_mut().zip(row.iter()) {
                    *o -= f * v;
                }
            }
        }
        self.basis[r] = c;
    }

    /// Runs to the optimum of the objective row; `false` when unbounded.
    fn optimize(&mut self) -> Result<(), Outcome> {
        let m = self.basis.len();
        let rhs = self.rhs();
        for pivots in 0..MAX_PIVOTS {
            let obj = self.row(m);
            let improving = (0..rhs).filter(|&j| self.allowed[j] && obj[j] < -EPS);
            // Steepest reduced cost first (far fewer pivots on these
            // programs); Bland's first improving column after
            // DANTZIG_PIVOTS, which cannot cycle.
            let c = if pivots < DANTZIG_PIVOTS {
                improving.min_by(|&a, &b| obj[a].total_cmp(&obj[b]))
            } else {
                improving.min()
            };
            let Some(c) = c else {
                return Ok(());
            };
            let mut best: Option<(usize, f64)> = None;
            for i in 0..m {
                let a = self.at(i, c);
                if a > EPS {
                    let ratio = self.at(i, rhs) / a;
                    let better = match best {
                        None => true,
                        Some((b, br)) => {
                            ratio < br - EPS || (ratio <= br + EPS && self.basis[i] < self.basis[b])
                        }
                    };
                    if better {
                        best = Some((i, ratio));
                    }
                }
            }
            let Some((r, _)) = best else {
                return Err(Outcome::Unbounded);
            };
            self.pivot(r, c);
        }
        Err(Outcome::Stalled)
    }
}

/// Maximises `c x` subject to `a x <= b` (rows of `a`) and `x >= 0`.
pub fn maximize<R: AsRef<[f64]>>(c: &[f64], a: &[R], b: &[f64]) -> Outcome {
    match Feasible::new(c.len(), a, b) {
        Ok(f) => f.maximize(c),
        Err(e) => e,
    }
}

/// A feasible basis of `a x <= b`, `x >= 0` (phase one done once), from
/// which several objectives are maximised.
#[derive(Clone, Debug)]
pub struct Feasible {
    tab: Tableau,
    n: usize,
}

impl Feasible {
    /// Phase one over `n` columns (the first `n` of each row of `a`);
    /// `Err` when infeasible (or stalled).
    pub fn new<R: AsRef<[f64]>>(n: usize, a: &[R], b: &[f64]) -> Result<Feasible, Outcome> {
        let m = a.len();
        // Columns: x (n), slacks (m), the phase-one column x0, rhs.
        let x0 = n + m;
        let width = n + m + 2;
        let mut t = vec![0.0; (m + 1) * width];
        for (i, (row, bi)) in a.iter().zip(b).enumerate() {
            let r = &mut t[i * width..(i + 1) * width];
            r[..n].copy_from_slice(&row.as_ref()[..n]);
            r[n + i] = 1.0;
            r[x0] = -1.0;
            r[width - 1] = *bi;
        }
        // Phase one: maximise -x0.
        t[m * width + x0] = 1.0;
        let mut tab = Tableau {
            t,
            width,
            basis: (n..n + m).collect(),
            allowed: vec![true; width - 1],
        };
        let worst = (0..m).min_by(|&i, &j| b[i].total_cmp(&b[j]));
        if let Some(r) = worst.filter(|&r| b[r] < 0.0) {
            tab.pivot(r, x0);
            tab.optimize()?;
            if tab.at(m, width - 1) < -1e-7 {
                return Err(Outcome::Infeasible);
            }
            // x0 at zero: pivot it out of the basis if it is still in.
            if let Some(r) = tab.basis.iter().position(|&c| c == x0)
                && let Some(c) = (0..x0).find(|&j| tab.at(r, j).abs() > EPS)
            {
                tab.pivot(r, c);
            }
        }
        tab.allowed[x0] = false;
        for i in 0..m {
            tab.t[i * width + x0] = 0.0;
        }
        Ok(Feasible { tab, n })
    }

    /// Phase two from the feasible basis: maximises `c x`.
    pub fn maximize(&self, c: &[f64]) -> Outcome {
        let mut tab = self.tab.clone();
        let (n, m, width) = (self.n, tab.basis.len(), tab.width);
        // The objective in terms of the non-basic columns.
        let (rows, obj) = tab.t.split_at_mut(m * width);
        obj.fill(0.0);
        for (o, cj) in obj.iter_mut().zip(c) {
            *o = -cj;
        }
        for (i, &bc) in tab.basis.iter().enumerate() {
            let f = obj[bc];
            if f != 0.0 {
                for (o, v) in obj.iter_mut().zip(&rows[i * width..(i + 1) * width]) {
                    *o -= f * v;
                }
            }
        }
        if let Err(e) = tab.optimize() {
            return e;
        }
        let mut x = vec![0.0; n];
        for (i, &bc) in tab.basis.iter().enumerate() {
            if bc < n {
                x[bc] = tab.at(i, width - 1);
            }
        }
        Outcome::Optimal(tab.at(m, width - 1), x)
    }
}

#[cfg(test)]
mod reference;

#[cfg(test)]
mod tests {
    use super::*;

    fn value(o: &Outcome) -> f64 {
        match o {
            Outcome::Optimal(v, _) => *v,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn textbook_programs() {
        // max 3x + 2y, x + y <= 4, x + 3y <= 6, x <= 3: (3, 1) -> 11.
        let a = vec![vec![1.0, 1.0], vec![1.0, 3.0], vec![1.0, 0.0]];
        let o = maximize(&[3.0, 2.0], &a, &[4.0, 6.0, 3.0]);
        assert!((value(&o) - 11.0).abs() < 1e-9, "{o:?}");
        // A lower bound (x + y >= 2 as -x - y <= -2) needs phase one:
        // min x + 2y -> max -x - 2y: (2, 0) -> -2.
        let a = vec![vec![-1.0, -1.0], vec![1.0, 0.0]];
        let o = maximize(&[-1.0, -2.0], &a, &[-2.0, 5.0]);
        assert!((value(&o) + 2.0).abs() < 1e-9, "{o:?}");
        // x >= 3 and x <= 2.
        let a = vec![vec![-1.0], vec![1.0]];
        assert_eq!(maximize(&[1.0], &a, &[-3.0, 2.0]), Outcome::Infeasible);
        // Nothing bounds x.
        assert_eq!(maximize(&[1.0], &[vec![-1.0]], &[0.0]), Outcome::Unbounded);
    }

    /// Every vertex of a small 2-D program, brute force, against the
    /// simplex, over many pseudo-random programs.
    #[test]
    fn agrees_with_vertex_enumeration() {
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        let mut rnd = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
        };
        for _ in 0..300 {
            let m = 4;
            let a: Vec<Vec<f64>> = (0..m).map(|_| vec![rnd(), rnd()]).collect();
            let b: Vec<f64> = (0..m).map(|_| rnd() + 0.3).collect();
            // A box keeps it bounded.
            let mut a = a;
            let mut b = b;
            a.push(vec![1.0, 0.0]);
            a.push(vec![0.0, 1.0]);
            b.extend([2.0, 2.0]);
            let c = [rnd(), rnd()];
            // Lines: each row, and the axes.
            let mut lines: Vec<([f64; 2], f64)> = a
                .iter()
                .zip(&b)
                .map(|(r, bi)| ([r[0], r[1]], *bi))
                .collect();
            lines.push(([1.0, 0.0], 0.0));
            lines.push(([0.0, 1.0], 0.0));
            let feasible = |x: [f64; 2]| {
                x[0] >= -1e-9
                    && x[1] >= -1e-9
                    && a.iter()
                        .zip(&b)
                        .all(|(r, bi)| r[0] * x[0] + r[1] * x[1] <= bi + 1e-9)
            };
            let mut best: Option<f64> = None;
            for i in 0..lines.len() {
                for j in i + 1..lines.len() {
                    let ((p, e), (q, f)) = (lines[i], lines[j]);
                    let det = p[0] * q[1] - p[1] * q[0];
                    if det.abs() < 1e-12 {
                        continue;
                    }
                    let x = [(e * q[1] - p[1] * f) / det, (p[0] * f - e * q[0]) / det];
                    if feasible(x) {
                        let v = c[0] * x[0] + c[1] * x[1];
                        best = Some(best.map_or(v, |bv: f64| bv.max(v)));
                    }
                }
            }
            match (maximize(&c, &a, &b), best) {
                (Outcome::Optimal(v, x), Some(bv)) => {
                    assert!((v - bv).abs() < 1e-7, "{v} {bv} {a:?} {b:?} {c:?}");
                    assert!(feasible([x[0], x[1]]), "{x:?}");
                }
                (Outcome::Infeasible, None) => {}
                (o, bv) => panic!("{o:?} vs {bv:?}: {a:?} {b:?} {c:?}"),
            }
        }
    }

    /// The same optima as the reference (the simplex before the flat
    /// tableau and Dantzig's rule: Bland's throughout, rows apart) on
    /// programs shaped like the estimate's: phase one needed, several
    /// objectives per basis. Where a program has several optimal vertices
    /// the `x` may differ; it is checked feasible and optimal instead.
    #[test]
    fn same_optima_as_the_reference_simplex() {
        let mut s = 0x2545_f491_4f6c_dd1du64;
        let mut rnd = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 11) as f64 / (1u64 << 53) as f64
        };
        let (mut optimal, mut infeasible) = (0, 0);
        for _ in 0..500 {
            let (n, m) = (2 + (rnd() * 20.0) as usize, 2 + (rnd() * 10.0) as usize);
            let a: Vec<Vec<f64>> = (0..m)
                .map(|_| (0..n).map(|_| rnd() * 2.0 - 0.5).collect())
                .collect();
            let b: Vec<f64> = (0..m).map(|_| rnd() * 2.0 - 0.3).collect();
            let new = Feasible::new(n, &a, &b);
            let old = reference::Feasible::new(n, &a, &b);
            match (&new, &old) {
                (Ok(f), Ok(g)) => {
                    for _ in 0..3 {
                        let c: Vec<f64> = (0..n).map(|_| rnd() * 2.0 - 1.0).collect();
                        match (f.maximize(&c), g.maximize(&c)) {
                            (Outcome::Optimal(v, x), Outcome::Optimal(w, _)) => {
                                assert!((v - w).abs() <= 1e-9 * (1.0 + w.abs()), "{v} {w}");
                                let cx: f64 = c.iter().zip(&x).map(|(c, x)| c * x).sum();
                                assert!((cx - v).abs() <= 1e-9 * (1.0 + v.abs()), "{cx} {v}");
                                for (row, bi) in a.iter().zip(&b) {
                                    let ax: f64 = row.iter().zip(&x).map(|(a, x)| a * x).sum();
                                    assert!(ax <= bi + 1e-9, "{ax} > {bi}");
                                }
                                assert!(x.iter().all(|x| *x >= -1e-9), "{x:?}");
                                optimal += 1;
                            }
                            (o, r) => assert_eq!(o, r),
                        }
                    }
                }
                (Err(e), Err(g)) => {
                    assert_eq!(e, g);
                    infeasible += 1;
                }
                _ => panic!("{new:?} vs reference"),
            }
        }
        assert!(optimal > 100 && infeasible > 10, "{optimal} {infeasible}");
    }
}
