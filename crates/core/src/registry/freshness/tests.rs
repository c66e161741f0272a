#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::*;

const GRACE: Duration = Duration::from_secs(60);

#[test]
fn a_healthy_watch_is_fresh() {
    let health = WatchHealth::new(GRACE);
    assert_eq!(health.check(Instant::now() + GRACE * 10), Ok(()));
}

#[test]
fn failures_within_the_grace_period_keep_it_fresh_and_beyond_it_do_not() {
    let mut health = WatchHealth::new(GRACE);
    let start = Instant::now();
    assert!(health.failed(start), "the first failure starts a run");
    assert!(!health.failed(start + GRACE / 2), "later ones continue it");
    assert_eq!(health.failing_since(), Some(start));
    assert_eq!(health.check(start + GRACE), Ok(()));
    let stale = health.check(start + GRACE + Duration::from_secs(1));
    assert!(stale.unwrap_err().contains("--template-watch-grace"));
}

#[test]
fn only_a_complete_list_ends_a_run_of_failures() {
    let mut health = WatchHealth::new(GRACE);
    let start = Instant::now();
    health.failed(start);
    let later = start + GRACE * 2;
    assert!(health.check(later).is_err());
    health.listed();
    assert_eq!(health.check(later), Ok(()));
    assert!(health.failed(later), "a new run begins");
    assert_eq!(health.check(later + GRACE), Ok(()));
    assert!(health.check(later + GRACE * 2).is_err());
}
