//! When a lane's next batch leaves ([`Lane::full`], [`Lane::due`]), what the lane counts in
//! flight, and what a window's end sends ([`Lane::window_ended`]).

use tokio::sync::oneshot;

use super::*;
use crate::backend::redis::wire::args::CellArgs;

/// `n` waiting checks (their receivers dropped: nothing is sent here).
fn waiting(n: usize) -> Vec<Waiter> {
    (0..n)
        .map(|_| Waiter {
            job: Job::Cell(
                "k".to_owned(),
                CellArgs {
                    max_burst: 1,
                    count: 1,
                    period_secs: 1,
                },
                1,
            ),
            answer: oneshot::channel().0,
        })
        .collect()
}

/// A lane with `n` checks waiting.
fn lane(n: usize) -> Lane {
    Lane {
        waiting: waiting(n),
        ..Lane::default()
    }
}

#[test]
fn the_next_batch_waits_until_it_is_as_large_as_the_one_in_flight() {
    let mut lane = lane(10);
    let first = lane.take();
    assert_eq!((first.len(), lane.in_flight, lane.flying), (10, 1, 10));
    lane.waiting = waiting(9);
    assert!(!lane.full(), "9 waiting while 10 are in flight");
    lane.waiting = waiting(10);
    assert!(lane.full() && lane.due());
    let second = lane.take();
    assert_eq!((second.len(), lane.in_flight, lane.flying), (10, 2, 20));
    // Full, but two batches in flight within their windows: it waits for one of them.
    lane.waiting = waiting(20);
    assert!(lane.full() && !lane.due());
    // The first answers; a batch of 25 had answered last: the next waits for the larger of the
    // one in flight (10) and that (25), as the callers of a batch come back together.
    lane.last_size = 25;
    lane.ended(10, true);
    assert_eq!((lane.in_flight, lane.flying), (1, 10));
    lane.waiting = waiting(24);
    assert!(!lane.full());
    lane.waiting = waiting(25);
    assert!(lane.full());
}

/// A full batch leaves however many are in flight: a lane is not capped at two batches a round
/// trip when checks come faster.
#[test]
fn a_batch_of_max_batch_leaves_whatever_is_in_flight() {
    let mut lane = lane(MAX_BATCH);
    assert!(lane.due(), "nothing in flight");
    lane.take();
    lane.waiting = waiting(MAX_BATCH);
    lane.take();
    assert_eq!(lane.in_flight, IN_FLIGHT);
    lane.waiting = waiting(MAX_BATCH - 1);
    assert!(!lane.due(), "two in flight, and not a full batch waiting");
    lane.waiting = waiting(MAX_BATCH);
    assert!(lane.due());
    lane.take();
    assert_eq!((lane.in_flight, lane.flying), (3, 3 * MAX_BATCH));
}

#[test]
fn a_lane_with_nothing_in_flight_counts_no_check_in_flight() {
    let mut lane = lane(MAX_BATCH + 5);
    let batch = lane.take();
    assert_eq!((batch.len(), lane.waiting.len()), (MAX_BATCH, 5));
    // A task that ends with a size it no longer matches (dropped half-way) cannot leave the lane
    // counting checks in flight once no batch is.
    lane.ended(1, true);
    assert_eq!((lane.in_flight, lane.flying, lane.open_windows), (0, 0, 0));
}

#[test]
fn a_check_waits_only_behind_a_batch_whose_window_is_open() {
    let mut lane = lane(4);
    lane.take();
    assert_eq!((lane.in_flight, lane.open_windows), (1, 1));
    lane.waiting = waiting(1);
    assert!(!lane.due(), "behind a larger batch within its window");
    // Its window ends before its answer: the check waiting leaves, its own window open.
    let sent = lane.window_ended().expect("the waiting check leaves");
    assert_eq!(sent.len(), 1);
    assert_eq!((lane.in_flight, lane.open_windows), (2, 1));
    // Both slower than the window: a check leaves at once, however many are in flight.
    assert!(lane.window_ended().is_none(), "nothing waits");
    lane.waiting = waiting(1);
    assert!(lane.due(), "no window open");
    // A batch that answers within its window closes it; one whose window ended closes none.
    lane.ended(1, false);
    assert_eq!((lane.in_flight, lane.open_windows), (1, 0));
    lane.take();
    lane.ended(1, true);
    assert_eq!((lane.in_flight, lane.open_windows), (1, 0));
}

#[test]
fn the_checks_left_behind_a_full_batch_leave_by_its_window() {
    let mut lane = lane(MAX_BATCH + 1);
    lane.take();
    assert_eq!(lane.waiting.len(), 1);
    assert!(!lane.due(), "behind a full batch within its window");
    assert_eq!(lane.window_ended().map(|b| b.len()), Some(1));
}
