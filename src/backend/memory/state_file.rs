//! A memory backend's state kept across a restart ([`MemoryBackend::save_state`],
//! [`MemoryBackend::load_state`]): a rolling deploy of in-memory processes would otherwise give every
//! client a fresh burst.
//!
//! The file is text, one key a line: `gcra`, the limit's name, the key as logs show it
//! ([`Key::render`]) and its TAT as Unix time in nanoseconds — wall-clock time, so that a process
//! whose monotonic clock started elsewhere reads it exactly. Lone GCRA limits only (the default
//! algorithm); windows, logs, stacks and concurrency slots start empty.

use std::fs;
use std::io::{self, Write};
use std::path::Path;

use super::MemoryBackend;
use crate::clock::Clock;
use crate::key::Key;
use crate::limit::Limit;

/// The first line of a state file: the format and its version.
const HEADER: &str = "tower-throttle memory state 1";

impl<C: Clock> MemoryBackend<C> {
    /// Writes the state of every live key of `limits` (the lone GCRA ones: the default algorithm)
    /// to `path`, for [`load_state`](Self::load_state) in the next process. Written to a temporary
    /// file beside `path`, then renamed over it, so a crash mid-write leaves the previous file.
    /// Returns how many keys it wrote.
    ///
    /// ```
    /// use tower_throttle::{Backend, Key, Limit, MemoryBackend, Quota};
    ///
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let limit = Limit::new("api", Quota::per_hour(2)).unwrap();
    /// let path = std::env::temp_dir().join(format!("throttle-doc-{}.state", std::process::id()));
    /// let before = MemoryBackend::new();
    /// before.check(&limit, &Key::from("ann"), 2).await.unwrap();
    /// assert_eq!(before.save_state(&path, &[limit.clone()]).unwrap(), 1);
    ///
    /// let after = MemoryBackend::new(); // the next process
    /// assert_eq!(after.load_state(&path, &[limit.clone()]).unwrap(), 1);
    /// assert!(!after.check(&limit, &Key::from("ann"), 1).await.unwrap().allowed);
    /// # std::fs::remove_file(&path).unwrap();
    /// # });
    /// ```
    pub fn save_state(&self, path: impl AsRef<Path>, limits: &[Limit]) -> io::Result<usize> {
        let path = path.as_ref();
        let stores = &*self.stores;
        let now = stores.clock.now_nanos();
        let origin = stores.clock.unix_origin_nanos();
        let names: Vec<(u32, &str)> = limits
            .iter()
            .filter(|l| l.gcra().is_some())
            .map(|l| (l.id(), l.name()))
            .collect();
        let mut text = format!("{HEADER}\n");
        let mut written = 0;
        let mut rendered = String::new();
        for (id, key, tat) in stores.gcra.records(now) {
            let Some((_, name)) = names.iter().find(|(i, _)| *i == id) else {
                continue;
            };
            rendered.clear();
            key.render(&mut rendered);
            text.push_str(&format!("gcra\t{name}\t{rendered}\t{}\n", origin + tat));
            written += 1;
        }
        let mut temporary = path.as_os_str().to_owned();
        temporary.push(".tmp");
        let mut file = fs::File::create(&temporary)?;
        file.write_all(text.as_bytes())?;
        file.sync_all()?;
        fs::rename(&temporary, path)?;
        Ok(written)
    }

    /// Reads a file [`save_state`](Self::save_state) wrote and gives each key of `limits` the state
    /// it had (the later of it and what this backend holds, so a key never gains). Keys of limits
    /// not in `limits` (or no longer lone GCRA limits) are dropped, and so are keys that refilled
    /// since. Returns how many keys it restored. A file that is not a state file, or is damaged
    /// anywhere, is an error and restores nothing.
    pub fn load_state(&self, path: impl AsRef<Path>, limits: &[Limit]) -> io::Result<usize> {
        let text = fs::read_to_string(path)?;
        let records =
            parse(&text).map_err(|why| io::Error::new(io::ErrorKind::InvalidData, why))?;
        let stores = &*self.stores;
        let now = stores.clock.now_nanos();
        let origin = stores.clock.unix_origin_nanos();
        let mut restored = 0;
        for (name, key, unix_tat) in records {
            let found = limits.iter().find(|l| l.name() == name);
            let Some((limit, params)) = found.and_then(|l| Some((l, l.gcra()?))) else {
                continue;
            };
            let Some(tat) = unix_tat.checked_sub(origin).filter(|tat| *tat > now) else {
                continue;
            };
            stores.gcra.restore(params, limit.id(), &key, tat, now);
            restored += 1;
        }
        Ok(restored)
    }
}

/// A backend that may be the memory backend: what [`Config::save_state`](crate::config::Config::save_state) writes from.
#[cfg(feature = "config")]
pub trait AsMemory {
    /// The memory backend, if this is one.
    fn as_memory(&self) -> Option<&MemoryBackend>;
}

#[cfg(feature = "config")]
impl AsMemory for MemoryBackend {
    fn as_memory(&self) -> Option<&MemoryBackend> {
        Some(self)
    }
}

