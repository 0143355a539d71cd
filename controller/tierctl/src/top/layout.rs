//! The screen's fixed lines around the VM table. Both the state (paging,
//! scrolling) and the renderer need them, so they live apart from both.

/// Lines above the table (title, status) and below it (footer).
pub const TOP_LINES: u16 = 2;
pub const BOTTOM_LINES: u16 = 1;

/// Rows of the terminal available to VM rows (the table header excluded).
pub fn table_body_height(terminal_height: u16) -> u16 {
    terminal_height.saturating_sub(TOP_LINES + BOTTOM_LINES + 1)
}
