//! The state of `tierctl top`: the fleet (live and, while paused, the
//! picture on screen), sort, filter, selection, panes and the connection.
//! Everything the renderer reads is here; nothing here does I/O.

use std::cmp::Ordering;

use regex::{Regex, RegexBuilder};
use tier_proto::v1::{DaemonInfo, Decision, Policy, StatsUpdate};

use super::layout::table_body_height;
use super::model::{Fleet, VmView};

/// Sortable columns, in the order `s` cycles through them (and keys 1-7).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SortColumn {
    Name,
    Vcpus,
    Resident,
    Access,
    Hit,
    Delta,
    Action,
}

impl SortColumn {
    pub const ALL: [SortColumn; 7] = [
        SortColumn::Name,
        SortColumn::Vcpus,
        SortColumn::Resident,
        SortColumn::Access,
        SortColumn::Hit,
        SortColumn::Delta,
        SortColumn::Action,
    ];

    pub fn label(self) -> &'static str {
        match self {
            SortColumn::Name => "name",
            SortColumn::Vcpus => "vcpu",
            SortColumn::Resident => "resident",
            SortColumn::Access => "acc/s",
            SortColumn::Hit => "dram-hit",
            SortColumn::Delta => "delta",
            SortColumn::Action => "last action",
        }
    }

    fn next(self) -> SortColumn {
        let i = SortColumn::ALL.iter().position(|&c| c == self).unwrap_or(0);
        SortColumn::ALL[(i + 1) % SortColumn::ALL.len()]
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sort {
    pub column: SortColumn,
    pub descending: bool,
}

/// The regex filter on VM name or id.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// Text of the filter (being typed while `editing`).
    pub text: String,
    pub editing: bool,
    /// The filter in force: the last text that compiled.
    pub regex: Option<Regex>,
    /// Why `text` does not compile, while it does not.
    pub error: Option<String>,
}

/// The connection to tierd, as the status line shows it.
#[derive(Debug, Clone, PartialEq)]
pub enum Conn {
    Connecting,
    Connected,
    /// Lost; the picture is the last one received.
    Disconnected {
        error: String,
        attempt: u32,
        retry_at_ns: u64,
    },
}

#[derive(Debug, Clone)]
pub struct App {
    /// Updated by every message, paused or not.
    pub live: Fleet,
    /// What the screen shows while paused.
    pub frozen: Option<Fleet>,
    pub info: Option<DaemonInfo>,
    pub policy: Option<Policy>,
    pub sort: Sort,
    pub filter: Filter,
    /// Indices into the shown fleet's VMs: filtered and sorted.
    pub order: Vec<usize>,
    /// Index into `order`.
    pub selected: usize,
    /// First VM of `order` on screen.
    pub offset: usize,
    /// VM id of the open detail pane.
    pub detail: Option<String>,
    pub help: bool,
    pub conn: Conn,
    /// Wall clock for "ago" and retry countdowns, Unix ns.
    pub now_ns: u64,
    /// Terminal size.
    pub width: u16,
    pub height: u16,
    pub quit: bool,
}

impl Default for App {
    fn default() -> Self {
        App::new()
    }
}

impl App {
    pub fn new() -> App {
        App {
            live: Fleet::default(),
            frozen: None,
            info: None,
            policy: None,
            // Most starved of DRAM first.
            sort: Sort {
                column: SortColumn::Delta,
                descending: false,
            },
            filter: Filter::default(),
            order: Vec::new(),
            selected: 0,
            offset: 0,
            detail: None,
            help: false,
            conn: Conn::Connecting,
            now_ns: 0,
            width: 80,
            height: 24,
            quit: false,
        }
    }

    /// The fleet on screen.
    pub fn shown(&self) -> &Fleet {
        self.frozen.as_ref().unwrap_or(&self.live)
    }

    pub fn paused(&self) -> bool {
        self.frozen.is_some()
    }

    pub fn default_target(&self) -> Option<f64> {
        self.policy.as_ref().map(|p| p.default_target)
    }

    pub fn epsilon(&self) -> f64 {
        self.policy.as_ref().map_or(0.02, |p| p.epsilon)
    }

