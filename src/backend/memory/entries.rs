//! The general store's entries, and how a decision, a release or a refund changes them.

use std::collections::VecDeque;
use std::time::Duration;

use crate::decision::Decision;
use crate::gcra;
use crate::key::Key;
use crate::limit::{Algorithm, Limit, MAX_STACKED_QUOTAS};
use crate::window::{self, FixedState, SlidingState};

/// What `out` is filled with before each limit decides.
pub(super) const PLACEHOLDER: Decision = Decision::allowed(0, 0, std::time::Duration::ZERO);

/// One key's state in the general store: one cell per limit of the stack (or the lone limit) that
/// was decided under the entry's first limit `limit`.
pub(super) struct Entry {
    pub(super) limit: u32,
    pub(super) key: Key,
    pub(super) cells: Cells,
}

impl Entry {
    pub(super) fn is(id: u32, key: &Key) -> impl Fn(&Entry) -> bool + '_ {
        move |e| e.limit == id && e.key == *key
    }
}

/// A copy of `limit`'s live state at `position` in `entry` (if any), or a fresh one.
pub(super) fn stored_state(entry: Option<&Entry>, limit: &Limit, position: u8, now: u64) -> State {
    entry
        .and_then(|e| {
            e.cells.iter().find(|c| {
                c.limit == limit.id()
                    && c.position == position
                    && c.state.algorithm() == limit.algorithm()
                    && c.expires_at > now
            })
        })
        .map_or(State::fresh(limit.algorithm()), |c| c.state.clone())
}

/// The cells of an entry, without an allocation for the common case of one limit.
pub(super) enum Cells {
    Empty,
    One(Cell),
    Many(Vec<Cell>),
}

/// One limit's state for one key.
pub(super) struct Cell {
    pub(super) limit: u32,
    /// The limit's place in its stack, so that a stack may hold two limits of one name.
    pub(super) position: u8,
    /// When the state becomes the same as no state, on the backend's clock (`now_nanos`);
    /// `u64::MAX` while requests are in flight, 0 for a state never written.
    pub(super) expires_at: u64,
    pub(super) state: State,
}

/// The state each algorithm keeps, as [`gcra`] and [`window`] define it.
#[derive(Clone)]
pub(super) enum State {
    /// The TAT, on the backend's clock (`now_nanos`, not Unix time).
    Gcra(u64),
    Fixed(FixedState),
    Sliding(SlidingState),
    /// Times of admitted units, oldest first (Unix time): at most the limit's count of them.
    Log(VecDeque<u64>),
    /// Slots in flight, and the lease they were taken under (0: none yet): a release under
    /// another lease (its key reset since) gives back nothing.
    InFlight(u64, u64),
}

impl State {
    /// A state equivalent to none for `algorithm`, so that each decision function reads it as a
    /// new key (a TAT of 0 is never after `now`; count 0 in window 0 is no count).
    pub(super) fn fresh(algorithm: Algorithm) -> State {
        match algorithm {
            Algorithm::FixedWindow => State::Fixed(FixedState::default()),
            Algorithm::SlidingWindow => State::Sliding(SlidingState::default()),
            Algorithm::SlidingLog => State::Log(VecDeque::new()),
            Algorithm::Concurrency => State::InFlight(0, 0),
            _ => State::Gcra(0),
        }
    }

    pub(super) fn algorithm(&self) -> Algorithm {
        match self {
            State::Gcra(_) => Algorithm::Gcra,
            State::Fixed(_) => Algorithm::FixedWindow,
            State::Sliding(_) => Algorithm::SlidingWindow,
            State::Log(_) => Algorithm::SlidingLog,
            State::InFlight(..) => Algorithm::Concurrency,
        }
    }
}

