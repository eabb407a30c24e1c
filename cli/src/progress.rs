//! Progress for long work (prune, export), always on stderr so stdout stays
//! clean for tables, JSON and JSON lines.
//!
//! On a terminal it is a bar redrawn in place (`\r`), at most ten times a
//! second. Anywhere else (a pipe, a log file, a test) it is plain text: one
//! line at each tenth of the work, and a final line.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

const BAR_WIDTH: usize = 30;

/// A progress reporter for `total` units of work.
pub struct Progress {
    label: &'static str,
    total: u64,
    tty: bool,
    last_draw: Option<Instant>,
    last_tenth: u64,
    finished: bool,
}

impl Progress {
    /// Starts reporting; nothing is printed until the first update.
    pub fn new(label: &'static str, total: u64) -> Progress {
        Progress {
            label,
            total,
            tty: std::io::stderr().is_terminal(),
            last_draw: None,
            last_tenth: 0,
            finished: false,
        }
    }

    /// Reports that `done` units are finished (the total may grow).
    pub fn update(&mut self, done: u64, total: u64) {
        self.total = total.max(done);
        if self.tty {
            let due = self
                .last_draw
                .is_none_or(|t| t.elapsed() >= Duration::from_millis(100));
            if due || done == self.total {
                self.draw_bar(done);
                self.last_draw = Some(Instant::now());
            }
        } else {
            let tenth = (done.saturating_mul(10))
                .checked_div(self.total)
                .unwrap_or(10);
            if tenth > self.last_tenth && tenth < 10 {
                self.last_tenth = tenth;
                self.line(done);
            }
        }
    }

    /// Ends the report with a final line.
    pub fn finish(&mut self, done: u64) {
        if self.finished {
            return;
        }
        self.finished = true;
        self.total = self.total.max(done);
        let mut err = std::io::stderr().lock();
        if self.tty {
            self.draw_bar(done);
            let _ = writeln!(err);
        } else {
            drop(err);
            self.line(done);
        }
    }

    fn percent(&self, done: u64) -> u64 {
        (done.saturating_mul(100))
            .checked_div(self.total)
            .unwrap_or(100)
    }

    fn line(&self, done: u64) {
        let _ = writeln!(
            std::io::stderr().lock(),
            "{}: {}% ({done}/{})",
            self.label,
            self.percent(done),
            self.total
        );
    }

    fn draw_bar(&self, done: u64) {
        let filled = usize::try_from(self.percent(done)).unwrap_or(100) * BAR_WIDTH / 100;
        let bar: String = (0..BAR_WIDTH)
            .map(|i| if i < filled { '#' } else { '.' })
            .collect();
        let _ = write!(
            std::io::stderr().lock(),
            "\r{} [{bar}] {:>3}% {done}/{}",
            self.label,
            self.percent(done),
            self.total
        );
    }
}
