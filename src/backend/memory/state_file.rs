//! A memory backend's state kept across a restart ([`MemoryBackend::save_state`],
//! [`MemoryBackend::load_state`]): a rolling deploy of in-memory processes would otherwise give every
//! client a fresh burst.
//!
//! The file is text, one key a line: `gcra`, a lone GCRA limit's name, the key as logs show it
//! ([`Key::render`]) and its TAT; or `entry`, the first limit of a stack (or a lone window, log or
//! stack limit), the key, and each limit's state (`name,position,expires,kind,fields…`, `;` between
//! them). Every time is Unix time in nanoseconds — wall-clock time, so that a process whose
//! monotonic clock started elsewhere reads it exactly. The last line, `end` and the count of keys,
//! tells a whole file from one cut short. Concurrency slots are not kept: a process that stopped
//! holds no request in flight.

use std::fs;
use std::io::{self, Write};
use std::path::Path;

use super::entries::{Cell, State};
use super::MemoryBackend;
use crate::clock::Clock;
use crate::key::Key;
use crate::limit::Limit;
use crate::window::{FixedState, SlidingState};

/// The first line of a state file: the format and its version.
const HEADER: &str = "tower-throttle memory state 2";

impl<C: Clock> MemoryBackend<C> {
    /// Writes the state of every live key of `limits` (every algorithm and stack but the
    /// concurrency limit, whose slots end with the process) to `path`, for
    /// [`load_state`](Self::load_state) in the next process. Written to a temporary
    /// file beside `path`, then renamed over it, so a crash mid-write leaves the previous file.
    /// Returns how many keys it wrote.
    ///
    /// ```
    /// use tower_throttle::{Key, Limit, MemoryBackend, Quota};
    ///
    /// let limit = Limit::new("api", Quota::per_hour(2)).unwrap();
    /// let path = std::env::temp_dir().join(format!("throttle-doc-{}.state", std::process::id()));
    /// let before = MemoryBackend::new();
    /// before.decide(&limit, &Key::from("ann"), 2).unwrap();
    /// assert_eq!(before.save_state(&path, &[limit.clone()]).unwrap(), 1);
    ///
    /// let after = MemoryBackend::new(); // the next process
    /// assert_eq!(after.load_state(&path, &[limit.clone()]).unwrap(), 1);
    /// assert!(!after.decide(&limit, &Key::from("ann"), 1).unwrap().allowed);
    /// # std::fs::remove_file(&path).unwrap();
    /// ```
    pub fn save_state(&self, path: impl AsRef<Path>, limits: &[Limit]) -> io::Result<usize> {
        let path = path.as_ref();
        let stores = &*self.stores;
        let now = stores.clock.now_nanos();
        let origin = stores.clock.unix_origin_nanos();
        let names: Vec<(u32, &str)> = limits.iter().map(|l| (l.id(), l.name())).collect();
        let name_of = |id: u32| names.iter().find(|(i, _)| *i == id).map(|(_, n)| *n);
        let mut text = format!("{HEADER}\n");
        let mut written = 0;
        let mut rendered = String::new();
        let mut line = |kind: &str, name: &str, key: &Key, rest: String| {
            rendered.clear();
            key.render(&mut rendered);
            text.push_str(&format!("{kind}\t{name}\t{rendered}\t{rest}\n"));
            written += 1;
        };
        for (id, key, tat) in stores.gcra.records(now) {
            if let Some(name) = name_of(id) {
                line("gcra", name, &key, (origin + tat).to_string());
            }
        }
        for (id, key, cells) in stores.general.records(now, origin) {
            let Some(first) = name_of(id) else {
                continue;
            };
            let cells: Vec<String> = cells
                .iter()
                .filter_map(|c| Some(cell_text(name_of(c.limit)?, c)))
                .collect();
            if cells.is_empty() {
                continue;
            }
            line("entry", first, &key, cells.join(";"));
        }
        // Last, the count: a file cut short anywhere (a full disk, a crash of the copy that
        // brought it) is told from a whole one.
        text.push_str(&format!("end\t{written}\n"));
        // A name of this save's own, made new: two saves at once (two processes, both pid 1 in
        // their containers on one volume, or a signal's beside a shutdown's) each write whole,
        // and the last renamed wins; nothing there before is written through (a link).
        static SAVES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let save = SAVES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let unique = std::hash::BuildHasher::hash_one(&std::hash::RandomState::new(), save);
        let mut temporary = path.as_os_str().to_owned();
        temporary.push(format!(".{}-{save}-{unique:016x}.tmp", std::process::id()));
        let mut options = fs::OpenOptions::new();
        options.write(true).create_new(true);
        // Keys are clients' own (API keys, user ids): readable by this user alone.
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let mut file = options.open(&temporary)?;
        let saved = file
            .write_all(text.as_bytes())
            .and_then(|()| file.sync_all())
            .and_then(|()| fs::rename(&temporary, path));
        if saved.is_err() {
            let _ = fs::remove_file(&temporary); // Not left behind, under a name no save reuses.
        }
        remove_stale_temporaries(path);
        saved.map(|()| written)
    }