impl Cells {
    pub(super) fn as_mut_slice(&mut self) -> &mut [Cell] {
        match self {
            Cells::Empty => &mut [],
            Cells::One(cell) => std::slice::from_mut(cell),
            Cells::Many(cells) => cells,
        }
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = &Cell> {
        let slice: &[Cell] = match self {
            Cells::Empty => &[],
            Cells::One(cell) => std::slice::from_ref(cell),
            Cells::Many(cells) => cells,
        };
        slice.iter()
    }

    pub(super) fn find_mut(&mut self, limit: u32, position: u8) -> Option<&mut Cell> {
        self.as_mut_slice()
            .iter_mut()
            .find(|c| c.limit == limit && c.position == position)
    }

    /// The index of the cell of `limit` at `position`, added with a fresh state if there is none
    /// (or if the name was reused for another algorithm).
    pub(super) fn index_of(&mut self, limit: &Limit, position: u8) -> usize {
        let (id, algorithm) = (limit.id(), limit.algorithm());
        let found = self
            .as_mut_slice()
            .iter()
            .position(|c| c.limit == id && c.position == position);
        if let Some(i) = found {
            let cell = &mut self.as_mut_slice()[i];
            if cell.state.algorithm() != algorithm {
                cell.state = State::fresh(algorithm);
                cell.expires_at = 0;
            }
            return i;
        }
        let cell = Cell {
            limit: id,
            position,
            expires_at: 0,
            state: State::fresh(algorithm),
        };
        *self = match std::mem::replace(self, Cells::Empty) {
            Cells::Empty => Cells::One(cell),
            Cells::One(first) => Cells::Many(vec![first, cell]),
            Cells::Many(mut cells) => {
                cells.push(cell);
                Cells::Many(cells)
            }
        };
        self.as_mut_slice().len() - 1
    }

    /// Drops the cells that have expired at `now`; whether any is left.
    pub(super) fn retain_live(&mut self, now: u64) -> bool {
        match self {
            Cells::Empty => {}
            Cells::One(cell) => {
                if cell.expires_at <= now {
                    *self = Cells::Empty;
                }
            }
            Cells::Many(cells) => {
                cells.retain(|c| c.expires_at > now);
                match cells.len() {
                    0 => *self = Cells::Empty,
                    1 => *self = Cells::One(cells.pop().expect("one cell")),
                    _ => {}
                }
            }
        }
        !matches!(self, Cells::Empty)
    }
}

/// A limit's next state, decided but not yet written: it is written only if the whole stack passes.
#[derive(Clone, Copy)]
pub(super) enum NextState {
    Gcra(Option<u64>),
    Fixed(Option<FixedState>),
    Sliding(Option<SlidingState>),
    /// The log was trimmed and, if admitted, the units appended in place (removed again if the
    /// stack is rejected).
    Log,
    InFlight(u64, u64),
}

/// Decides `quantities[i]` units under each `limits[i]` on `cells` at `now` (the backend's clock;
/// windows add `origin` for Unix time), writing the new states only if every limit admits.
pub(super) fn decide_cells(
    cells: &mut Cells,
    limits: &[Limit],
    key: &Key,
    now: u64,
    origin: u64,
    quantities: &[u64],
    out: &mut [Decision],
) {
    let unix_now = now.saturating_add(origin);
    let mut pending = [(0usize, NextState::Log); MAX_STACKED_QUOTAS];
    let mut every_limit_admits = true;
    for (position, limit) in limits.iter().enumerate() {
        let index = cells.index_of(limit, position as u8);
        let cell = &mut cells.as_mut_slice()[index];
        let quantity = quantities[position];
        let (decision, next) = decide_one(&mut cell.state, limit, key, now, unix_now, quantity);
        out[position] = decision;
        pending[position] = (index, next);
        every_limit_admits &= decision.allowed;
    }
    let slice = cells.as_mut_slice();
    for (position, limit) in limits.iter().enumerate() {
        let (index, next) = pending[position];
        let cell = &mut slice[index];
        if every_limit_admits {
            commit(cell, next, limit, key, now, origin);
        } else if out[position].allowed {
            if let (State::Log(log), NextState::Log) = (&mut cell.state, next) {
                log.truncate(log.len() - quantities[position] as usize);
            }
            // Nothing was recorded: report the state as it stands.
            out[position] = decide_one(&mut cell.state, limit, key, now, unix_now, 0).0;
        }
    }
}

/// The next lease of a concurrency key's slots: a key reset while requests are in flight takes a
/// new one, so that their releases do not give back the slots of the requests after it.
static LEASES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// One limit's decision on `state`. Only the sliding log is changed in place (trimmed, and appended
/// to if admitted); the other states come back in [`NextState`].
pub(super) fn decide_one(
    state: &mut State,
    limit: &Limit,
    key: &Key,
    now: u64,
    unix_now: u64,
    quantity: u64,
) -> (Decision, NextState) {
    match (state, limit.gcra(), limit.window(), limit.concurrency()) {
        (State::Gcra(tat), Some(params), _, _) => {
            let live = (*tat > now).then_some(*tat);
            let out = gcra::decide(live, now, params, quantity);
            (out.decision, NextState::Gcra(out.new_tat))
        }
        (State::Fixed(s), _, Some(params), _) => {
            // A window per key starts at the key's phase: its clock moves by the shift.
            let at = unix_now + limit.window_shift(key);
            let (d, next) = window::fixed_window(Some(*s), at, params, quantity);
            (d, NextState::Fixed(next))
        }
        (State::Sliding(s), _, Some(params), _) => {
            let (d, next) = window::sliding_window(Some(*s), unix_now, params, quantity);
            (d, NextState::Sliding(next))
        }
        (State::Log(log), _, Some(params), _) => (
            window::sliding_log(log, unix_now, params, quantity),
            NextState::Log,
        ),
        (State::InFlight(n, lease), _, _, Some(max)) => {
            let (d, next) = window::concurrency(*n, max, quantity);
            // A key's slots share one lease, new when it had none in flight.
            let lease = match *lease {
                0 => LEASES.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
                lease => lease,
            };
            let d = if d.allowed { d.with_lease(lease) } else { d };
            (d, NextState::InFlight(next, lease))
        }
        _ => unreachable!("Cells::index_of gives each limit the state of its algorithm"),
    }
}

/// Takes `quantity` units of `limit` for `key`, admitted at most `since` ago (with its decision's
/// `reset_after`, if known), out of `state` (at `now` on the backend's clock, `unix_now` in Unix
/// time). Whatever cannot be proven to be the request's own is left: a refund may give back less
/// than the request took, never more. Expiries are left as they are (later than needed at worst).
pub(super) fn refund_state(
    state: &mut State,
    (limit, key): (&Limit, &Key),
    (now, unix_now): (u64, u64),
    (quantity, since, reset_after): (u64, u64, Option<Duration>),
) {
    let admitted_after = unix_now.saturating_sub(since);
    match (state, limit.gcra(), limit.window()) {
        (State::Gcra(tat), Some(params), _) if *tat > now => {
            // Less the time they may have drained: see `MemoryBackend::adjust`.
            let since = gcra::drain_bound(since, reset_after, quantity, params);
            let back = params
                .emission_interval()
                .saturating_mul(quantity)
                .saturating_sub(since);
            *tat = tat.saturating_sub(back);
        }
        (State::Fixed(s), _, Some(params)) => {
            let shift = limit.window_shift(key);
            let (window, _) = params.fixed_window_at(unix_now + shift);
            // Only while the window that admitted the request is still the current one (and it
            // surely is when the earliest admission time falls in it too).
            if s.window == window && params.fixed_window_at(admitted_after + shift).0 == window {
                s.count = s.count.saturating_sub(quantity);
            }
        }
        (State::Sliding(s), _, Some(params)) => {
            let window = unix_now / params.period();
            let (mut current, mut previous) = match *s {
                ref s if s.window == window => (s.current, s.previous),
                ref s if s.window.saturating_add(1) == window => (0, s.current),
                _ => return,
            };
            match window - admitted_after / params.period() {
                0 => current = current.saturating_sub(quantity),
                // Admitted in the previous window, or in this one within `since` of its start:
                // the previous window's count weighs less, so taking the units from it never gives
                // back more than the request took.
                1 => previous = previous.saturating_sub(quantity),
                _ => return,
            }
            *s = SlidingState {
                window,
                current,
                previous,
            };
        }
        // A period on, the request's own units have left the log: what is there is newer.
        (State::Log(_), _, Some(params)) if since >= params.period() => {}
        (State::Log(log), _, Some(_)) => {
            // The oldest units logged at or after the earliest admission time: the request's own,
            // or older ones (which leave the window sooner, so removing them gives back less).
            let from = log.partition_point(|t| *t < admitted_after);
            let to = from.saturating_add(quantity as usize).min(log.len());
            log.drain(from..to);
        }
        _ => {}
    }
}

/// Settles `deltas[i]` units more (or fewer) under each GCRA limit `limits[i]` on `cells` at `now`
/// ([`gcra::settle`]), fewer under a window (as [`refund_state`], as settle.lua does); a charge
/// makes the cell if it has none, a refund never does.
pub(super) fn settle_cells(
    cells: &mut Cells,
    (limits, key): (&[Limit], &Key),
    deltas: &[i64],
    (now, origin): (u64, u64),
    (since, admitted): (u64, &[Decision]),
) {
    for (position, (limit, &delta)) in limits.iter().zip(deltas).enumerate() {
        let reset = admitted.get(position).map(|d| d.reset_after);
        let position = position as u8;
        if delta == 0 || (delta < 0 && cells.find_mut(limit.id(), position).is_none()) {
            continue;
        }
        let Some(params) = limit.gcra() else {
            if let (true, Some(cell)) = (delta < 0, cells.find_mut(limit.id(), position)) {
                let at = (now, now.saturating_add(origin));
                refund_state(
                    &mut cell.state,
                    (limit, key),
                    at,
                    (delta.unsigned_abs(), since, reset),
                );
            }
            continue;
        };
        let index = cells.index_of(limit, position);
        let cell = &mut cells.as_mut_slice()[index];
        if let State::Gcra(tat) = &mut cell.state {
            let since = match delta < 0 {
                true => gcra::drain_bound(since, reset, delta.unsigned_abs(), params),
                false => since,
            };
            *tat = gcra::settle(Some(*tat), now, params, delta, since).unwrap_or(0);
            cell.expires_at = *tat;
        }
    }
}

/// Writes an admitted stack's new state into `cell`, with when it expires on the backend's clock.
pub(super) fn commit(
    cell: &mut Cell,
    next: NextState,
    limit: &Limit,
    key: &Key,
    now: u64,
    origin: u64,
) {
    let params = limit.window();
    let period = params.map_or(0, |p| p.period());
    // Window states expire on a Unix-time boundary; the backend's clock is Unix time − origin.
    let at_unix = |t: u64| t.saturating_sub(origin);
    cell.expires_at = match (&mut cell.state, next) {
        (State::Gcra(tat), NextState::Gcra(next)) => {
            *tat = next.filter(|t| *t > now).unwrap_or(0);
            *tat
        }
        (State::Fixed(s), NextState::Fixed(next)) => {
            *s = next.unwrap_or_default();
            // The window's end (as long as its calendar says, if it has one) on the key's own
            // clock, back on Unix time, then the backend's.
            let shift = limit.window_shift(key);
            next.zip(params).map_or(0, |(s, params)| {
                at_unix(params.fixed_window_end(s.window).saturating_sub(shift))
            })
        }
        (State::Sliding(s), NextState::Sliding(next)) => {
            *s = next.unwrap_or_default();
            // The current count is weighed until the end of the next window, the previous one until
            // the end of this window.
            next.map_or(0, |s| {
                let windows = if s.current > 0 { 2 } else { 1 };
                at_unix(s.window.saturating_add(windows).saturating_mul(period))
            })
        }
        (State::Log(log), NextState::Log) => log
            .back()
            .map_or(0, |newest| at_unix(newest.saturating_add(period))),
        (State::InFlight(n, lease), NextState::InFlight(next, next_lease)) => {
            *n = next;
            *lease = next_lease;
            if next > 0 {
                u64::MAX
            } else {
                0
            }
        }
        _ => unreachable!("decide_one returns the pending state of the cell's algorithm"),
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cell of `limit` at `position` in state `InFlight(n)`, live until `expires_at`.
    fn cell(limit: u32, position: u8, n: u64, expires_at: u64) -> Cell {
        let state = State::InFlight(n, 1);
        Cell {
            limit,
            position,
            expires_at,
            state,
        }
    }

    /// An entry may hold a cell of the same limit at another place in a stack, and another
    /// limit's at the same place (two stacks that share their first limit): a cell is found by
    /// both, never by either alone.
    #[test]
    fn a_cell_is_found_by_its_limit_and_its_position_together() {
        let mut cells = Cells::Many(vec![
            cell(1, 0, 10, 9),
            cell(2, 1, 20, 9),
            cell(3, 1, 30, 9),
        ]);
        let found = |cells: &mut Cells, limit, position| {
            let cell = cells.find_mut(limit, position);
            cell.map(|c| (c.limit, c.position))
        };
        assert_eq!(found(&mut cells, 3, 1), Some((3, 1)));
        assert_eq!(found(&mut cells, 1, 1), None);
        assert_eq!(found(&mut cells, 2, 0), None);
        let limit = Limit::with_algorithm("c", Algorithm::Concurrency, crate::Quota::per_second(5))
            .unwrap();
        let in_flight =
            |entry: &Entry, position, now| match stored_state(Some(entry), &limit, position, now) {
                State::InFlight(n, _) => n,
                _ => unreachable!("a concurrency limit's state"),
            };
        let id = limit.id();
        let entry = |cells| Entry {
            limit: id,
            key: Key::from("k"),
            cells,
        };
        // Another limit's cell at the place, and this limit's at another: its state is fresh.
        let others = entry(Cells::Many(vec![
            cell(id, 0, 10, 9),
            cell(id + 1, 1, 20, 9),
        ]));
        assert_eq!(in_flight(&others, 1, 0), 0);
        // Its own cell at that place, while live.
        let own = entry(Cells::Many(vec![
            cell(id + 1, 1, 20, 9),
            cell(id, 1, 30, 9),
        ]));
        assert_eq!(in_flight(&own, 1, 0), 30);
        assert_eq!(in_flight(&own, 1, 9), 0);
    }

    #[test]
    fn entries_are_the_size_the_backend_documents() {
        // The general store's entry, as documented on MemoryBackend.
        assert_eq!(std::mem::size_of::<Entry>(), 80);
        assert_eq!(std::mem::size_of::<Cell>(), 48);
    }
}
