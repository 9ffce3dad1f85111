//! `Limit` on its own: what a delaying limit makes an admitted request wait.

use std::time::Duration;

use tower_throttle::{Decision, Limit, Quota};

#[test]
fn only_an_admitted_request_of_a_delaying_limit_waits_beyond_the_tolerance() {
    // 10 a second, bursts of 10: a tolerance of 1 s; waits of up to 1 s beyond it.
    let quota = Quota::per_second(10);
    let delaying = Limit::new("d", quota)
        .unwrap()
        .with_delay(Duration::from_secs(1))
        .unwrap();
    let ms = Duration::from_millis;
    // The key's TAT 1.3 s ahead: 300 ms past the tolerance.
    let admitted = Decision::allowed(10, 0, ms(1300));
    assert_eq!(delaying.delay_for(&admitted), ms(300));
    // Within the tolerance: at once.
    assert_eq!(
        delaying.delay_for(&Decision::allowed(10, 3, ms(700))),
        Duration::ZERO
    );
    // A rejection is answered at once, however far the TAT lies ahead.
    let rejected = Decision::limited(10, 0, Some(ms(500)), ms(1300));
    assert_eq!(delaying.delay_for(&rejected), Duration::ZERO);
    // A limit that does not delay never waits.
    let plain = Limit::new("p", quota).unwrap();
    assert_eq!(plain.delay(), None);
    assert_eq!(plain.delay_for(&admitted), Duration::ZERO);
    assert_eq!(delaying.delay(), Some(Duration::from_secs(1)));
}
