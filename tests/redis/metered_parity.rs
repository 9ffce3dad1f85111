//! Metered limits on Redis, differentially: the scripts (`gcra.lua`, `limits.lua` with a quantity
//! per limit, `settle.lua`) against a pure model of the GCRA with debt, to the nanosecond on a
//! test clock; and random reserve/settle sequences with debt on the real clock, where the model,
//! the memory backend, the Lua path and `CL.THROTTLE` (settled by `settle.lua` on the module's own
//! keys) must give the same decisions and retry times.
//!
//! The model is the GCRA of `src/gcra.rs` (`decide`), with a metered limit's ceiling (a TAT up to
//! `tolerance + max_debt × interval` ahead is debt, read as it is) and the settle of issue 26: a
//! positive delta moves the TAT to `max(TAT, now) + delta × interval`, capped at the ceiling and
//! never lowered; a negative one gives back as a refund does, less the time since admission.
//! Seeds are printed; `METERED_SEED=<n>` replays one.

use std::time::Duration;

use redis::AsyncCommands;
use tokio::time::Instant;
use tower_throttle::{
    redis::{RedisBackend, RedisMode},
    Decision, Key, Limit, MemoryBackend, Quota,
};

use crate::algorithms::Rng;
use crate::batch::on_a_test_clock;
use crate::support::asks::Asks;
use crate::support::redis::RedisServer;

const MS: u64 = 1_000_000;
const S: u64 = 1_000_000_000;