    /// Reads a file [`save_state`](Self::save_state) wrote and gives each key of `limits` the state
    /// it had (for a lone GCRA limit the later of it and what this backend holds, so a key never
    /// gains; for the others, only a key this backend has not seen yet). Keys of limits not in
    /// `limits` are dropped (a stack's, of those of its limits that are gone), and so are keys that
    /// refilled since. Returns how many keys it restored, no more than it holds (a backend whose
    /// [`max_keys`](super::MemoryBackendBuilder::max_keys) is below the file's keys keeps its
    /// cap). A file that is not a state file, or is damaged anywhere, is an error and restores
    /// nothing.
    pub fn load_state(&self, path: impl AsRef<Path>, limits: &[Limit]) -> io::Result<usize> {
        let text = fs::read_to_string(path)?;
        let records =
            parse(&text).map_err(|why| io::Error::new(io::ErrorKind::InvalidData, why))?;
        let stores = &*self.stores;
        let now = stores.clock.now_nanos();
        let origin = stores.clock.unix_origin_nanos();
        let mut restored = 0;
        let limit_named = |name: &str| limits.iter().find(|l| l.name() == name);
        for record in records {
            match record {
                Record::Gcra(name, key, unix_tat) => {
                    // Only a lone GCRA limit keeps its keys in the GCRA table.
                    let Some((limit, params)) =
                        limit_named(name).and_then(|l| Some((l, l.gcra()?)))
                    else {
                        continue;
                    };
                    let Some(tat) = unix_tat.checked_sub(origin).filter(|tat| *tat > now) else {
                        continue;
                    };
                    stores.gcra.restore(params, limit.id(), &key, tat, now);
                }
                Record::Entry(first, key, cells) => {
                    let Some(first) = limit_named(first) else {
                        continue;
                    };
                    let cells: Vec<Cell> = cells
                        .into_iter()
                        .filter_map(|(name, cell)| {
                            let limit = limit_named(name)?.id();
                            Some(Cell { limit, ..cell })
                        })
                        .collect();
                    if cells.is_empty() || !stores.general.restore(first, &key, cells, now, origin)
                    {
                        continue;
                    }
                }
            }
            restored += 1;
        }
        // A backend holding fewer keys than the file forgot the older ones as it restored.
        Ok(restored.min(self.len()))
    }
}

/// A backend that may be the memory backend: what
/// [`Config::save_state`](crate::config::Config::save_state) writes from.
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

/// One line of a state file.
enum Record<'a> {
    /// A lone GCRA limit's key: the limit's name, the key, the TAT (Unix ns).
    Gcra(&'a str, Key, u64),
    /// A general store entry: its first limit's name, the key, and each cell's limit name and
    /// cell (its times in Unix ns, its limit id not yet known).
    Entry(&'a str, Key, Vec<(&'a str, Cell)>),
}

/// A cell as a state file writes it: `name,position,expires,kind,fields…`.
fn cell_text(name: &str, cell: &Cell) -> String {
    let (position, expires) = (cell.position, cell.expires_at);
    match &cell.state {
        State::Gcra(tat) => format!("{name},{position},{expires},gcra,{tat}"),
        State::Fixed(s) => {
            format!("{name},{position},{expires},fixed,{},{}", s.window, s.count)
        }
        State::Sliding(s) => format!(
            "{name},{position},{expires},sliding,{},{},{}",
            s.window, s.current, s.previous
        ),
        State::Log(times) => {
            let times: Vec<String> = times.iter().map(u64::to_string).collect();
            format!("{name},{position},{expires},log,{}", times.join(","))
        }
        State::InFlight(..) => unreachable!("GeneralStore::records leaves slots out"),
    }
}