/// The records of a state file, or what is wrong with it.
fn parse(text: &str) -> Result<Vec<(&str, Key, u64)>, String> {
    let mut lines = text.lines();
    if lines.next() != Some(HEADER) {
        return Err(format!(
            "not a state file: its first line is not {HEADER:?}"
        ));
    }
    lines
        .enumerate()
        .map(|(i, line)| {
            let bad = || format!("line {}: not `gcra <limit> <key> <tat>`: {line:?}", i + 2);
            let mut fields = line.split('\t');
            let (Some("gcra"), Some(name), Some(key), Some(tat), None) = (
                fields.next(),
                fields.next(),
                fields.next(),
                fields.next(),
                fields.next(),
            ) else {
                return Err(bad());
            };
            let key = Key::from_rendered(key).ok_or_else(bad)?;
            let tat: u64 = tat.parse().map_err(|_| bad())?;
            Ok((name, key, tat))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::clock::SystemClock;
    use crate::quota::Quota;

    fn backend() -> MemoryBackend<SystemClock> {
        MemoryBackend::builder()
            .clock(SystemClock::new())
            .shards(4)
            .build()
            .unwrap()
    }

    fn file(name: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("throttle-{name}-{}.state", std::process::id()))
    }

    #[test]
    fn every_kind_of_key_comes_back_exactly_and_only_for_limits_that_still_exist() {
        let hourly = Limit::new("hourly", Quota::per_hour(10)).unwrap();
        let gone = Limit::new("gone", Quota::per_hour(10)).unwrap();
        let window =
            Limit::with_algorithm("window", crate::Algorithm::FixedWindow, Quota::per_hour(10))
                .unwrap();
        let keys = [
            Key::from("ann"),
            Key::from_ip("10.0.0.7".parse().unwrap()),
            Key::from_ip("2001:db8::7".parse().unwrap()),
            Key::hashed("a long secret"),
            Key::from(&b"bytes \t\n%"[..]),
        ];
        let before = backend();
        for (used, key) in keys.iter().enumerate() {
            for _ in 0..=used {
                assert!(before.decide(&hourly, key, 1).unwrap().allowed);
                assert!(before.decide(&gone, key, 1).unwrap().allowed);
            }
        }
        // A key several threads decide on may move to its shard's hot slot: saved from there too.
        let hot = Key::from("hot");
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..2 {
                        before.decide(&hourly, &hot, 1).unwrap();
                    }
                });
            }
        });
        let path = file("kinds");
        let all = [hourly.clone(), gone.clone(), window.clone()];
        assert_eq!(before.save_state(&path, &all).unwrap(), 11);
        let after = backend(); // another clock, started later
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(
            after.load_state(&path, &[hourly.clone(), window]).unwrap(),
            6
        );
        for (used, key) in keys.iter().enumerate() {
            let state = after.decide(&hourly, key, 0).unwrap();
            assert_eq!(state.remaining, 10 - 1 - used as u64, "{key}");
            // The dropped limit's keys start afresh.
            assert_eq!(after.decide(&gone, key, 0).unwrap().remaining, 10, "{key}");
        }
        assert_eq!(after.decide(&hourly, &hot, 0).unwrap().remaining, 2);
        // Loading again never gives a key back what it used.
        after.decide(&hourly, &keys[0], 1).unwrap();
        assert_eq!(
            after
                .load_state(&path, std::slice::from_ref(&hourly))
                .unwrap(),
            6
        );
        assert_eq!(after.decide(&hourly, &keys[0], 0).unwrap().remaining, 8);
        fs::remove_file(&path).unwrap();
    }

    #[test]
    fn a_damaged_or_foreign_file_is_an_error_and_restores_nothing() {
        let limit = Limit::new("api", Quota::per_hour(2)).unwrap();
        let path = file("damaged");
        let load = |text: &str| {
            fs::write(&path, text).unwrap();
            let fresh = backend();
            let out = fresh
                .load_state(&path, std::slice::from_ref(&limit))
                .map_err(|e| e.to_string());
            (out, fresh.len())
        };
        let far = u64::MAX / 2;
        let (out, len) = load(&format!(
            "{HEADER}\ngcra\tapi\tann\t{far}\ngcra\tapi\tbob\n"
        ));
        assert_eq!(
            out.unwrap_err(),
            "line 3: not `gcra <limit> <key> <tat>`: \"gcra\\tapi\\tbob\""
        );
        assert_eq!(len, 0, "nothing restored from a damaged file");
        let (out, _) = load("{\"json\": true}\n");
        assert!(out.unwrap_err().starts_with("not a state file"));
        let (out, _) = load(&format!("{HEADER}\ngcra\tapi\tann bob\t{far}\n"));
        assert!(
            out.unwrap_err().starts_with("line 2"),
            "a key with a space is not a rendering"
        );
        // A stale file: every key has refilled since, so nothing comes back.
        let (out, len) = load(&format!("{HEADER}\ngcra\tapi\tann\t1000\n"));
        assert_eq!((out.unwrap(), len), (0, 0));
        fs::remove_file(&path).unwrap();
        assert_eq!(
            backend().load_state(&path, &[limit]).unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
    }
}
