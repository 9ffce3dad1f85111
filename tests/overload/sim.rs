//! The simulated server and its clients, in virtual nanoseconds: Poisson arrivals of two
//! partitions ask the gate; an admitted request queues (FIFO) for one of the server's workers;
//! its service time depends on the phase (a slow dependency, fewer workers) and, in one scenario,
//! on how many workers are busy; after the worker, a request may still hold its slot in the gate
//! (a slow client reading its body, an asynchronous wait on a dependency).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use tower_throttle::overload::{Gate, Overload};

use crate::scenarios::{Phase, Scenario, SHED_PAUSE};

pub const SECOND: u64 = 1_000_000_000;
pub const MS: u64 = 1_000_000;

/// splitmix64: a tiny, seeded, reproducible generator (no dependency).
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1].
    pub fn unit(&mut self) -> f64 {
        ((self.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }

    /// Exponential with mean 1.
    pub fn exp(&mut self) -> f64 {
        -self.unit().ln()
    }
}

/// What protects the server.
#[derive(Clone, Debug)]
pub enum Protection {
    /// Every request admitted.
    None,
    /// A fixed limit on requests in flight (the gate with min == max).
    Static(u32),
    /// The gate with these options.
    Adaptive(&'static str, Overload),
}

impl Protection {
    pub fn name(&self) -> String {
        match self {
            Protection::None => "none".into(),
            Protection::Static(n) => format!("static {n}"),
            Protection::Adaptive(name, _) => (*name).into(),
        }
    }
}

/// The partitions: `paid` with 0.8 of the limit, `free` with 0.2.
pub const PARTITIONS: [(&str, f64); 2] = [("paid", 0.8), ("free", 0.2)];
/// The share of arrivals that are `paid`: more than its share is free's, so that free, beyond
/// its share under pressure, is what is shed first.
const PAID_TRAFFIC: f64 = 0.6;
/// Samples of the limit: this many a run (averaged into the chart's columns).
pub const LIMIT_SAMPLES: usize = 400;

/// One request.
struct Request {
    partition: usize,
    admitted: u64,
    /// Its work on a worker before the phase's scale and the contention.
    work: u64,
    /// What it holds its slot after the worker (slow client, asynchronous dependency).
    hold: u64,
    /// The closed-loop client that sent it.
    client: Option<usize>,
}

/// What a run measured.
pub struct Outcome {
    /// Latency of every completed request (admission to end), nanoseconds.
    pub latencies: Vec<u64>,
    /// Latency an unloaded server would have given every arriving request (its service and
    /// hold, no queue, no contention), nanoseconds.
    pub intrinsic: Vec<u64>,
    pub arrivals: [u64; 2],
    pub shed: [u64; 2],
    /// The limit, sampled evenly over the run (none without a gate).
    pub limit: Vec<u32>,
    /// Shed requests by time, in tenths of a second.
    pub shed_at: Vec<u64>,
    /// From the scenario's `settle` on: the latencies of requests admitted, and what an
    /// unloaded server would have given the arrivals.
    pub settled: Vec<u64>,
    pub settled_intrinsic: Vec<u64>,
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    Arrival,
    /// Closed-loop client `id` sends a request.
    Client(usize),
    /// A worker finished request `id`.
    Served(usize),
    /// Request `id` released its slot.
    Ended(usize),
    /// The phase changed: workers may be free to take queued requests.
    Phase,
    Sample,
}

pub fn gate_of(protection: &Protection) -> Option<Gate> {
    let with_partitions = |overload: Overload| {
        PARTITIONS
            .iter()
            .fold(overload, |o, (name, share)| o.partition(*name, *share))
    };
    match protection {
        Protection::None => None,
        Protection::Static(n) => {
            Some(Gate::new(&with_partitions(Overload::aimd().limits(*n, *n))).unwrap())
        }
        Protection::Adaptive(_, overload) => {
            Some(Gate::new(&with_partitions(overload.clone())).unwrap())
        }
    }
}

struct Server<'a> {
    scenario: &'a Scenario,
    gate: Option<Gate>,
    requests: Vec<Request>,
    queue: VecDeque<usize>,
    busy: u32,
    events: BinaryHeap<Reverse<(u64, u64, Event)>>,
    seq: u64,
    out: Outcome,
}

impl Server<'_> {
    fn at(&mut self, time: u64, event: Event) {
        self.seq += 1;
        self.events.push(Reverse((time, self.seq, event)));
    }

    fn start_queued(&mut self, now: u64) {
        let phase = self.scenario.phase(now);
        while self.busy < phase.workers {
            let Some(id) = self.queue.pop_front() else {
                return;
            };
            self.busy += 1;
            let contention = match self.scenario.knee {
                // Processor sharing past the knee: each busy worker slows all of them.
                Some(knee) => (f64::from(self.busy) / f64::from(knee)).max(1.0),
                None => 1.0,
            };
            let service = self.requests[id].work as f64 * phase.scale * contention;
            self.at(now + service as u64, Event::Served(id));
        }
    }

    fn arrive(&mut self, now: u64, rng: &mut Rng, client: Option<usize>) {
        let phase: &Phase = self.scenario.phase(now);
        let partition = if let Some(id) = client {
            // A client's partition is its own: the first 60 % are paid.
            usize::from((id as f64 + 0.5) / f64::from(self.scenario.clients) > PAID_TRAFFIC)
        } else {
            let next = now + (rng.exp() * SECOND as f64 / phase.rate) as u64;
            if next < self.scenario.duration {
                self.at(next, Event::Arrival);
            }
            usize::from(rng.unit() > PAID_TRAFFIC)
        };
        // Service: part of the mean fixed, part (`spread`) exponential.
        let spread = self.scenario.spread;
        let work = (self.scenario.service as f64 * (1.0 - spread + spread * rng.exp())) as u64;
        let slow = rng.unit() <= self.scenario.slow_share;
        let hold = phase.hold + if slow { self.scenario.slow_hold } else { 0 };
        self.out.arrivals[partition] += 1;
        let intrinsic = (work as f64 * phase.scale) as u64 + hold;
        self.out.intrinsic.push(intrinsic);
        let settled = self.scenario.settle.is_some_and(|from| now >= from);
        if settled {
            self.out.settled_intrinsic.push(intrinsic);
        }
        let admitted = self
            .gate
            .as_ref()
            .is_none_or(|g| g.try_admit(partition, now));
        if !admitted {
            self.out.shed[partition] += 1;
            self.out.shed_at.push(now / (SECOND / 10));
            if let Some(id) = client {
                self.resend(now + SHED_PAUSE, id);
            }
            return;
        }
        self.requests.push(Request {
            partition,
            admitted: now,
            work,
            hold,
            client,
        });
        self.queue.push_back(self.requests.len() - 1);
        self.start_queued(now);
    }

    fn resend(&mut self, at: u64, client: usize) {
        if at < self.scenario.duration {
            self.at(at, Event::Client(client));
        }
    }

    fn end(&mut self, now: u64, id: usize) {
        let request = &self.requests[id];
        self.out.latencies.push(now - request.admitted);
        if self
            .scenario
            .settle
            .is_some_and(|from| request.admitted >= from)
        {
            self.out.settled.push(now - request.admitted);
        }
        if let Some(gate) = &self.gate {
            gate.finish(request.partition, request.admitted, now, false);
        }
        if let Some(client) = request.client {
            self.resend(now, client);
        }
    }
}

