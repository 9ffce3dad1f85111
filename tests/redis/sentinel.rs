//! Redis Sentinel: see tests/redis/failover.rs.