    /// The selected VM, if any is shown.
    pub fn selected_vm(&self) -> Option<&VmView> {
        let i = *self.order.get(self.selected)?;
        self.shown().vms.get(i)
    }

    pub fn on_update(&mut self, u: StatsUpdate, first_of_stream: bool) {
        self.live.apply(u, first_of_stream);
        if first_of_stream {
            self.conn = Conn::Connected;
        }
        if !self.paused() {
            self.refresh();
            // The VM of an open detail pane went away (or tierd restarted and
            // gave it a new id): back to the table, whose footer says so.
            if let Some(id) = &self.detail
                && self.shown().vm(id).is_none()
            {
                self.detail = None;
            }
        }
    }

    pub fn on_decision(&mut self, d: Decision) {
        self.live.apply_decision(d);
        if !self.paused() {
            self.refresh();
        }
    }

    pub fn on_connected(&mut self, info: DaemonInfo, policy: Option<Policy>) {
        self.info = Some(info);
        if policy.is_some() {
            self.policy = policy;
        }
        self.conn = Conn::Connected;
    }

    pub fn on_disconnected(&mut self, error: String, attempt: u32, retry_at_ns: u64) {
        self.conn = Conn::Disconnected {
            error,
            attempt,
            retry_at_ns,
        };
    }

    pub fn resize(&mut self, width: u16, height: u16) {
        self.width = width;
        self.height = height;
        self.scroll_into_view();
    }

    pub fn toggle_pause(&mut self) {
        self.frozen = match self.frozen.take() {
            Some(_) => None,
            None => Some(self.live.clone()),
        };
        self.refresh();
    }

    pub fn set_sort(&mut self, sort: Sort) {
        self.sort = sort;
        self.refresh();
    }

    /// `s`: the next column, in its natural direction.
    pub fn next_sort_column(&mut self) {
        let column = self.sort.column.next();
        self.set_sort(Sort {
            column,
            descending: natural_descending(column),
        });
    }

    /// A column by number; the same one again flips the direction.
    pub fn sort_by(&mut self, column: SortColumn) {
        let descending = if self.sort.column == column {
            !self.sort.descending
        } else {
            natural_descending(column)
        };
        self.set_sort(Sort { column, descending });
    }

    pub fn flip_sort(&mut self) {
        self.set_sort(Sort {
            column: self.sort.column,
            descending: !self.sort.descending,
        });
    }

    /// Sets the filter text; the filter in force changes when it compiles.
    pub fn set_filter_text(&mut self, text: String) {
        self.filter.text = text;
        if self.filter.text.is_empty() {
            self.filter.regex = None;
            self.filter.error = None;
        } else {
            match RegexBuilder::new(&self.filter.text)
                .case_insensitive(true)
                .size_limit(1 << 20)
                .build()
            {
                Ok(re) => {
                    self.filter.regex = Some(re);
                    self.filter.error = None;
                }
                Err(e) => self.filter.error = Some(short_regex_error(&e)),
            }
        }
        self.refresh();
    }

    pub fn clear_filter(&mut self) {
        self.filter.editing = false;
        self.set_filter_text(String::new());
    }

    /// Recomputes the order after data, sort or filter changed; the
    /// selection stays on the same VM when it is still shown.
    pub fn refresh(&mut self) {
        let keep = self.selected_vm().map(|v| v.vm.id.clone());
        let fleet = self.frozen.as_ref().unwrap_or(&self.live);
        let default = self.policy.as_ref().map(|p| p.default_target);
        let re = self.filter.regex.as_ref();
        let mut order: Vec<usize> = (0..fleet.vms.len())
            .filter(|&i| {
                let vm = &fleet.vms[i].vm;
                re.is_none_or(|re| re.is_match(&vm.name) || re.is_match(&vm.id))
            })
            .collect();
        let sort = self.sort;
        order.sort_by(|&a, &b| {
            let (va, vb) = (&fleet.vms[a], &fleet.vms[b]);
            compare(va, vb, sort, default).then_with(|| va.vm.name.cmp(&vb.vm.name))
        });
        self.order = order;
        self.selected = keep
            .and_then(|id| {
                self.order
                    .iter()
                    .position(|&i| self.shown().vms[i].vm.id == id)
            })
            .unwrap_or(self.selected)
            .min(self.order.len().saturating_sub(1));
        self.scroll_into_view();
    }

