//! Overrides and timed bans on the memory backend (tests/shared/overrides.rs; the Redis fleet in
//! tests/http/overrides_on_redis.rs).

use tower_throttle::MemoryBackend;

use crate::shared::overrides::{
    an_overridden_concurrency_slot_is_given_back, overrides_and_bans_apply,
};

#[tokio::test]
async fn overrides_and_bans_apply_in_memory() {
    overrides_and_bans_apply(MemoryBackend::new()).await;
}

#[tokio::test]
async fn an_overridden_concurrency_slot_is_given_back_in_memory() {
    an_overridden_concurrency_slot_is_given_back(MemoryBackend::new()).await;
}
