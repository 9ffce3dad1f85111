//! A seeded Zipf stream over 10,000 clients, for the top-limited-keys tests (the integration tests
//! include this file too, so both draw the same streams).

/// SplitMix64: a seeded generator, so the streams are the same on every run.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The clients of the streams.
pub const CLIENTS: usize = 10_000;

/// `events` client numbers (0..CLIENTS) drawn with Zipf weights `1 / rank` (client 0 the most),
/// and each client's exact count.
pub fn zipf_stream(events: usize, seed: u64) -> (Vec<usize>, Vec<u64>) {
    let mut total = 0.0;
    let cumulative: Vec<f64> = (0..CLIENTS)
        .map(|rank| {
            total += 1.0 / (rank + 1) as f64;
            total
        })
        .collect();
    let mut rng = Rng::new(seed);
    let mut exact = vec![0u64; CLIENTS];
    let stream = (0..events)
        .map(|_| {
            let target = rng.unit() * total;
            let client = cumulative.partition_point(|&c| c < target).min(CLIENTS - 1);
            exact[client] += 1;
            client
        })
        .collect();
    (stream, exact)
}

/// The exact `n` heaviest clients.
pub fn true_top(exact: &[u64], n: usize) -> Vec<usize> {
    let mut ranked: Vec<usize> = (0..exact.len()).collect();
    ranked.sort_by(|&a, &b| exact[b].cmp(&exact[a]).then(a.cmp(&b)));
    ranked.truncate(n);
    ranked
}
