//! The simplex as it was before its tableau went flat (Vec of rows, one
//! allocation each): kept for tests, which check the flat one against it
//! bit for bit.

use super::{EPS, MAX_PIVOTS, Outcome};

#[derive(Clone)]
struct Tableau {
    /// `m` constraint rows then the objective row; the last column is the
    /// right-hand side (objective row: the current value).
    t: Vec<Vec<f64>>,
    basis: Vec<usize>,
    /// Columns that may enter (the phase-one column is barred afterwards).
    allowed: Vec<bool>,
}

impl Tableau {
    fn rhs(&self) -> usize {
        self.t[0].len() - 1
    }

    fn pivot(&mut self, r: usize, c: usize) {
        let p = self.t[r][c];
        for v in &mut self.t[r] {
            *v /= p;
        }
        let row = std::mem::take(&mut self.t[r]);
        for other in self.t.iter_mut() {
            // The pivot row itself is the empty one taken out.
            let f = other.get(c).copied().unwrap_or(0.0);
            if f != 0.0 {
                for (o, v) in other.iter_mut().zip(&row) {
                    *o -= f * v;
                }
            }
        }
        self.t[r] = row;
        self.basis[r] = c;
    }

    /// Runs to the optimum of the objective row; `false` when unbounded.
    fn optimize(&mut self) -> Result<(), Outcome> {
        let m = self.basis.len();
        let rhs = self.rhs();
        for _ in 0..MAX_PIVOTS {
            let obj = &self.t[m];
            let Some(c) = (0..rhs).find(|&j| self.allowed[j] && obj[j] < -EPS) else {
                return Ok(());
            };
            let mut best: Option<(usize, f64)> = None;
            for i in 0..m {
                let a = self.t[i][c];
                if a > EPS {
                    let ratio = self.t[i][rhs] / a;
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

/// A feasible basis of `a x <= b`, `x >= 0` (phase one done once), from
/// which several objectives are maximised.
#[derive(Clone)]
pub(super) struct Feasible {
    tab: Tableau,
    n: usize,
}

impl Feasible {
    /// Phase one over `n` columns; `Err` when infeasible (or stalled).
    pub(super) fn new(n: usize, a: &[Vec<f64>], b: &[f64]) -> Result<Feasible, Outcome> {
        let m = a.len();
        // Columns: x (n), slacks (m), the phase-one column x0, rhs.
        let x0 = n + m;
        let width = n + m + 2;
        let mut t = Vec::with_capacity(m + 1);
        for (i, (row, bi)) in a.iter().zip(b).enumerate() {
            let mut r = vec![0.0; width];
            r[..n].copy_from_slice(&row[..n]);
            r[n + i] = 1.0;
            r[x0] = -1.0;
            r[width - 1] = *bi;
            t.push(r);
        }
        // Phase one: maximise -x0.
        let mut obj = vec![0.0; width];
        obj[x0] = 1.0;
        t.push(obj);
        let mut tab = Tableau {
            t,
            basis: (n..n + m).collect(),
            allowed: vec![true; width - 1],
        };
        let worst = (0..m).min_by(|&i, &j| b[i].total_cmp(&b[j]));
        if let Some(r) = worst.filter(|&r| b[r] < 0.0) {
            tab.pivot(r, x0);
            tab.optimize()?;
            if tab.t[m][width - 1] < -1e-7 {
                return Err(Outcome::Infeasible);
            }
            // x0 at zero: pivot it out of the basis if it is still in.
            if let Some(r) = tab.basis.iter().position(|&c| c == x0)
                && let Some(c) = (0..x0).find(|&j| tab.t[r][j].abs() > EPS)
            {
                tab.pivot(r, c);
            }
        }
        tab.allowed[x0] = false;
        for row in &mut tab.t[..m] {
            row[x0] = 0.0;
        }
        Ok(Feasible { tab, n })
    }

    /// Phase two from the feasible basis: maximises `c x`.
    pub(super) fn maximize(&self, c: &[f64]) -> Outcome {
        let mut tab = self.tab.clone();
        let (n, m) = (self.n, tab.basis.len());
        let width = tab.t[0].len();
        // The objective in terms of the non-basic columns.
        let mut obj = vec![0.0; width];
        for (o, cj) in obj.iter_mut().zip(c) {
            *o = -cj;
        }
        for (i, &bc) in tab.basis.iter().enumerate() {
            let f = obj[bc];
            if f != 0.0 {
                for (o, v) in obj.iter_mut().zip(&tab.t[i]) {
                    *o -= f * v;
                }
            }
        }
        tab.t[m] = obj;
        if let Err(e) = tab.optimize() {
            return e;
        }
        let mut x = vec![0.0; n];
        for (i, &bc) in tab.basis.iter().enumerate() {
            if bc < n {
                x[bc] = tab.t[i][width - 1];
            }
        }
        Outcome::Optimal(tab.t[m][width - 1], x)
    }
}