    /// Moves the selection by `delta` VMs.
    pub fn move_selection(&mut self, delta: isize) {
        let last = self.order.len().saturating_sub(1);
        self.selected = self.selected.saturating_add_signed(delta).min(last);
        self.scroll_into_view();
    }

    pub fn select_last(&mut self) {
        self.selected = self.order.len().saturating_sub(1);
        self.scroll_into_view();
    }

    /// VMs that fit on one page (rows are as high as a VM has tiers).
    pub fn page_vms(&self) -> usize {
        let rows = table_body_height(self.height) as usize;
        let per = self.selected_vm().map_or(1, |v| v.vm.tiers.len().max(1));
        (rows / per).max(1)
    }

    /// Keeps the selected VM on screen, scrolling as little as possible.
    pub fn scroll_into_view(&mut self) {
        let rows = table_body_height(self.height) as usize;
        self.offset = first_visible(self, self.offset, rows);
    }

    pub fn open_detail(&mut self) {
        self.detail = self.selected_vm().map(|v| v.vm.id.clone());
    }
}

/// The first VM to draw so that the selection is visible, starting from `hint`.
pub fn first_visible(app: &App, hint: usize, rows: usize) -> usize {
    let fleet = app.shown();
    let height = |k: usize| {
        app.order
            .get(k)
            .map_or(1, |&i| fleet.vms[i].vm.tiers.len().max(1))
    };
    let sel = app.selected.min(app.order.len().saturating_sub(1));
    let mut start = hint.min(sel);
    // Move down until rows start..=sel fit.
    let mut used: usize = (start..=sel).map(height).sum();
    while used > rows && start < sel {
        used -= height(start);
        start += 1;
    }
    start
}

/// Direction that shows the interesting VMs first: starved (lowest hit,
/// most negative delta) first, busiest and largest first.
fn natural_descending(c: SortColumn) -> bool {
    matches!(
        c,
        SortColumn::Vcpus | SortColumn::Resident | SortColumn::Access | SortColumn::Action
    )
}

/// Compares two VMs by a column; VMs without a value go last either way.
fn compare(a: &VmView, b: &VmView, sort: Sort, default: Option<f64>) -> Ordering {
    fn opt<T: PartialOrd>(a: Option<T>, b: Option<T>, desc: bool) -> Ordering {
        match (a, b) {
            (Some(x), Some(y)) => {
                let o = x.partial_cmp(&y).unwrap_or(Ordering::Equal);
                if desc { o.reverse() } else { o }
            }
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (None, None) => Ordering::Equal,
        }
    }
    let d = sort.descending;
    match sort.column {
        SortColumn::Name => {
            let o = a.vm.name.cmp(&b.vm.name);
            if d { o.reverse() } else { o }
        }
        SortColumn::Vcpus => opt(Some(a.vm.vcpus), Some(b.vm.vcpus), d),
        SortColumn::Resident => opt(Some(a.resident_total()), Some(b.resident_total()), d),
        SortColumn::Access => opt(a.accesses_total(), b.accesses_total(), d),
        SortColumn::Hit => opt(a.hit(), b.hit(), d),
        SortColumn::Delta => opt(a.delta(default), b.delta(default), d),
        SortColumn::Action => opt(
            a.last_decision.as_ref().map(|x| x.timestamp_unix_ns),
            b.last_decision.as_ref().map(|x| x.timestamp_unix_ns),
            d,
        ),
    }
}

/// The regex crate's errors span several lines; the prompt has one.
fn short_regex_error(e: &regex::Error) -> String {
    let s = e.to_string();
    s.lines()
        .rev()
        .find(|l| l.trim_start().starts_with("error:"))
        .map_or(s.clone(), |l| l.trim().to_string())
}