fn seed(default: u64) -> u64 {
    let seed = std::env::var("METERED_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default);
    println!("seed {seed} (METERED_SEED={seed} replays it)");
    seed
}

/// A GCRA limit's numbers, in nanoseconds; `ceiling` is `tolerance` for a limit that is not metered.
#[derive(Clone, Copy, Debug)]
struct Model {
    interval: u64,
    tolerance: u64,
    limit: u64,
    ceiling: u64,
}

impl Model {
    fn of(limit: &Limit) -> Model {
        let params = limit.gcra().unwrap();
        let ceiling = if limit.is_metered() {
            params.tolerance() + params.emission_interval() * limit.max_debt()
        } else {
            params.tolerance()
        };
        Model {
            interval: params.emission_interval(),
            tolerance: params.tolerance(),
            limit: params.limit(),
            ceiling,
        }
    }

    /// `gcra::decide` on a backlog (TAT − now, 0: no state) with this ceiling: the reply
    /// `[limited, limit, remaining, retry_after (-1: never), reset_after]`, the backlog to store.
    fn decide(&self, backlog: u64, quantity: u64) -> ([i64; 5], Option<u64>) {
        let Model {
            interval,
            tolerance,
            limit,
            ceiling,
        } = *self;
        let rebased = backlog > ceiling;
        let backlog = backlog.min(ceiling);
        let increment = interval * quantity;
        let new_backlog = backlog + increment;
        if new_backlog <= tolerance {
            let remaining = (tolerance - new_backlog) / interval;
            let reply = [0, limit as i64, remaining as i64, -1, new_backlog as i64];
            return (reply, (new_backlog > 0).then_some(new_backlog));
        }
        let remaining = (tolerance.saturating_sub(backlog) / interval).min(limit);
        let retry = if increment <= tolerance {
            (new_backlog - tolerance) as i64
        } else {
            -1
        };
        let reply = [1, limit as i64, remaining as i64, retry, backlog as i64];
        (reply, (rebased && backlog > 0).then_some(backlog))
    }

    /// The settle: the backlog to store (`Some(None)`: delete the key), or `None` to leave it.
    fn settle(&self, backlog: u64, delta: i64, since_us: u64) -> Option<Option<u64>> {
        let units = delta.unsigned_abs();
        if delta > 0 {
            let ahead = (backlog + self.interval * units).min(self.ceiling);
            return (ahead > backlog).then_some(Some(ahead));
        }
        if delta == 0 || backlog == 0 {
            return None;
        }
        let back = (self.interval * units).checked_sub(since_us * 1000)?;
        if back == 0 {
            return None;
        }
        Some(backlog.checked_sub(back).filter(|a| *a > 0))
    }
}

/// A random stored state for `model` at `now`, as a TAT string: none, passed, within the burst, in
/// debt, beyond the ceiling (another quota's), or not a TAT.
fn random_state(rng: &mut Rng, model: &Model, now: u64) -> Option<String> {
    let Model {
        tolerance, ceiling, ..
    } = *model;
    Some(match rng.below(7) {
        0 => return None,
        1 => (now - rng.below(10 * MS)).to_string(),
        2 | 3 => (now + 1 + rng.below(tolerance)).to_string(),
        4 | 5 => (now + tolerance + 1 + rng.below(ceiling - tolerance + 1)).to_string(),
        _ if rng.below(2) == 0 => (now + ceiling + 1 + rng.below(tolerance)).to_string(),
        _ => "not a tat".to_owned(),
    })
}

/// What the scripts read in a stored value: its backlog at `now` (0: no state).
fn backlog_of(stored: Option<&str>, now: u64) -> u64 {
    stored
        .filter(|s| (10..30).contains(&s.len()))
        .and_then(|s| s.parse::<u64>().ok())
        .filter(|tat| *tat > now)
        .map_or(0, |tat| tat - now)
}

fn random_limit(rng: &mut Rng, name: &str, metered: bool) -> Limit {
    let period = Duration::from_nanos(rng.pick(&[MS, 7919 * 1000, 100 * MS, S, 3600 * S]));
    let count = 1 + rng.below(20);
    let quota = Quota::per_period(count, period).with_max_burst(rng.below(2 * count));
    let limit = Limit::new(name, quota).unwrap();
    if metered {
        limit.with_max_debt(rng.below(3 * count + 1))
    } else {
        limit
    }
}

/// `gcra.lua` (a metered check alone), `limits.lua` (a stack, a quantity per limit) and
/// `settle.lua` compute the model to the nanosecond: replies and stored TATs, on random instants,
/// quotas, debt caps, states (in debt, beyond the cap, …), quantities and deltas.
#[tokio::test]
async fn metered_scripts_compute_the_model_exactly() {
    let server = RedisServer::start();
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let gcra = on_a_test_clock(crate::lua::GCRA);
    let limits = on_a_test_clock(crate::lua::LIMITS);
    let settle = on_a_test_clock(crate::lua::SETTLE);
    let batch = on_a_test_clock(crate::lua::GCRA_BATCH);
    let mut rng = Rng(seed(0x3e7e_12ed));
    let mut seen = [0u32; 7];
    for case in 0..3000u32 {
        let now_s = 1_700_000_000 + rng.below(100_000_000);
        let now_us = rng.below(1_000_000);
        let now = now_s * S + now_us * 1000;
        let metered = random_limit(&mut rng, "tokens", true);
        let plain = random_limit(&mut rng, "requests", false);
        let (m, p) = (Model::of(&metered), Model::of(&plain));
        let keys = ["t:{k}", "r:{k}"];
        let states = [
            random_state(&mut rng, &m, now),
            random_state(&mut rng, &p, now),
        ];
        let mut pipe = redis::pipe();
        pipe.cmd("FLUSHALL").ignore();
        pipe.hset_multiple("test-clock", &[("s", now_s), ("us", now_us)])
            .ignore();
        for (key, state) in keys.iter().zip(&states) {
            if let Some(state) = state {
                pipe.set(*key, state).ignore();
            }
        }
        let () = pipe.query_async(&mut conn).await.unwrap();
        let backlogs = [
            backlog_of(states[0].as_deref(), now),
            backlog_of(states[1].as_deref(), now),
        ];
        // What each key should hold after the call: `None` = as it was.
        let mut expected: [Option<Option<u64>>; 2] = [None, None];
        let context = format!("case {case}: {m:?} {p:?} states {states:?} at {now}");
        match rng.below(4) {
            3 => {
                // Coalesced checks of the metered limit (gcra_batch.lua, its ceiling in the
                // group's quota): each item decided on the state the one before left.
                let (q, items) = (1 + rng.below(m.limit), 1 + rng.below(4));
                let (count, numbers) = crate::gcra_group::group_args(
                    &mut None,
                    (m.interval, m.tolerance, m.ceiling),
                    q,
                    items as usize,
                );
                let reply: Vec<i64> = batch
                    .key(keys[0])
                    .arg(count)
                    .arg(&numbers.expect("the first group's quota")[..])
                    .invoke_async(&mut conn)
                    .await
                    .unwrap();
                let mut backlog = backlogs[0];
                let mut want = Vec::new();
                for _ in 0..items {
                    let (r, write) = m.decide(backlog, q);
                    want.extend(r);
                    if let Some(w) = write {
                        expected[0] = Some(Some(w));
                        backlog = w;
                    }
                    backlog = backlog.min(m.ceiling);
                }
                // One backlog for the group, expanded as the backend expands it.
                assert_eq!(reply.len(), 1, "{context}: batch of {items} × {q}");
                let mut got = Vec::new();
                let quota = (m.interval, m.tolerance, m.limit);
                crate::gcra_group::push_replies(
                    &mut got,
                    reply[0] as u64,
                    quota,
                    q,
                    items as usize,
                );
                let got: Vec<i64> = got.into_iter().flatten().collect();
                assert_eq!(got, want, "{context}: batch of {items} × {q}");
                seen[6] += 1;
            }
            0 => {
                // A metered limit checked alone: gcra.lua with its ceiling.
                let q = rng.below(m.limit + 2);
                let reply: [i64; 5] = gcra
                    .key(keys[0])
                    .arg(m.interval)
                    .arg(m.tolerance)
                    .arg(m.limit)
                    .arg(q)
                    .arg(m.ceiling)
                    .invoke_async(&mut conn)
                    .await
                    .unwrap();
                let (want, write) = m.decide(backlogs[0], q);
                assert_eq!(reply, want, "{context}: check {q}");
                expected[0] = write.map(Some);
                seen[want[0] as usize] += 1;
            }
            1 => {
                // A stack: the metered limit reserves its estimate, the other takes the request's
                // cost (the call's own quantity, 999, is not used).
                let qs = [rng.below(m.limit + 2), rng.below(3)];
                let mut invocation = limits.prepare_invoke();
                invocation.key(keys[0]).key(keys[1]);
                invocation.arg(2).arg(999).arg(7).arg(0).arg(0).arg(0);
                for model in [&m, &p] {
                    invocation
                        .arg(0)
                        .arg(model.limit)
                        .arg(model.interval)
                        .arg(model.tolerance);
                }
                invocation.arg(m.ceiling).arg(0).arg(qs[0]).arg(qs[1]);
                let reply: Vec<i64> = invocation.invoke_async(&mut conn).await.unwrap();
                // Each key rebased (beyond its ceiling), then decided; written, a rebase too, only
                // if both admit; a limit that would have admitted in a refused stack reports
                // quantity 0.
                let models = [m, p];
                let mut rebased = backlogs;
                let was_rebased = [0, 1].map(|i| backlogs[i] > models[i].ceiling);
                for i in 0..2 {
                    rebased[i] = rebased[i].min(models[i].ceiling);
                }
                let decided: Vec<_> = (0..2)
                    .map(|i| models[i].decide(rebased[i], qs[i]))
                    .collect();
                let admitted = decided.iter().all(|(r, _)| r[0] == 0);
                let mut want = vec![0];
                for i in 0..2 {
                    let (mut r, write) = decided[i];
                    if admitted {
                        if let (true, Some(w)) = (qs[i] > 0 || was_rebased[i], write) {
                            expected[i] = Some(Some(w));
                        }
                    } else if r[0] == 0 {
                        r = models[i].decide(rebased[i], 0).0;
                    }
                    want.extend(r);
                }
                assert_eq!(reply, want, "{context}: stack {qs:?}");
                seen[2 + usize::from(admitted)] += 1;
            }
            _ => {
                // A settle: both keys, a delta each (the plain limit is only given back to).
                let deltas = [
                    rng.below(4 * m.limit + 4) as i64 - m.limit as i64 - 1,
                    -(rng.below(3) as i64),
                ];
                let some = rng.below(m.interval / 1000 + 2);
                let since_us = rng.pick(&[0, 1, 1000, some]);
                let reply: i64 = settle
                    .key(keys[0])
                    .key(keys[1])
                    .arg(2)
                    .arg(0)
                    .arg(m.interval)
                    .arg(deltas[0])
                    .arg(m.ceiling)
                    .arg(since_us)
                    .arg(0)
                    .arg(p.interval)
                    .arg(deltas[1])
                    .arg(p.ceiling)
                    .arg(since_us)
                    .invoke_async(&mut conn)
                    .await
                    .unwrap();
                assert_eq!(reply, 2);
                expected[0] = m.settle(backlogs[0], deltas[0], since_us);
                expected[1] = p.settle(backlogs[1], deltas[1], since_us);
                seen[4 + usize::from(deltas[0] > 0)] += 1;
            }
        }
        for i in 0..2 {
            let stored: Option<String> = redis::cmd("GET")
                .arg(keys[i])
                .query_async(&mut conn)
                .await
                .unwrap();
            let want = match expected[i] {
                None => states[i].clone(),
                Some(None) => None,
                // Written with an expiry in real time (PX, when the TAT passes): a TAT less than
                // 100 ms ahead may be gone by now.
                Some(Some(backlog)) if backlog < 100 * MS && stored.is_none() => None,
                Some(Some(backlog)) => Some((now + backlog).to_string()),
            };
            assert_eq!(stored, want, "{context}: key {i} after the call");
        }
    }
    // Every kind of call and answer came up: checks admitted and refused, stacks admitted and
    // refused, settles giving back and charging.
    assert!(seen.iter().all(|n| *n > 100), "{seen:?}");
}

/// One backend under test in [`reserve_and_settle_sequences_agree`].
struct Side {
    name: &'static str,
    backend: RedisBackend,
    limit: Limit,
}

/// Random reserve/settle sequences with debt on the real clock: the model, the memory backend, the
/// Lua path and `CL.THROTTLE` (its keys settled by `settle.lua`) give the same decisions,
/// `remaining` and retry times (memory and Lua within 250 ms; `CL.THROTTLE` the next whole second above the exact time).
///
/// One unit every 5 s, 3 at once, up to 6 more in debt. The model runs on the time since the
/// sequence began, read before each call; every backlog is then a whole number of seconds less the
/// time since its anchor (a check or a charge on an idle key), which only grows, and a run lasts
/// far less than a second: every backend's clock lies on the same side of every boundary as the
/// model's (the reasoning of `backend.rs`'s `schedule`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reserve_and_settle_sequences_agree() {
    let server = RedisServer::start_with_cell();
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let quota = Quota::per_period(1, Duration::from_secs(5)).with_max_burst(2);
    let mut sides = Vec::new();
    for (name, mode) in [("lua", RedisMode::Lua), ("cell", RedisMode::Cell)] {
        let backend = RedisBackend::builder()
            .url(server.url())
            .mode(mode)
            .timeout(Duration::from_secs(2))
            .connect()
            .await
            .unwrap();
        let limit = Limit::new(format!("tokens-{name}"), quota)
            .unwrap()
            .with_max_debt(6);
        sides.push(Side {
            name,
            backend,
            limit,
        });
    }
    let model = Model::of(&sides[0].limit);
    // And the memory backend, on its own clock.
    let memory = MemoryBackend::new();
    let on_memory = Limit::new("tokens", quota).unwrap().with_max_debt(6);
    // The backend adds its timeout to `since` (refund.rs): a settle's admission was at most that
    // long before it ran.
    let since_us = 2_000_000;
    let mut rng = Rng(seed(0x5e771e));
    let margin = Duration::from_millis(250);
    // Admitted, refused within the burst, refused in debt, settles.
    let mut counts = [0u32; 4];
    for run in 0..8 {
        let key = Key::from(format!("seq-{run}"));
        let start = std::time::Instant::now();
        // The model's TAT, in ns since `start` (0: none).
        let mut tat = 0u64;
        for step in 0..14 {
            let now = start.elapsed().as_nanos() as u64;
            let backlog = tat.saturating_sub(now);
            let delta = rng.below(9) as i64 - 2;
            let settled = model.settle(backlog, delta, since_us);
            if let (0, Some(settled)) = (rng.below(3), settled) {
                // Only settles that change the state: each is waited for until it shows.
                counts[3] += 1;
                let mut before = Vec::new();
                for side in &sides {
                    let key = side.backend.state_key(&side.limit, &key);
                    let stored: Option<String> = conn.get(&key).await.unwrap();
                    before.push((key, stored));
                    side.backend.settle(
                        std::slice::from_ref(&side.limit),
                        &Key::from(format!("seq-{run}")),
                        &[delta],
                        Duration::ZERO,
                    );
                }
                // The memory backend takes `since` as it is; Redis adds its timeout to it.
                memory.settle(
                    std::slice::from_ref(&on_memory),
                    &Key::from(format!("seq-{run}")),
                    &[delta],
                    Duration::from_micros(since_us),
                );
                tat = settled.map_or(0, |b| now + b);
                for (key, stored) in before {
                    changed(&mut conn, &key, stored).await;
                }
                continue;
            }
            let q = rng.pick(&[1, 1, 2, 3]);
            let (want, write) = model.decide(backlog, q);
            if let Some(w) = write {
                tat = now + w;
            }
            counts[match (want[0], backlog > model.tolerance) {
                (0, _) => 0,
                (_, false) => 1,
                (_, true) => 2,
            }] += 1;
            let mut decisions = vec![(
                "memory",
                memory
                    .check_each(std::slice::from_ref(&on_memory), &key, &[q])
                    .await
                    .unwrap()[0],
            )];
            for side in &sides {
                let d: Decision = side
                    .backend
                    .check_each(std::slice::from_ref(&side.limit), &key, &[q])
                    .await
                    .unwrap()
                    .pop()
                    .unwrap();
                decisions.push((side.name, d));
            }
            for (name, d) in decisions {
                let context = format!(
                    "run {run} step {step} {name}: q {q}, backlog {backlog}, model {want:?}, got {d:?}"
                );
                assert_eq!(d.allowed, want[0] == 0, "{context}");
                assert_eq!(d.remaining as i64, want[2], "{context}");
                let exact = Duration::from_nanos(want[3].max(0) as u64);
                match (d.retry_after, want[3]) {
                    (None, -1) => {}
                    (Some(got), 0..) if name != "cell" => {
                        assert!(got.abs_diff(exact) <= margin, "{context}")
                    }
                    // The next whole second (or, from this process's deny cache, that aged).
                    (Some(got), 0..) => assert!(
                        exact <= got + margin && got <= exact + Duration::from_secs(1) + margin,
                        "{context}"
                    ),
                    _ => panic!("{context}"),
                }
            }
        }
    }
    // Every kind came up (with the default seed, at least 5 of each).
    assert!(counts.iter().all(|n| *n >= 1), "{counts:?}");
}

/// Polls (2 s at most) until `key` no longer holds `before`: a settle is sent on a task of its own.
async fn changed(conn: &mut redis::aio::MultiplexedConnection, key: &str, before: Option<String>) {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let now: Option<String> = conn.get(key).await.unwrap();
        if now != before {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the settle of {key} never landed (still {before:?})"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}