/// A cell from its text ([`cell_text`]).
fn parse_cell(text: &str) -> Option<(&str, Cell)> {
    let mut fields = text.split(',');
    let name = fields.next()?;
    let position: u8 = fields.next()?.parse().ok()?;
    let expires: u64 = fields.next()?.parse().ok()?;
    let kind = fields.next()?;
    // An empty log (every unit given back) is written with no times: `log,`.
    let fields = fields.filter(|field| !field.is_empty());
    let numbers: Vec<u64> = fields.map(str::parse).collect::<Result<_, _>>().ok()?;
    let state = match (kind, numbers.as_slice()) {
        ("gcra", [tat]) => State::Gcra(*tat),
        ("fixed", [window, count]) => State::Fixed(FixedState {
            window: *window,
            count: *count,
        }),
        ("sliding", [window, current, previous]) => State::Sliding(SlidingState {
            window: *window,
            current: *current,
            previous: *previous,
        }),
        ("log", times) if times.windows(2).all(|w| w[0] <= w[1]) => {
            State::Log(times.to_vec().into())
        }
        _ => return None,
    };
    let cell = Cell {
        limit: 0,
        position,
        expires_at: expires,
        state,
    };
    Some((name, cell))
}

/// How old another save's temporary file beside `path` must be to be one a crash left behind (it
/// holds clients' keys), not one a save is writing now.
const STALE: std::time::Duration = std::time::Duration::from_secs(600);

/// Removes the temporary files of saves to `path` that a crash left behind.
fn remove_stale_temporaries(path: &Path) {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return;
    };
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    let prefix = format!("{}.", name.to_string_lossy());
    for entry in entries.flatten() {
        let file = entry.file_name();
        let file = file.to_string_lossy();
        let ours = file.starts_with(&prefix) && file.ends_with(".tmp");
        let age = entry.metadata().and_then(|m| m.modified()).ok();
        let stale = age
            .and_then(|at| at.elapsed().ok())
            .is_some_and(|age| age > STALE);
        if ours && stale {
            let _ = fs::remove_file(entry.path());
        }
    }
}

/// The records of a state file, or what is wrong with it.
fn parse(text: &str) -> Result<Vec<Record<'_>>, String> {
    let mut lines = text.lines().enumerate();
    if lines.next().map(|(_, line)| line) != Some(HEADER) {
        return Err(format!(
            "not a state file: its first line is not {HEADER:?}"
        ));
    }
    let mut records = Vec::new();
    while let Some((i, line)) = lines.next() {
        let Some(count) = line.strip_prefix("end\t") else {
            records.push(record(i + 1, line)?);
            continue;
        };
        // The last line, whole (with its newline), and the count of the lines before it.
        if lines.next().is_some() || !text.ends_with('\n') || count.parse() != Ok(records.len()) {
            let read = records.len();
            return Err(format!(
                "damaged: {read} records, then the end line {line:?}"
            ));
        }
        return Ok(records);
    }
    Err("cut short: no end line (`end <records>`)".into())
}

