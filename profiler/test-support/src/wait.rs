//! Waiting for a condition with a deadline: the one loop every test, the
//! e2e run and the benches use in place of their own
//! `Instant::now() + ...; loop { ...; sleep }`.

use std::future::Future;
use std::time::{Duration, Instant};

/// The first pause between polls of a condition; each pause doubles up to
/// [`POLL_MAX`], so a quick condition is seen quickly and a costly check
/// (a command run, an HTTP request) is not run many times a second.
pub const POLL: Duration = Duration::from_millis(20);
/// The longest pause between polls.
pub const POLL_MAX: Duration = Duration::from_millis(200);

/// A condition that did not hold within its timeout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimedOut {
    /// What was waited for, as the caller named it.
    pub what: String,
    pub timeout: Duration,
    /// Why the condition last did not hold, where it said.
    pub last: Option<String>,
}

impl std::fmt::Display for TimedOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "timed out after {:?} waiting for {}",
            self.timeout, self.what
        )?;
        if let Some(last) = &self.last {
            write!(f, "; last: {last}")?;
        }
        Ok(())
    }
}

impl std::error::Error for TimedOut {}

/// What a polled condition returns: `Some(v)` or `Ok(v)` when it holds;
/// `None`, or `Err(why)` to say why not (the last `why` is in the timeout
/// message).
pub trait Check<T> {
    fn check(self) -> Result<T, Option<String>>;
}

impl<T> Check<T> for Option<T> {
    fn check(self) -> Result<T, Option<String>> {
        self.ok_or(None)
    }
}

impl<T, E: std::fmt::Display> Check<T> for Result<T, E> {
    fn check(self) -> Result<T, Option<String>> {
        self.map_err(|e| Some(e.to_string()))
    }
}

/// Polls `f` (pausing [`POLL`], then longer) until it holds ([`Check`]), and returns its
/// value. `f` is called at least once, also with a zero timeout. Panics
/// naming `what` (and why it last did not hold) once `timeout` has passed.
pub fn wait_until<T, C: Check<T>>(what: &str, timeout: Duration, f: impl FnMut() -> C) -> T {
    try_wait_until(what, timeout, f).unwrap_or_else(|e| panic!("{e}"))
}

/// [`wait_until`] that returns [`TimedOut`] in place of panicking: for the
/// e2e run and benches, which report errors rather than panic.
pub fn try_wait_until<T, C: Check<T>>(
    what: &str,
    timeout: Duration,
    mut f: impl FnMut() -> C,
) -> Result<T, TimedOut> {
    let mut deadline = Deadline::new(what, timeout);
    loop {
        match f().check() {
            Ok(v) => return Ok(v),
            Err(last) => std::thread::sleep(deadline.pause(last)?),
        }
    }
}

/// [`wait_until`] for async conditions: sleeps on tokio's timer, so other
/// tasks run meanwhile.
pub async fn wait_until_async<T, C, Fut>(what: &str, timeout: Duration, f: impl FnMut() -> Fut) -> T
where
    C: Check<T>,
    Fut: Future<Output = C>,
{
    try_wait_until_async(what, timeout, f)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// [`wait_until_async`] that returns [`TimedOut`] in place of panicking.
pub async fn try_wait_until_async<T, C, Fut>(
    what: &str,
    timeout: Duration,
    mut f: impl FnMut() -> Fut,
) -> Result<T, TimedOut>
where
    C: Check<T>,
    Fut: Future<Output = C>,
{
    let mut deadline = Deadline::new(what, timeout);
    loop {
        match f().await.check() {
            Ok(v) => return Ok(v),
            Err(last) => tokio::time::sleep(deadline.pause(last)?).await,
        }
    }
}

/// The deadline of one wait, and its pauses.
struct Deadline<'a> {
    what: &'a str,
    timeout: Duration,
    at: Instant,
    pause: Duration,
}

impl<'a> Deadline<'a> {
    fn new(what: &'a str, timeout: Duration) -> Self {
        Deadline {
            what,
            timeout,
            at: Instant::now() + timeout,
            pause: POLL,
        }
    }

    /// The pause before the next poll, or [`TimedOut`] (with `last`, why
    /// the condition did not hold) once the deadline has passed.
    fn pause(&mut self, last: Option<String>) -> Result<Duration, TimedOut> {
        if Instant::now() >= self.at {
            return Err(TimedOut {
                what: self.what.to_string(),
                timeout: self.timeout,
                last,
            });
        }
        let pause = self.pause;
        self.pause = (pause * 2).min(POLL_MAX);
        Ok(pause)
    }
}

/// Awaits `fut` for at most `timeout`: for a loop that waits on a stream
/// (a deadline checked between items would miss a stream that stalls).
/// Panics naming `what` on timeout.
pub async fn within<T>(what: &str, timeout: Duration, fut: impl Future<Output = T>) -> T {
    try_within(what, timeout, fut)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// [`within`] that returns [`TimedOut`] in place of panicking.
pub async fn try_within<T>(
    what: &str,
    timeout: Duration,
    fut: impl Future<Output = T>,
) -> Result<T, TimedOut> {
    tokio::time::timeout(timeout, fut)
        .await
        .map_err(|_| TimedOut {
            what: what.to_string(),
            timeout,
            last: None,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn returns_the_first_value_that_holds() {
        let mut n = 0;
        let v = wait_until("n to reach 3", Duration::from_secs(5), || {
            n += 1;
            (n >= 3).then_some(n)
        });
        assert_eq!(v, 3);
    }

    #[test]
    fn a_timeout_says_why_the_condition_last_failed() {
        let mut n = 0;
        let e = try_wait_until("n to reach 1000", Duration::from_millis(120), || {
            n += 1;
            if n >= 1000 {
                Ok(n)
            } else {
                Err(format!("n is {n}"))
            }
        })
        .unwrap_err();
        assert!(e.to_string().contains("; last: n is "), "{e}");
    }

    #[test]
    fn times_out_naming_what_it_waited_for() {
        let e = try_wait_until("never", Duration::from_millis(120), || None::<()>).unwrap_err();
        assert_eq!(e.what, "never");
        assert!(e.to_string().contains("waiting for never"), "{e}");
    }

    #[test]
    fn within_ends_a_stalled_future() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let e = rt
            .block_on(try_within(
                "a stalled stream",
                Duration::from_millis(50),
                std::future::pending::<()>(),
            ))
            .unwrap_err();
        assert_eq!(e.what, "a stalled stream");
        assert_eq!(rt.block_on(within("ready", Duration::ZERO, async { 7 })), 7);
    }

    #[test]
    #[should_panic(expected = "waiting for the moon")]
    fn panics_with_what_on_timeout() {
        wait_until("the moon", Duration::ZERO, || None::<()>);
    }
}