/// Runs `scenario` with `protection`: arrivals until its end, then up to 10 s to drain.
pub fn run(scenario: &Scenario, protection: &Protection) -> Outcome {
    let mut rng = Rng::new(scenario.seed);
    let mut server = Server {
        scenario,
        gate: gate_of(protection),
        requests: Vec::new(),
        queue: VecDeque::new(),
        busy: 0,
        events: BinaryHeap::new(),
        seq: 0,
        out: Outcome {
            latencies: Vec::new(),
            intrinsic: Vec::new(),
            arrivals: [0; 2],
            shed: [0; 2],
            limit: Vec::new(),
            shed_at: Vec::new(),
            settled: Vec::new(),
            settled_intrinsic: Vec::new(),
        },
    };
    if scenario.clients == 0 {
        server.at(0, Event::Arrival);
    }
    for client in 0..scenario.clients as usize {
        server.at(0, Event::Client(client));
    }
    for phase in &scenario.phases {
        server.at(phase.from, Event::Phase);
    }
    let step = scenario.duration / LIMIT_SAMPLES as u64;
    if server.gate.is_some() {
        server.at(step / 2, Event::Sample);
    }
    let stop = scenario.duration + 10 * SECOND;
    while let Some(Reverse((now, _, event))) = server.events.pop() {
        if now > stop {
            break;
        }
        match event {
            Event::Arrival => server.arrive(now, &mut rng, None),
            Event::Client(id) => server.arrive(now, &mut rng, Some(id)),
            Event::Served(id) => {
                server.busy -= 1;
                let hold = server.requests[id].hold;
                if hold == 0 {
                    server.end(now, id);
                } else {
                    server.at(now + hold, Event::Ended(id));
                }
                server.start_queued(now);
            }
            Event::Ended(id) => server.end(now, id),
            Event::Phase => server.start_queued(now),
            Event::Sample => {
                if let Some(gate) = &server.gate {
                    server.out.limit.push(gate.limit());
                }
                if now + step < scenario.duration {
                    server.at(now + step, Event::Sample);
                }
            }
        }
    }
    server.out
}