/// Line `number` of a state file: a record.
fn record(number: usize, line: &str) -> Result<Record<'_>, String> {
    let bad = || {
        format!(
            "line {number}: not `gcra <limit> <key> <tat>` nor `entry <limit> <key> <cells>`: {line:?}"
        )
    };
    let fields: Vec<&str> = line.split('\t').collect();
    let [kind, name, key, rest] = fields[..] else {
        return Err(bad());
    };
    let key = Key::from_rendered(key).ok_or_else(bad)?;
    match kind {
        "gcra" => Ok(Record::Gcra(name, key, rest.parse().map_err(|_| bad())?)),
        "entry" => {
            let cells = rest.split(';').map(parse_cell).collect::<Option<Vec<_>>>();
            Ok(Record::Entry(name, key, cells.ok_or_else(bad)?))
        }
        _ => Err(bad()),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::backend::Charges;
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

    /// A backend capped below the file's keys keeps its cap, and counts no more keys restored
    /// than it holds.
    #[test]
    fn a_capped_backend_restores_no_more_than_it_holds() {
        let limit = Limit::new("hourly", Quota::per_hour(10)).unwrap();
        let before = backend();
        for i in 0..1000 {
            before
                .decide(&limit, &Key::from(format!("k{i}")), 1)
                .unwrap();
        }
        let path = file("capped");
        assert_eq!(
            before
                .save_state(&path, std::slice::from_ref(&limit))
                .unwrap(),
            1000
        );
        let after = MemoryBackend::builder().max_keys(16).build().unwrap();
        let restored = after.load_state(&path, &[limit]).unwrap();
        let held = after.len();
        assert!(
            restored <= held && held <= 16,
            "{restored} restored, {held} held"
        );
        fs::remove_file(&path).unwrap();
    }

    /// A file (or link) already at a name a save could pick for its temporary file is never
    /// written: the names this process's saves took before (a counter from 0; the module's other
    /// tests save about 120 times) hold links to a victim.
    #[cfg(unix)]
    #[test]
    fn a_save_writes_through_no_link_left_beside_the_file() {
        let limit = Limit::new("api", Quota::per_hour(2)).unwrap();
        let (path, victim) = (file("linked"), file("victim"));
        fs::write(&victim, "untouched").unwrap();
        let links: Vec<_> = (0..512)
            .map(|n| {
                let mut link = path.as_os_str().to_owned();
                link.push(format!(".{}-{n}.tmp", std::process::id()));
                let _ = fs::remove_file(&link);
                std::os::unix::fs::symlink(&victim, &link).unwrap();
                link
            })
            .collect();
        let saver = backend();
        saver.decide(&limit, &Key::from("ann"), 1).unwrap();
        for _ in 0..4 {
            assert_eq!(
                saver
                    .save_state(&path, std::slice::from_ref(&limit))
                    .unwrap(),
                1
            );
        }
        assert_eq!(fs::read_to_string(&victim).unwrap(), "untouched");
        for link in links
            .iter()
            .chain([path.as_os_str().to_owned(), victim.into()].iter())
        {
            fs::remove_file(link).unwrap();
        }
    }

    /// What a crash left beside the file (a temporary file of keys, ten minutes old) goes with the
    /// next save; a save's under way (fresh) stays.
    #[test]
    fn a_save_removes_the_temporary_files_a_crash_left() {
        let limit = Limit::new("api", Quota::per_hour(2)).unwrap();
        let path = file("crashed");
        let at = |suffix: &str| {
            let mut name = path.as_os_str().to_owned();
            name.push(suffix);
            std::path::PathBuf::from(name)
        };
        let (left, fresh) = (at(".1-0-dead.tmp"), at(".2-0-beef.tmp"));
        for temporary in [&left, &fresh] {
            fs::write(temporary, "keys").unwrap();
        }
        let old = std::time::SystemTime::now() - Duration::from_secs(1200);
        fs::File::options()
            .write(true)
            .open(&left)
            .unwrap()
            .set_modified(old)
            .unwrap();
        backend().save_state(&path, &[limit]).unwrap();
        assert!(!left.exists(), "left by a crash");
        assert!(fresh.exists(), "another save's, under way");
        for done in [&fresh, &path] {
            fs::remove_file(done).unwrap();
        }
    }

    /// A key whose window ended since it was saved is not restored, nor counted as restored.
    #[test]
    fn a_key_whose_window_ended_is_not_counted_as_restored() {
        use crate::limit::Algorithm;
        let window = Limit::with_algorithm("w", Algorithm::FixedWindow, Quota::per_second(5));
        let window = window.unwrap();
        let path = file("ended");
        let saver = backend();
        saver.decide(&window, &Key::from("ann"), 1).unwrap();
        assert_eq!(
            saver
                .save_state(&path, std::slice::from_ref(&window))
                .unwrap(),
            1
        );
        std::thread::sleep(Duration::from_millis(1100));
        let loader = backend();
        assert_eq!(
            loader
                .load_state(&path, std::slice::from_ref(&window))
                .unwrap(),
            0
        );
        assert_eq!(loader.len(), 0);
        fs::remove_file(&path).unwrap();
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
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o077, 0, "the keys are readable by others: {mode:o}");
        }
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
            "line 3: not `gcra <limit> <key> <tat>` nor `entry <limit> <key> <cells>`: \"gcra\\tapi\\tbob\""
        );
        assert_eq!(len, 0, "nothing restored from a damaged file");
        // A damaged cell of an entry: the whole file is refused too.
        let (out, len) = load(&format!(
            "{HEADER}\ngcra\tapi\tann\t{far}\nentry\tapi\tbob\tapi,0,{far},fixed,1\n"
        ));
        assert!(out.unwrap_err().starts_with("line 3"));
        assert_eq!(len, 0);
        let (out, _) = load("{\"json\": true}\n");
        assert!(out.unwrap_err().starts_with("not a state file"));
        let (out, _) = load(&format!("{HEADER}\ngcra\tapi\tann bob\t{far}\n"));
        assert!(
            out.unwrap_err().starts_with("line 2"),
            "a key with a space is not a rendering"
        );
        // A stale file: every key has refilled since, so nothing comes back.
        let (out, len) = load(&format!("{HEADER}\ngcra\tapi\tann\t1000\nend\t1\n"));
        assert_eq!((out.unwrap(), len), (0, 0));
        // Cut short: mid-line (a TAT missing digits, no newline), between lines, or with its
        // end line miscounted; each restores nothing.
        let whole = format!("{HEADER}\ngcra\tapi\tann\t{far}\ngcra\tapi\tbob\t{far}\nend\t2\n");
        for cut in [
            whole[..whole.len() - 1].to_owned(),
            whole[..whole.find("end").unwrap() - 3].to_owned(),
            whole[..whole.find("gcra\tapi\tbob").unwrap()].to_owned(),
            whole.replace("end\t2", "end\t3"),
            format!("{whole}gcra\tapi\tcid\t{far}\n"),
        ] {
            let (out, len) = load(&cut);
            assert!(out.is_err(), "{cut:?}");
            assert_eq!(len, 0, "{cut:?}");
        }
        assert_eq!(load(&whole), (Ok(2), 2));
        fs::remove_file(&path).unwrap();
        assert_eq!(
            backend().load_state(&path, &[limit]).unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
    }

    #[test]
    fn windows_logs_and_stacks_come_back_and_slots_do_not() {
        use crate::Algorithm;
        let limit = |name: &str, algorithm| {
            Limit::with_algorithm(name, algorithm, Quota::per_hour(5)).unwrap()
        };
        let fixed = limit("fixed", Algorithm::FixedWindow);
        let sliding = limit("sliding", Algorithm::SlidingWindow);
        let log = limit("log", Algorithm::SlidingLog);
        let slots = limit("slots", Algorithm::Concurrency);
        let stack = [
            Limit::new("stack.1h", Quota::per_hour(5)).unwrap(),
            Limit::new("stack.1d", Quota::per_day(50)).unwrap(),
        ];
        let key = Key::from("ann");
        let before = backend();
        for _ in 0..3 {
            for lone in [&fixed, &sliding, &log, &slots] {
                assert!(before.decide(lone, &key, 1).unwrap().allowed);
            }
            let stacked = before
                .decide_charges(Charges::stack(&stack, &key, 1))
                .unwrap();
            assert!(stacked.iter().all(|d| d.allowed));
        }
        let path = file("general");
        let all = [
            &[fixed.clone(), sliding.clone(), log.clone(), slots.clone()][..],
            &stack,
        ]
        .concat();
        assert_eq!(
            before.save_state(&path, &all).unwrap(),
            4,
            "the slots are not kept"
        );
        let after = backend();
        assert_eq!(after.load_state(&path, &all).unwrap(), 4);
        let left = |backend: &MemoryBackend<_>, l| backend.decide(l, &key, 0).unwrap().remaining;
        for lone in [&fixed, &sliding, &log] {
            assert_eq!(left(&after, lone), 2, "{}", lone.name());
        }
        assert_eq!(left(&after, &slots), 5, "no slot held");
        let stacked = after
            .decide_charges(Charges::stack(&stack, &key, 0))
            .unwrap();
        assert_eq!((stacked[0].remaining, stacked[1].remaining), (2, 47));
        // A stack one of whose limits is gone keeps the others' states.
        let fresh = backend();
        let kept = [&[fixed.clone()][..], &stack[..1]].concat();
        assert_eq!(fresh.load_state(&path, &kept).unwrap(), 2);
        assert_eq!(left(&fresh, &fixed), 2);
        let stacked = fresh
            .decide_charges(Charges::stack(&stack, &key, 0))
            .unwrap();
        assert_eq!((stacked[0].remaining, stacked[1].remaining), (2, 50));
        fs::remove_file(&path).unwrap();
    }

    /// A log whose every unit was given back is kept empty, and read back with the other keys.
    #[test]
    fn an_emptied_log_is_read_back() {
        use crate::backend::{Adjustment, Backend, Charges};
        let hourly = Limit::new("hourly", Quota::per_hour(2)).unwrap();
        let log =
            Limit::with_algorithm("log", crate::Algorithm::SlidingLog, Quota::per_hour(5)).unwrap();
        let (ann, bob) = (Key::from("ann"), Key::from("bob"));
        let before = backend();
        for _ in 0..2 {
            assert!(before.decide(&hourly, &bob, 1).unwrap().allowed);
        }
        assert!(before.decide(&log, &ann, 1).unwrap().allowed);
        let since = Duration::from_secs(1);
        before.adjust(
            Charges::one(&log, &ann, 1),
            Adjustment::Refund {
                since,
                admitted: &[],
            },
        );
        let (path, limits) = (file("emptied"), [hourly.clone(), log.clone()]);
        before.save_state(&path, &limits).unwrap();
        let after = backend();
        assert!(after.load_state(&path, &limits).is_ok());
        assert!(!after.decide(&hourly, &bob, 1).unwrap().allowed);
        assert_eq!(after.decide(&log, &ann, 0).unwrap().remaining, 5);
        fs::remove_file(&path).unwrap();
    }

    /// Saves at once to one file each write a whole file: the last renamed is read back whole.
    #[test]
    fn saves_at_once_leave_a_whole_file() {
        let limit = [Limit::new("many", Quota::per_hour(10)).unwrap()];
        let saving = backend();
        for i in 0..300 {
            assert!(
                saving
                    .decide(&limit[0], &Key::from(format!("k{i}")), 1)
                    .unwrap()
                    .allowed
            );
        }
        let path = file("at-once");
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..25 {
                        assert_eq!(saving.save_state(&path, &limit).unwrap(), 300);
                    }
                });
            }
        });
        assert_eq!(backend().load_state(&path, &limit).unwrap(), 300);
        fs::remove_file(&path).unwrap();
    }

    /// A clock `at` nanoseconds past an origin at Unix time `origin`.
    struct At {
        origin: u64,
        at: u64,
    }

    impl crate::clock::Clock for At {
        fn now_nanos(&self) -> u64 {
            self.at
        }

        fn unix_origin_nanos(&self) -> u64 {
            self.origin
        }
    }

    /// A log kept by a process whose clock was ahead of the next one's comes back in order: the
    /// next process's file loads, with every unit counted.
    #[test]
    fn a_log_kept_by_a_clock_ahead_comes_back_in_order() {
        let log = Limit::with_algorithm("log", crate::Algorithm::SlidingLog, Quota::per_hour(5));
        let log = [log.unwrap()];
        let key = Key::from("ann");
        let t0 = 1_700_000_000 * 1_000_000_000;
        let second = 1_000_000_000;
        let at = |origin, at| {
            let clock = At { origin, at };
            MemoryBackend::builder().clock(clock).build().unwrap()
        };
        let path = file("skewed");
        let ahead = at(t0 + 2 * second, second);
        assert!(ahead.decide(&log[0], &key, 1).unwrap().allowed);
        assert_eq!(ahead.save_state(&path, &log).unwrap(), 1);
        let behind = at(t0, second);
        assert_eq!(behind.load_state(&path, &log).unwrap(), 1);
        assert!(behind.decide(&log[0], &key, 1).unwrap().allowed);
        assert_eq!(behind.save_state(&path, &log).unwrap(), 1);
        let next = at(t0, 2 * second);
        assert_eq!(next.load_state(&path, &log).unwrap(), 1);
        assert_eq!(next.decide(&log[0], &key, 0).unwrap().remaining, 3);
        fs::remove_file(&path).unwrap();
    }

    #[test]
    fn a_state_kept_under_a_larger_quota_reads_as_full_under_a_smaller_one() {
        use crate::Algorithm;
        let quota = |count| Quota::per_hour(count);
        let fixed =
            |count| Limit::with_algorithm("w", Algorithm::FixedWindow, quota(count)).unwrap();
        let log = |count| Limit::with_algorithm("l", Algorithm::SlidingLog, quota(count)).unwrap();
        let key = Key::from("ann");
        let before = backend();
        for _ in 0..50 {
            assert!(before.decide(&fixed(100), &key, 1).unwrap().allowed);
            assert!(before.decide(&log(100), &key, 1).unwrap().allowed);
        }
        let path = file("smaller");
        before.save_state(&path, &[fixed(100), log(100)]).unwrap();
        let after = backend();
        assert_eq!(after.load_state(&path, &[fixed(10), log(10)]).unwrap(), 2);
        for limit in [fixed(10), log(10)] {
            let refused = after.decide(&limit, &key, 1).unwrap();
            assert!(
                !refused.allowed && refused.remaining == 0,
                "{}: {refused:?}",
                limit.name()
            );
        }
        fs::remove_file(&path).unwrap();
    }
}
