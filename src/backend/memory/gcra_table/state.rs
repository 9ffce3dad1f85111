//! The GCRA table's records out and back in, for a state file kept across a restart
//! ([`MemoryBackend::save_state`](crate::MemoryBackend::save_state)).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::atomic::Ordering::Relaxed;

use super::hot::{HotKey, MOVED};
use super::{by_form, read, write, Compact, GcraTable, RecordKey, TatRecord};
use crate::gcra;
use crate::key::Key;

impl GcraTable {
    /// Every record whose TAT is after `now`, the hot slots' included: (limit id, key, TAT).
    pub(in crate::backend::memory) fn records(&self, now: u64) -> Vec<(u32, Key, u64)> {
        let mut out = Vec::new();
        for shard in self.shards.iter() {
            let table = read(&shard.table);
            let live = |tat: u64| tat > now && tat != MOVED;
            collect(&table.v4, &mut out, live, |ip| {
                Key::from_ip(IpAddr::V4(Ipv4Addr::from_bits(*ip)))
            });
            collect(&table.v6, &mut out, live, |ip| {
                Key::from_ip(IpAddr::V6(Ipv6Addr::from(*ip)))
            });
            collect(&table.other, &mut out, live, Key::clone);
            // Under the read lock no record leaves the slot, so its TAT is exact.
            let hot = shard.hot.snapshot();
            if let Some((limit, key, tat)) = hot.filter(|(_, _, tat)| live(*tat)) {
                let key = match key {
                    HotKey::V4(ip) => Key::from_ip(IpAddr::V4(Ipv4Addr::from_bits(ip))),
                    HotKey::V6(ip) => Key::from_ip(IpAddr::V6(Ipv6Addr::from(ip))),
                    HotKey::Other(key) => key,
                };
                out.push((limit, key, tat));
            }
        }
        out
    }

    /// Puts back `key`'s TAT read from a state file: the later of it and what the table holds now,
    /// so a restore never gives a key more than it had.
    pub(in crate::backend::memory) fn restore(
        &self,
        params: &gcra::GcraParams,
        id: u32,
        key: &Key,
        tat: u64,
        now: u64,
    ) {
        if tat <= now || tat == MOVED {
            return;
        }
        by_form!(key, |k| self.restore_in(params, id, k, tat, now))
    }

    fn restore_in<K: RecordKey + Clone>(
        &self,
        params: &gcra::GcraParams,
        id: u32,
        key: &K,
        tat: u64,
        now: u64,
    ) {
        let hash = key.record_hash(id, &self.hasher);
        let shard = self.shard(hash);
        let mut table = write(&shard.table);
        if shard
            .hot
            .with(id, |h| key.is_hot(h), |hot| hot.fetch_max(tat, Relaxed))
            .is_some()
        {
            return;
        }
        match K::table_mut(&mut table).find_entry(hash, |s| s.limit == id && s.key == *key) {
            Ok(mut occupied) => {
                occupied.get_mut().tat.fetch_max(tat, Relaxed);
            }
            Err(_) => self.insert_new(&mut table, hash, params, id, key.clone(), tat, now),
        }
    }
}

fn collect<K>(
    table: &hashbrown::HashTable<TatRecord<K>>,
    out: &mut Vec<(u32, Key, u64)>,
    live: impl Fn(u64) -> bool,
    key_of: impl Fn(&K) -> Key,
) {
    for record in table.iter() {
        let tat = record.tat.load(Relaxed);
        if live(tat) {
            out.push((record.limit, key_of(&record.key), tat));
        }
    }
}
